//! Recovery from damaged files: torn tails at every byte, bit flips in
//! sealed segments, damaged or missing indexes, interrupted rolls.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::path::{Path, PathBuf};

use crate::support::{
    TOPIC, assert_gap_free, copy_tree, frame_starts, open, provision, read_all, recovery_point,
    segments, table_contents, value_for,
};
use bus_core::{BatchRecord, BusError, EventBus, StoredEvent};
use bus_embedded::{EmbeddedBus, Options};

fn uid(i: usize) -> String {
    format!("u{i}")
}

/// Publishes `n` records one by one (one frame each) with UIDs `u0..`.
fn publish(bus: &dyn EventBus, from: usize, n: usize) {
    for i in from..from + n {
        let ack = bus
            .publish_idempotent(TOPIC, "k", &value_for(&uid(i), i), &uid(i))
            .unwrap();
        assert_eq!(ack.offset, i as u64);
    }
}

/// A closed one-partition bus of `n` records published one by one (one
/// frame each): its directory, its only segment and the segment's bytes.
fn closed_log(n: usize) -> (tempfile::TempDir, PathBuf, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    {
        let bus = open(dir.path());
        provision(&bus, 1);
        publish(&bus, 0, n);
    }
    let log = segments(dir.path(), 0)[0].clone();
    let bytes = std::fs::read(&log).unwrap();
    (dir, log, bytes)
}

fn assert_records(events: &[StoredEvent], n: usize) {
    assert_eq!(events.len(), n);
    assert_gap_free(events);
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event.value, value_for(&uid(i), i), "offset {i}");
    }
}

#[test]
fn torn_tail_at_every_byte_of_the_last_frame() {
    let dir = tempfile::tempdir().unwrap();
    {
        let bus = open(dir.path());
        provision(&bus, 1);
        publish(&bus, 0, 10);
    }
    // A closed segment ends with its last frame (no zeros written ahead).
    let before = std::fs::metadata(&segments(dir.path(), 0)[0])
        .unwrap()
        .len();
    let point = std::fs::read(recovery_point(dir.path(), 0)).unwrap();
    {
        let bus = open(dir.path());
        let batch: Vec<BatchRecord> = (10..13)
            .map(|i| BatchRecord::new("k", value_for(&uid(i), i)).with_uid(uid(i)))
            .collect();
        bus.publish_batch(TOPIC, &batch).unwrap();
    }
    let log = segments(dir.path(), 0)[0].clone();
    let full = std::fs::read(&log).unwrap();
    assert!(full.len() as u64 > before + 8);
    // The session that wrote the batch was killed before it closed: the
    // batch's frame was never known complete, so any cut of it is a torn tail.
    let crash = |bytes: &[u8]| {
        std::fs::write(&log, bytes).unwrap();
        std::fs::write(recovery_point(dir.path(), 0), &point).unwrap();
    };
    for cut in before as usize..full.len() {
        crash(&full[..cut]);
        let bus = open(dir.path());
        assert_records(&read_all(&bus, 0).unwrap(), 10);
        assert_eq!(bus.find_event_by_uid(TOPIC, "k", &uid(11)).unwrap(), None);
        assert!(
            bus.find_event_by_uid(TOPIC, "k", &uid(9))
                .unwrap()
                .is_some()
        );
        let ack = bus.publish(TOPIC, "k", &value_for("after", 0)).unwrap();
        assert_eq!(ack.offset, 10, "cut at {cut}");
    }
    crash(&full);
    let bus = open(dir.path());
    assert_records(&read_all(&bus, 0).unwrap(), 13);
}

