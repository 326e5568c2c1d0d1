//! Issue 19 on whatever `BUS_KAFKA_BROKERS` is (one broker in CI, three
//! with scripts/kafka-cluster.sh): `capabilities().ack_durability` follows
//! the broker count, a replication factor above it is `InvalidArgument`
//! naming the field with nothing of the manifest created, and a factor that
//! fits gets `min.insync.replicas` 2 from 3 replicas up (1 below).

mod common;

use std::time::Duration;

use bus_core::{AckDurability, BusError, EventBus, Manifest, TopicSpec};
use bus_kafka::{KafkaBus, KafkaOptions, kafka_topic_name};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;

fn admin(brokers: &str) -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap_or_else(|e| panic!("admin: {e}"))
}

fn broker_count(brokers: &str) -> usize {
    admin(brokers)
        .inner()
        .fetch_metadata(None, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("metadata: {e}"))
        .brokers()
        .len()
}

fn min_insync(brokers: &str, topic: &str) -> String {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    let admin = admin(brokers);
    let configs = runtime
        .block_on(admin.describe_configs(
            &[ResourceSpecifier::Topic(topic)],
            &AdminOptions::new().request_timeout(Some(Duration::from_secs(10))),
        ))
        .unwrap_or_else(|e| panic!("describe: {e}"));
    configs
        .into_iter()
        .find_map(|config| {
            config
                .ok()?
                .get("min.insync.replicas")
                .and_then(|entry| entry.value.clone())
        })
        .expect("min.insync.replicas")
}

#[test]
fn replication_factor_follows_the_cluster() {
    let brokers = match common::brokers() {
        Ok(brokers) => brokers,
        Err(why) => return common::skip("replication", &why),
    };
    let nodes = broker_count(&brokers);
    let id = uuid::Uuid::new_v4().simple().to_string();
    let bus = KafkaBus::connect_with(
        KafkaOptions::new([brokers.clone()])
            .manifest_topic(format!("bus-test-manifest-{}", &id[..16])),
    )
    .unwrap_or_else(|e| panic!("connect: {e}"));
    let expected = if nodes >= 3 {
        AckDurability::Replicated { min_insync: 2 }
    } else {
        AckDurability::None
    };
    assert_eq!(
        bus.capabilities().ack_durability,
        expected,
        "{nodes} broker(s)"
    );

    let good = format!("rf-good-{}", &id[..12]);
    let big = format!("rf-big-{}", &id[..12]);
    let too_many = u16::try_from(nodes + 1).expect("few brokers");
    let result = bus.provision(&Manifest::new([
        TopicSpec::new(good.clone(), 1),
        TopicSpec::new(big.clone(), 1).with_replication_factor(too_many),
    ]));
    assert!(
        matches!(&result, Err(BusError::InvalidArgument { field, .. })
            if field == "topics[1].replication_factor"),
        "{result:?}"
    );
    assert!(!common::topic_exists(&brokers, &kafka_topic_name(&good)));
    assert!(!common::topic_exists(&brokers, &kafka_topic_name(&big)));
    assert!(!bus.topics().contains(&good));

    let fits = u16::try_from(nodes.min(3)).expect("few brokers");
    bus.provision(&Manifest::new([
        TopicSpec::new(good.clone(), 1).with_replication_factor(fits)
    ]))
    .unwrap_or_else(|e| panic!("provision at {fits}: {e}"));
    let want = if fits >= 3 { "2" } else { "1" };
    assert_eq!(min_insync(&brokers, &kafka_topic_name(&good)), want);
    common::delete_raw_topics(&brokers, &[kafka_topic_name(&good)]);
}
