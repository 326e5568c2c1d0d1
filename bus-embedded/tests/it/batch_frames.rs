//! A large batch is written as several bounded frames in one write and
//! fsync: a crash inside it leaves none of it, damage to any of its frames
//! once acked is reported, and one record reads back without its batch.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::path::{Path, PathBuf};

use crate::support::{
    TOPIC, assert_gap_free, frame_starts, open, provision, read_all, recovery_point, segments,
    value_for,
};
use bus_core::{BatchRecord, BusError, EventBus};
use bus_embedded::EmbeddedBus;

/// Records in the batch: several frames (of at most 16 records).
const BATCH: usize = 200;
/// Records published one by one before it.
const BEFORE: usize = 10;

fn uid(i: usize) -> String {
    format!("u{i}")
}

struct Written {
    dir: tempfile::TempDir,
    log: PathBuf,
    /// Segment bytes before the batch.
    before: usize,
    /// The segment after the batch, closed cleanly.
    full: Vec<u8>,
    /// The recovery point from before the batch (restoring it stands for
    /// a crash of the session that wrote the batch).
    stale_point: Vec<u8>,
}

fn write_batch() -> Written {
    let dir = tempfile::tempdir().unwrap();
    {
        let bus = open(dir.path());
        provision(&bus, 1);
        for i in 0..BEFORE {
            bus.publish_idempotent(TOPIC, "k", &value_for(&uid(i), i), &uid(i))
                .unwrap();
        }
    }
    let log = segments(dir.path(), 0)[0].clone();
    let before = std::fs::read(&log).unwrap().len();
    let stale_point = std::fs::read(recovery_point(dir.path(), 0)).unwrap();
    {
        let bus = open(dir.path());
        let batch: Vec<BatchRecord> = (BEFORE..BEFORE + BATCH)
            .map(|i| BatchRecord::new("k", value_for(&uid(i), i)).with_uid(uid(i)))
            .collect();
        let acks = bus.publish_batch(TOPIC, &batch).unwrap();
        assert_eq!(acks.len(), BATCH);
    }
    let full = std::fs::read(&log).unwrap();
    Written {
        dir,
        log,
        before,
        full,
        stale_point,
    }
}

fn assert_first(bus: &EmbeddedBus, n: usize, what: &str) {
    let events = read_all(bus, 0).unwrap();
    assert_eq!(events.len(), n, "{what}");
    assert_gap_free(&events);
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event.value, value_for(&uid(i), i), "{what}: offset {i}");
    }
}

/// Frame starts of the batch, within the segment.
fn batch_frames(w: &Written) -> Vec<usize> {
    let starts: Vec<usize> = frame_starts(&w.full)
        .into_iter()
        .filter(|&s| s >= w.before)
        .collect();
    assert!(starts.len() >= 3, "the batch is several frames: {starts:?}");
    starts
}

#[test]
fn a_cut_inside_a_multi_frame_batch_leaves_none_of_it() {
    let w = write_batch();
    let frames = batch_frames(&w);
    // Every frame boundary inside the batch (where each frame before it
    // verifies), bytes around them, and points inside frames.
    let mut cuts: Vec<usize> = Vec::new();
    for &start in &frames {
        cuts.extend([start, start + 1, start + 8, start + 30]);
    }
    cuts.extend((w.before..w.full.len()).step_by(997));
    cuts.push(w.full.len() - 1);
    cuts.retain(|&c| c >= w.before && c < w.full.len());
    for cut in cuts {
        std::fs::write(&w.log, &w.full[..cut]).unwrap();
        std::fs::write(recovery_point(w.dir.path(), 0), &w.stale_point).unwrap();
        let bus = open(w.dir.path());
        assert_first(&bus, BEFORE, &format!("cut at byte {cut}"));
        for i in [BEFORE, BEFORE + 100, BEFORE + BATCH - 1] {
            assert_eq!(
                bus.find_event_by_uid(TOPIC, "k", &uid(i)).unwrap(),
                None,
                "cut at {cut}: uid {i} of the torn batch"
            );
        }
        let ack = bus.publish(TOPIC, "k", &value_for("after", 0)).unwrap();
        assert_eq!(ack.offset, BEFORE as u64, "cut at {cut}");
    }
    std::fs::write(&w.log, &w.full).unwrap();
    std::fs::write(recovery_point(w.dir.path(), 0), &w.stale_point).unwrap();
    assert_first(&open(w.dir.path()), BEFORE + BATCH, "whole batch");
}