/// Under `Durability::Sync` small frames are written into zeros written
/// ahead, so after a crash the unsynced last frame may be on disk in any
/// order of its pages, with zeros after it: any such state is an
/// unacknowledged tail, while damage to an earlier frame is still refused.
#[test]
fn torn_writes_into_zeros_written_ahead() {
    // Ten records closed cleanly, then a session killed while writing the
    // eleventh: the recovery point is still the one of the clean close.
    let (dir, _, _) = closed_log(10);
    let point = std::fs::read(recovery_point(dir.path(), 0)).unwrap();
    publish(&open(dir.path()), 10, 1);
    let log = segments(dir.path(), 0)[0].clone();
    let full = std::fs::read(&log).unwrap();
    let last = *frame_starts(&full).last().unwrap();
    let zeros = vec![0u8; 64 << 10];
    let with_tail = |bytes: &[u8]| [bytes, &zeros].concat();
    let crash = |bytes: Vec<u8>| {
        std::fs::write(&log, bytes).unwrap();
        std::fs::write(recovery_point(dir.path(), 0), &point).unwrap();
    };
    let check = |bytes: Vec<u8>, what: &str| {
        crash(bytes);
        let bus = open(dir.path());
        let events = read_all(&bus, 0).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_records(&events, 10);
        assert_eq!(bus.find_event_by_uid(TOPIC, "k", &uid(10)).unwrap(), None);
        let ack = bus.publish(TOPIC, "k", &value_for("after", 0)).unwrap();
        assert_eq!(ack.offset, 10, "{what}");
        drop(bus);
        // The next open finds what that publish wrote, and no zeros.
        assert_ne!(std::fs::read(&log).unwrap().last(), Some(&0), "{what}");
    };
    for cut in last..full.len() {
        // The frame's first bytes reached the disk, the rest did not.
        let mut bytes = full[..cut].to_vec();
        bytes.resize(full.len(), 0);
        check(with_tail(&bytes), &format!("written up to byte {cut}"));
        // Its later bytes reached the disk, the first ones did not.
        let mut bytes = full.clone();
        bytes[last..=cut].fill(0);
        check(with_tail(&bytes), &format!("zeros up to byte {cut}"));
    }
    // A damaged earlier frame is refused even with zeros after the last.
    let mut bytes = full.clone();
    let second = frame_starts(&full)[1];
    bytes[second + 12] ^= 0x40;
    crash(with_tail(&bytes));
    match EmbeddedBus::open(dir.path()) {
        Err(BusError::Corrupt { offset, .. }) => assert_eq!(offset, 1),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

/// Sealed and cleanly closed segments end with their last frame; zeros are
/// written ahead only under `Durability::Sync`, and only while open.
#[test]
fn zeros_ahead_only_while_open_and_only_under_sync() {
    let dir = tempfile::tempdir().unwrap();
    let bus = EmbeddedBus::open_with(dir.path(), sealed_options()).unwrap();
    provision(&bus, 1);
    publish(&bus, 0, 40);
    let logs = segments(dir.path(), 0);
    assert!(logs.len() >= 4, "{logs:?}");
    let ends_in_zero = |log: &PathBuf| std::fs::read(log).unwrap().last() == Some(&0);
    for log in &logs[..logs.len() - 1] {
        assert!(!ends_in_zero(log), "sealed {log:?} ends in zeros");
    }
    assert!(
        ends_in_zero(logs.last().unwrap()),
        "no zeros ahead while open"
    );
    drop(bus);
    for log in &segments(dir.path(), 0) {
        assert!(!ends_in_zero(log), "closed {log:?} ends in zeros");
    }
    assert_records(&read_all(&open(dir.path()), 0).unwrap(), 40);

    let dir = tempfile::tempdir().unwrap();
    let interval = Options::default().durability(bus_embedded::Durability::Interval(5));
    let bus = EmbeddedBus::open_with(dir.path(), interval).unwrap();
    provision(&bus, 1);
    publish(&bus, 0, 10);
    let log = segments(dir.path(), 0)[0].clone();
    assert!(!ends_in_zero(&log), "zeros ahead under Interval");
}

fn sealed_options() -> Options {
    Options::default()
        .segment_bytes(700)
        .index_interval_bytes(150)
}

/// A dir with several sealed segments of 40 single-record frames.
fn sealed_dir() -> (tempfile::TempDir, Vec<PathBuf>) {
    let dir = tempfile::tempdir().unwrap();
    {
        let bus = EmbeddedBus::open_with(dir.path(), sealed_options()).unwrap();
        provision(&bus, 1);
        publish(&bus, 0, 40);
    }
    let logs = segments(dir.path(), 0);
    assert!(logs.len() >= 4, "{logs:?}");
    (dir, logs)
}

/// Reading everything must report the damage; what it returns before must be right.
fn assert_damage_reported(dir: &Path, what: &str) {
    let bus = match EmbeddedBus::open(dir) {
        Err(BusError::Corrupt { .. }) => return,
        Err(other) => panic!("{what}: expected Corrupt, got {other:?}"),
        Ok(bus) => bus,
    };
    let mut offset = 0;
    loop {
        match bus.fetch(TOPIC, 0, offset, 7) {
            Ok(page) if page.is_empty() => panic!("{what}: damage was not reported"),
            Ok(page) => {
                for event in &page {
                    assert_eq!(event.offset, offset, "{what}: hole");
                    let i = offset as usize;
                    assert_eq!(event.value, value_for(&uid(i), i), "{what}: wrong data");
                    offset += 1;
                }
            }
            Err(BusError::Corrupt { .. } | BusError::Integrity { .. }) => return,
            Err(other) => panic!("{what}: unexpected {other:?}"),
        }
    }
}

#[test]
fn bit_flips_in_sealed_segments_are_reported() {
    for (name, pick) in [
        ("length low bit", 0usize),
        ("length high byte", 3),
        ("checksum", 5),
        ("header", 12),
        ("payload", 40),
    ] {
        for frame in [0usize, 1, 2] {
            let (dir, logs) = sealed_dir();
            let log = &logs[1];
            let mut bytes = std::fs::read(log).unwrap();
            let starts = frame_starts(&bytes);
            let at = starts[frame.min(starts.len() - 1)] + pick;
            bytes[at] ^= if pick == 3 { 0x80 } else { 0x01 };
            std::fs::write(log, &bytes).unwrap();
            assert_damage_reported(dir.path(), &format!("{name} of frame {frame}"));
        }
    }
}

#[test]
fn damage_inside_the_active_segment_fails_open() {
    let (dir, log, mut bytes) = closed_log(5);
    let second = frame_starts(&bytes)[1];
    bytes[second + 30] ^= 0x10;
    std::fs::write(&log, &bytes).unwrap();
    match EmbeddedBus::open(dir.path()) {
        Err(BusError::Corrupt {
            location, offset, ..
        }) => {
            assert!(location.ends_with(".log"), "{location}");
            assert_eq!(offset, 1);
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

fn hint(log: &Path, ext: &str) -> PathBuf {
    log.with_extension(ext)
}

fn assert_every_fetch(dir: &Path, n: usize) {
    let bus = EmbeddedBus::open_with(dir, sealed_options()).unwrap();
    assert_records(&read_all(&bus, 0).unwrap(), n);
    for i in (0..n).rev() {
        let got = bus.fetch(TOPIC, 0, i as u64, 1).unwrap();
        assert_eq!(got[0].value, value_for(&uid(i), i));
        let found = bus.find_event_by_uid(TOPIC, "k", &uid(i)).unwrap().unwrap();
        assert_eq!(found.offset, i as u64);
    }
    let ack = bus.publish(TOPIC, "k", &value_for("next", 0)).unwrap();
    assert_eq!(ack.offset, n as u64);
}

#[test]
fn damaged_indexes_are_rebuilt() {
    type Damage = fn(&Path);
    let damages: [(&str, Damage); 5] = [
        ("missing", |p| std::fs::remove_file(p).unwrap()),
        ("truncated", |p| {
            let len = std::fs::metadata(p).unwrap().len();
            std::fs::OpenOptions::new()
                .write(true)
                .open(p)
                .unwrap()
                .set_len(len / 2)
                .unwrap();
        }),
        ("zero-filled", |p| {
            let len = std::fs::metadata(p).unwrap().len() as usize;
            std::fs::write(p, vec![0; len]).unwrap();
        }),
        ("empty", |p| std::fs::write(p, b"").unwrap()),
        ("garbage", |p| {
            std::fs::write(p, b"not an index at all").unwrap()
        }),
    ];
    for ext in ["idx", "uids"] {
        for (name, damage) in damages {
            let (dir, logs) = sealed_dir();
            let originals: Vec<Vec<u8>> = logs[..logs.len() - 1]
                .iter()
                .map(|log| std::fs::read(hint(log, ext)).unwrap())
                .collect();
            for log in &logs[..logs.len() - 1] {
                damage(&hint(log, ext));
            }
            assert_every_fetch(dir.path(), 40);
            for (log, original) in logs.iter().zip(&originals) {
                let rebuilt = std::fs::read(hint(log, ext)).unwrap();
                if ext == "uids" {
                    // Rebuilt under a new key: the same segment and entries.
                    assert_eq!(
                        table_contents(&rebuilt),
                        table_contents(original),
                        "{ext} {name}: rebuilt differently"
                    );
                } else {
                    assert_eq!(&rebuilt, original, "{ext} {name}: rebuilt differently");
                }
            }
        }
    }
}

#[test]
fn swapped_index_files_are_not_trusted() {
    let (dir, logs) = sealed_dir();
    let a = std::fs::read(hint(&logs[0], "idx")).unwrap();
    let b = std::fs::read(hint(&logs[1], "idx")).unwrap();
    std::fs::write(hint(&logs[0], "idx"), b).unwrap();
    std::fs::write(hint(&logs[1], "idx"), a).unwrap();
    assert_every_fetch(dir.path(), 40);
}

#[test]
fn crash_between_roll_and_metadata() {
    // The next segment was created, the sealed one's hints never written.
    let (dir, logs) = sealed_dir();
    for log in &logs[..logs.len() - 1] {
        std::fs::remove_file(hint(log, "idx")).unwrap();
        std::fs::remove_file(hint(log, "uids")).unwrap();
    }
    let next = logs
        .last()
        .unwrap()
        .with_file_name(format!("{:020}.log", 40));
    if std::fs::metadata(logs.last().unwrap()).unwrap().len() > 0 {
        std::fs::write(&next, b"").unwrap();
    }
    assert_every_fetch(dir.path(), 40);

    // The hints of the active segment were written, its successor never created.
    let (dir, logs) = sealed_dir();
    let active = logs.last().unwrap();
    std::fs::copy(hint(&logs[0], "idx"), hint(active, "idx")).unwrap();
    std::fs::copy(hint(&logs[0], "uids"), hint(active, "uids")).unwrap();
    assert_every_fetch(dir.path(), 40);
    assert!(!hint(active, "idx").exists());
}

#[test]
fn a_gap_between_segments_is_corruption() {
    let (dir, logs) = sealed_dir();
    std::fs::remove_file(&logs[1]).unwrap();
    assert!(matches!(
        EmbeddedBus::open(dir.path()),
        Err(BusError::Corrupt { .. })
    ));
}

#[test]
fn a_cut_of_a_cleanly_closed_segment_is_corruption() {
    let (dir, log, bytes) = closed_log(5);
    for cut in [1, 40, bytes.len() - frame_starts(&bytes)[4]] {
        std::fs::write(&log, &bytes[..bytes.len() - cut]).unwrap();
        match EmbeddedBus::open(dir.path()) {
            Err(BusError::Corrupt {
                location, offset, ..
            }) => {
                assert_eq!(Path::new(&location), log, "cut {cut}");
                assert_eq!(offset, 4, "names the first record cut, cut {cut}");
            }
            other => panic!("cut {cut}: expected Corrupt, got {other:?}"),
        }
    }
}

#[test]
fn a_damaged_or_dangling_recovery_point_is_corruption() {
    // A crash cannot tear a file replaced atomically.
    let (dir, _, _) = closed_log(3);
    let point = recovery_point(dir.path(), 0);
    let mut bytes = std::fs::read(&point).unwrap();
    bytes[6] ^= 1;
    std::fs::write(&point, &bytes).unwrap();
    match EmbeddedBus::open(dir.path()) {
        Err(BusError::Corrupt { location, .. }) => assert_eq!(Path::new(&location), point),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // The active segment it names is gone; the sealed ones before it are whole.
    let (dir, logs) = sealed_dir();
    let active = logs.last().unwrap();
    std::fs::remove_file(active).unwrap();
    match EmbeddedBus::open(dir.path()) {
        Err(BusError::Corrupt { location, .. }) => assert_eq!(Path::new(&location), active),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

/// Each time the writer extends the zeros written ahead it advances the
/// recovery point (after that round's fsync), so a crashed writer's log
/// cut below it is reported even without a clean close or `maintenance`.
#[test]
fn zeros_written_ahead_advance_the_recovery_point() {
    let live = tempfile::tempdir().unwrap();
    let bus = open(live.path());
    provision(&bus, 1);
    let log = segments(live.path(), 0)[0].clone();
    let mut n = 0;
    // The first frame gets 16 KiB of zeros; the next extension comes past them.
    while std::fs::metadata(&log).unwrap().len() < 40 << 10 {
        publish(&bus, n, 1);
        n += 1;
    }
    let crashed = tempfile::tempdir().unwrap();
    copy_tree(live.path(), crashed.path());
    drop(bus);
    let log = segments(crashed.path(), 0)[0].clone();
    let bytes = std::fs::read(&log).unwrap();
    assert_eq!(bytes.last(), Some(&0), "zeros written ahead");
    let starts = frame_starts(&bytes[..16 << 10]);
    let cut = starts[starts.len() / 2] + 3;
    std::fs::write(&log, &bytes[..cut]).unwrap();
    match EmbeddedBus::open(crashed.path()) {
        Err(BusError::Corrupt {
            location, offset, ..
        }) => {
            assert_eq!(Path::new(&location), log);
            assert_eq!(offset, (starts.len() / 2) as u64);
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}
