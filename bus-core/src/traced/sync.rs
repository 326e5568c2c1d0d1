//! [`EventBus`] for [`Traced`]: each operation in its span of the schema.

use super::Traced;
use crate::subscription::{Selector, StartAt, SubscribeOptions, Subscription};
use crate::{
    BatchRecord, BatchRecordWithHeaders, BusError, Capabilities, EventBus, Headers, Manifest,
    PartitionOffsets, PublishAck, StoredEvent, StoredRecord, TopicSpec,
};

impl<B: EventBus> EventBus for Traced<B> {
    fn set_control_key(&self, key: [u8; 32]) -> Result<(), BusError> {
        self.inner.set_control_key(key)
    }

    fn publish(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
    ) -> Result<PublishAck, BusError> {
        op_span!(self, publish, topic).in_scope(|| self.send(topic, key, value, None, None))
    }

    fn publish_idempotent(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
        event_uid: &str,
    ) -> Result<PublishAck, BusError> {
        op_span!(self, publish_idempotent, topic, event_uid)
            .in_scope(|| self.send(topic, key, value, Some(event_uid), None))
    }

    fn find_event_by_uid(
        &self,
        topic: &str,
        key: &str,
        event_uid: &str,
    ) -> Result<Option<PublishAck>, BusError> {
        op_span!(self, find_event_by_uid, topic, event_uid)
            .in_scope(|| self.inner.find_event_by_uid(topic, key, event_uid))
    }

    fn fetch(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, BusError> {
        op_span!(self, fetch, topic, partition, offset, max).in_scope(|| {
            #[cfg(feature = "otel")]
            let receiving = crate::otel::Receiving::start(self.system, topic, partition);
            let fetched = self.inner.fetch(topic, partition, offset, max);
            #[cfg(feature = "otel")]
            receiving.finish_events(&fetched);
            fetched
        })
    }

    /// In the `bus.publish` span: headers are a publish's argument, not
    /// another operation (C25).
    fn publish_with_headers(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
        event_uid: Option<&str>,
        headers: &Headers,
    ) -> Result<PublishAck, BusError> {
        op_span!(self, publish, topic)
            .in_scope(|| self.send(topic, key, value, event_uid, Some(headers)))
    }

    /// In the `bus.fetch` span.
    fn fetch_with_headers(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> Result<Vec<StoredRecord>, BusError> {
        op_span!(self, fetch, topic, partition, offset, max).in_scope(|| {
            #[cfg(feature = "otel")]
            let receiving = crate::otel::Receiving::start(self.system, topic, partition);
            let fetched = self.inner.fetch_with_headers(topic, partition, offset, max);
            #[cfg(feature = "otel")]
            receiving.finish_records(&fetched);
            fetched
        })
    }

    fn delete_below(&self, topic: &str, partition: u32, offset: u64) -> Result<u64, BusError> {
        self.inner.delete_below(topic, partition, offset)
    }

    fn partitions(&self, topic: &str) -> Result<u32, BusError> {
        self.inner.partitions(topic)
    }

    fn topics(&self) -> Vec<String> {
        self.inner.topics()
    }

    fn maintenance(&self, now_ms: u64) -> Result<u64, BusError> {
        op_span!(self, maintenance).in_scope(|| self.inner.maintenance(now_ms))
    }

    fn provision(&self, manifest: &Manifest) -> Result<(), BusError> {
        op_span!(self, provision).in_scope(|| self.inner.provision(manifest))
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn topic_spec(&self, topic: &str) -> Result<Option<TopicSpec>, BusError> {
        op_span!(self, topic_spec, topic).in_scope(|| self.inner.topic_spec(topic))
    }

    fn offsets(&self, topic: &str, partition: u32) -> Result<PartitionOffsets, BusError> {
        op_span!(self, offsets, topic, partition).in_scope(|| self.inner.offsets(topic, partition))
    }

    fn publish_batch(
        &self,
        topic: &str,
        records: &[BatchRecord],
    ) -> Result<Vec<PublishAck>, BusError> {
        op_span!(self, publish_batch, topic, records.len()).in_scope(|| {
            #[cfg(feature = "otel")]
            {
                let mut sending = crate::otel::Sending::batch(self.system, topic, records.len());
                let acks = match sending.batch_records(topic, records, self.keeps_headers) {
                    Some(carried) => self.inner.publish_batch_with_headers(topic, &carried),
                    None => self.inner.publish_batch(topic, records),
                };
                sending.finish_batch(&acks);
                acks
            }
            #[cfg(not(feature = "otel"))]
            self.inner.publish_batch(topic, records)
        })
    }

    /// In the `bus.publish_batch` span, as [`EventBus::publish_with_headers`]
    /// is in `bus.publish`.
    fn publish_batch_with_headers(
        &self,
        topic: &str,
        records: &[BatchRecordWithHeaders],
    ) -> Result<Vec<PublishAck>, BusError> {
        op_span!(self, publish_batch, topic, records.len()).in_scope(|| {
            #[cfg(feature = "otel")]
            {
                let mut sending = crate::otel::Sending::batch(self.system, topic, records.len());
                let carried = sending.batch_headers(topic, records, self.keeps_headers)?;
                let acks = self
                    .inner
                    .publish_batch_with_headers(topic, carried.as_deref().unwrap_or(records));
                sending.finish_batch(&acks);
                acks
            }
            #[cfg(not(feature = "otel"))]
            self.inner.publish_batch_with_headers(topic, records)
        })
    }

    fn subscribe(
        &self,
        topic: &str,
        selector: Selector,
        start: StartAt,
        options: SubscribeOptions,
    ) -> Result<Subscription, BusError> {
        op_span!(self, subscribe, topic).in_scope(|| {
            #[cfg_attr(not(feature = "otel"), allow(unused_mut))]
            let mut subscription = self.inner.subscribe(topic, selector, start, options)?;
            #[cfg(feature = "otel")]
            subscription.trace_deliveries(self.system);
            Ok(subscription)
        })
    }
}
