//! Faults injected through the file layer: opening syncs every active
//! segment before use (and a failed sync fails the open), and a writer that
//! panics mid-write poisons its partition instead of hanging the publishers
//! waiting on it (C15).
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bus_core::{BusError, EventBus};
use bus_embedded::testing::FileLayer;
use bus_embedded::{EmbeddedBus, Options};
use serde_json::json;

use crate::support::{TOPIC, open, provision};

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
