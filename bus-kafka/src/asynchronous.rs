//! The async surface of the Kafka backend (feature `async`).
//!
//! librdkafka is a thread-based C library: its producer queues a record at
//! once and reports the delivery from its own thread. A publish without a
//! UID (the common case) therefore runs on the caller's task: it queues the
//! record and awaits the report through a channel that wakes the task (no
//! thread of the bus in between). What librdkafka only offers as blocking
//! calls — consumers positioned for a fetch or a UID lookup, the dedup
//! index's catch-up of a UID publish, the manifest topic's refresh on a
//! cache miss, the admin client — runs on the caller's runtime's blocking
//! pool, never on a worker and never on the bus's connector: a bus made by
//! [`KafkaBus::connect_async`] and used through this surface starts no
//! connector thread (see [`KafkaBus::connector_started`]). Subscriptions
//! share the bus's one subscription consumer and its thread, as on the sync
//! surface.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bus_core::backend::BatchItem;
use bus_core::{
    AsyncEventBus, BatchRecord, BatchRecordWithHeaders, BoxFuture, BusError, Headers, Manifest,
    PublishAck, Selector, StartAt, SubscribeOptions, SubscriptionStream,
};
use futures::StreamExt as _;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::client::{Delivery, Reply, Ticket};
use crate::errors::{map_error, timed_out};
use crate::locate::{self, Delivered};
use crate::publish::{Prepared, prepare_all, to_record};
use crate::registry::Entry;
use crate::{Core, KafkaBus, KafkaOptions, client, cluster_facts, topics};
use bus_core::backend::sync::lock;

impl KafkaBus {
    /// [`KafkaBus::connect`] for async code (see
    /// [`KafkaBus::connect_async_with`]).
    pub async fn connect_async(url: &str) -> Result<Self, BusError> {
        Self::connect_async_with(KafkaOptions::from_url(url)?).await
    }

    /// [`KafkaBus::connect_with`] for async code: the clients are made and
    /// the manifest topic checked on the caller's runtime's blocking pool;
    /// no connector thread is started. Extra librdkafka settings travel in
    /// `options` ([`KafkaOptions::rdkafka`]).
    pub async fn connect_async_with(options: KafkaOptions) -> Result<Self, BusError> {
        options.validate()?;
        off_runtime("kafka connect", move || {
            let admin = Arc::new(client::admin(&options)?);
            let deadline = Instant::now() + options.timeout;
            let facts = cluster_facts(&options, &admin, deadline)?;
            Self::assemble(options, admin, facts)
        })
        .await
    }

    /// Another handle on the same clients, for work moved to the blocking
    /// pool.
    fn handle(&self) -> Self {
        Self {
            executor: Arc::clone(&self.executor),
            core: Arc::clone(&self.core),
            subscriptions: Arc::clone(&self.subscriptions),
            waker: Arc::clone(&self.waker),
        }
    }

