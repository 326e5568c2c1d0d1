//! Write and fsync failures through a fault-injecting file layer: the
//! failing round errors, nothing acked is lost, no offset gap appears, and
//! the partition stays poisoned until the bus is reopened.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::support::{TOPIC, assert_gap_free, open, provision, read_all, value_for};
use bus_core::{BusError, EventBus};
use bus_embedded::testing::FileLayer;
use bus_embedded::{EmbeddedBus, Options};

/// Fails the `fail_write`-th write (after writing half of it, like a torn
/// write) or the `fail_sync`-th fdatasync.
#[derive(Debug)]
struct Faulty {
    writes: AtomicU64,
    syncs: AtomicU64,
    fail_write: u64,
    fail_sync: u64,
}

impl FileLayer for Faulty {
    fn write_all_at(&self, file: &File, buf: &[u8], pos: u64) -> std::io::Result<()> {
        if self.writes.fetch_add(1, Ordering::SeqCst) + 1 == self.fail_write {
            file.write_all_at(&buf[..buf.len() / 2], pos)?;
            return Err(std::io::Error::other("injected write failure"));
        }
        file.write_all_at(buf, pos)
    }

    fn sync_data(&self, file: &File) -> std::io::Result<()> {
        if self.syncs.fetch_add(1, Ordering::SeqCst) + 1 == self.fail_sync {
            return Err(std::io::Error::other("injected fsync failure"));
        }
        file.sync_data()
    }
}

fn run(fail_write: u64, fail_sync: u64, segment_bytes: u64) {
    let what = format!("write #{fail_write}, sync #{fail_sync}, segments of {segment_bytes}");
    let dir = tempfile::tempdir().unwrap();
    provision(&open(dir.path()), 1);
    let faulty = Arc::new(Faulty {
        writes: AtomicU64::new(0),
        syncs: AtomicU64::new(0),
        fail_write,
        fail_sync,
    });
    let options = Options::default()
        .segment_bytes(segment_bytes)
        .file_layer(faulty);
    let bus = EmbeddedBus::open_with(dir.path(), options).unwrap();
    let acked: BTreeMap<u64, String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let bus = &bus;
                scope.spawn(move || {
                    let mut acked = Vec::new();
                    for i in 0..40 {
                        let uid = format!("t{t}-{i}");
                        match bus.publish_idempotent(TOPIC, "k", &value_for(&uid, i), &uid) {
                            Ok(ack) => acked.push((ack.offset, uid)),
                            Err(BusError::Poisoned { .. }) => break,
                            Err(other) => panic!("unexpected {other:?}"),
                        }
                    }
                    acked
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    assert!(acked.len() < 160, "{what}: the fault never fired");
    // Poisoned until reopen, for every later publish.
    assert!(matches!(
        bus.publish(TOPIC, "k", &value_for("late", 0)),
        Err(BusError::Poisoned { .. })
    ));
    // What was acked stays readable on the poisoned bus.
    assert!(read_all(&bus, 0).unwrap().len() >= acked.len());
    drop(bus);
    let bus = open(dir.path());
    let events = read_all(&bus, 0).unwrap();
    assert_gap_free(&events);
    for (offset, uid) in &acked {
        let event = &events[*offset as usize];
        assert_eq!(event.value["uid"], *uid, "{what}: acked {uid} lost");
    }
    let ack = bus.publish(TOPIC, "k", &value_for("after", 0)).unwrap();
    assert_eq!(ack.offset, events.len() as u64, "{what}");
}

#[test]
fn failed_writes_poison_and_lose_nothing_acked() {
    for n in [1, 2, 7, 20] {
        run(n, u64::MAX, 1 << 20);
        run(n, u64::MAX, 600);
    }
}

#[test]
fn failed_fsyncs_poison_and_lose_nothing_acked() {
    for n in [1, 2, 7, 20] {
        run(u64::MAX, n, 1 << 20);
        run(u64::MAX, n, 600);
    }
}

#[test]
fn interval_durability_acks_and_flushes_on_close() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options::default()
        .durability(bus_embedded::Durability::Interval(5))
        .segment_bytes(800);
    {
        let bus = EmbeddedBus::open_with(dir.path(), options).unwrap();
        provision(&bus, 1);
        for i in 0..30 {
            let uid = format!("i{i}");
            let ack = bus
                .publish_idempotent(TOPIC, "k", &value_for(&uid, i), &uid)
                .unwrap();
            assert_eq!(ack.offset, i as u64);
        }
    }
    let bus = open(dir.path());
    let events = read_all(&bus, 0).unwrap();
    assert_eq!(events.len(), 30);
    assert_gap_free(&events);
}

/// Fails every fdatasync with the OS error `errno`.
#[derive(Debug)]
struct SyncFails(i32);

impl FileLayer for SyncFails {
    fn write_all_at(&self, file: &File, buf: &[u8], pos: u64) -> std::io::Result<()> {
        file.write_all_at(buf, pos)
    }

    fn sync_data(&self, _file: &File) -> std::io::Result<()> {
        Err(std::io::Error::from_raw_os_error(self.0))
    }
}

/// What a caller sees when the disk fills (ENOSPC) and when the device
/// fails (EIO): both poison, only the first says a full disk, and both
/// keep the OS error as their source.
#[test]
fn a_full_disk_is_told_from_a_failing_device() {
    use std::error::Error as _;
    for (errno, full) in [(libc_enospc(), true), (5, false)] {
        let dir = tempfile::tempdir().unwrap();
        provision(&open(dir.path()), 1);
        let options = Options::default().file_layer(Arc::new(SyncFails(errno)));
        let bus = EmbeddedBus::open_with(dir.path(), options).unwrap();
        for attempt in 0..2 {
            let error = bus.publish(TOPIC, "k", &value_for("x", 0)).unwrap_err();
            let BusError::Poisoned { disk_full, .. } = &error else {
                panic!("errno {errno}, attempt {attempt}: {error:?}");
            };
            assert_eq!(*disk_full, full, "errno {errno}: {error}");
            assert_eq!(error.to_string().contains("disk is full"), full, "{error}");
            let source = error.source().expect("the OS error");
            let io = source
                .downcast_ref::<std::io::Error>()
                .expect("an io::Error");
            assert_eq!(io.raw_os_error(), Some(errno), "{error}");
        }
    }
}

/// ENOSPC on Linux.
const fn libc_enospc() -> i32 {
    28
}
