//! The partition's UID locator (`uid-locator`): written at a clean close,
//! and when it is missing, cut, damaged, stale (another partition's, or
//! from before segments were sealed or deleted) or left behind by a crash,
//! every lookup still answers right, dedup holds and no record is lost or
//! duplicated; more sealed segments than it covers are asked directly.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::path::{Path, PathBuf};

use crate::support::{TOPIC, assert_gap_free, copy_tree, provision, read_all, segments, value_for};
use bus_core::{EventBus, Manifest, TopicSpec};
use bus_embedded::{EmbeddedBus, Options};

fn options() -> Options {
    Options::default()
        .segment_bytes(2000)
        .index_interval_bytes(300)
}

fn uid(i: usize) -> String {
    format!("uid-{i}")
}

fn locator(dir: &Path, partition: u32) -> PathBuf {
    bus_embedded::testing::partition_dir(dir, TOPIC, partition).join("uid-locator")
}

/// Publishes `from..to` (batches of 5, UIDs `uid-i`) to partition 0.
fn publish(bus: &EmbeddedBus, from: usize, to: usize) {
    for at in (from..to).step_by(5) {
        let batch: Vec<bus_core::BatchRecord> = (at..(at + 5).min(to))
            .map(|i| bus_core::BatchRecord::new("k", value_for(&uid(i), i)).with_uid(uid(i)))
            .collect();
        let acks = bus.publish_batch(TOPIC, &batch).unwrap();
        assert_eq!(acks[0].offset, at as u64);
    }
}

/// Every lookup, dedup and record of a log of records `from..to`.
fn check(bus: &EmbeddedBus, from: usize, to: usize, what: &str) {
    for i in (from..to).rev() {
        let found = bus.find_event_by_uid(TOPIC, "k", &uid(i)).unwrap();
        assert_eq!(found.map(|a| a.offset), Some(i as u64), "{what}: find {i}");
    }
    for i in (0..from).step_by(3) {
        assert_eq!(
            bus.find_event_by_uid(TOPIC, "k", &uid(i)).unwrap(),
            None,
            "{what}: deleted {i} found"
        );
    }
    for absent in ["uid-99999", "uid-", "nope"] {
        assert_eq!(
            bus.find_event_by_uid(TOPIC, "k", absent).unwrap(),
            None,
            "{what}"
        );
    }
    for i in (from..to).step_by(7) {
        let ack = bus
            .publish_idempotent(TOPIC, "k", &value_for(&uid(i), i), &uid(i))
            .unwrap();
        assert_eq!(ack.offset, i as u64, "{what}: dedup of {i}");
    }
    let events = read_all(bus, 0).unwrap();
    assert_eq!(events.len(), to - events[0].offset as usize, "{what}");
    assert_eq!(events.last().unwrap().offset as usize, to - 1, "{what}");
    if from == 0 {
        assert_gap_free(&events);
    }
}

/// A closed bus of `n` records and its locator file.
fn closed(n: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let bus = EmbeddedBus::open_with(dir.path(), options()).unwrap();
    provision(&bus, 1);
    publish(&bus, 0, n);
    drop(bus);
    assert!(segments(dir.path(), 0).len() > 5);
    assert!(
        std::fs::read(locator(dir.path(), 0))
            .unwrap()
            .starts_with(b"BUL2")
    );
    dir
}

fn reopen(dir: &Path) -> EmbeddedBus {
    EmbeddedBus::open_with(dir, options()).unwrap()
}

#[test]
fn damaged_or_missing_locators_are_rebuilt() {
    type Damage = fn(&Path);
    let damages: [(&str, Damage); 6] = [
        ("intact", |_| {}),
        ("missing", |p| std::fs::remove_file(p).unwrap()),
        ("empty", |p| std::fs::write(p, b"").unwrap()),
        ("cut", |p| {
            let bytes = std::fs::read(p).unwrap();
            std::fs::write(p, &bytes[..bytes.len() - 1]).unwrap();
        }),
        ("flipped in the header", |p| {
            let mut bytes = std::fs::read(p).unwrap();
            bytes[20] ^= 1;
            std::fs::write(p, bytes).unwrap();
        }),
        ("flipped in the entries", |p| {
            let mut bytes = std::fs::read(p).unwrap();
            let at = bytes.len() - 10;
            bytes[at] ^= 0x40;
            std::fs::write(p, bytes).unwrap();
        }),
    ];
    for (name, damage) in damages {
        let dir = closed(150);
        damage(&locator(dir.path(), 0));
        let bus = reopen(dir.path());
        check(&bus, 0, 150, name);
        publish(&bus, 150, 200);
        check(&bus, 0, 200, name);
        drop(bus);
        let bytes = std::fs::read(locator(dir.path(), 0)).unwrap();
        assert!(bytes.starts_with(b"BUL2"), "{name}: not rewritten");
        check(&reopen(dir.path()), 0, 200, name);
    }
}

