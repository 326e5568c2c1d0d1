//! Regressions for reviewed bugs: length damage mid-log taken for a torn
//! tail, holes in a fetch racing retention, corrupt frames that cannot be
//! skipped, forged UIDs capturing dedup, unsynced bytes exposed on reopen,
//! and a panicking writer hanging its partition.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

mod support;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bus_core::{BatchRecord, BusError, EventBus, Manifest, TopicSpec};
use bus_embedded::testing::{FileLayer, append_raw_record};
use bus_embedded::{EmbeddedBus, Options};
use serde_json::json;
use support::{
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

#[test]
fn fetch_across_retention_has_no_hole() {
    let dir = tempfile::tempdir().unwrap();
    let bus = EmbeddedBus::open_with(dir.path(), Options::default().segment_bytes(300)).unwrap();
    bus.provision(&Manifest::new([
        TopicSpec::new(TOPIC, 1).with_retention_ms(1)
    ]))
    .unwrap();
    for i in 0..200 {
        bus.publish(TOPIC, "k", &json!({ "i": i })).unwrap();
    }
    let done = AtomicBool::new(false);
    let (fetches, holes) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 200..3000 {
                bus.publish(TOPIC, "k", &json!({ "i": i })).unwrap();
                if i % 20 == 0 {
                    bus.maintenance(bus_core::now_ms().saturating_sub(2))
                        .unwrap();
                }
            }
            done.store(true, Ordering::SeqCst);
        });
        s.spawn(|| {
            while !done.load(Ordering::SeqCst) {
                let Ok(page) = bus.fetch(TOPIC, 0, 0, 100_000) else {
                    continue;
                };
                fetches.fetch_add(1, Ordering::Relaxed);
                let gaps = page.windows(2).filter(|w| w[1].offset != w[0].offset + 1);
                holes.fetch_add(gaps.count() as u64, Ordering::Relaxed);
            }
        });
    });
    assert!(fetches.load(Ordering::Relaxed) > 0);
    assert_eq!(
        holes.load(Ordering::Relaxed),
        0,
        "a fetch result had a hole"
    );
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

const KEY: [u8; 32] = [7; 32];

fn keyed(dir: &Path) -> EmbeddedBus {
    let bus = EmbeddedBus::open_with(dir, Options::default().segment_bytes(300)).unwrap();
    bus.set_control_key(KEY).unwrap();
    bus
}

fn forge(dir: &Path, uid: &str) -> u64 {
    append_raw_record(dir, TOPIC, 0, "k", Some(uid), br#"{"forged":1}"#, None).unwrap()
}

#[test]
fn forged_uid_does_not_capture_dedup_or_find() {
    let dir = tempfile::tempdir().unwrap();
    {
        let bus = keyed(dir.path());
        provision(&bus, 1);
        bus.publish(TOPIC, "k", &json!({"n": 0})).unwrap();
    }
    assert_eq!(forge(dir.path(), "pay-42"), 1);
    let genuine = json!({"amount": 42});
    let ack = {
        let bus = keyed(dir.path());
        assert_eq!(bus.find_event_by_uid(TOPIC, "k", "pay-42").unwrap(), None);
        let ack = bus
            .publish_idempotent(TOPIC, "k", &genuine, "pay-42")
            .unwrap();
        assert_eq!(ack.offset, 2);
        assert_eq!(bus.fetch(TOPIC, 0, 2, 1).unwrap()[0].value, genuine);
        assert_eq!(
            bus.find_event_by_uid(TOPIC, "k", "pay-42").unwrap(),
            Some(ack.clone())
        );
        assert_eq!(
            bus.publish_idempotent(TOPIC, "k", &genuine, "pay-42")
                .unwrap(),
            ack
        );
        // Seal the segments holding both copies, so their .uids persist.
        for i in 0..10 {
            bus.publish(TOPIC, "k", &value_for("pad", i)).unwrap();
        }
        assert!(segments(dir.path(), 0).len() > 1);
        ack
    };
    // A reopen (from persisted UID files) still prefers the authentic copy.
    let bus = keyed(dir.path());
    let next = bus.offsets(TOPIC, 0).unwrap().next;
    assert_eq!(
        bus.publish_idempotent(TOPIC, "k", &genuine, "pay-42")
            .unwrap(),
        ack
    );
    assert_eq!(
        bus.find_event_by_uid(TOPIC, "k", "pay-42").unwrap(),
        Some(ack)
    );
    assert_eq!(bus.offsets(TOPIC, 0).unwrap().next, next, "stored nothing");
}

#[test]
fn forged_copy_after_the_genuine_one_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let ack = {
        let bus = keyed(dir.path());
        provision(&bus, 1);
        bus.publish_idempotent(TOPIC, "k", &json!({"a": 1}), "pay-7")
            .unwrap()
    };
    // The bus dedups the raw append itself, so forge offset 1 elsewhere and
    // append its frame to the log, as a writer around the bus could.
    let other = tempfile::tempdir().unwrap();
    provision(&open(other.path()), 1);
    open(other.path()).publish(TOPIC, "k", &json!(0)).unwrap();
    assert_eq!(forge(other.path(), "pay-7"), 1);
    let forged = std::fs::read(&segments(other.path(), 0)[0]).unwrap();
    let log = segments(dir.path(), 0)[0].clone();
    let mut bytes = std::fs::read(&log).unwrap();
    bytes.extend_from_slice(&forged[frame_starts(&forged)[1]..]);
    std::fs::write(&log, &bytes).unwrap();

    let bus = keyed(dir.path());
    assert_eq!(
        bus.offsets(TOPIC, 0).unwrap().next,
        2,
        "the forgery is in the log"
    );
    assert_eq!(
        bus.publish_idempotent(TOPIC, "k", &json!({"a": 1}), "pay-7")
            .unwrap(),
        ack
    );
    assert_eq!(
        bus.find_event_by_uid(TOPIC, "k", "pay-7").unwrap(),
        Some(ack)
    );
    assert_eq!(bus.offsets(TOPIC, 0).unwrap().next, 2, "stored nothing");
}

