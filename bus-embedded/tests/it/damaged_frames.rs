//! Damaged frames: length damage in the middle of the active segment is
//! refused (never taken for a torn tail and truncated), a real torn tail is
//! still truncated, and a reader can step past a corrupt frame (batch or
//! single) to every intact record after it (C15).
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use bus_core::{BatchRecord, BusError, EventBus};
use bus_embedded::{EmbeddedBus, Options};

use crate::support::{
    TOPIC, frame_starts, open, provision, read_all, recovery_point, segments, value_for,
};

fn publish(bus: &dyn EventBus, n: usize) {
    for i in 0..n {
        let u = format!("u{i}");
        let ack = bus
            .publish_idempotent(TOPIC, "k", &value_for(&u, i), &u)
            .unwrap();
        assert_eq!(ack.offset, i as u64);
    }
}

#[test]
fn length_damage_mid_active_segment_is_refused_not_truncated() {
    // Past EOF (short), over the frame limit, far past EOF.
    for (byte, mask) in [(2usize, 0x10u8), (3, 0x80), (3, 0x01)] {
        let dir = tempfile::tempdir().unwrap();
        {
            let bus = open(dir.path());
            provision(&bus, 1);
            publish(&bus, 5);
        }
        let log = segments(dir.path(), 0)[0].clone();
        let mut bytes = std::fs::read(&log).unwrap();
        let second = frame_starts(&bytes)[1];
        bytes[second + byte] ^= mask;
        std::fs::write(&log, &bytes).unwrap();
        match EmbeddedBus::open(dir.path()) {
            Err(BusError::Corrupt {
                location, offset, ..
            }) => {
                assert!(location.ends_with(".log"), "{location}");
                assert_eq!(offset, 1, "names the damaged frame's offset");
            }
            other => panic!("byte {byte} mask {mask:#x}: expected Corrupt, got {other:?}"),
        }
        assert_eq!(std::fs::metadata(&log).unwrap().len(), bytes.len() as u64);
    }
}

#[test]
fn torn_tail_is_still_truncated() {
    let dir = tempfile::tempdir().unwrap();
    {
        let bus = open(dir.path());
        provision(&bus, 1);
        publish(&bus, 4);
    }
    // The fifth record's session is killed before it closes: its frame
    // lies past the recovery point of the clean close before it.
    let point = std::fs::read(recovery_point(dir.path(), 0)).unwrap();
    let ack = open(dir.path())
        .publish_idempotent(TOPIC, "k", &value_for("u4", 4), "u4")
        .unwrap();
    assert_eq!(ack.offset, 4);
    let log = segments(dir.path(), 0)[0].clone();
    let bytes = std::fs::read(&log).unwrap();
    let last = *frame_starts(&bytes).last().unwrap();
    // The last frame half written, and a length over the limit.
    for tail in [bytes[..last + (bytes.len() - last) / 2].to_vec(), {
        let mut b = bytes.clone();
        b[last + 3] ^= 0x80;
        b
    }] {
        std::fs::write(&log, &tail).unwrap();
        std::fs::write(recovery_point(dir.path(), 0), &point).unwrap();
        let bus = open(dir.path());
        assert_eq!(read_all(&bus, 0).unwrap().len(), 4);
        assert_eq!(std::fs::metadata(&log).unwrap().len(), last as u64);
        drop(bus);
    }
}

/// Fetches everything from 0, stepping past each error to `offset + 1`, as
/// a consumer that tolerates damage does; the step count is bounded so a
/// regression fails instead of hanging.
fn skip_reading(bus: &dyn EventBus) -> (Vec<u64>, Vec<u64>) {
    let (mut got, mut errors) = (Vec::new(), Vec::new());
    let mut offset = 0;
    for _ in 0..10_000 {
        match bus.fetch(TOPIC, 0, offset, 10) {
            Err(BusError::Corrupt { offset: o, .. } | BusError::Integrity { offset: o, .. }) => {
                assert!(
                    o >= offset,
                    "error names {o}, before the requested {offset}"
                );
                errors.push(o);
                offset = o + 1;
            }
            Ok(page) if page.is_empty() => return (got, errors),
            Ok(page) => {
                offset = page.last().unwrap().offset + 1;
                got.extend(page.iter().map(|e| e.offset));
            }
            Err(other) => panic!("{other}"),
        }
    }
    panic!("skipping never reached the end: {errors:?}");
}

/// A batch frame (offsets 0..3) then single records, in segments of 600
/// bytes; `damage` gets the first (sealed) segment's bytes.
fn damaged_log(damage: impl Fn(&mut Vec<u8>)) -> (tempfile::TempDir, EmbeddedBus) {
    let dir = tempfile::tempdir().unwrap();
    let opts = || Options::default().segment_bytes(600);
    {
        let bus = EmbeddedBus::open_with(dir.path(), opts()).unwrap();
        provision(&bus, 1);
        let batch: Vec<BatchRecord> = (0..3)
            .map(|i| BatchRecord::new("k", value_for("b", i)))
            .collect();
        bus.publish_batch(TOPIC, &batch).unwrap();
        for i in 3..20 {
            bus.publish(TOPIC, "k", &value_for("s", i)).unwrap();
        }
    }
    let logs = segments(dir.path(), 0);
    assert!(logs.len() > 1);
    let mut bytes = std::fs::read(&logs[0]).unwrap();
    damage(&mut bytes);
    std::fs::write(&logs[0], &bytes).unwrap();
    let bus = EmbeddedBus::open_with(dir.path(), opts()).unwrap();
    (dir, bus)
}

#[test]
fn corrupt_batch_frame_can_be_skipped() {
    let (_dir, bus) = damaged_log(|bytes| bytes[60] ^= 1);
    for o in 0..3 {
        assert!(
            matches!(bus.fetch(TOPIC, 0, o, 1), Err(BusError::Corrupt { offset, .. }) if offset == o)
        );
    }
    assert_eq!(bus.fetch(TOPIC, 0, 3, 1).unwrap()[0].offset, 3);
    let (got, errors) = skip_reading(&bus);
    assert_eq!(errors, vec![0, 1, 2]);
    assert_eq!(got, (3..20).collect::<Vec<_>>());
}

#[test]
fn frame_with_damaged_length_can_be_skipped() {
    for (byte, mask) in [(3usize, 0x80u8), (2, 0x10), (0, 0x04)] {
        let (_dir, bus) = damaged_log(|bytes| {
            let second = frame_starts(bytes)[1];
            bytes[second + byte] ^= mask;
        });
        let (got, errors) = skip_reading(&bus);
        assert_eq!(errors, vec![3], "byte {byte} mask {mask:#x}");
        let intact: Vec<u64> = (0..20).filter(|&o| o != 3).collect();
        assert_eq!(got, intact, "byte {byte} mask {mask:#x}");
    }
}
