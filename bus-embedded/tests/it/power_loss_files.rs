//! What a power cut leaves on disk, written by hand (no FUSE; #29): an
//! `Interval` log with a hole of zeros followed by whole frames, and a torn
//! or garbage `acked` marker in front of a read-only open.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::path::Path;

use crate::support::{
    TOPIC, assert_gap_free, copy_tree, frame_starts, provision, read_all, segments, value_for,
};
use bus_core::{BusError, EventBus};
use bus_embedded::{Durability, EmbeddedBus, Options};

fn publish(bus: &dyn EventBus, from: usize, n: usize) {
    for i in from..from + n {
        let uid = format!("u{i}");
        let ack = bus
            .publish_idempotent(TOPIC, "k", &value_for(&uid, i), &uid)
            .unwrap();
        assert_eq!(ack.offset, i as u64);
    }
}

fn assert_first(bus: &dyn EventBus, n: usize, what: &str) {
    let events = read_all(bus, 0).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(events.len(), n, "{what}");
    assert_gap_free(&events);
    for (i, event) in events.iter().enumerate() {
        assert_eq!(
            event.value,
            value_for(&format!("u{i}"), i),
            "{what}: offset {i}"
        );
    }
}

fn interval() -> Options {
    // A flusher that never runs on its own in the test's time: only
    // `maintenance` fsyncs (and stores the recovery point).
    Options::default().durability(Durability::Interval(3_600_000))
}

/// An `Interval` log as a torn power cut leaves it: 5 records fsynced (the
/// recovery point stored after that fsync), 10 more acked but never
/// fsynced, of which the pages of records 5 to 7 did not reach the disk
/// while later ones did. Returns the directory (a copy of the open bus's:
/// what `kill -9` leaves) and the frames' starts in the segment.
fn torn_interval_log(root: &Path) -> (std::path::PathBuf, Vec<usize>) {
    let live = root.join("live");
    let bus = EmbeddedBus::open_with(&live, interval()).unwrap();
    provision(&bus, 1);
    publish(&bus, 0, 5);
    bus.maintenance(bus_core::now_ms()).unwrap();
    publish(&bus, 5, 10);
    let crashed = root.join("crashed");
    copy_tree(&live, &crashed);
    drop(bus);
    let log = segments(&crashed, 0)[0].clone();
    let mut bytes = std::fs::read(&log).unwrap();
    let starts = frame_starts(&bytes);
    assert_eq!(starts.len(), 15, "one frame per record");
    // The hole: zeros where frames 5, 6 and 7 were, then whole frames.
    bytes[starts[5]..starts[8]].fill(0);
    std::fs::write(&log, &bytes).unwrap();
    (crashed, starts)
}

/// The hole past the recovery point is the documented loss of the last
/// interval: the log is cut there (records 0 to 4 kept) and publishing
/// goes on at offset 5. Without the `unordered-tail` marker (a `Sync`
/// writer's log), the same bytes are damage: `Corrupt`, as before.
#[test]
fn an_interval_log_with_a_hole_past_its_recovery_point_is_cut_at_the_hole() {
    let root = tempfile::tempdir().unwrap();
    let (crashed, _) = torn_interval_log(root.path());
    let pdir = bus_embedded::testing::partition_dir(&crashed, TOPIC, 0);
    assert!(
        pdir.join("unordered-tail").exists(),
        "the Interval writer's marker"
    );

    // The rule off: the strict reading refuses the log.
    let strict = root.path().join("strict");
    copy_tree(&crashed, &strict);
    std::fs::remove_file(
        bus_embedded::testing::partition_dir(&strict, TOPIC, 0).join("unordered-tail"),
    )
    .unwrap();
    match EmbeddedBus::open_with(&strict, interval()) {
        Err(BusError::Corrupt { offset, .. }) => assert_eq!(offset, 5),
        other => panic!("without the marker the hole must be Corrupt: {other:?}"),
    }

    // A reader before any writer shows what recovery will keep.
    let reader = EmbeddedBus::open_read_only(&crashed).unwrap();
    assert_first(&reader, 5, "read-only before recovery");
    drop(reader);
    let bus = EmbeddedBus::open_with(&crashed, interval()).unwrap();
    assert_first(&bus, 5, "after recovery");
    assert_eq!(bus.find_event_by_uid(TOPIC, "k", "u9").unwrap(), None);
    publish(&bus, 5, 3);
    drop(bus);
    // A Sync writer reopens it, recovers, and takes the marker away.
    let bus = EmbeddedBus::open(&crashed).unwrap();
    assert_first(&bus, 8, "reopened under Sync");
    assert!(
        !pdir.join("unordered-tail").exists(),
        "a Sync writer's log is strict again"
    );
}

/// Below the recovery point the frames were fsynced: a bad one there is
/// damage even in an `Interval` log, `Corrupt` naming the segment and the
/// offset.
#[test]
fn damage_below_an_interval_logs_recovery_point_is_still_corrupt() {
    let root = tempfile::tempdir().unwrap();
    let (crashed, starts) = torn_interval_log(root.path());
    let log = segments(&crashed, 0)[0].clone();
    let mut bytes = std::fs::read(&log).unwrap();
    bytes[starts[2] + 12] ^= 0x40;
    std::fs::write(&log, &bytes).unwrap();
    match EmbeddedBus::open_with(&crashed, interval()) {
        Err(BusError::Corrupt {
            location, offset, ..
        }) => {
            assert_eq!(offset, 2);
            assert!(location.ends_with(".log"), "{location}");
        }
        other => panic!("damage below the recovery point must be Corrupt: {other:?}"),
    }
}

/// The `acked` marker is never fsynced: after a power cut it can be empty,
/// partly written, zeros, garbage or stale. A read-only open made before
/// any writer reopens must show every fsynced record whatever it holds.
#[test]
fn a_torn_or_garbage_acked_marker_hides_nothing_from_a_reader_without_writer() {
    let dir = tempfile::tempdir().unwrap();
    let marker = bus_embedded::testing::partition_dir(dir.path(), TOPIC, 0).join("acked");
    let stale = {
        let bus = EmbeddedBus::open(dir.path()).unwrap();
        provision(&bus, 1);
        publish(&bus, 0, 3);
        let stale = std::fs::read(&marker).unwrap();
        publish(&bus, 3, 17);
        stale
    };
    let mut garbage = [0u8; 24];
    for (i, b) in garbage.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(151).wrapping_add(7);
    }
    let cases: [(&str, Vec<u8>); 6] = [
        ("empty", Vec::new()),
        ("zeros", vec![0; 24]),
        ("partly written", stale[..10].to_vec()),
        ("garbage", garbage.to_vec()),
        (
            "torn: half of an older marker",
            [&stale[..12], &[0xAB; 12][..]].concat(),
        ),
        ("stale but valid", stale.clone()),
    ];
    for (what, bytes) in cases {
        std::fs::write(&marker, &bytes).unwrap();
        let reader = EmbeddedBus::open_read_only(dir.path()).unwrap();
        assert_first(&reader, 20, what);
    }
}