    /// Runs `work` on a handle of this bus on the blocking pool.
    async fn blocking_async<T, F>(&self, what: &'static str, work: F) -> Result<T, BusError>
    where
        T: Send + 'static,
        F: FnOnce(KafkaBus) -> Result<T, BusError> + Send + 'static,
    {
        let bus = self.handle();
        off_runtime(what, move || work(bus)).await
    }

    /// The topic's manifest entry when cached (no I/O).
    fn cached_entry(&self, topic: &str) -> Result<Option<Entry>, BusError> {
        bus_core::backend::validate_topic(topic)?;
        Ok(lock(&self.core.registry).cached(topic).cloned())
    }

    /// The topic's manifest entry; a cache miss reads the manifest topic
    /// on the blocking pool.
    async fn entry_async(&self, topic: &str) -> Result<Entry, BusError> {
        if let Some(entry) = self.cached_entry(topic)? {
            return Ok(entry);
        }
        let owned = topic.to_owned();
        self.blocking_async("topic lookup", move |bus| bus.entry(&owned))
            .await
    }

    /// Records without UIDs, produced from the caller's task; a batch with
    /// a UID (given, or in a value's `metadata.uid`) goes through the dedup
    /// index on the blocking pool. With or without headers (C25).
    async fn publish_async(
        &self,
        topic: &str,
        records: &[BatchItem<'_>],
    ) -> Result<Vec<PublishAck>, BusError> {
        let entry = self.entry_async(topic).await?;
        let prepared = prepare_all(self.core.auth().as_ref(), &entry, records)?;
        if prepared.is_empty() {
            return Ok(Vec::new());
        }
        // A UID given or carried in the value (`metadata.uid`, C6).
        if prepared.iter().any(|record| record.uid.is_some()) {
            let owned = topic.to_owned();
            let records: Vec<BatchRecordWithHeaders> =
                records.iter().map(BatchItem::to_owned_record).collect();
            return self
                .blocking_async("publish", move |bus| {
                    bus.publish_many(&owned, &BatchItem::all(&records))
                })
                .await;
        }
        let deadline = self.deadline();
        let offsets = produce_async(&self.core, &entry.kafka_topic, &prepared, deadline).await;
        prepared
            .iter()
            .zip(offsets)
            .map(|(record, offset)| {
                offset.map(|offset| PublishAck {
                    topic: topic.to_owned(),
                    partition: record.partition,
                    offset,
                })
            })
            .collect()
    }

    async fn publish_one_async(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
        uid: Option<&str>,
        headers: &Headers,
    ) -> Result<PublishAck, BusError> {
        let record = BatchItem {
            key,
            value,
            uid,
            headers,
        };
        self.publish_async(topic, &[record])
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| BusError::backend("kafka", "no delivery"))
    }
}

/// `work` on the caller's runtime's blocking pool.
async fn off_runtime<T, F>(what: &'static str, work: F) -> Result<T, BusError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, BusError> + Send + 'static,
{
    bus_core::backend::on_blocking_pool("kafka", what, work).await
}

/// [`crate::publish::produce`] for a task: records are queued strictly in
/// order (a full queue is retried after an async pause, so none overtakes
/// another) and their delivery reports awaited until `deadline`.
async fn produce_async(
    core: &Arc<Core>,
    topic: &str,
    records: &[Prepared],
    deadline: Instant,
) -> Vec<Result<u64, BusError>> {
    let start = locate::Start::now(core, topic, records);
    let kind = Delivery::Plain;
    let producer = core.producer(kind);
    let (reply, mut replies) = futures::channel::mpsc::unbounded();
    let mut out: Vec<Option<Delivered>> = Vec::new();
    out.resize_with(records.len(), || None);
    let mut outstanding = 0usize;
    for (index, slot) in out.iter_mut().enumerate() {
        let mut ticket = Box::new(Ticket {
            index,
            reply: Reply::Task(reply.clone()),
            late: None,
        });
        loop {
            match producer.send(to_record(topic, &records[index], ticket)) {
                Ok(()) => {
                    outstanding += 1;
                    break;
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                    if Instant::now() < deadline =>
                {
                    ticket = back.delivery_opaque;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err((error, _)) => {
                    core.heal_producer(kind, &producer);
                    *slot = Some(Err(map_error(&core.options, "publish", error)));
                    break;
                }
            }
        }
    }
    drop(reply);
    let until = tokio::time::Instant::from_std(deadline);
    while outstanding > 0 {
        let Ok(Some((index, outcome))) = tokio::time::timeout_at(until, replies.next()).await
        else {
            break;
        };
        outstanding -= 1;
        let Some(slot) = out.get_mut(index) else {
            continue;
        };
        *slot = Some(match outcome {
            Ok(offset) => Ok(u64::try_from(offset).ok()),
            Err(error) => {
                core.heal_producer(kind, &producer);
                Err(map_error(&core.options, "publish", error))
            }
        });
    }
    if out.iter().any(Option::is_none) {
        // No report by the deadline (see Core::heal_stalled).
        core.heal_stalled(kind, &producer);
    }
    let delivered: Vec<Delivered> = out
        .into_iter()
        .map(|outcome| outcome.unwrap_or_else(|| Err(timed_out(&core.options, "publish"))))
        .collect();
    // Records stored without an offset in their reports are read back
    // (crate::locate), which blocks: on the blocking pool.
    let out = if delivered.iter().any(|outcome| matches!(outcome, Ok(None))) {
        // Offsets the reports did give, kept should the read-back fail.
        let known: Vec<Option<u64>> = delivered
            .iter()
            .map(|outcome| outcome.as_ref().ok().copied().flatten())
            .collect();
        let (shared, owned_topic, owned) = (Arc::clone(core), topic.to_owned(), records.to_vec());
        off_runtime("publish", move || {
            Ok(locate::resolve(
                &shared,
                &owned_topic,
                &owned,
                delivered,
                &start,
                deadline,
            ))
        })
        .await
        .unwrap_or_else(|_| {
            known
                .into_iter()
                .map(|offset| {
                    offset.ok_or_else(|| timed_out(&core.options, "publish (reading records back)"))
                })
                .collect()
        })
    } else {
        // Every offset known: no I/O.
        locate::resolve(core, topic, records, delivered, &start, deadline)
    };
    crate::publish::stored(topic, records, &out);
    out
}

/// The headers of a publish without any.
static NO_HEADERS: Headers = Headers::new();

impl AsyncEventBus for KafkaBus {
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
        Box::pin(async move { self.publish_async(topic, &BatchItem::all(records)).await })
    }

    /// Headers as Kafka record headers of each record (C25).
    fn publish_batch_with_headers<'a>(
        &'a self,
        topic: &'a str,
        records: &'a [BatchRecordWithHeaders],
    ) -> BoxFuture<'a, Result<Vec<PublishAck>, BusError>> {
        Box::pin(async move { self.publish_async(topic, &BatchItem::all(records)).await })
    }

    fn fetch<'a>(
        &'a self,
        topic: &'a str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> BoxFuture<'a, Result<Vec<bus_core::StoredEvent>, BusError>> {
        let topic = topic.to_owned();
        Box::pin(self.blocking_async("fetch", move |bus| {
            bus_core::EventBus::fetch(&bus, &topic, partition, offset, max)
        }))
    }

    /// Headers as Kafka record headers (C25), produced from the caller's
    /// task as any publish.
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
        Box::pin(self.blocking_async("fetch", move |bus| {
            bus_core::EventBus::fetch_with_headers(&bus, &topic, partition, offset, max)
        }))
    }

