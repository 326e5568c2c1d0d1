//! The durable-consumer cases (C20–C23) on Kafka (`BUS_KAFKA_BROKERS`):
//! each case owns a manifest topic (so its topics and its cursor topic are
//! its own), deleted with them when the case ends; a restart is a new
//! `KafkaBus` on the same manifest topic.

mod common;

use bus_conformance::Unavailable;
use bus_conformance::consumers::{ConsumerBus, ConsumerHarness, ConsumerNamespace};
use bus_core::{BusError, EventBus};
use bus_kafka::{KafkaBus, KafkaOptions};

struct Kafka;

struct KafkaNamespace {
    brokers: String,
    manifest_topic: String,
}

impl KafkaNamespace {
    fn options(&self) -> KafkaOptions {
        KafkaOptions::new(self.brokers.split(',').map(str::to_owned))
            .manifest_topic(self.manifest_topic.clone())
    }
}

impl ConsumerHarness for Kafka {
    fn backend(&self) -> &'static str {
        "kafka"
    }

    fn namespace(&self) -> Result<Box<dyn ConsumerNamespace>, Unavailable> {
        let brokers = common::brokers().map_err(Unavailable)?;
        Ok(Box::new(KafkaNamespace {
            brokers,
            manifest_topic: format!("bus-test-consumers-{}", bus_conformance::namespace_id(16)),
        }))
    }
}

impl ConsumerNamespace for KafkaNamespace {
    fn open(&mut self) -> Result<Box<dyn ConsumerBus>, BusError> {
        Ok(Box::new(KafkaBus::connect_with(self.options())?))
    }
}

impl Drop for KafkaNamespace {
    fn drop(&mut self) {
        // Best effort: the case's topics, its cursor topic, its manifest.
        let mut raw = vec![self.manifest_topic.clone()];
        if let Ok(bus) = KafkaBus::connect_with(self.options()) {
            let _ = bus.delete_topics(&bus.topics());
            raw.push(bus.cursor_topic());
        }
        common::delete_raw_topics(&self.brokers, &raw);
    }
}

bus_conformance::consumer_suite!(Kafka);

/// The same cases with a cold tier under every bus (C24): what a consumer
/// has not acknowledged is read from the tier below the hot records (the
/// S3 server of the tests when BUS_S3_ENDPOINT is set, else local files).
mod cold {
    use super::Kafka;

    bus_conformance::cold_consumer_suite!(Kafka);
}
