//! C24 round trip and idempotence on every location (memory, local files,
//! the S3 server when BUS_S3_ENDPOINT is set).
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

mod common;

use bus_cold::{ColdTier, DEFAULT_OBJECT_RECORDS};
use bus_core::BusError;
use common::{auth, locations, records, unique};

#[test]
fn archived_records_read_back_exactly_from_any_offset() {
    for (name, location, _dir) in locations("roundtrip") {
        let tier = ColdTier::open(&location).unwrap();
        let topic = unique("rt");
        let all = records(&topic, 2, 0, 1000);
        // Three objects of uneven sizes.
        assert_eq!(
            tier.archive_records(&topic, 2, &all[..300]).unwrap(),
            300,
            "{name}"
        );
        assert_eq!(
            tier.archive_records(&topic, 2, &all[300..301]).unwrap(),
            1,
            "{name}"
        );
        assert_eq!(
            tier.archive_records(&topic, 2, &all[301..]).unwrap(),
            699,
            "{name}"
        );
        let manifest = tier.manifest(&topic, 2).unwrap();
        assert_eq!(
            (manifest.start(), manifest.end(), manifest.ranges.len()),
            (Some(0), 1000, 3)
        );
        // Exact records, across object boundaries, from any offset.
        assert_eq!(tier.read(&topic, 2, 0, 5000).unwrap(), all, "{name}");
        for (from, max) in [
            (0, 1),
            (127, 2),
            (128, 300),
            (299, 3),
            (300, 1),
            (999, 10),
            (500, 0),
        ] {
            let got = tier.read(&topic, 2, from, max).unwrap();
            let want: Vec<_> = all.iter().skip(from as usize).take(max).cloned().collect();
            assert_eq!(got, want, "{name}: read({from}, {max})");
        }
        assert!(
            tier.read(&topic, 2, 1000, 10).unwrap().is_empty(),
            "{name}: at the end"
        );
        // As events, tags verified: same values and stored_at.
        let events = tier.fetch(&topic, 2, 0, 2000, Some(&auth())).unwrap();
        assert_eq!(events.len(), 1000);
        for (event, record) in events.iter().zip(&all) {
            assert_eq!(event.offset, record.offset);
            assert_eq!(event.stored_at, record.stored_at);
            assert_eq!(
                serde_json::to_vec(&event.value).unwrap(),
                serde_json::to_vec(
                    &serde_json::from_slice::<serde_json::Value>(&record.value).unwrap()
                )
                .unwrap()
            );
            assert_eq!(event.key, record.key);
        }
        // Another partition of the topic holds nothing.
        assert!(tier.read(&topic, 3, 0, 10).unwrap().is_empty(), "{name}");
    }
}

#[test]
fn archiving_twice_writes_nothing_twice() {
    for (name, location, _dir) in locations("idempotent") {
        let tier = ColdTier::open(&location).unwrap();
        let topic = unique("idem");
        let all = records(&topic, 0, 10, 260);
        assert_eq!(
            tier.archive_records(&topic, 0, &all[..100]).unwrap(),
            100,
            "{name}"
        );
        let first = tier.manifest(&topic, 0).unwrap();
        assert_eq!(
            tier.archive_records(&topic, 0, &all[..100]).unwrap(),
            0,
            "{name}: again"
        );
        assert_eq!(
            tier.archive_records(&topic, 0, &all[20..60]).unwrap(),
            0,
            "{name}: inside"
        );
        assert_eq!(
            tier.manifest(&topic, 0).unwrap(),
            first,
            "{name}: no new manifest"
        );
        // Overlapping: only the new tail is written.
        assert_eq!(
            tier.archive_records(&topic, 0, &all[50..]).unwrap(),
            150,
            "{name}"
        );
        let manifest = tier.manifest(&topic, 0).unwrap();
        assert_eq!(manifest.generation, 2);
        assert_eq!(
            manifest
                .ranges
                .iter()
                .map(|r| (r.from, r.end))
                .collect::<Vec<_>>(),
            [(10, 110), (110, 260)],
            "{name}"
        );
        // The archiver loop over a source: already archived, nothing read.
        let archived = tier
            .archive_with(&topic, 0, 260, DEFAULT_OBJECT_RECORDS, |_, _| {
                panic!("nothing to read")
            })
            .unwrap();
        assert_eq!(archived, 0);
        // Below the first archived offset reads from it (like a fetch below the log start).
        assert_eq!(tier.read(&topic, 0, 0, 1000).unwrap(), all, "{name}");
    }
}

