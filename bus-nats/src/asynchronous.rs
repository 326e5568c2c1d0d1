//! The async surface of the NATS backend (feature `async`).
//!
//! Every operation but `subscribe` awaits the backend's own async-nats code
//! (the code the connector thread runs for the sync surface) directly on
//! the caller's runtime, bounded by the operation timeout: no thread hop.
//! A bus made by [`NatsBus::connect_async`], [`NatsBus::from_client`] or
//! [`NatsBus::from_jetstream`] has its connection on the caller's runtime
//! and starts no connector thread until a sync method is called (see
//! [`NatsBus::connector_started`]). `subscribe` builds the subscription
//! with the sync code on the caller's blocking pool, and that code, like the
//! subscription's push task and reads, runs its futures on the caller's
//! runtime too: the subscription's own thread (the `Stream` adapter's)
//! waits for them, never a runtime worker.

use std::sync::Arc;

use async_nats::jetstream;
use bus_core::backend::BatchItem;
use bus_core::backend::executor::bounded;
use bus_core::{
    AsyncEventBus, BatchRecord, BatchRecordWithHeaders, BoxFuture, BusError, Headers, Manifest,
    PartitionOffsets, PublishAck, Selector, StartAt, StoredEvent, StoredRecord, SubscribeOptions,
    SubscriptionStream, backend::check_partition, backend::uid_partition, backend::validate_topic,
};

use crate::bus::{connect_client, jetstream_of};
use crate::get::Reads;
use crate::naming::record_subject_as;
use crate::options::NatsOptions;
use crate::publish::{prepare, send_all};
use crate::shared::TopicState;
use crate::uid::{Resolved, UidSubject};
use crate::{NatsBus, fetch, topics};

impl NatsBus {
    /// [`NatsBus::connect`] for async code: connects on the caller's
    /// runtime and starts no connector thread.
    pub async fn connect_async(url: &str) -> Result<Self, BusError> {
        Self::connect_async_with(NatsOptions::from_url(url)?).await
    }

    /// [`NatsBus::connect_with`] for async code: connects on the caller's
    /// runtime (within the connect timeout plus the operation timeout) and
    /// starts no connector thread.
    pub async fn connect_async_with(options: NatsOptions) -> Result<Self, BusError> {
        options.check()?;
        let within = options.connect_timeout + options.timeout;
        bounded("nats connect", within, async {
            let client = connect_client(&options).await?;
            let js = jetstream_of(client, options.timeout).await?;
            Ok(Self::from_parts(
                js,
                options.prefix.clone(),
                options.timeout,
            ))
        })
        .await
    }

    /// A bus over an existing client (the application's own connection);
    /// of `options` only the prefix and the operation timeout are used.
    /// Checks that JetStream answers; starts no thread.
    pub async fn from_client(
        client: async_nats::Client,
        options: &NatsOptions,
    ) -> Result<Self, BusError> {
        let js = bounded(
            "nats jetstream",
            options.timeout,
            jetstream_of(client, options.timeout),
        )
        .await?;
        Ok(Self::from_parts(
            js,
            options.prefix.clone(),
            options.timeout,
        ))
    }

    /// A bus over an existing JetStream context, used as configured (its
    /// own request timeout and ack window); of `options` only the prefix
    /// and the operation timeout are used. Starts no thread.
    pub fn from_jetstream(js: jetstream::Context, options: &NatsOptions) -> Self {
        Self::from_parts(js, options.prefix.clone(), options.timeout)
    }

