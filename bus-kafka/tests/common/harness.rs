//! The conformance suite's harness for a real Kafka broker
//! (`BUS_KAFKA_BROKERS`). Each case gets its own manifest topic, so its
//! topics are its own; a reopen is a new `KafkaBus` on the same broker.

use bus_conformance::{Harness, Namespace, RawRecord, Unavailable};
use bus_core::auth::to_hex;
use bus_core::{BusError, EventBus};
use bus_kafka::{KafkaBus, KafkaOptions, kafka_topic_name};

/// The suite's harness; `through_async` runs every case through the async
/// surface of a bus made by `KafkaBus::connect_async`.
pub struct Kafka {
    pub through_async: bool,
}

impl Harness for Kafka {
    fn backend(&self) -> &'static str {
        "kafka"
    }

    fn namespace(&self) -> Result<Box<dyn Namespace>, Unavailable> {
        let brokers = super::brokers().map_err(Unavailable)?;
        Ok(Box::new(CaseNamespace {
            through_async: self.through_async,
            brokers,
            manifest_topic: format!("bus-test-manifest-{}", bus_conformance::namespace_id(16)),
        }))
    }
}

struct CaseNamespace {
    through_async: bool,
    brokers: String,
    manifest_topic: String,
}

impl CaseNamespace {
    fn options(&self) -> KafkaOptions {
        KafkaOptions::new(self.brokers.split(',').map(str::to_owned))
            .manifest_topic(self.manifest_topic.clone())
    }
}

impl Namespace for CaseNamespace {
    fn open(&mut self) -> Result<Box<dyn EventBus>, BusError> {
        let options = self.options();
        #[cfg(feature = "async")]
        if self.through_async {
            return Ok(Box::new(bus_conformance::ThroughAsync::build(|| {
                KafkaBus::connect_async_with(options)
            })?));
        }
        assert!(!self.through_async, "the async surface needs feature async");
        Ok(Box::new(KafkaBus::connect_with(options)?))
    }

    fn inject_raw(
        &mut self,
        _bus: &mut Option<Box<dyn EventBus>>,
        topic: &str,
        partition: u32,
        raw: &RawRecord,
    ) -> Result<(), BusError> {
        let mut headers = Vec::new();
        if let Some(uid) = &raw.uid {
            headers.push(("bus-uid", uid.as_bytes().to_vec()));
        }
        if let Some(tag) = &raw.tag {
            headers.push(("bus-tag", to_hex(tag).into_bytes()));
        }
        // The caller's headers (C25) as the bus writes them.
        for (name, value) in raw.headers.iter() {
            headers.push((name, value.as_bytes().to_vec()));
        }
        super::produce_raw(
            &self.brokers,
            &kafka_topic_name(topic),
            partition,
            &raw.key,
            &raw.value,
            &headers,
        )
    }
}

impl Drop for CaseNamespace {
    fn drop(&mut self) {
        // Best effort: the case's topics, then its manifest topic.
        if let Ok(bus) = KafkaBus::connect_with(self.options()) {
            let _ = bus.delete_topics(&bus.topics());
        }
        super::delete_raw_topics(&self.brokers, std::slice::from_ref(&self.manifest_topic));
    }
}
