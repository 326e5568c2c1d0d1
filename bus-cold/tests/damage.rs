//! C24: a cold range that is missing, truncated, edited, forged or foreign
//! is an error naming the range (`Corrupt` / `Integrity`), never a silent
//! gap; a stray object under the tier's prefix is refused, not guessed at.
//! On local files, where the test can damage objects directly.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

mod common;

use std::path::{Path, PathBuf};

use bus_cold::{ColdLocation, ColdTier, Manifest, format};
use bus_core::BusError;
use common::{auth, records, unique};

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    topic: String,
    tier: ColdTier,
}

/// Three archived objects: [0, 100), [100, 200), [200, 300) of partition 0,
/// and [0, 100) of partition 1.
fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_owned();
    let tier = ColdTier::open(&ColdLocation::Local { root: root.clone() }).unwrap();
    let topic = unique("dmg");
    let all = records(&topic, 0, 0, 300);
    for chunk in all.chunks(100) {
        tier.archive_records(&topic, 0, chunk).unwrap();
    }
    tier.archive_records(&topic, 1, &records(&topic, 1, 0, 100))
        .unwrap();
    Fixture {
        _dir: dir,
        root,
        topic,
        tier,
    }
}

impl Fixture {
    fn object(&self, partition: u32, from: u64, end: u64) -> PathBuf {
        self.root
            .join(&self.topic)
            .join(partition.to_string())
            .join("objects")
            .join(format!("{from:020}-{end:020}.bcold"))
    }
    fn newest_manifest(&self, partition: u32) -> PathBuf {
        let dir = self
            .root
            .join(&self.topic)
            .join(partition.to_string())
            .join("manifest");
        let mut all: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        all.sort();
        all.pop().unwrap()
    }
    /// A fresh tier (no cached objects) reading partition 0 from `from`.
    fn read_from(&self, from: u64) -> Result<Vec<bus_core::StoredEvent>, BusError> {
        let tier = ColdTier::open(&ColdLocation::Local {
            root: self.root.clone(),
        })
        .unwrap();
        tier.fetch(&self.topic, 0, from, 1000, Some(&auth()))
    }
    /// Rewrites the newest manifest so it agrees with the object now at
    /// [from, end) (what an attacker who knows the format would also do).
    fn bless(&self, from: u64, end: u64) {
        let path = self.newest_manifest(0);
        let mut manifest: Manifest =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let bytes = std::fs::read(self.object(0, from, end)).unwrap();
        let range = manifest.ranges.iter_mut().find(|r| r.from == from).unwrap();
        range.bytes = bytes.len() as u64;
        range.crc32c = crc32c::crc32c(&bytes);
        std::fs::write(path, serde_json::to_vec(&manifest).unwrap()).unwrap();
    }
}

fn names_range(error: &BusError, topic: &str, from: u64, end: u64) {
    let text = error.to_string();
    assert!(
        text.contains(&format!("{topic}/0 [{from}, {end})")),
        "the error must name the range [{from}, {end}): {text}"
    );
}

fn assert_corrupt(
    result: Result<Vec<bus_core::StoredEvent>, BusError>,
    fx: &Fixture,
    from: u64,
    end: u64,
    why: &str,
) {
    match result {
        Err(error @ BusError::Corrupt { .. }) => {
            names_range(&error, &fx.topic, from, end);
            assert!(error.to_string().contains(why), "{error}");
        }
        other => panic!("expected Corrupt naming [{from}, {end}) ({why}), got {other:?}"),
    }
}

#[test]
fn a_missing_object_is_corrupt_naming_its_range_not_a_gap() {
    let fx = fixture();
    std::fs::remove_file(fx.object(0, 100, 200)).unwrap();
    assert_corrupt(
        fx.read_from(0).map(|e| e[100..].to_vec()),
        &fx,
        100,
        200,
        "missing",
    );
    // Reads wholly before or after the damaged range still work.
    assert_eq!(
        fx.tier.fetch(&fx.topic, 0, 0, 100, None).unwrap().len(),
        100
    );
    assert_eq!(fx.read_from(200).unwrap().len(), 100);
}

#[test]
fn a_truncated_object_is_corrupt() {
    let fx = fixture();
    let path = fx.object(0, 100, 200);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    assert_corrupt(fx.read_from(150), &fx, 100, 200, "truncated");
    // Even with the manifest made to agree, the object itself says so.
    fx.bless(100, 200);
    assert_corrupt(fx.read_from(150), &fx, 100, 200, "truncated");
}