    fn find_event_by_uid<'a>(
        &'a self,
        topic: &'a str,
        key: &'a str,
        event_uid: &'a str,
    ) -> BoxFuture<'a, Result<Option<PublishAck>, BusError>> {
        let (topic, key, uid) = (topic.to_owned(), key.to_owned(), event_uid.to_owned());
        Box::pin(self.blocking_async("find_event_by_uid", move |bus| {
            bus_core::EventBus::find_event_by_uid(&bus, &topic, &key, &uid)
        }))
    }

    fn offsets<'a>(
        &'a self,
        topic: &'a str,
        partition: u32,
    ) -> BoxFuture<'a, Result<bus_core::PartitionOffsets, BusError>> {
        let topic = topic.to_owned();
        Box::pin(self.blocking_async("offsets", move |bus| {
            bus_core::EventBus::offsets(&bus, &topic, partition)
        }))
    }
    /// Rare administrative calls the sync surface already answers, on the
    /// caller's runtime's blocking pool.
    fn topics<'a>(&'a self) -> BoxFuture<'a, Result<Vec<String>, BusError>> {
        Box::pin(self.blocking_async("topics", move |bus| Ok(bus_core::EventBus::topics(&bus))))
    }

    fn topic_spec<'a>(
        &'a self,
        topic: &'a str,
    ) -> BoxFuture<'a, Result<Option<bus_core::TopicSpec>, BusError>> {
        let topic = topic.to_owned();
        Box::pin(self.blocking_async("topic_spec", move |bus| {
            bus_core::EventBus::topic_spec(&bus, &topic)
        }))
    }

    fn maintenance<'a>(&'a self, now_ms: u64) -> BoxFuture<'a, Result<u64, BusError>> {
        Box::pin(self.blocking_async("maintenance", move |bus| {
            bus_core::EventBus::maintenance(&bus, now_ms)
        }))
    }

    fn partitions<'a>(&'a self, topic: &'a str) -> BoxFuture<'a, Result<u32, BusError>> {
        Box::pin(async move { Ok(self.entry_async(topic).await?.spec.partitions) })
    }

    /// The admin client's work on the blocking pool (not the connector).
    fn provision<'a>(&'a self, manifest: &'a Manifest) -> BoxFuture<'a, Result<(), BusError>> {
        let manifest = manifest.clone();
        Box::pin(self.blocking_async("provision", move |bus| {
            manifest.validate()?;
            let deadline = bus.deadline();
            topics::provision(&bus.core, &manifest, deadline)
        }))
    }

    fn subscribe<'a>(
        &'a self,
        topic: &'a str,
        selector: Selector,
        start: StartAt,
        options: SubscribeOptions,
    ) -> BoxFuture<'a, Result<SubscriptionStream, BusError>> {
        let topic = topic.to_owned();
        Box::pin(self.blocking_async("subscribe", move |bus| {
            bus.subscribe_live(&topic, &selector, start, options)?
                .into_stream()
        }))
    }
}
