//! Live subscriptions on the shared broker (`BUS_KAFKA_BROKERS`): history
//! then the live tail, `max_lag` jumps, and more records than a partition's
//! buffer holds. Each test provisions under its own manifest topic.

use crate::common;

use std::time::{Duration, Instant};

use bus_conformance::util::publish_n;
use bus_core::{
    EventBus, Manifest, Selector, StartAt, SubscribeOptions, Subscription, SubscriptionItem,
    TopicSpec,
};
use bus_kafka::{KafkaBus, KafkaOptions};

const WAIT: Duration = Duration::from_secs(30);

/// A bus with a fresh manifest topic and `topic` provisioned, or a skip.
fn bus_with(test: &str, topic: &str, partitions: u32) -> Option<(KafkaBus, String)> {
    let brokers = match common::brokers() {
        Ok(brokers) => brokers,
        Err(why) => {
            common::skip(test, &why);
            return None;
        }
    };
    let id = uuid::Uuid::new_v4().simple().to_string();
    let manifest = format!("bus-test-manifest-{}", &id[..16]);
    let options =
        KafkaOptions::new(brokers.split(',').map(str::to_owned)).manifest_topic(manifest.clone());
    let bus = KafkaBus::connect_with(options).unwrap_or_else(|e| panic!("connect: {e}"));
    bus.provision(&Manifest::new([TopicSpec::new(topic, partitions)]))
        .unwrap_or_else(|e| panic!("provision: {e}"));
    Some((bus, manifest))
}

fn cleanup(bus: &KafkaBus, manifest: &str) {
    let _ = bus.delete_topics(&bus.topics());
    if let Ok(brokers) = common::brokers() {
        common::delete_raw_topics(&brokers, &[manifest.to_owned()]);
    }
}

/// The next `count` items, failing on an error item or after `WAIT`.
fn take(sub: &mut Subscription, count: usize) -> Vec<SubscriptionItem> {
    let deadline = Instant::now() + WAIT;
    let mut items = Vec::new();
    while items.len() < count {
        assert!(
            Instant::now() < deadline,
            "only {} of {count} items",
            items.len()
        );
        match sub.recv_timeout(Duration::from_millis(500)) {
            Ok(Some(item)) => items.push(item),
            Ok(None) => {}
            Err(error) => panic!("error item: {error}"),
        }
    }
    items
}

fn offsets(items: &[SubscriptionItem]) -> Vec<u64> {
    items
        .iter()
        .map(|item| item.event().map_or(u64::MAX, |event| event.offset))
        .collect()
}

#[test]
fn history_then_live_tail_without_gap_or_duplicate() {
    let topic = "sub-tail";
    let Some((bus, manifest)) = bus_with("history_then_live_tail", topic, 1) else {
        return;
    };
    publish_n(&bus, topic, "k", 5);
    let mut sub = bus
        .subscribe(
            topic,
            Selector::Partition(0),
            StartAt::Beginning,
            SubscribeOptions::default(),
        )
        .unwrap_or_else(|e| panic!("subscribe: {e}"));
    assert_eq!(offsets(&take(&mut sub, 5)), vec![0, 1, 2, 3, 4]);
    publish_n(&bus, topic, "k", 3);
    assert_eq!(offsets(&take(&mut sub, 3)), vec![5, 6, 7]);
    assert!(matches!(sub.try_recv(), Ok(None)), "nothing more");
    drop(sub);
    cleanup(&bus, &manifest);
}

#[test]
fn now_delivers_only_records_acked_after_subscribe() {
    let topic = "sub-now";
    let Some((bus, manifest)) = bus_with("now_delivers_only_later_records", topic, 2) else {
        return;
    };
    publish_n(&bus, topic, "a", 4);
    let mut sub = bus
        .subscribe(
            topic,
            Selector::Topic,
            StartAt::Now,
            SubscribeOptions::default(),
        )
        .unwrap_or_else(|e| panic!("subscribe: {e}"));
    let acks = publish_n(&bus, topic, "a", 2);
    let items = take(&mut sub, 2);
    let got: Vec<(u32, u64)> = items
        .iter()
        .filter_map(SubscriptionItem::event)
        .map(|event| (event.partition, event.offset))
        .collect();
    let want: Vec<(u32, u64)> = acks.iter().map(|ack| (ack.partition, ack.offset)).collect();
    assert_eq!(got, want);
    drop(sub);
    cleanup(&bus, &manifest);
}