#[test]
fn archive_with_reads_the_source_in_objects_and_refuses_gaps() {
    for (name, location, _dir) in locations("archive-with") {
        let tier = ColdTier::open(&location).unwrap();
        let topic = unique("aw");
        let all = records(&topic, 1, 5, 1005);
        let mut reads = Vec::new();
        let archived = tier
            .archive_with(&topic, 1, 905, 200, |from, max| {
                reads.push((from, max));
                Ok(all
                    .iter()
                    .filter(|r| r.offset >= from)
                    .take(max)
                    .cloned()
                    .collect())
            })
            .unwrap();
        assert_eq!(archived, 900, "{name}");
        // The first read asks from 0 and the first archive starts where the
        // source does (5); then one read per object.
        assert_eq!(
            reads,
            [(0, 200), (205, 200), (405, 200), (605, 200), (805, 100)],
            "{name}"
        );
        assert_eq!(tier.manifest(&topic, 1).unwrap().end(), 905);
        // A source whose records do not start where the tier ends: a gap, refused.
        let gap = records(&topic, 1, 950, 960);
        let error = tier.archive_records(&topic, 1, &gap).unwrap_err();
        assert!(
            matches!(error, BusError::InvalidArgument { .. }),
            "{name}: {error}"
        );
        assert!(error.to_string().contains("905"), "{error}");
        assert_eq!(
            tier.manifest(&topic, 1).unwrap().end(),
            905,
            "{name}: nothing archived"
        );
    }
}

/// A tier that compresses (format version 3): the same records back from
/// any offset, tags verified, across compressed and uncompressed objects of
/// one partition, and fewer bytes stored than without compression.
#[test]
fn compressed_objects_read_back_exactly_and_smaller() {
    for (name, location, _dir) in locations("compressed") {
        // Each open of `memory:` is a store of its own: nothing to share.
        if name == "memory" {
            continue;
        }
        let topic = unique("zip");
        let all = records(&topic, 0, 0, 600);
        let plain = ColdTier::open(&location).unwrap();
        assert_eq!(plain.archive_records(&topic, 0, &all[..200]).unwrap(), 200);
        let mut sizes = vec![plain.manifest(&topic, 0).unwrap().ranges[0].bytes];
        for (compression, upto) in [
            (bus_core::Compression::Lz4, 400),
            (bus_core::Compression::Zstd, 600),
        ] {
            let tier = ColdTier::open(&location)
                .unwrap()
                .with_compression(compression);
            let from = upto - 200;
            assert_eq!(
                tier.archive_records(&topic, 0, &all[from..upto]).unwrap(),
                200,
                "{name} {compression}"
            );
            sizes.push(
                tier.manifest(&topic, 0)
                    .unwrap()
                    .ranges
                    .last()
                    .unwrap()
                    .bytes,
            );
        }
        // Any reader reads every object, whatever its codec.
        let reader = ColdTier::open(&location).unwrap();
        assert_eq!(reader.read(&topic, 0, 0, 1000).unwrap(), all, "{name}");
        assert_eq!(
            reader.read(&topic, 0, 399, 2).unwrap(),
            all[399..401],
            "{name}"
        );
        for record in &all {
            let event = bus_cold::to_event(&topic, 0, record.clone(), Some(&auth())).unwrap();
            assert_eq!(event.offset, record.offset);
        }
        eprintln!("{name}: 200 records in {sizes:?} bytes (none, lz4, zstd)");
        assert!(
            sizes[1] < sizes[0] && sizes[2] < sizes[0],
            "{name}: {sizes:?}"
        );
    }
}