/// The batch's pages reached the disk in any order before a crash: a
/// missing (zeroed) page in an early frame with the later frames intact
/// is still an unacknowledged torn batch, not damage.
#[test]
fn a_batch_torn_out_of_order_is_dropped_whole() {
    let w = write_batch();
    let frames = batch_frames(&w);
    for hole in [frames[0] + 100, frames[1] + 40] {
        let mut bytes = w.full.clone();
        for b in &mut bytes[hole..hole + 64] {
            *b = 0;
        }
        std::fs::write(&w.log, &bytes).unwrap();
        std::fs::write(recovery_point(w.dir.path(), 0), &w.stale_point).unwrap();
        let bus = open(w.dir.path());
        assert_first(&bus, BEFORE, &format!("zeros at {hole}"));
    }
}

fn assert_corrupt(dir: &Path, what: &str) {
    match EmbeddedBus::open(dir) {
        Err(BusError::Corrupt { offset, .. }) => {
            assert!(offset >= BEFORE as u64, "{what}: offset {offset}");
        }
        Err(other) => panic!("{what}: expected Corrupt, got {other:?}"),
        Ok(bus) => match read_all(&bus, 0) {
            Err(BusError::Corrupt { .. }) => {}
            other => panic!("{what}: damage not reported: {:?}", other.map(|e| e.len())),
        },
    }
}

#[test]
fn a_flipped_byte_in_a_non_last_frame_of_an_acked_batch_is_corrupt() {
    let w = write_batch();
    let frames = batch_frames(&w);
    for &frame in &frames[..frames.len() - 1] {
        // Length, checksum, the frame flags, a record byte.
        for pick in [0usize, 5, 10, 60] {
            let mut bytes = w.full.clone();
            bytes[frame + pick] ^= 0x01;
            std::fs::write(&w.log, &bytes).unwrap();
            // The batch was acked and the bus closed: the recovery point
            // covers it.
            assert_corrupt(w.dir.path(), &format!("byte {} of frame at {frame}", pick));
        }
    }
    // And after a later batch was written past the recovery point: the
    // later frames prove the damaged batch was complete and acked.
    std::fs::write(&w.log, &w.full).unwrap();
    {
        let bus = open(w.dir.path());
        bus.publish(TOPIC, "k", &value_for("later", 0)).unwrap();
    }
    let mut bytes = std::fs::read(&w.log).unwrap();
    bytes[frames[1] + 60] ^= 0x01;
    std::fs::write(&w.log, &bytes).unwrap();
    std::fs::write(recovery_point(w.dir.path(), 0), &w.stale_point).unwrap();
    assert_corrupt(w.dir.path(), "damaged batch followed by another");
}

#[test]
fn one_record_of_a_batch_reads_back_alone() {
    let w = write_batch();
    let bus = open(w.dir.path());
    for i in [
        BEFORE,
        BEFORE + 63,
        BEFORE + 64,
        BEFORE + 150,
        BEFORE + BATCH - 1,
    ] {
        let page = bus.fetch(TOPIC, 0, i as u64, 1).unwrap();
        assert_eq!(page.len(), 1);
        assert_eq!(page[0].offset, i as u64);
        assert_eq!(page[0].value, value_for(&uid(i), i));
        let found = bus.find_event_by_uid(TOPIC, "k", &uid(i)).unwrap().unwrap();
        assert_eq!(found.offset, i as u64);
    }
}

/// A read-only reader (another process's view) sees a multi-frame batch
/// whole once it is acked, and never a part of it: its frames cut at every
/// boundary and given to a reader show only the records before the batch.
#[test]
fn a_read_only_reader_sees_a_batch_whole_or_not_at_all() {
    let w = write_batch();
    let frames = batch_frames(&w);
    let reader = EmbeddedBus::open_read_only(w.dir.path()).unwrap();
    assert_first(&reader, BEFORE + BATCH, "acked batch");
    drop(reader);
    let writer = open(w.dir.path());
    let reader = EmbeddedBus::open_read_only(w.dir.path()).unwrap();
    assert_first(&reader, BEFORE + BATCH, "beside its writer");
    let batch: Vec<BatchRecord> = (BEFORE + BATCH..BEFORE + 2 * BATCH)
        .map(|i| BatchRecord::new("k", value_for(&uid(i), i)).with_uid(uid(i)))
        .collect();
    writer.publish_batch(TOPIC, &batch).unwrap();
    assert_first(&reader, BEFORE + 2 * BATCH, "a second batch, refreshed");
    drop(reader);
    drop(writer);
    for &cut in &frames[1..] {
        // A segment that precedes a newer one is read whole by a reader:
        // a batch cut at a frame boundary must not show its first frames.
        std::fs::write(&w.log, &w.full[..cut]).unwrap();
        std::fs::write(recovery_point(w.dir.path(), 0), &w.stale_point).unwrap();
        let reader = EmbeddedBus::open_read_only(w.dir.path()).unwrap();
        let seen = read_all(&reader, 0).map(|events| events.len());
        assert!(
            matches!(seen, Ok(BEFORE) | Err(BusError::Corrupt { .. })),
            "cut at {cut}: {seen:?}"
        );
    }
}
