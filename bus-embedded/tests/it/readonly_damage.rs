//! A read-only open (C16) meets damage the way the writer's open does: a
//! flipped byte in an acked record is an error naming it, never a log that
//! silently ends before it.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::path::Path;

use crate::support::{TOPIC, frame_starts, provision, segments, value_for};
use bus_core::{BusError, EventBus};
use bus_embedded::{EmbeddedBus, Options};

const RECORDS: usize = 40;

/// A closed log of `RECORDS` records, one frame each, over several segments.
fn written(dir: &Path) {
    let options = Options::default().segment_bytes(2048);
    let bus = EmbeddedBus::open_with(dir, options).unwrap();
    provision(&bus, 1);
    for i in 0..RECORDS {
        bus.publish(TOPIC, "k", &value_for("r", i)).unwrap();
    }
}

fn flip_in_frame(log: &Path, frame: usize) {
    let mut bytes = std::fs::read(log).unwrap();
    let starts = frame_starts(&bytes);
    let at = starts[frame] + 20;
    bytes[at] ^= 0x10;
    std::fs::write(log, bytes).unwrap();
}

/// What each open says about the whole partition: the records it serves
/// before an error, and the error.
fn read_everything(bus: &dyn EventBus) -> (usize, Option<BusError>) {
    let mut offset = 0;
    loop {
        match bus.fetch(TOPIC, 0, offset, 1000) {
            Ok(events) if events.is_empty() => return (offset as usize, None),
            Ok(events) => offset = events.last().unwrap().offset + 1,
            Err(error) => return (offset as usize, Some(error)),
        }
    }
}

fn assert_damage_reported(what: &str, served: usize, error: Option<BusError>) {
    assert!(
        served < RECORDS,
        "{what}: served {served} records over a damaged one"
    );
    assert!(
        matches!(
            error,
            Some(BusError::Corrupt { .. } | BusError::Integrity { .. })
        ),
        "{what}: served {served} of {RECORDS} records, then {error:?} (a silent end)"
    );
}

#[test]
fn a_flipped_byte_in_a_sealed_segment_is_reported_by_a_read_only_open() {
    let dir = tempfile::tempdir().unwrap();
    written(dir.path());
    let logs = segments(dir.path(), 0);
    assert!(logs.len() >= 2, "{} segments", logs.len());
    flip_in_frame(&logs[0], 1);
    let reader = EmbeddedBus::open_read_only(dir.path());
    let (served, error) = match reader {
        Ok(reader) => read_everything(&reader),
        Err(error) => (0, Some(error)),
    };
    assert_damage_reported("sealed", served, error);
}

#[test]
fn a_flipped_byte_below_the_acked_end_of_the_active_segment_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    written(dir.path());
    let logs = segments(dir.path(), 0);
    let active = logs.last().unwrap();
    let frames = frame_starts(&std::fs::read(active).unwrap()).len();
    assert!(frames >= 2, "{frames} frames in the active segment");
    flip_in_frame(active, 0);
    let reader = EmbeddedBus::open_read_only(dir.path());
    let (served, error) = match reader {
        Ok(reader) => read_everything(&reader),
        Err(error) => (0, Some(error)),
    };
    assert_damage_reported("active", served, error);
}
