//! C24 through `ColdBus`: a manifest's `[topics.cold]` must name the bus's
//! own tier (else nothing is provisioned), is shown by `topic_spec`, and its
//! retention is the topic's cold retention in `maintenance`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use bus_cold::{ColdBus, ColdBusOptions, ColdLocation, ColdTier};
use bus_core::memory::MemoryBus;
use bus_core::{BusError, ColdSpec, EventBus, Manifest, TopicSpec};
use serde_json::json;

const HOUR_MS: u64 = 3_600_000;

fn cold_bus(options: ColdBusOptions) -> ColdBus<MemoryBus> {
    let tier = Arc::new(ColdTier::open(&ColdLocation::Memory).unwrap());
    ColdBus::new(MemoryBus::new(), tier, options)
}

#[test]
fn a_declared_location_must_be_the_bus_tier() {
    let bus = cold_bus(ColdBusOptions::default());
    let elsewhere = Manifest::new([
        TopicSpec::new("first", 1),
        TopicSpec::new("second", 1).with_cold(ColdSpec::new("file:///var/lib/elsewhere")),
    ]);
    match bus.provision(&elsewhere).unwrap_err() {
        BusError::InvalidArgument { field, reason } => {
            assert_eq!(field, "topics[1].cold.location");
            assert!(reason.contains("memory:"), "{reason}");
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    assert!(bus.topics().is_empty(), "{:?} provisioned", bus.topics());

    let here = Manifest::new([
        TopicSpec::new("kept", 1).with_cold(ColdSpec::new("memory:").with_retention_ms(HOUR_MS)),
        TopicSpec::new("plain", 1),
    ]);
    bus.provision(&here).unwrap();
    assert_eq!(
        bus.topic_spec("kept").unwrap().unwrap().cold,
        Some(ColdSpec::new("memory:").with_retention_ms(HOUR_MS))
    );
    assert_eq!(bus.topic_spec("plain").unwrap().unwrap().cold, None);
    // The inner bus never sees the section (it would refuse it).
    assert_eq!(bus.inner().topic_spec("kept").unwrap().unwrap().cold, None);
}

#[test]
fn a_declared_retention_overrides_the_bus_default() {
    // The bus's default keeps cold history 1 ms; "kept" declares an hour.
    let bus = cold_bus(ColdBusOptions {
        cold_retention_ms: Some(1),
        ..ColdBusOptions::default()
    });
    bus.provision(&Manifest::new([
        TopicSpec::new("kept", 1).with_cold(ColdSpec::new("memory:").with_retention_ms(HOUR_MS)),
        TopicSpec::new("plain", 1),
    ]))
    .unwrap();
    for topic in ["kept", "plain"] {
        for n in 0..10 {
            bus.publish(topic, "k", &json!({ "n": n })).unwrap();
        }
        bus.archive_and_trim(topic, 0, 10).unwrap();
    }
    bus.maintenance(bus_core::now_ms() + 60_000).unwrap();
    assert_eq!(bus.fetch("kept", 0, 0, 100).unwrap().len(), 10);
    assert_eq!(bus.offsets("kept", 0).unwrap().first, 0);
    assert!(bus.fetch("plain", 0, 0, 100).unwrap().is_empty());
    assert_eq!(bus.offsets("plain", 0).unwrap().first, 10);
    // Two hours on, the declared hour is over too.
    bus.maintenance(bus_core::now_ms() + 2 * HOUR_MS).unwrap();
    assert!(bus.fetch("kept", 0, 0, 100).unwrap().is_empty());
}

/// C24 with C20: a durable consumer of a `ColdBus` that begins below the
/// hot log start is served from the tier, keeps its cursor in the inner
/// bus's store, and resumes after what it acknowledged.
#[test]
fn a_durable_consumer_reads_history_from_the_tier() {
    use bus_core::consumer::{ConsumeOptions, DurableConsumers};
    use bus_core::{Selector, StartAt};
    use std::time::Duration;

    let bus = cold_bus(ColdBusOptions::default());
    bus.provision(&Manifest::new([TopicSpec::new("audit", 1)]))
        .unwrap();
    for n in 0..10 {
        bus.publish("audit", "k", &json!({ "n": n })).unwrap();
    }
    bus.archive_and_trim("audit", 0, 8).unwrap();
    assert_eq!(bus.inner().offsets("audit", 0).unwrap().first, 8);
    let consume = || {
        bus.consume(
            "audit",
            "reader",
            Selector::Topic,
            StartAt::Beginning,
            ConsumeOptions::default(),
        )
        .unwrap()
    };
    let mut consumer = consume();
    for n in 0..6u64 {
        let delivery = consumer
            .recv_timeout(Duration::from_secs(10))
            .unwrap()
            .unwrap_or_else(|| panic!("no delivery of offset {n}"));
        assert_eq!(delivery.offset, n);
        assert_eq!(delivery.event.value, json!({ "n": n }));
        consumer.ack(&delivery).unwrap();
    }
    drop(consumer);
    // The cursor is in the inner bus's store: listed there, and the
    // consumer resumes at 6 (below the hot start: from the tier again).
    let listed = bus.inner().consumers("audit").unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].partitions[0].cursor, 6);
    let mut consumer = consume();
    for n in 6..10u64 {
        let delivery = consumer
            .recv_timeout(Duration::from_secs(10))
            .unwrap()
            .unwrap_or_else(|| panic!("no delivery of offset {n}"));
        assert_eq!(delivery.offset, n);
        consumer.ack(&delivery).unwrap();
    }
}
