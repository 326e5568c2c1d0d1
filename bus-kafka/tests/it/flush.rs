//! `KafkaOptions::flush_each_message` on the shared broker (C15, #29): the
//! bus's topics and its manifest topic are created with `flush.messages=1`
//! and `capabilities()` says an ack means `Disk`; without the option it
//! says what the broker's own `log.flush.interval.messages` decides; an
//! existing topic that does not flush each message is refused (a
//! `Conflict` naming it), with nothing created. That an ack then survives a
//! power cut is `tests/power_cut.rs`.

use crate::common;

use std::time::Duration;

use bus_core::{AckDurability, BusError, EventBus, Manifest, TopicSpec};
use bus_kafka::{KafkaBus, KafkaOptions, kafka_topic_name};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use serde_json::json;

/// A config value of a topic or broker.
fn config(brokers: &str, resource: ResourceSpecifier<'_>, name: &str) -> Option<String> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap_or_else(|e| panic!("admin: {e}"));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    let configs = runtime
        .block_on(admin.describe_configs(&[resource], &AdminOptions::new()))
        .unwrap_or_else(|e| panic!("describe_configs: {e}"));
    configs
        .into_iter()
        .next()
        .and_then(Result::ok)
        .and_then(|config| config.get(name).and_then(|entry| entry.value.clone()))
}

/// Whether every broker flushes each message (what the bus should find).
fn brokers_flush(brokers: &str) -> bool {
    let consumer: rdkafka::consumer::BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "bus-test-metadata")
        .create()
        .unwrap_or_else(|e| panic!("consumer: {e}"));
    let metadata =
        rdkafka::consumer::Consumer::fetch_metadata(&consumer, None, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("metadata: {e}"));
    metadata.brokers().iter().all(|broker| {
        config(
            brokers,
            ResourceSpecifier::Broker(broker.id()),
            "log.flush.interval.messages",
        )
        .as_deref()
            == Some("1")
    })
}

fn topic_flush(brokers: &str, kafka_topic: &str) -> Option<String> {
    config(
        brokers,
        ResourceSpecifier::Topic(kafka_topic),
        "flush.messages",
    )
}

#[test]
fn flush_each_message_flushes_the_bus_topics_and_acks_mean_disk() {
    let test = "flush_each_message_flushes_the_bus_topics_and_acks_mean_disk";
    let brokers = match common::brokers() {
        Ok(brokers) => brokers,
        Err(why) => return common::skip(test, &why),
    };
    let id = &uuid::Uuid::new_v4().simple().to_string()[..12];
    let (flushed_manifest, plain_manifest) = (
        format!("bus-test-flushed-manifest-{id}"),
        format!("bus-test-plain-manifest-{id}"),
    );
    let (audit, plain, other) = (
        format!("flush-audit-{id}"),
        format!("flush-plain-{id}"),
        format!("flush-other-{id}"),
    );
    let options = |manifest: &str, flush: bool| {
        KafkaOptions::new([brokers.clone()])
            .manifest_topic(manifest)
            .flush_each_message(flush)
    };

    // Without the option the bus says what the broker decides.
    let plain_bus = KafkaBus::connect_with(options(&plain_manifest, false))
        .unwrap_or_else(|e| panic!("connect: {e}"));
    let durability = plain_bus.capabilities().ack_durability;
    assert_eq!(
        durability == AckDurability::Disk,
        brokers_flush(&brokers),
        "{durability:?}"
    );
    plain_bus
        .provision(&Manifest::new([TopicSpec::new(&plain, 1)]))
        .unwrap_or_else(|e| panic!("provision plain: {e}"));

    // With it: its manifest topic and its topics flush each message.
    let bus = KafkaBus::connect_with(options(&flushed_manifest, true))
        .unwrap_or_else(|e| panic!("connect flushed: {e}"));
    assert_eq!(bus.capabilities().ack_durability, AckDurability::Disk);
    bus.provision(&Manifest::new([TopicSpec::new(&audit, 2)]))
        .unwrap_or_else(|e| panic!("provision flushed: {e}"));
    assert_eq!(
        topic_flush(&brokers, &flushed_manifest).as_deref(),
        Some("1")
    );
    assert_eq!(
        topic_flush(&brokers, &kafka_topic_name(&audit)).as_deref(),
        Some("1")
    );
    let ack = bus
        .publish_idempotent(&audit, "k", &json!({ "n": 1 }), "uid-1")
        .unwrap_or_else(|e| panic!("publish: {e}"));
    let events = bus
        .fetch(&audit, ack.partition, ack.offset, 1)
        .unwrap_or_else(|e| panic!("fetch: {e}"));
    assert_eq!(events[0].value, json!({ "n": 1 }));
    // Provisioning again verifies, and passes.
    bus.provision(&Manifest::new([TopicSpec::new(&audit, 2)]))
        .unwrap_or_else(|e| panic!("provision again: {e}"));
    if !brokers_flush(&brokers) {
        // A topic created without it is refused, naming it, before
        // anything of the manifest is created.
        let refused = bus.provision(&Manifest::new([
            TopicSpec::new(&other, 1),
            TopicSpec::new(&plain, 1),
        ]));
        assert!(
            matches!(&refused, Err(BusError::Conflict { topic, property, .. })
                if *topic == plain && property == "flush.messages"),
            "{refused:?}"
        );
        assert!(!common::topic_exists(&brokers, &kafka_topic_name(&other)));
        // So is a manifest topic created without it, at connect.
        let refused = KafkaBus::connect_with(options(&plain_manifest, true));
        assert!(
            matches!(&refused, Err(BusError::Conflict { topic, property, .. })
                if *topic == plain_manifest && property == "flush.messages"),
            "{refused:?}"
        );
    }

    let _ = bus.delete_topics(&[audit]);
    let _ = plain_bus.delete_topics(&[plain]);
    common::delete_raw_topics(&brokers, &[flushed_manifest, plain_manifest]);
}