    /// A handle on the same connection for work moved to the blocking
    /// pool, whose sync code runs its futures on `runtime`; dropping it
    /// cleans nothing up.
    fn handle(&self, runtime: tokio::runtime::Handle) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            executor: Arc::clone(&self.executor),
            primary: false,
            on_runtime: Some(runtime),
        }
    }

    /// Runs `work` with a handle of this bus (its sync calls run on the
    /// caller's runtime) on that runtime's blocking pool.
    async fn blocking<T, F>(&self, what: &'static str, work: F) -> Result<T, BusError>
    where
        T: Send + 'static,
        F: FnOnce(NatsBus) -> Result<T, BusError> + Send + 'static,
    {
        let bus = self.handle(tokio::runtime::Handle::current());
        bus_core::backend::on_blocking_pool("nats", what, move || work(bus)).await
    }

    /// The topic from the cache, else from the server (contract C2).
    async fn topic_async(&self, name: &str) -> Result<Arc<TopicState>, BusError> {
        validate_topic(name)?;
        if let Some(state) = self.shared.cached(name) {
            return Ok(state);
        }
        match topics::lookup(&self.shared, name).await? {
            Some(spec) => Ok(self.shared.remember(spec)),
            None => Err(BusError::UnknownTopic(name.to_owned())),
        }
    }

    async fn publish_async(
        &self,
        topic: &str,
        records: &[BatchItem<'_>],
    ) -> Result<Vec<PublishAck>, BusError> {
        bounded("publish", self.shared.timeout, async {
            let state = self.topic_async(topic).await?;
            let prepared = records
                .iter()
                .map(|r| prepare(&self.shared, &state, r.key, r.value, r.uid, r.headers))
                .collect::<Result<Vec<_>, _>>()?;
            if prepared.is_empty() {
                return Ok(Vec::new());
            }
            send_all(Arc::clone(&self.shared), state, prepared).await
        })
        .await
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
            .ok_or_else(|| BusError::backend("nats", "publish returned no ack"))
    }

    async fn find_async(
        &self,
        topic: &str,
        key: &str,
        event_uid: &str,
    ) -> Result<Option<PublishAck>, BusError> {
        let shared = &self.shared;
        let state = self.topic_async(topic).await?;
        let partition = uid_partition(&state.spec, key, event_uid)?;
        let stream = state.partition(partition)?.stream.clone();
        let subject = record_subject_as(&stream, Some(event_uid), state.uid_subjects);
        let what = format!("find_event_by_uid in {stream}");
        let handle = shared
            .js
            .get_stream_no_info(&stream)
            .await
            .map_err(|error| {
                BusError::backend_caused("nats", format!("stream {stream}: {error}"), error)
            })?;
        // The server's per-subject index answers; nothing is scanned.
        let auth = shared.auth();
        let lookup = UidSubject {
            reads: Reads::new(&handle, shared.clustered),
            subject: &subject,
            topic,
            partition,
            uid: event_uid,
            auth: auth.as_ref(),
            what: &what,
        };
        let sequence = match lookup.resolve().await? {
            Resolved::Authentic(sequence) => Some(sequence),
            Resolved::Absent { .. } => None,
        };
        Ok(sequence.map(|sequence| PublishAck {
            topic: topic.to_owned(),
            partition,
            offset: sequence.saturating_sub(1),
        }))
    }
}

/// The headers of a publish without any.
static NO_HEADERS: Headers = Headers::new();

impl AsyncEventBus for NatsBus {
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

    /// Headers as NATS message headers of each record (C25).
    fn publish_batch_with_headers<'a>(
        &'a self,
        topic: &'a str,
        records: &'a [BatchRecordWithHeaders],
    ) -> BoxFuture<'a, Result<Vec<PublishAck>, BusError>> {
        Box::pin(async move { self.publish_async(topic, &BatchItem::all(records)).await })
    }

    /// Headers as NATS message headers (C25).
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

    fn fetch<'a>(
        &'a self,
        topic: &'a str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> BoxFuture<'a, Result<Vec<StoredEvent>, BusError>> {
        Box::pin(async move {
            Ok(self
                .fetch_with_headers(topic, partition, offset, max)
                .await?
                .into_iter()
                .map(|record| record.event)
                .collect())
        })
    }

    fn fetch_with_headers<'a>(
        &'a self,
        topic: &'a str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> BoxFuture<'a, Result<Vec<StoredRecord>, BusError>> {
        Box::pin(bounded("fetch", self.shared.timeout, async move {
            let state = self.topic_async(topic).await?;
            check_partition(topic, partition, state.spec.partitions)?;
            if max == 0 {
                return Ok(Vec::new());
            }
            let shared = Arc::clone(&self.shared);
            let messages = fetch::fetch(shared, state, partition, offset, max).await?;
            fetch::decode_all(topic, partition, self.shared.auth().as_ref(), &messages)
        }))
    }

    fn find_event_by_uid<'a>(
        &'a self,
        topic: &'a str,
        key: &'a str,
        event_uid: &'a str,
    ) -> BoxFuture<'a, Result<Option<PublishAck>, BusError>> {
        Box::pin(bounded(
            "find_event_by_uid",
            self.shared.timeout,
            self.find_async(topic, key, event_uid),
        ))
    }

    fn offsets<'a>(
        &'a self,
        topic: &'a str,
        partition: u32,
    ) -> BoxFuture<'a, Result<PartitionOffsets, BusError>> {
        Box::pin(bounded("offsets", self.shared.timeout, async move {
            let state = self.topic_async(topic).await?;
            check_partition(topic, partition, state.spec.partitions)?;
            fetch::offsets(Arc::clone(&self.shared), state, partition).await
        }))
    }

    fn partitions<'a>(&'a self, topic: &'a str) -> BoxFuture<'a, Result<u32, BusError>> {
        Box::pin(bounded("topic lookup", self.shared.timeout, async move {
            Ok(self.topic_async(topic).await?.spec.partitions)
        }))
    }

    fn provision<'a>(&'a self, manifest: &'a Manifest) -> BoxFuture<'a, Result<(), BusError>> {
        Box::pin(bounded("provision", self.shared.timeout, async move {
            manifest.validate()?;
            for spec in topics::provision(&self.shared, manifest).await? {
                self.shared.remember(spec);
            }
            Ok(())
        }))
    }

    /// Rare administrative calls the sync surface already answers, on the
    /// caller's runtime's blocking pool.
    fn topics<'a>(&'a self) -> BoxFuture<'a, Result<Vec<String>, BusError>> {
        Box::pin(self.blocking("topics", move |bus| Ok(bus_core::EventBus::topics(&bus))))
    }

    fn topic_spec<'a>(
        &'a self,
        topic: &'a str,
    ) -> BoxFuture<'a, Result<Option<bus_core::TopicSpec>, BusError>> {
        let topic = topic.to_owned();
        Box::pin(self.blocking("topic_spec", move |bus| {
            bus_core::EventBus::topic_spec(&bus, &topic)
        }))
    }

    fn maintenance<'a>(&'a self, now_ms: u64) -> BoxFuture<'a, Result<u64, BusError>> {
        Box::pin(self.blocking("maintenance", move |bus| {
            bus_core::EventBus::maintenance(&bus, now_ms)
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
        Box::pin(self.blocking("subscribe", move |bus| {
            bus.subscribe_live(&topic, &selector, start, options)?
                .into_stream()
        }))
    }
}
