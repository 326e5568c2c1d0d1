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
