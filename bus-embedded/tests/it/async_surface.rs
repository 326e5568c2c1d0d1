//! The async surface of the embedded log (feature `async`): the same
//! contract through `AsyncEventBus`, publishes that await the group commit
//! without holding a runtime thread, and async and sync publishers sharing
//! rounds.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bus_core::{
    AsyncEventBus, BatchRecord, BusError, EventBus, Manifest, Selector, StartAt, SubscribeOptions,
    SubscriptionItem, TopicSpec,
};
use bus_embedded::testing::FileLayer;
use bus_embedded::{EmbeddedBus, Options};
use futures::StreamExt as _;
use serde_json::json;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn round_trip_through_the_async_surface() {
    let dir = tempfile::tempdir().unwrap();
    let bus: Arc<dyn AsyncEventBus> = Arc::new(EmbeddedBus::open(dir.path()).unwrap());
    runtime().block_on(async {
        let manifest = Manifest::new([TopicSpec::new("t", 2)]);
        bus.provision(&manifest).await.unwrap();
        bus.provision(&manifest).await.unwrap();
        assert_eq!(bus.partitions("t").await.unwrap(), 2);
        let ack = bus
            .publish_idempotent("t", "k", &json!({"n": 1}), "u1")
            .await
            .unwrap();
        assert_eq!(ack.offset, 0);
        // Dedup: the original ack, nothing stored.
        let again = bus
            .publish_idempotent("t", "k", &json!({"n": 1}), "u1")
            .await
            .unwrap();
        assert_eq!(again, ack);
        let plain = bus.publish("t", "k", &json!({"n": 2})).await.unwrap();
        assert_eq!((plain.partition, plain.offset), (ack.partition, 1));
        let batch = [
            BatchRecord::new("k", json!({"n": 3})),
            BatchRecord::new("k", json!({"n": 4})).with_uid("u4"),
            BatchRecord::new("k", json!({"n": 1})).with_uid("u1"),
        ];
        let acks = bus.publish_batch("t", &batch).await.unwrap();
        let offsets: Vec<u64> = acks.iter().map(|a| a.offset).collect();
        assert_eq!(offsets, [2, 3, 0]);
        let events = bus.fetch("t", ack.partition, 0, 10).await.unwrap();
        let ns: Vec<_> = events.iter().map(|e| e.value["n"].clone()).collect();
        assert_eq!(ns, [json!(1), json!(2), json!(3), json!(4)]);
        assert_eq!(
            bus.find_event_by_uid("t", "k", "u4").await.unwrap(),
            Some(acks[1].clone())
        );
        assert_eq!(bus.find_event_by_uid("t", "k", "none").await.unwrap(), None);
        let offsets = bus.offsets("t", ack.partition).await.unwrap();
        assert_eq!((offsets.first, offsets.next), (0, 4));
        // C2 through the async surface.
        assert!(matches!(
            bus.publish("missing", "k", &json!({})).await,
            Err(BusError::UnknownTopic(_))
        ));
        assert!(matches!(
            bus.fetch("t", 9, 0, 1).await,
            Err(BusError::UnknownPartition { .. })
        ));
        // History, then a record published after the subscription was made.
        let mut stream = bus
            .subscribe(
                "t",
                Selector::Key("k".to_owned()),
                StartAt::Offset(2),
                SubscribeOptions::default(),
            )
            .await
            .unwrap();
        let mut seen = Vec::new();
        for _ in 0..2 {
            match stream.next().await.unwrap().unwrap() {
                SubscriptionItem::Record { event, .. } => seen.push(event.offset),
                other => panic!("{other:?}"),
            }
        }
        bus.publish("t", "k", &json!({"n": 5})).await.unwrap();
        match stream.next().await.unwrap().unwrap() {
            SubscriptionItem::Record { event, .. } => seen.push(event.offset),
            other => panic!("{other:?}"),
        }
        assert_eq!(seen, [2, 3, 4]);
    });
    // What the async surface acked survives a reopen, read by the sync one.
    drop(bus);
    let reopened = EmbeddedBus::open(dir.path()).unwrap();
    let partition = EventBus::find_event_by_uid(&reopened, "t", "k", "u1")
        .unwrap()
        .unwrap()
        .partition;
    assert_eq!(
        EventBus::offsets(&reopened, "t", partition).unwrap().next,
        5
    );
}

