//! The async surface of the embedded log (feature `async`).
//!
//! A publish prepares its record on the caller's task (validation, JSON,
//! HMAC: CPU only), queues it into the partition's group commit and awaits
//! the answer: the partition's commit thread (or a sync publisher leading
//! the round) writes and fsyncs, so a runtime worker never waits on the
//! disk, and 64 tasks publishing at once share rounds like 64 threads do.
//! Reads (fetch, find-by-UID, offsets), provisioning and subscribing touch
//! files and run on the caller's tokio runtime's blocking pool, so the
//! async surface must be used from inside a tokio runtime.

use bus_core::backend::BatchItem;
use bus_core::{
    AsyncEventBus, BatchRecord, BatchRecordWithHeaders, BoxFuture, BusError, EventBus, Headers,
    Manifest, PublishAck, Selector, StartAt, SubscribeOptions, SubscriptionStream,
};

use crate::bus::EmbeddedBus;

/// The headers of a publish without any.
static NO_HEADERS: Headers = Headers::new();

impl EmbeddedBus {
    /// Runs `work` on a handle of this bus on the runtime's blocking pool.
    async fn blocking<T, F>(&self, what: &'static str, work: F) -> Result<T, BusError>
    where
        T: Send + 'static,
        F: FnOnce(EmbeddedBus) -> Result<T, BusError> + Send + 'static,
    {
        let handle = self.handle();
        bus_core::backend::on_blocking_pool("embedded", what, move || work(handle)).await
    }

    /// One record through the group commit, awaited.
    async fn publish_one_async(
        &self,
        topic_name: &str,
        key: &str,
        value: &serde_json::Value,
        uid: Option<&str>,
        headers: &Headers,
    ) -> Result<PublishAck, BusError> {
        let one = self.one_record(topic_name, key, value, uid, headers)?;
        let answer = one
            .topic
            .partition(one.partition)?
            .append_async(vec![one.record], one.auth)?;
        crate::publish::one_ack(topic_name, one.partition, &answer.await?)
    }

    /// `publish_batch`: validated as a whole first, then one request per
    /// partition, all queued before the first is awaited.
    async fn publish_batch_async(
        &self,
        topic_name: &str,
        records: &[BatchItem<'_>],
    ) -> Result<Vec<PublishAck>, BusError> {
        self.inner.writable("publish_batch")?;
        let topic = self.inner.topic(topic_name)?;
        let auth = self.inner.auth();
        let groups = self.group_batch(&topic, records, auth.as_ref())?;
        let mut answers = Vec::with_capacity(groups.len());
        for (partition, (positions, batch)) in groups {
            let answer = topic
                .partition(partition)?
                .append_async(batch, auth.clone())?;
            answers.push((partition, positions, answer));
        }
        let mut acks: Vec<Option<PublishAck>> = vec![None; records.len()];
        for (partition, positions, answer) in answers {
            for (i, offset) in positions.into_iter().zip(answer.await?) {
                acks[i] = Some(PublishAck {
                    topic: topic_name.to_owned(),
                    partition,
                    offset,
                });
            }
        }
        acks.into_iter()
            .map(|ack| ack.ok_or_else(|| BusError::backend("embedded", "batch record not acked")))
            .collect()
    }
}

impl AsyncEventBus for EmbeddedBus {
    fn publish<'a>(
        &'a self,
        topic: &'a str,
        key: &'a str,
        value: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<PublishAck, BusError>> {
        Box::pin(self.publish_one_async(topic, key, value, None, &NO_HEADERS))
    }

    /// A malformed UID is refused before anything is queued (contract C12).
    fn publish_idempotent<'a>(
        &'a self,
        topic: &'a str,
        key: &'a str,
        value: &'a serde_json::Value,
        event_uid: &'a str,
    ) -> BoxFuture<'a, Result<PublishAck, BusError>> {
        Box::pin(async move {
            bus_core::backend::validate_uid(event_uid)?;
            self.publish_one_async(topic, key, value, Some(event_uid), &NO_HEADERS)
                .await
        })
    }

