//! C17: a NATS subscription runs on the bus's connector runtime (no thread
//! of its own), and dropping it removes its consumers from the server at
//! once (not after their inactivity expiry). One test alone in this binary,
//! so the process's thread count moves only with it.

mod common;

use std::time::{Duration, Instant};

use bus_conformance::util::{poll_until, publish_n};
use bus_core::{EventBus, Manifest, Selector, StartAt, SubscribeOptions, TopicSpec};
use bus_nats::naming::stream_name;

const PARTITIONS: u32 = 2;

/// Threads of this process, from `/proc/self/task`.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, Iterator::count)
}

/// Consumers on each partition's stream, from the server.
fn consumers(prefix: &str, topic: &str) -> Vec<usize> {
    let streams: Vec<String> = (0..PARTITIONS)
        .map(|partition| stream_name(prefix, topic, partition))
        .collect();
    common::raw(async move |js| {
        let mut counts = Vec::new();
        for stream in &streams {
            let mut handle = js.get_stream(stream).await.expect("stream");
            let info = handle.info().await.expect("stream info");
            counts.push(info.state.consumer_count);
        }
        counts
    })
}

#[test]
fn dropping_a_subscription_releases_its_threads_and_consumers() {
    let Some(bus) = common::shared_bus("subscribe_drop", "sub-drop") else {
        return;
    };
    let topic = "sub-drop";
    bus.provision(&Manifest::new([TopicSpec::new(topic, PARTITIONS)]))
        .unwrap_or_else(|e| panic!("provision: {e}"));
    // 600 records: reading them from the beginning opens the subscription's
    // own replay cursor (a pull consumer) besides its push consumer.
    publish_n(&bus, topic, "k", 600);
    let _ = bus.offsets(topic, 0);
    let threads_before = threads();
    let consumers_before = consumers(bus.prefix(), topic);

    let mut sub = bus
        .subscribe(
            topic,
            Selector::Topic,
            StartAt::Beginning,
            SubscribeOptions::default(),
        )
        .unwrap_or_else(|e| panic!("subscribe: {e}"));
    let mut received = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while received < 600 {
        assert!(Instant::now() < deadline, "only {received} of 600 records");
        if let Some(item) = sub
            .recv_timeout(Duration::from_secs(1))
            .unwrap_or_else(|e| panic!("recv: {e}"))
        {
            assert!(item.event().is_some(), "unexpected {item:?}");
            received += 1;
        }
    }
    let threads_during = threads();
    let consumers_during = consumers(bus.prefix(), topic);
    assert!(
        threads_during <= threads_before,
        "a subscription runs on the connector, no thread of its own: {threads_before} -> {threads_during}"
    );
    let opened: usize = consumers_during
        .iter()
        .zip(&consumers_before)
        .map(|(during, before)| during - before)
        .sum();
    assert!(
        opened >= PARTITIONS as usize,
        "a push consumer per partition: {consumers_before:?} -> {consumers_during:?}"
    );

    let started = Instant::now();
    drop(sub);
    let dropped_in = started.elapsed();
    assert!(
        dropped_in < Duration::from_secs(1),
        "drop returns at once, took {dropped_in:?}"
    );
    // The server expires idle consumers after 30 s; deleted ones go at once.
    let after = poll_until(
        "the subscription's consumers to be deleted",
        Duration::from_secs(10),
        || {
            let now = consumers(bus.prefix(), topic);
            (now == consumers_before).then_some(now)
        },
    );
    let threads_after = threads();
    assert!(
        threads_after <= threads_before,
        "{threads_before} -> {threads_after}"
    );
    eprintln!(
        "threads: {threads_before} before, {threads_during} subscribed, {threads_after} after; consumers {consumers_before:?} -> {consumers_during:?} -> {after:?} after a drop that took {dropped_in:?}"
    );
    common::cleanup(&bus);
}
