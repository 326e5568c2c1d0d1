//! TEMPORARY (issue #28): a bus whose durable-consumer calls are refused,
//! for the backends whose `DurableConsumers` implementation has not landed
//! yet (NATS: branch consumers-nats; Kafka: branch consumers-kafka). It
//! lets `bus::connect_consumers` return a [`crate::Bus`] for every URL now,
//! with a clear error instead of a compile error. Delete this file once
//! both are wired in `consumers.rs`.
//!
//! The refusal is [`BusError::Unsupported`]: the operation is one the
//! backend, as compiled, does not offer (the `bus` command maps it to exit
//! 2, bad usage, like any other unsupported operation), and nothing is
//! stored or fenced.

// Only the nats and kafka arms use it; other builds keep it compiled (and
// its test run) so it cannot rot before the lead deletes it.
#![cfg_attr(not(any(feature = "nats", feature = "kafka")), allow(dead_code))]

use bus_core::consumer::{ConsumeOptions, Consumer, ConsumerInfo, DurableConsumers};
use bus_core::{
    BatchRecord, BusError, Capabilities, EventBus, Manifest, PartitionOffsets, PublishAck,
    Selector, StartAt, StoredEvent, SubscribeOptions, Subscription, TopicSpec,
};

/// `B`'s [`EventBus`] unchanged (every method forwarded, provided ones
/// included, so a backend's own `publish_batch` or `offsets` is kept), and
/// [`DurableConsumers`] refused.
#[derive(Debug)]
pub(crate) struct Unconsumable<B> {
    inner: B,
}

impl<B: EventBus> Unconsumable<B> {
    pub(crate) fn new(inner: B) -> Self {
        Self { inner }
    }

    fn refused(&self, operation: &str) -> BusError {
        BusError::Unsupported {
            operation: format!(
                "{operation} (durable consumers, C20-C23, are not wired into the facade for this backend yet)"
            ),
            backend: self.inner.capabilities().backend.to_owned(),
        }
    }
}

impl<B: EventBus> DurableConsumers for Unconsumable<B> {
    fn consume(
        &self,
        _topic: &str,
        _name: &str,
        _selector: Selector,
        _start_if_new: StartAt,
        _options: ConsumeOptions,
    ) -> Result<Consumer, BusError> {
        Err(self.refused("consume"))
    }

    fn consumers(&self, _topic: &str) -> Result<Vec<ConsumerInfo>, BusError> {
        Err(self.refused("consumers"))
    }

    fn reset_consumer(&self, _topic: &str, _name: &str, _start: StartAt) -> Result<(), BusError> {
        Err(self.refused("reset_consumer"))
    }

    fn delete_consumer(&self, _topic: &str, _name: &str) -> Result<bool, BusError> {
        Err(self.refused("delete_consumer"))
    }
}

impl<B: EventBus> EventBus for Unconsumable<B> {
    fn set_control_key(&self, key: [u8; 32]) -> Result<(), BusError> {
        self.inner.set_control_key(key)
    }
    fn publish(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
    ) -> Result<PublishAck, BusError> {
        self.inner.publish(topic, key, value)
    }
    fn publish_idempotent(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
        event_uid: &str,
    ) -> Result<PublishAck, BusError> {
        self.inner.publish_idempotent(topic, key, value, event_uid)
    }
    fn find_event_by_uid(
        &self,
        topic: &str,
        key: &str,
        event_uid: &str,
    ) -> Result<Option<PublishAck>, BusError> {
        self.inner.find_event_by_uid(topic, key, event_uid)
    }
    fn fetch(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, BusError> {
        self.inner.fetch(topic, partition, offset, max)
    }
    fn partitions(&self, topic: &str) -> Result<u32, BusError> {
        self.inner.partitions(topic)
    }
    fn topics(&self) -> Vec<String> {
        self.inner.topics()
    }
    fn maintenance(&self, now_ms: u64) -> Result<u64, BusError> {
        self.inner.maintenance(now_ms)
    }
    fn provision(&self, manifest: &Manifest) -> Result<(), BusError> {
        self.inner.provision(manifest)
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn topic_spec(&self, topic: &str) -> Result<Option<TopicSpec>, BusError> {
        self.inner.topic_spec(topic)
    }
    fn offsets(&self, topic: &str, partition: u32) -> Result<PartitionOffsets, BusError> {
        self.inner.offsets(topic, partition)
    }
    fn publish_batch(
        &self,
        topic: &str,
        records: &[BatchRecord],
    ) -> Result<Vec<PublishAck>, BusError> {
        self.inner.publish_batch(topic, records)
    }
    fn subscribe(
        &self,
        topic: &str,
        selector: Selector,
        start: StartAt,
        options: SubscribeOptions,
    ) -> Result<Subscription, BusError> {
        self.inner.subscribe(topic, selector, start, options)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use bus_core::memory::MemoryBus;

    /// The plain operations reach the wrapped bus; the consumer calls are
    /// refused with `Unsupported`, naming the backend.
    #[test]
    fn forwards_the_bus_and_refuses_consumers() {
        let bus = bus_core::Traced::new(Unconsumable::new(MemoryBus::new()));
        bus.provision(&Manifest::new([TopicSpec::new("t", 2)]))
            .unwrap();
        let ack = bus.publish("t", "k", &serde_json::json!({"n": 1})).unwrap();
        assert_eq!(bus.fetch("t", ack.partition, 0, 5).unwrap().len(), 1);
        assert_eq!(bus.capabilities().backend, "memory");
        let refused = [
            bus.consume(
                "t",
                "c",
                Selector::Topic,
                StartAt::Beginning,
                ConsumeOptions::default(),
            )
            .err(),
            bus.consumers("t").err(),
            bus.reset_consumer("t", "c", StartAt::Beginning).err(),
            bus.delete_consumer("t", "c").err(),
        ];
        for error in refused {
            assert!(
                matches!(error, Some(BusError::Unsupported { ref backend, .. }) if backend == "memory"),
                "{error:?}"
            );
        }
    }
}
