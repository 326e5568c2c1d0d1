//! C17: dropping a Kafka subscription releases its threads (the feed's and
//! its consumer's) at once. One test alone in this binary, so the process's
//! thread count moves only with it.

mod common;

use std::time::{Duration, Instant};

use bus_conformance::util::{poll_until, publish_n};
use bus_core::{EventBus, Manifest, Selector, StartAt, SubscribeOptions, TopicSpec};
use bus_kafka::{KafkaBus, KafkaOptions};

/// Threads of this process, from `/proc/self/task`.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, Iterator::count)
}

#[test]
fn dropping_a_subscription_releases_its_threads() {
    let test = "dropping_a_subscription_releases_its_threads";
    let brokers = match common::brokers() {
        Ok(brokers) => brokers,
        Err(why) => return common::skip(test, &why),
    };
    let id = uuid::Uuid::new_v4().simple().to_string();
    let manifest = format!("bus-test-manifest-{}", &id[..16]);
    let options =
        KafkaOptions::new(brokers.split(',').map(str::to_owned)).manifest_topic(manifest.clone());
    let bus = KafkaBus::connect_with(options).unwrap_or_else(|e| panic!("connect: {e}"));
    let topic = "sub-drop";
    bus.provision(&Manifest::new([TopicSpec::new(topic, 2)]))
        .unwrap_or_else(|e| panic!("provision: {e}"));
    publish_n(&bus, topic, "k", 3);
    // Warm the bus's own clients (query consumer, producer) first.
    let _ = bus.offsets(topic, 0);
    let before = threads();

    let mut sub = bus
        .subscribe(
            topic,
            Selector::Topic,
            StartAt::Beginning,
            SubscribeOptions::default(),
        )
        .unwrap_or_else(|e| panic!("subscribe: {e}"));
    let item = sub
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("recv: {e}"));
    assert!(item.is_some(), "a record within 30 s");
    let during = threads();
    assert!(
        during > before,
        "a subscription runs threads: {before} -> {during}"
    );

    let started = Instant::now();
    drop(sub);
    let dropped_in = started.elapsed();
    let after = poll_until(
        "the subscription's threads to end",
        Duration::from_secs(10),
        || {
            let now = threads();
            (now <= before).then_some(now)
        },
    );
    eprintln!(
        "threads: {before} before, {during} subscribed, {after} after a drop that took {dropped_in:?}"
    );
    let _ = bus.delete_topics(&bus.topics());
    common::delete_raw_topics(&brokers, &[manifest]);
}
