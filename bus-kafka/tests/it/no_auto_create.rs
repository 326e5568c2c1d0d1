//! C2 against a broker that auto-creates topics: the bus refuses unknown
//! topics before anything reaches the broker, so the topic still does not
//! exist afterwards, while a raw client writing to an unknown topic does
//! create it (which proves the broker would have).

use crate::common;

use std::time::Duration;

use bus_core::{BatchRecord, BusError, EventBus};
use bus_kafka::{KafkaBus, KafkaOptions, kafka_topic_name};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use serde_json::json;

fn auto_create_enabled(brokers: &str) -> bool {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap_or_else(|e| panic!("admin: {e}"));
    let metadata = admin
        .inner()
        .fetch_metadata(None, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("metadata: {e}"));
    let id = metadata.brokers().first().map_or(1, |broker| broker.id());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    let configs = runtime
        .block_on(admin.describe_configs(&[ResourceSpecifier::Broker(id)], &AdminOptions::new()))
        .unwrap_or_else(|e| panic!("describe_configs: {e}"));
    let config = configs
        .into_iter()
        .next()
        .and_then(Result::ok)
        .unwrap_or_else(|| panic!("no broker config"));
    config
        .get("auto.create.topics.enable")
        .and_then(|entry| entry.value.clone())
        .is_some_and(|value| value == "true")
}

#[test]
fn unknown_topics_are_refused_and_never_auto_created() {
    let brokers = match common::brokers() {
        Ok(brokers) => brokers,
        Err(why) => return common::skip("unknown_topics_are_refused_and_never_auto_created", &why),
    };
    assert!(
        auto_create_enabled(&brokers),
        "this test needs a broker with auto.create.topics.enable=true (the default)"
    );
    let id = uuid::Uuid::new_v4().simple().to_string();
    let manifest_topic = format!("bus-test-manifest-{}", &id[..16]);
    let bus = KafkaBus::connect_with(
        KafkaOptions::new([brokers.clone()]).manifest_topic(manifest_topic.clone()),
    )
    .unwrap_or_else(|e| panic!("connect: {e}"));
    let ghost = format!("ghost-{}", &id[..12]);
    let value = json!({"x": 1});
    let unknown = |result: Result<(), BusError>| {
        assert!(
            matches!(result, Err(BusError::UnknownTopic(ref t)) if *t == ghost),
            "{result:?}"
        );
    };
    unknown(bus.publish(&ghost, "k", &value).map(drop));
    unknown(bus.publish_idempotent(&ghost, "k", &value, "u").map(drop));
    unknown(
        bus.publish_batch(&ghost, &[BatchRecord::new("k", value.clone())])
            .map(drop),
    );
    unknown(bus.fetch(&ghost, 0, 0, 10).map(drop));
    unknown(bus.find_event_by_uid(&ghost, "k", "u").map(drop));
    unknown(bus.partitions(&ghost).map(drop));
    assert!(!bus.topics().contains(&ghost));
    for name in [ghost.clone(), kafka_topic_name(&ghost)] {
        assert!(
            !common::topic_exists(&brokers, &name),
            "{name} exists on the broker after the bus refused it"
        );
    }

    // Control: a raw producer writing to an unknown topic makes the broker create it.
    let control = format!("ghost-control-{}", &id[..12]);
    common::produce_raw(&brokers, &control, 0, "k", b"{}", &[])
        .unwrap_or_else(|e| panic!("raw produce: {e}"));
    assert!(
        common::topic_exists(&brokers, &control),
        "the broker did not auto-create {control}: the test proves nothing"
    );
    common::delete_raw_topics(&brokers, &[control, manifest_topic]);
}

/// `topic_spec` reports the spec recorded in the manifest topic, the one
/// provision verifies against: a second bus on the same manifest topic reads
/// it back equal, and an unknown topic is `UnknownTopic`.
#[test]
fn topic_spec_reads_back_the_provisioned_spec() {
    let brokers = match common::brokers() {
        Ok(brokers) => brokers,
        Err(why) => return common::skip("topic_spec_reads_back_the_provisioned_spec", &why),
    };
    let id = uuid::Uuid::new_v4().simple().to_string();
    let manifest_topic = format!("bus-test-manifest-{}", &id[..16]);
    let options = || KafkaOptions::new([brokers.clone()]).manifest_topic(manifest_topic.clone());
    let bus = KafkaBus::connect_with(options()).unwrap_or_else(|e| panic!("connect: {e}"));
    let topic = format!("described-{}", &id[..12]);
    let spec = bus_core::TopicSpec::new(topic.clone(), 2)
        .with_retention_ms(3_600_000)
        .with_dedup_window_ms(5_000)
        .with_max_record_bytes(4_096);
    bus.provision(&bus_core::Manifest::new([spec.clone()]))
        .unwrap_or_else(|e| panic!("provision: {e}"));
    assert_eq!(bus.topic_spec(&topic).ok(), Some(Some(spec.clone())));
    let other = KafkaBus::connect_with(options()).unwrap_or_else(|e| panic!("connect: {e}"));
    assert_eq!(other.topic_spec(&topic).ok(), Some(Some(spec)));
    let ghost = format!("ghost-{}", &id[..12]);
    let unknown = other.topic_spec(&ghost);
    assert!(
        matches!(unknown, Err(BusError::UnknownTopic(ref t)) if *t == ghost),
        "{unknown:?}"
    );
    common::delete_raw_topics(&brokers, &[kafka_topic_name(&topic), manifest_topic]);
}