#[test]
fn an_edited_byte_is_corrupt() {
    let fx = fixture();
    let path = fx.object(0, 200, 300);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x20;
    std::fs::write(&path, &bytes).unwrap();
    assert_corrupt(fx.read_from(200), &fx, 200, 300, "checksum");
    // Past the manifest's whole-object CRC, the frame's CRC catches it.
    fx.bless(200, 300);
    assert_corrupt(fx.read_from(200), &fx, 200, 300, "checksum");
}

#[test]
fn a_forged_record_with_valid_checksums_fails_its_tag() {
    let fx = fixture();
    let place = format::Place {
        topic: &fx.topic,
        partition: 0,
        from: 100,
        end: 200,
    };
    let path = fx.object(0, 100, 200);
    let mut records = format::decode(place, &std::fs::read(&path).unwrap(), 100, 1000).unwrap();
    records[42].value = br#"{"n":142,"forged":true}"#.to_vec();
    std::fs::write(&path, format::encode(place, &records).unwrap()).unwrap();
    fx.bless(100, 200);
    match fx.read_from(100) {
        Err(BusError::Integrity {
            partition: 0,
            offset: 142,
            ref reason,
            ..
        }) => {
            assert!(reason.contains("cold"), "{reason}")
        }
        other => panic!("expected Integrity at offset 142, got {other:?}"),
    }
    // Without a control key the record reads as it is (as on the hot log).
    assert_eq!(
        fx.tier.fetch(&fx.topic, 0, 142, 1, None).unwrap()[0].value["forged"],
        true
    );
}

#[test]
fn a_foreign_object_is_corrupt() {
    let fx = fixture();
    // Partition 1's [0, 100) put in place of partition 0's [0, 100).
    std::fs::copy(fx.object(1, 0, 100), fx.object(0, 0, 100)).unwrap();
    fx.bless(0, 100);
    assert_corrupt(fx.read_from(0), &fx, 0, 100, "foreign");
    // Another range's object of the same partition under this range's name.
    let fx = fixture();
    std::fs::copy(fx.object(0, 200, 300), fx.object(0, 100, 200)).unwrap();
    fx.bless(100, 200);
    assert_corrupt(fx.read_from(100), &fx, 100, 200, "not the range");
    // Not a cold object at all.
    let fx = fixture();
    std::fs::write(fx.object(0, 0, 100), b"{\"something\": \"else\"}").unwrap();
    fx.bless(0, 100);
    assert_corrupt(fx.read_from(0), &fx, 0, 100, "magic");
}

#[test]
fn a_stray_or_foreign_manifest_is_refused() {
    let fx = fixture();
    let dir = fx.newest_manifest(0).parent().unwrap().to_owned();
    std::fs::write(dir.join("notes.txt"), b"hello").unwrap();
    let error = fx.read_from(0).unwrap_err();
    assert!(
        matches!(error, BusError::Corrupt { .. }) && error.to_string().contains("notes.txt"),
        "{error}"
    );
    std::fs::remove_file(dir.join("notes.txt")).unwrap();
    // Partition 1's manifest copied as partition 0's next generation.
    let foreign = fx.newest_manifest(1);
    std::fs::copy(foreign, dir.join(format!("{:020}.json", 99))).unwrap();
    let error = fx.read_from(0).unwrap_err();
    assert!(
        matches!(error, BusError::Corrupt { .. }) && error.to_string().contains("foreign"),
        "{error}"
    );
    assert!(!Path::new(&dir).join("00000000000000000100.json").exists());
}

#[test]
fn a_leftover_object_of_other_content_blocks_the_archive_without_writing() {
    let fx = fixture();
    // Something else wrote the name the next archive would use.
    let next = fx.object(0, 300, 310);
    std::fs::write(&next, b"not ours").unwrap();
    let before = fx.tier.manifest(&fx.topic, 0).unwrap();
    let error = fx
        .tier
        .archive_records(&fx.topic, 0, &records(&fx.topic, 0, 300, 310))
        .unwrap_err();
    assert!(matches!(error, BusError::Corrupt { .. }), "{error}");
    assert_eq!(
        fx.tier.manifest(&fx.topic, 0).unwrap(),
        before,
        "nothing archived"
    );
    assert_eq!(
        std::fs::read(next).unwrap(),
        b"not ours",
        "nothing overwritten"
    );
}
