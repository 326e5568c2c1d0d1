//! C1 when the cluster's metadata does not show a topic the manifest topic
//! records: a broker whose metadata lags (a 3-node cluster under load), or
//! a Kafka topic deleted behind the bus's back. The recorded spec still
//! decides: a manifest that differs from it is a conflict and nothing is
//! recorded or created; one that matches brings the Kafka topic back with
//! the recorded spec. (CI's cluster lane once saw a provision with another
//! retention succeed and overwrite the recorded spec this way.)

use crate::common;

use std::time::Duration;

use bus_conformance::util::poll_until;
use bus_core::{BusError, EventBus, Manifest, TopicSpec};
use bus_kafka::{KafkaBus, KafkaOptions, kafka_topic_name};

/// Polls until the cluster's metadata shows `topic` present (or absent).
fn wait_until_listed(brokers: &str, topic: &str, present: bool) {
    let what = format!(
        "topic {topic:?} to be {}",
        if present { "listed" } else { "gone" }
    );
    poll_until(&what, Duration::from_secs(30), || {
        (common::topic_exists(brokers, topic) == present).then_some(())
    });
}

#[test]
fn the_recorded_spec_decides_when_metadata_lacks_the_topic() {
    let test = "the_recorded_spec_decides_when_metadata_lacks_the_topic";
    let brokers = match common::brokers() {
        Ok(brokers) => brokers,
        Err(why) => return common::skip(test, &why),
    };
    let id = uuid::Uuid::new_v4().simple().to_string();
    let manifest_topic = format!("bus-test-manifest-{}", &id[..16]);
    let options = KafkaOptions::new([brokers.clone()]).manifest_topic(manifest_topic.clone());
    let bus = KafkaBus::connect_with(options.clone()).unwrap_or_else(|e| panic!("connect: {e}"));
    let topic = format!("lagging-{}", &id[..12]);
    let recorded = TopicSpec::new(topic.clone(), 2).with_retention_ms(60_000);
    bus.provision(&Manifest::new([recorded.clone()]))
        .unwrap_or_else(|e| panic!("provision: {e}"));
    let kafka = kafka_topic_name(&topic);
    common::delete_raw_topics(&brokers, std::slice::from_ref(&kafka));
    wait_until_listed(&brokers, &kafka, false);

    for (spec, property) in [
        (
            TopicSpec::new(topic.clone(), 3).with_retention_ms(60_000),
            "partitions",
        ),
        (
            TopicSpec::new(topic.clone(), 2).with_retention_ms(5_000),
            "retention_ms",
        ),
        (
            TopicSpec::new(topic.clone(), 2)
                .with_retention_ms(60_000)
                .with_dedup_window_ms(7),
            "dedup_window_ms",
        ),
    ] {
        let result = bus.provision(&Manifest::new([spec]));
        assert!(
            matches!(result, Err(BusError::Conflict { property: ref p, .. }) if p == property),
            "{property}: {result:?}"
        );
        assert!(
            !common::topic_exists(&brokers, &kafka),
            "a refused provision created the Kafka topic"
        );
    }
    // Another bus reading the manifest topic afresh sees the recorded spec.
    let other = KafkaBus::connect_with(options).unwrap_or_else(|e| panic!("connect: {e}"));
    assert_eq!(
        other
            .topic_spec(&topic)
            .unwrap_or_else(|e| panic!("topic_spec: {e}")),
        Some(recorded.clone())
    );

    bus.provision(&Manifest::new([recorded.clone()]))
        .unwrap_or_else(|e| panic!("provision of the recorded spec: {e}"));
    wait_until_listed(&brokers, &kafka, true);
    assert_eq!(
        bus.partitions(&topic)
            .unwrap_or_else(|e| panic!("partitions: {e}")),
        2
    );
    let ack = bus
        .publish(&topic, "k", &serde_json::json!({"back": true}))
        .unwrap_or_else(|e| panic!("publish: {e}"));
    let read = bus
        .fetch(&topic, ack.partition, ack.offset, 1)
        .unwrap_or_else(|e| panic!("fetch: {e}"));
    assert_eq!(read.len(), 1);
    common::delete_raw_topics(&brokers, &[kafka, manifest_topic]);
}