#[test]
fn max_lag_jumps_to_the_newest_records() {
    let topic = "sub-lag";
    let Some((bus, manifest)) = bus_with("max_lag_jumps", topic, 1) else {
        return;
    };
    let mut sub = bus
        .subscribe(
            topic,
            Selector::Partition(0),
            StartAt::Beginning,
            SubscribeOptions::default().max_lag(4),
        )
        .unwrap_or_else(|e| panic!("subscribe: {e}"));
    publish_n(&bus, topic, "k", 10);
    let items = take(&mut sub, 5);
    assert_eq!(
        items[0],
        SubscriptionItem::Lagged {
            partition: 0,
            skipped: 6,
            next_offset: 6
        }
    );
    assert_eq!(offsets(&items[1..]), vec![6, 7, 8, 9]);
    publish_n(&bus, topic, "k", 1);
    assert_eq!(offsets(&take(&mut sub, 1)), vec![10]);
    drop(sub);
    cleanup(&bus, &manifest);
}

#[test]
fn more_records_than_a_buffer_holds_arrive_in_order() {
    let topic = "sub-many";
    let Some((bus, manifest)) = bus_with("more_records_than_a_buffer", topic, 1) else {
        return;
    };
    let records: Vec<bus_core::BatchRecord> = (0..5_000)
        .map(|n| bus_core::BatchRecord::new("k", serde_json::json!({ "n": n })))
        .collect();
    for chunk in records.chunks(1_000) {
        bus.publish_batch(topic, chunk)
            .unwrap_or_else(|e| panic!("publish: {e}"));
    }
    let mut sub = bus
        .subscribe(
            topic,
            Selector::Partition(0),
            StartAt::Offset(0),
            SubscribeOptions::default(),
        )
        .unwrap_or_else(|e| panic!("subscribe: {e}"));
    // The feed reads ahead faster than this drains it: its buffer fills,
    // the partition pauses and resumes, and nothing is lost or repeated.
    let got = offsets(&take(&mut sub, 5_000));
    assert_eq!(got, (0..5_000).collect::<Vec<u64>>());
    drop(sub);
    cleanup(&bus, &manifest);
}

#[test]
fn try_recv_on_a_fresh_subscription_with_history_returns_the_first_record() {
    // Its own name: a failed run leaves its records behind.
    let topic = &format!(
        "sub-try-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let Some((bus, manifest)) = bus_with("try_recv_with_history", topic, 2) else {
        return;
    };
    let acks = publish_n(&bus, topic, "k", 3);
    let partition = acks[0].partition;
    for start in [StartAt::Beginning, StartAt::Offset(acks[0].offset)] {
        let mut sub = bus
            .subscribe(
                topic,
                Selector::Partition(partition),
                start.clone(),
                SubscribeOptions::default(),
            )
            .unwrap_or_else(|e| panic!("subscribe: {e}"));
        let item = sub
            .try_recv()
            .unwrap_or_else(|e| panic!("try_recv: {e}"))
            .unwrap_or_else(|| panic!("{start:?}: no record on the first try_recv"));
        assert_eq!(offsets(&[item]), vec![acks[0].offset]);
        // The rest without waiting either, then nothing.
        let rest: Vec<SubscriptionItem> = std::iter::from_fn(|| sub.try_recv().ok().flatten())
            .take(10)
            .collect();
        assert_eq!(offsets(&rest), vec![acks[1].offset, acks[2].offset]);
    }
    cleanup(&bus, &manifest);
}

#[test]
fn subscriptions_of_one_bus_share_the_tail_and_drop_independently() {
    let topic = "sub-share";
    let Some((bus, manifest)) = bus_with("subscriptions_share_the_tail", topic, 1) else {
        return;
    };
    publish_n(&bus, topic, "k", 2);
    let subscribe = |start| {
        bus.subscribe(
            topic,
            Selector::Partition(0),
            start,
            SubscribeOptions::default(),
        )
        .unwrap_or_else(|e| panic!("subscribe: {e}"))
    };
    // One at the tail (the shared consumer starts at offset 2), one from
    // the start (history fetched, then the tail).
    let mut tail = subscribe(StartAt::Now);
    let mut whole = subscribe(StartAt::Beginning);
    publish_n(&bus, topic, "k", 3);
    assert_eq!(offsets(&take(&mut tail, 3)), vec![2, 3, 4]);
    assert_eq!(offsets(&take(&mut whole, 5)), vec![0, 1, 2, 3, 4]);
    // A late one starting inside what the shared consumer holds.
    let mut late = subscribe(StartAt::Offset(3));
    drop(tail);
    publish_n(&bus, topic, "k", 1);
    assert_eq!(offsets(&take(&mut whole, 1)), vec![5]);
    assert_eq!(offsets(&take(&mut late, 3)), vec![3, 4, 5]);
    drop(whole);
    publish_n(&bus, topic, "k", 1);
    assert_eq!(offsets(&take(&mut late, 1)), vec![6]);
    assert!(matches!(late.try_recv(), Ok(None)), "nothing more");
    drop(late);
    cleanup(&bus, &manifest);
}