#[test]
fn a_read_only_open_refuses_async_publishes() {
    let dir = tempfile::tempdir().unwrap();
    let writer = EmbeddedBus::open(dir.path()).unwrap();
    EventBus::provision(&writer, &Manifest::new([TopicSpec::new("t", 1)])).unwrap();
    let reader = EmbeddedBus::open_read_only(dir.path()).unwrap();
    runtime().block_on(async {
        let error = AsyncEventBus::publish(&reader, "t", "k", &json!({}))
            .await
            .unwrap_err();
        assert!(matches!(error, BusError::ReadOnly { .. }), "{error:?}");
        AsyncEventBus::publish(&writer, "t", "k", &json!({"n": 1}))
            .await
            .unwrap();
        let events = AsyncEventBus::fetch(&reader, "t", 0, 0, 10).await.unwrap();
        assert_eq!(events.len(), 1);
    });
}

/// A file layer whose `fdatasync` waits, once armed, until the test opens
/// the gate.
#[derive(Debug, Default)]
struct FsyncGate {
    armed: AtomicBool,
    entered: AtomicBool,
    open: Mutex<bool>,
    opened: Condvar,
}

impl FsyncGate {
    fn release(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

impl FileLayer for FsyncGate {
    fn write_all_at(&self, file: &File, buf: &[u8], pos: u64) -> std::io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(file, buf, pos)
    }

    fn sync_data(&self, file: &File) -> std::io::Result<()> {
        if self.armed.load(Ordering::SeqCst) {
            self.entered.store(true, Ordering::SeqCst);
            let mut open = self.open.lock().unwrap();
            while !*open {
                open = self.opened.wait(open).unwrap();
            }
        }
        file.sync_data()
    }
}

/// On a current-thread runtime (one thread for every task), a publish
/// waiting on its fsync leaves the thread to other tasks: the fsync runs
/// on the partition's commit thread, not the caller's.
#[test]
fn an_async_publish_waiting_on_fsync_does_not_block_the_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(FsyncGate::default());
    let options = Options::default().file_layer(Arc::clone(&gate) as Arc<dyn FileLayer>);
    let bus = Arc::new(EmbeddedBus::open_with(dir.path(), options).unwrap());
    EventBus::provision(&*bus, &Manifest::new([TopicSpec::new("t", 1)])).unwrap();
    gate.armed.store(true, Ordering::SeqCst);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let publisher = Arc::clone(&bus);
        let publish = tokio::spawn(async move {
            AsyncEventBus::publish(&*publisher, "t", "k", &json!({"n": 1})).await
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        while !gate.entered.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "the fsync never started");
            tokio::task::yield_now().await;
        }
        // The fsync is held: another task still runs on the only thread,
        // timers fire, and the publish is still waiting.
        let other = tokio::spawn(async {
            tokio::time::sleep(Duration::from_millis(1)).await;
            42
        });
        assert_eq!(other.await.unwrap(), 42);
        assert!(!publish.is_finished(), "acked before its fsync finished");
        // Not visible before it is durable (C8).
        assert!(EventBus::fetch(&*bus, "t", 0, 0, 1).unwrap().is_empty());
        gate.release();
        let ack = publish.await.unwrap().unwrap();
        assert_eq!(ack.offset, 0);
    });
    assert_eq!(EventBus::fetch(&*bus, "t", 0, 0, 1).unwrap().len(), 1);
}