    fn publish_batch<'a>(
        &'a self,
        topic: &'a str,
        records: &'a [BatchRecord],
    ) -> BoxFuture<'a, Result<Vec<PublishAck>, BusError>> {
        Box::pin(async move {
            self.publish_batch_async(topic, &BatchItem::all(records))
                .await
        })
    }

    /// Headers in each record's frame (C25), through the same group commit.
    fn publish_batch_with_headers<'a>(
        &'a self,
        topic: &'a str,
        records: &'a [BatchRecordWithHeaders],
    ) -> BoxFuture<'a, Result<Vec<PublishAck>, BusError>> {
        Box::pin(async move {
            self.publish_batch_async(topic, &BatchItem::all(records))
                .await
        })
    }

    /// Headers in the frame (C25), through the same group commit.
    fn publish_with_headers<'a>(
        &'a self,
        topic: &'a str,
        key: &'a str,
        value: &'a serde_json::Value,
        event_uid: Option<&'a str>,
        headers: &'a Headers,
    ) -> BoxFuture<'a, Result<PublishAck, BusError>> {
        Box::pin(async move {
            if let Some(uid) = event_uid {
                bus_core::backend::validate_uid(uid)?;
            }
            self.publish_one_async(topic, key, value, event_uid, headers)
                .await
        })
    }

    fn fetch_with_headers<'a>(
        &'a self,
        topic: &'a str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> BoxFuture<'a, Result<Vec<bus_core::StoredRecord>, BusError>> {
        let topic = topic.to_owned();
        Box::pin(self.blocking("fetch", move |bus| {
            EventBus::fetch_with_headers(&bus, &topic, partition, offset, max)
        }))
    }

    fn fetch<'a>(
        &'a self,
        topic: &'a str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> BoxFuture<'a, Result<Vec<bus_core::StoredEvent>, BusError>> {
        let topic = topic.to_owned();
        Box::pin(self.blocking("fetch", move |bus| {
            EventBus::fetch(&bus, &topic, partition, offset, max)
        }))
    }

    fn find_event_by_uid<'a>(
        &'a self,
        topic: &'a str,
        key: &'a str,
        event_uid: &'a str,
    ) -> BoxFuture<'a, Result<Option<PublishAck>, BusError>> {
        let (topic, key, uid) = (topic.to_owned(), key.to_owned(), event_uid.to_owned());
        Box::pin(self.blocking("find_event_by_uid", move |bus| {
            EventBus::find_event_by_uid(&bus, &topic, &key, &uid)
        }))
    }

    fn offsets<'a>(
        &'a self,
        topic: &'a str,
        partition: u32,
    ) -> BoxFuture<'a, Result<bus_core::PartitionOffsets, BusError>> {
        let topic = topic.to_owned();
        Box::pin(self.blocking("offsets", move |bus| {
            EventBus::offsets(&bus, &topic, partition)
        }))
    }
    /// Rare administrative calls the sync surface already answers, on the
    /// caller's runtime's blocking pool.
    fn topics<'a>(&'a self) -> BoxFuture<'a, Result<Vec<String>, BusError>> {
        Box::pin(self.blocking("topics", move |bus| Ok(EventBus::topics(&bus))))
    }

    fn topic_spec<'a>(
        &'a self,
        topic: &'a str,
    ) -> BoxFuture<'a, Result<Option<bus_core::TopicSpec>, BusError>> {
        let topic = topic.to_owned();
        Box::pin(self.blocking("topic_spec", move |bus| EventBus::topic_spec(&bus, &topic)))
    }

    fn maintenance<'a>(&'a self, now_ms: u64) -> BoxFuture<'a, Result<u64, BusError>> {
        Box::pin(self.blocking("maintenance", move |bus| {
            EventBus::maintenance(&bus, now_ms)
        }))
    }

    fn partitions<'a>(&'a self, topic: &'a str) -> BoxFuture<'a, Result<u32, BusError>> {
        let owned = topic.to_owned();
        Box::pin(async move {
            if self.inner.options.read_only {
                // A read-only open may look for new topics on disk.
                self.blocking("partitions", move |bus| EventBus::partitions(&bus, &owned))
                    .await
            } else {
                EventBus::partitions(self, topic)
            }
        })
    }

    fn provision<'a>(&'a self, manifest: &'a Manifest) -> BoxFuture<'a, Result<(), BusError>> {
        let manifest = manifest.clone();
        Box::pin(self.blocking("provision", move |bus| EventBus::provision(&bus, &manifest)))
    }

    fn subscribe<'a>(
        &'a self,
        topic: &'a str,
        selector: Selector,
        start: StartAt,
        options: SubscribeOptions,
    ) -> BoxFuture<'a, Result<SubscriptionStream, BusError>> {
        let topic = topic.to_owned();
        Box::pin(self.blocking("subscribe", move |bus| {
            EventBus::subscribe(&bus, &topic, selector, start, options)?.into_stream()
        }))
    }
}
