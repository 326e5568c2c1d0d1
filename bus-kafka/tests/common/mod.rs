//! Shared by the broker tests: where the broker is, raw clients around the
//! bus, the conformance suite's harness (`harness`).
#![allow(dead_code)]

pub mod harness;
pub mod kraft;
pub mod own;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bus_core::BusError;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

/// `BUS_KAFKA_BROKERS` (or a testcontainers broker), or why the broker tests cannot run.
pub fn brokers() -> Result<String, String> {
    bus_conformance::brokers::kafka_brokers()
        .map(|brokers| brokers.trim().to_owned())
        .map_err(|why| why.0)
}

/// Skips loudly, or fails under `BUS_REQUIRE_BROKERS=1`.
pub fn skip(test: &str, why: &str) {
    assert!(
        !bus_conformance::brokers_required(),
        "{test}: BUS_REQUIRE_BROKERS=1 but {why}"
    );
    bus_conformance::loud(&format!("SKIPPED kafka::{test}: {why}"));
}

/// Produces one record straight into a Kafka topic, as a foreign client.
pub fn produce_raw(
    brokers: &str,
    topic: &str,
    partition: u32,
    key: &str,
    value: &[u8],
    headers: &[(&str, Vec<u8>)],
) -> Result<(), BusError> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .map_err(|e| BusError::backend("kafka", e.to_string()))?;
    let mut owned = OwnedHeaders::new();
    for (name, value) in headers {
        owned = owned.insert(Header {
            key: name,
            value: Some(value.as_slice()),
        });
    }
    let record = BaseRecord::to(topic)
        .partition(i32::try_from(partition).unwrap_or(0))
        .key(key)
        .payload(value)
        .headers(owned);
    producer
        .send(record)
        .map_err(|(e, _)| BusError::backend("kafka", e.to_string()))?;
    producer
        .flush(Duration::from_secs(10))
        .map_err(|e| BusError::backend("kafka", e.to_string()))
}

/// Whether the cluster lists `topic` (an all-topics metadata request, which
/// never auto-creates anything).
pub fn topic_exists(brokers: &str, topic: &str) -> bool {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "bus-test-metadata")
        .set("allow.auto.create.topics", "false")
        .create()
        .unwrap_or_else(|e| panic!("consumer: {e}"));
    let metadata = consumer
        .fetch_metadata(None, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("metadata: {e}"));
    metadata.topics().iter().any(|t| t.name() == topic)
}

/// Deletes Kafka topics by name, ignoring failures (best-effort cleanup).
pub fn delete_raw_topics(brokers: &str, topics: &[String]) {
    let Ok(admin) = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create::<AdminClient<DefaultClientContext>>()
    else {
        return;
    };
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    if let Ok(runtime) = runtime {
        let _ = runtime.block_on(admin.delete_topics(&names, &AdminOptions::new()));
    }
}

/// What a durable consumer in a fault test handled and acknowledged.
#[derive(Default)]
pub struct Tally {
    pub handled: BTreeMap<(u32, u64), u32>,
    pub durable: BTreeSet<(u32, u64)>,
    /// Acknowledged, not yet durable (the write failed in the outage).
    pub pending: BTreeSet<(u32, u64)>,
    pub after_ack: u64,
}

impl Tally {
    /// One step: make pending acks durable, else handle and ack a record.
    pub fn step(&mut self, consumer: &mut bus_core::consumer::Consumer) -> Result<(), BusError> {
        if !self.pending.is_empty() {
            consumer.flush()?;
            self.durable.append(&mut self.pending);
            return Ok(());
        }
        let Some(delivery) = consumer.recv_timeout(Duration::from_millis(200))? else {
            return Ok(());
        };
        let at = (delivery.partition, delivery.offset);
        if self.durable.contains(&at) {
            self.after_ack += 1;
        }
        *self.handled.entry(at).or_default() += 1;
        self.pending.insert(at);
        consumer.ack(&delivery)?;
        self.durable.append(&mut self.pending);
        Ok(())
    }
}