/// Async tasks and sync threads publishing into the same partitions at
/// once share group-commit rounds: distinct offsets, each key's records in
/// order, nothing lost.
#[test]
fn async_and_sync_publishers_share_rounds() {
    let dir = tempfile::tempdir().unwrap();
    let bus = Arc::new(EmbeddedBus::open(dir.path()).unwrap());
    EventBus::provision(&*bus, &Manifest::new([TopicSpec::new("t", 2)])).unwrap();
    const EACH: u64 = 60;
    let threads: Vec<_> = (0..4)
        .map(|thread| {
            let bus = Arc::clone(&bus);
            std::thread::spawn(move || {
                for n in 0..EACH {
                    let key = format!("sync-{thread}");
                    EventBus::publish(&*bus, "t", &key, &json!({"n": n})).unwrap();
                }
            })
        })
        .collect();
    runtime().block_on(async {
        let tasks: Vec<_> = (0..8)
            .map(|task| {
                let bus = Arc::clone(&bus);
                tokio::spawn(async move {
                    let key = format!("async-{task}");
                    for n in 0..EACH {
                        AsyncEventBus::publish(&*bus, "t", &key, &json!({"n": n}))
                            .await
                            .unwrap();
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    });
    for thread in threads {
        thread.join().unwrap();
    }
    let mut per_key: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut total = 0;
    for partition in 0..2 {
        let events = EventBus::fetch(&*bus, "t", partition, 0, 10_000).unwrap();
        for (expected, event) in (0u64..).zip(&events) {
            assert_eq!(event.offset, expected, "a hole or a repeat");
        }
        total += events.len();
        for event in events {
            per_key
                .entry(event.key.clone())
                .or_default()
                .push(event.value["n"].as_u64().unwrap());
        }
    }
    assert_eq!(total, 12 * 60);
    for (key, ns) in per_key {
        assert_eq!(ns, (0..EACH).collect::<Vec<_>>(), "order of {key}");
    }
}

/// Concurrent retries of one UID through the async surface store one
/// record (C6), also when a sync retry races them.
#[test]
fn concurrent_async_retries_of_a_uid_store_one_record() {
    let dir = tempfile::tempdir().unwrap();
    let bus = Arc::new(EmbeddedBus::open(dir.path()).unwrap());
    EventBus::provision(&*bus, &Manifest::new([TopicSpec::new("t", 1)])).unwrap();
    let sync_bus = Arc::clone(&bus);
    let sync_retry = std::thread::spawn(move || {
        EventBus::publish_idempotent(&*sync_bus, "t", "k", &json!({"n": 1}), "same").unwrap()
    });
    let acks = runtime().block_on(async {
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let bus = Arc::clone(&bus);
                tokio::spawn(async move {
                    AsyncEventBus::publish_idempotent(&*bus, "t", "k", &json!({"n": 1}), "same")
                        .await
                        .unwrap()
                })
            })
            .collect();
        let mut acks = Vec::new();
        for task in tasks {
            acks.push(task.await.unwrap());
        }
        acks
    });
    let first = sync_retry.join().unwrap();
    assert!(
        acks.iter().all(|ack| *ack == first),
        "{acks:?} vs {first:?}"
    );
    assert_eq!(EventBus::offsets(&*bus, "t", 0).unwrap().next, 1);
}

/// Dropping the bus after async publishes closes it cleanly: the next open
/// finds a clean close (nothing to recover) and every acked record.
#[test]
fn dropping_the_bus_stops_its_commit_threads_and_closes_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let bus = Arc::new(EmbeddedBus::open(dir.path()).unwrap());
    EventBus::provision(&*bus, &Manifest::new([TopicSpec::new("t", 3)])).unwrap();
    runtime().block_on(async {
        for n in 0..30 {
            AsyncEventBus::publish(&*bus, "t", &format!("k{n}"), &json!({"n": n}))
                .await
                .unwrap();
        }
    });
    drop(bus);
    // The lock is free again (the bus and its threads are gone) and
    // everything acked is there.
    let reopened = EmbeddedBus::open(dir.path()).unwrap();
    let stored: u64 = (0..3)
        .map(|p| EventBus::offsets(&reopened, "t", p).unwrap().next)
        .sum();
    assert_eq!(stored, 30);
}