/// Counts (or fails) the fsync of recovery, and panics on the writer's
/// first write when `panic_write` is set.
#[derive(Debug, Default)]
struct Layer {
    recovered: AtomicU64,
    fail_recovered: bool,
    panic_write: AtomicBool,
}

impl FileLayer for Layer {
    fn write_all_at(&self, file: &File, buf: &[u8], pos: u64) -> std::io::Result<()> {
        assert!(
            !self.panic_write.swap(false, Ordering::SeqCst),
            "injected writer panic"
        );
        file.write_all_at(buf, pos)
    }

    fn sync_data(&self, file: &File) -> std::io::Result<()> {
        file.sync_data()
    }

    fn sync_recovered(&self, file: &File) -> std::io::Result<()> {
        self.recovered.fetch_add(1, Ordering::SeqCst);
        if self.fail_recovered {
            return Err(std::io::Error::other("injected fsync failure"));
        }
        file.sync_all()
    }
}

#[test]
fn open_syncs_every_active_segment_before_use() {
    let dir = tempfile::tempdir().unwrap();
    {
        let bus = open(dir.path());
        provision(&bus, 3);
        bus.publish(TOPIC, "k", &json!(1)).unwrap();
    }
    // No torn tail to truncate: the active segments are synced anyway.
    let layer = Arc::new(Layer::default());
    let bus =
        EmbeddedBus::open_with(dir.path(), Options::default().file_layer(layer.clone())).unwrap();
    assert_eq!(layer.recovered.load(Ordering::SeqCst), 3);
    drop(bus);
    let failing = Arc::new(Layer {
        fail_recovered: true,
        ..Layer::default()
    });
    assert!(matches!(
        EmbeddedBus::open_with(dir.path(), Options::default().file_layer(failing)),
        Err(BusError::Io(_))
    ));
}

#[test]
fn a_panicking_writer_does_not_hang_the_partition() {
    let dir = tempfile::tempdir().unwrap();
    provision(&open(dir.path()), 1);
    let layer = Arc::new(Layer::default());
    let bus = Arc::new(
        EmbeddedBus::open_with(dir.path(), Options::default().file_layer(layer.clone())).unwrap(),
    );
    layer.panic_write.store(true, Ordering::SeqCst);
    let (tx, rx) = std::sync::mpsc::channel();
    for t in 0..4 {
        let (bus, tx) = (Arc::clone(&bus), tx.clone());
        std::thread::spawn(move || {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                bus.publish(TOPIC, "k", &json!({ "t": t })).map(drop)
            }));
            drop(bus); // before reporting, so the reopen below finds it closed
            tx.send(result.map_err(drop)).unwrap();
        });
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut panicked = 0;
    for _ in 0..4 {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left).expect("a publisher hung") {
            Err(()) => panicked += 1,
            Ok(Err(BusError::Poisoned { .. })) => {}
            Ok(other) => panic!("expected Poisoned after the panic, got {other:?}"),
        }
    }
    assert_eq!(panicked, 1, "only the leader sees the panic");
    assert!(matches!(
        bus.publish(TOPIC, "k", &json!(0)),
        Err(BusError::Poisoned { .. })
    ));
    drop(bus);
    let bus = open(dir.path());
    assert_eq!(bus.publish(TOPIC, "k", &json!(0)).unwrap().offset, 0);
}

#[test]
fn value_of_exactly_one_mib_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let bus = open(dir.path());
    provision(&bus, 1);
    let value = json!("y".repeat((1 << 20) - 2));
    assert_eq!(serde_json::to_vec(&value).unwrap().len(), 1 << 20);
    let ack = bus.publish(TOPIC, "k", &value).unwrap();
    assert_eq!(bus.fetch(TOPIC, 0, ack.offset, 1).unwrap()[0].value, value);
}
