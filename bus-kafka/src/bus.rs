//! The [`EventBus`] implementation: each method checks the topic against the
//! manifest first, then does its Kafka work on the connector.

use bus_core::auth::RecordAuth;
use bus_core::{
    BatchRecord, BusError, Capabilities, DedupHorizon, EventBus, Manifest, PartitionOffsets,
    PublishAck, Selector, StartAt, StoredEvent, SubscribeOptions, Subscription,
    backend::check_partition, backend::uid_partition,
};

use crate::{KafkaBus, fetch, topics};
use bus_core::backend::sync::lock;

impl EventBus for KafkaBus {
    fn set_control_key(&self, key: [u8; 32]) -> Result<(), BusError> {
        let mut slot = self
            .core
            .auth
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *slot = Some(RecordAuth::new(&key));
        drop(slot);
        // Which records hold a UID depends on the key: index again.
        let states: Vec<_> = lock(&self.core.partitions).values().cloned().collect();
        for state in states {
            lock(&state.index).reset();
        }
        Ok(())
    }

    fn publish(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
    ) -> Result<PublishAck, BusError> {
        self.publish_one(topic, key, value, None)
    }

    /// A malformed UID is refused before anything is written (contract C12).
    fn publish_idempotent(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
        event_uid: &str,
    ) -> Result<PublishAck, BusError> {
        bus_core::backend::validate_uid(event_uid)?;
        self.publish_one(topic, key, value, Some(event_uid))
    }
    fn find_event_by_uid(
        &self,
        topic: &str,
        key: &str,
        event_uid: &str,
    ) -> Result<Option<PublishAck>, BusError> {
        let entry = self.entry(topic)?;
        let partition = uid_partition(&entry.spec, key, event_uid)?;
        let (core, deadline, uid) = (&self.core, self.deadline(), event_uid);
        let offset = {
            let state = {
                let mut map = lock(&core.partitions);
                std::sync::Arc::clone(map.entry((entry.spec.name.clone(), partition)).or_default())
            };
            let mut index = state.lock_until(&core.options, deadline)?;
            index.settle();
            let kafka_partition = i32::try_from(partition).unwrap_or(i32::MAX);
            let auth = core.auth();
            let checker = crate::dedup::Checker {
                topic: &entry.spec.name,
                partition,
                auth: auth.as_ref(),
            };
            index.catch_up(
                core,
                &entry.kafka_topic,
                kafka_partition,
                entry.spec.dedup_window_ms,
                deadline,
                checker,
            )?;
            match index.get(uid) {
                Some(offset) => Some(offset),
                None => index.search_tail(
                    core,
                    &entry.kafka_topic,
                    kafka_partition,
                    uid,
                    deadline,
                    checker,
                )?,
            }
        };
        Ok(offset.map(|offset| PublishAck {
            topic: topic.to_owned(),
            partition,
            offset,
        }))
    }
    fn fetch(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, BusError> {
        let entry = self.entry(topic)?;
        check_partition(topic, partition, entry.spec.partitions)?;
        if max == 0 {
            return Ok(Vec::new());
        }
        let kafka_partition = i32::try_from(partition).unwrap_or(i32::MAX);
        let core = &self.core;
        let auth = core.auth();
        let decoded = core.pool.read(
            &core.options,
            &entry.kafka_topic,
            kafka_partition,
            offset,
            max,
            self.deadline(),
            |message| fetch::decode_one(topic, partition, message, auth.as_ref()),
        )?;
        fetch::authentic_prefix(decoded)
    }
    fn offsets(&self, topic: &str, partition: u32) -> Result<PartitionOffsets, BusError> {
        let entry = self.entry(topic)?;
        check_partition(topic, partition, entry.spec.partitions)?;
        let core = &self.core;
        let (first, next) = core.pool.watermarks(
            &core.options,
            &entry.kafka_topic,
            i32::try_from(partition).unwrap_or(i32::MAX),
            self.deadline(),
        )?;
        Ok(PartitionOffsets { first, next })
    }

    fn partitions(&self, topic: &str) -> Result<u32, BusError> {
        Ok(self.entry(topic)?.spec.partitions)
    }

    fn topics(&self) -> Vec<String> {
        let core = &self.core;
        let mut registry = lock(&core.registry);
        // On a failed refresh, the last known set.
        let _ = registry.refresh(&core.options, &core.pool.meta(), self.deadline());
        registry.entries().keys().cloned().collect()
    }
    fn maintenance(&self, _now_ms: u64) -> Result<u64, BusError> {
        // Kafka enforces retention.ms itself.
        Ok(0)
    }
    fn provision(&self, manifest: &Manifest) -> Result<(), BusError> {
        manifest.validate()?;
        let manifest = manifest.clone();
        self.blocking("provision", move |core, deadline| {
            topics::provision(core, &manifest, deadline)
        })
    }

    /// The spec recorded in the manifest topic, the record `provision`
    /// verifies an existing topic against (C1). The registry is read afresh
    /// first, so a topic another bus provisioned or deleted shows as it is.
    fn topic_spec(&self, topic: &str) -> Result<Option<bus_core::TopicSpec>, BusError> {
        bus_core::backend::validate_topic(topic)?;
        let core = &self.core;
        let mut registry = lock(&core.registry);
        registry.refresh(&core.options, &core.pool.meta(), self.deadline())?;
        registry
            .cached(topic)
            .map(|entry| Some(entry.spec.clone()))
            .ok_or_else(|| BusError::UnknownTopic(topic.to_owned()))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::minimal("kafka")
            .durable(true)
            .dedup_horizon(DedupHorizon::Window)
            .native_batch(true)
            .native_retention(self.core.native_retention)
            // A broker never fsyncs by itself: an ack is durable only by
            // replication, which needs three brokers (topics at RF >= 3 get
            // min.insync.replicas = 2).
            .ack_durability(if self.core.brokers >= 3 {
                bus_core::AckDurability::Replicated { min_insync: 2 }
            } else {
                bus_core::AckDurability::None
            })
    }
    fn publish_batch(
        &self,
        topic: &str,
        records: &[BatchRecord],
    ) -> Result<Vec<PublishAck>, BusError> {
        self.publish_many(topic, records)
    }
    fn subscribe(
        &self,
        topic: &str,
        selector: Selector,
        start: StartAt,
        options: SubscribeOptions,
    ) -> Result<Subscription, BusError> {
        self.subscribe_live(topic, &selector, start, options)
    }
}