#[test]
fn a_locator_damaged_while_the_bus_is_open_is_not_answered_from() {
    // Loaded (and so checked) at the first lookup; damaged on disk after
    // that. Its buckets are read on each lookup and each must add up to
    // what memory holds, so no lookup trusts a damaged fingerprint: every
    // stored UID is still found and deduplicated, through the segments'
    // own filters.
    let dir = closed(150);
    let bus = reopen(dir.path());
    check(&bus, 0, 150, "before damage");
    let path = locator(dir.path(), 0);
    let mut bytes = std::fs::read(&path).unwrap();
    let entries = u64::from_le_bytes(bytes[32..40].try_into().unwrap()) as usize;
    assert!(
        entries >= 100,
        "{entries} entries (the sealed segments' UIDs)"
    );
    // The high byte of every entry's fingerprint (entries: 3 bytes each
    // from byte 48: fingerprint u16, slot u8).
    for entry in 0..entries {
        bytes[48 + entry * 3 + 1] ^= 0x40;
    }
    // In place, as a failing disk would: the bus reads this very file.
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, &bytes, 0).unwrap();
    drop(file);
    let log = crate::support::global_log();
    check(&bus, 0, 150, "damaged while open");
    let dir_name = dir.path().display().to_string();
    let text = log.text();
    assert!(
        text.lines().any(|line| line.contains(&dir_name)
            && line.contains("UID locator bucket does not match its check")),
        "no warning:\n{text}"
    );
    drop(bus);
    check(&reopen(dir.path()), 0, 150, "reopened");
}

#[test]
fn stale_locators_are_not_trusted() {
    // Another log's locator (same segment bases, other UIDs and lengths).
    let dir = closed(150);
    let other = tempfile::tempdir().unwrap();
    {
        let bus = EmbeddedBus::open_with(other.path(), options()).unwrap();
        provision(&bus, 1);
        for i in 0..150 {
            bus.publish_idempotent(TOPIC, "k", &value_for("o", i), &format!("other-{i}"))
                .unwrap();
        }
    }
    std::fs::copy(locator(other.path(), 0), locator(dir.path(), 0)).unwrap();
    check(&reopen(dir.path()), 0, 150, "another log's");

    // An older locator of this log: segments sealed since are missing
    // from it (as after a crash), a few or many.
    for more in [20, 400] {
        let dir = closed(100);
        let old = std::fs::read(locator(dir.path(), 0)).unwrap();
        let bus = reopen(dir.path());
        publish(&bus, 100, 100 + more);
        drop(bus);
        std::fs::write(locator(dir.path(), 0), &old).unwrap();
        check(
            &reopen(dir.path()),
            0,
            100 + more,
            &format!("{more} behind"),
        );
    }
}

#[test]
fn a_crash_leaves_the_last_close_locator_and_loses_nothing() {
    let dir = closed(100);
    let bus = reopen(dir.path());
    // Loaded, then more segments sealed, then killed before close.
    check(&bus, 0, 100, "before");
    publish(&bus, 100, 300);
    let crashed = tempfile::tempdir().unwrap();
    copy_tree(dir.path(), crashed.path());
    drop(bus);
    let bus = reopen(crashed.path());
    check(&bus, 0, 300, "after kill");
    publish(&bus, 300, 320);
    check(&bus, 0, 320, "after kill, more");
}

#[test]
fn deleted_segments_leave_the_locator() {
    let dir = tempfile::tempdir().unwrap();
    let bus = EmbeddedBus::open_with(dir.path(), options()).unwrap();
    bus.provision(&Manifest::new([
        TopicSpec::new(TOPIC, 1).with_retention_ms(1)
    ]))
    .unwrap();
    publish(&bus, 0, 100);
    check(&bus, 0, 100, "before");
    // Everything older than now: every sealed segment goes (the active
    // one is rolled first).
    let gone = bus.maintenance(u64::MAX / 2).unwrap();
    assert_eq!(gone, 100);
    publish(&bus, 100, 200);
    check(&bus, 100, 200, "after retention");
    drop(bus);
    check(&reopen(dir.path()), 100, 200, "reopened");
}

#[test]
fn more_segments_than_the_locator_covers() {
    // Tiny segments: over 256 sealed ones.
    let options = Options::default()
        .segment_bytes(200)
        .index_interval_bytes(100);
    let dir = tempfile::tempdir().unwrap();
    let bus = EmbeddedBus::open_with(dir.path(), options.clone()).unwrap();
    provision(&bus, 1);
    for i in 0..600 {
        let ack = bus
            .publish_idempotent(TOPIC, "k", &value_for(&uid(i), i), &uid(i))
            .unwrap();
        assert_eq!(ack.offset, i as u64);
    }
    assert!(segments(dir.path(), 0).len() > 300);
    check(&bus, 0, 600, "open");
    drop(bus);
    let bus = EmbeddedBus::open_with(dir.path(), options).unwrap();
    check(&bus, 0, 600, "reopened");
}
