//! The async adapter of a subscription: a `Stream` that runs in a tokio task
//! without blocking a runtime thread, and ends its thread when dropped.

use std::time::Duration;

use bus::memory::MemoryBus;
use bus_core::{
    EventBus, Manifest, Selector, StartAt, SubscribeOptions, SubscriptionItem, TopicSpec,
};
use futures::StreamExt as _;
use serde_json::json;

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |dir| dir.count())
}

#[test]
fn a_stream_delivers_in_a_current_thread_runtime_and_its_drop_joins_the_thread() {
    let bus = MemoryBus::new();
    bus.provision(&Manifest::new([TopicSpec::new("audit", 1)]))
        .expect("provision");
    let before = threads();
    let stream = bus
        .subscribe(
            "audit",
            Selector::Topic,
            StartAt::Now,
            SubscribeOptions::default(),
        )
        .expect("subscribe")
        .into_stream()
        .expect("stream");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let publisher = bus.handle();
    let received = runtime.block_on(async move {
        let mut stream = stream;
        // The only runtime thread must stay free: this timer firing while
        // the stream waits proves the wait is not on it.
        let ticked = tokio::time::timeout(Duration::from_millis(50), stream.next()).await;
        assert!(ticked.is_err(), "nothing published yet");
        let task = tokio::spawn(async move {
            let item = tokio::time::timeout(Duration::from_secs(10), stream.next()).await;
            (item, stream)
        });
        for n in 0..2 {
            publisher
                .publish("audit", "k", &json!({ "n": n }))
                .expect("publish");
        }
        let (item, stream) = task.await.expect("task");
        drop(stream);
        item
    });
    match received {
        Ok(Some(Ok(SubscriptionItem::Record { event, .. }))) => assert_eq!(event.offset, 0),
        other => panic!("expected the first record, got {other:?}"),
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while threads() > before {
        assert!(
            std::time::Instant::now() < deadline,
            "the stream's thread outlived it: {} threads, {before} before",
            threads()
        );
        std::thread::yield_now();
    }
}

/// C18: the stream hands out what the synchronous handle would, whatever
/// the timing: its thread reads only when the consumer asks, so 10 records
/// published into `max_lag(4)` before the first poll are `Lagged(6)` and
/// the newest four, every time (it read ahead and gave `[1, Lagged(5), 7,
/// ...]` in most runs before). The embedded log's fsynced publishes leave
/// the stream's thread time to wake between two of them.
#[cfg(feature = "embedded")]
#[test]
fn a_stream_decides_lag_when_an_item_is_asked_for_not_ahead() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let bus = bus::EmbeddedBus::open(dir.path()).expect("open");
    for round in 0..30 {
        let topic = format!("lag-{round}");
        bus.provision(&Manifest::new([TopicSpec::new(&topic, 1)]))
            .expect("provision");
        let mut stream = bus
            .subscribe(
                &topic,
                Selector::Topic,
                StartAt::Now,
                SubscribeOptions::default().max_lag(4),
            )
            .expect("subscribe")
            .into_stream()
            .expect("stream");
        for n in 1..=10 {
            bus.publish(&topic, "k", &json!({ "n": n }))
                .expect("publish");
        }
        let items: Vec<SubscriptionItem> = runtime.block_on(async {
            let mut items = Vec::new();
            for _ in 0..5 {
                let item = tokio::time::timeout(Duration::from_secs(10), stream.next())
                    .await
                    .expect("an item in time")
                    .expect("the stream goes on")
                    .expect("not an error");
                items.push(item);
            }
            items
        });
        assert_eq!(
            items[0],
            SubscriptionItem::Lagged {
                partition: 0,
                skipped: 6,
                next_offset: 6
            },
            "round {round}: {items:?}"
        );
        let offsets: Vec<u64> = items[1..]
            .iter()
            .filter_map(|item| item.event().map(|event| event.offset))
            .collect();
        assert_eq!(offsets, vec![6, 7, 8, 9], "round {round}");
    }
}

/// C17: dropping the bus ends its subscriptions, sync and streamed: a
/// `recv` returns `None` and the stream ends, instead of waiting forever.
#[test]
fn dropping_the_memory_bus_ends_its_subscriptions() {
    let bus = MemoryBus::new();
    bus.provision(&Manifest::new([TopicSpec::new("audit", 1)]))
        .expect("provision");
    let open = |bus: &MemoryBus| {
        bus.subscribe(
            "audit",
            Selector::Topic,
            StartAt::Now,
            SubscribeOptions::default(),
        )
        .expect("subscribe")
    };
    let mut sync = open(&bus);
    let stream = open(&bus).into_stream().expect("stream");
    // Another handle's subscription is not the dropped bus's.
    let other = bus.handle();
    let mut others = open(&other);
    let ended = std::thread::spawn(move || sync.recv().is_none());
    drop(bus);
    assert!(ended.join().expect("waiter"), "recv ends with the bus");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let mut stream = stream;
        let end = tokio::time::timeout(Duration::from_secs(10), stream.next()).await;
        assert!(matches!(end, Ok(None)), "the stream ends: {end:?}");
    });
    other
        .publish("audit", "k", &json!({"n": 1}))
        .expect("publish");
    assert!(matches!(
        others.recv_timeout(Duration::from_secs(10)),
        Ok(Some(SubscriptionItem::Record { .. }))
    ));
}
