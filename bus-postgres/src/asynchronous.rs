//! The async surface (feature `async`): every operation awaits the same
//! tokio-postgres code the synchronous bus runs on its connector runtime,
//! here on the caller's runtime, bounded by the bus's timeout. A bus made
//! by [`PostgresBus::connect_async`] starts no connector thread until a
//! synchronous call or a subscription needs one (subscriptions read through
//! the synchronous feed, which [`bus_core::SubscriptionStream`] drives off
//! the runtime's workers).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bus_core::backend::executor::bounded;
use bus_core::{AsyncEventBus, BoxFuture};
use bus_core::{
    BatchRecord, BatchRecordWithHeaders, BusError, Headers, Manifest, PartitionOffsets, PublishAck,
    Selector, StartAt, StoredEvent, SubscribeOptions, SubscriptionStream, backend::BatchItem,
    backend::check_partition, backend::uid_partition, backend::validate_topic,
    backend::validate_uid,
};

use crate::bus::{PostgresBus, Rounds};
use crate::errors::pool;
use crate::inner::Core;
use crate::options::PostgresOptions;
use crate::shared::{Shared, Topic};
use crate::{fetch, topics};

impl PostgresBus {
    /// Runs `work` with a handle of this bus (its sync calls) on the
    /// caller's runtime's blocking pool.
    async fn blocking<T, F>(&self, what: &'static str, work: F) -> Result<T, BusError>
    where
        T: Send + 'static,
        F: FnOnce(PostgresBus) -> Result<T, BusError> + Send + 'static,
    {
        let bus = PostgresBus {
            core: Arc::clone(&self.core),
        };
        bus_core::backend::on_blocking_pool("postgres", what, move || work(bus)).await
    }

    /// [`PostgresBus::connect`] for async code: connects on the caller's
    /// runtime and starts no connector thread.
    pub async fn connect_async(url: &str) -> Result<Self, BusError> {
        Self::connect_async_with(PostgresOptions::from_url(url)?).await
    }

    /// [`PostgresBus::connect_with`] for async code.
    pub async fn connect_async_with(options: PostgresOptions) -> Result<Self, BusError> {
        options.check()?;
        let timeout = options.timeout;
        let shared = Arc::new(Shared::new(options)?);
        bounded("connect", timeout, async {
            let client = shared.pool.get().await.map_err(pool)?;
            topics::check_version(&shared, &**client).await
        })
        .await?;
        Ok(Self {
            core: Arc::new(Core {
                executor: OnceLock::new(),
                shared,
            }),
        })
    }

    fn timeout(&self) -> Duration {
        self.core.shared.options.timeout
    }

    async fn topic_async(&self, name: &str) -> Result<Arc<Topic>, BusError> {
        validate_topic(name)?;
        if let Some(topic) = self.core.shared.cached(name) {
            return Ok(topic);
        }
        topics::topic(&self.core.shared, name).await
    }

    /// A batch, with or without headers (C25); UIDs checked by the caller.
    async fn publish_async(
        &self,
        topic: &str,
        records: &[BatchItem<'_>],
    ) -> Result<Vec<PublishAck>, BusError> {
        bounded("publish", self.timeout(), async {
            let topic = self.topic_async(topic).await?;
            let Some(rounds) = Rounds::prepare(&topic, records)? else {
                return Ok(Vec::new());
            };
            let name = topic.spec.name.clone();
            let offsets = rounds.append(Arc::clone(&self.core.shared), topic).await?;
            Rounds::acks(&name, offsets)
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
            .ok_or_else(|| BusError::backend("postgres", "publish returned no ack"))
    }
}

/// The headers of a publish without any.
static NO_HEADERS: Headers = Headers::new();

impl AsyncEventBus for PostgresBus {
    /// Headers in the `headers` column (C25), through the same group commit.
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
            for uid in records.iter().filter_map(|r| r.uid.as_deref()) {
                validate_uid(uid)?;
            }
            self.publish_async(topic, &BatchItem::all(records)).await
        })
    }

    /// Headers in each record's `headers` column (C25).
    fn publish_batch_with_headers<'a>(
        &'a self,
        topic: &'a str,
        records: &'a [BatchRecordWithHeaders],
    ) -> BoxFuture<'a, Result<Vec<PublishAck>, BusError>> {
        Box::pin(async move {
            for uid in records.iter().filter_map(|r| r.record.uid.as_deref()) {
                validate_uid(uid)?;
            }
            self.publish_async(topic, &BatchItem::all(records)).await
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
    ) -> BoxFuture<'a, Result<Vec<bus_core::StoredRecord>, BusError>> {
        Box::pin(bounded("fetch", self.timeout(), async move {
            let topic = self.topic_async(topic).await?;
            check_partition(&topic.spec.name, partition, topic.spec.partitions)?;
            if max == 0 {
                return Ok(Vec::new());
            }
            fetch::fetch(&self.core.shared, &topic, partition, offset, max).await
        }))
    }

    fn find_event_by_uid<'a>(
        &'a self,
        topic: &'a str,
        key: &'a str,
        event_uid: &'a str,
    ) -> BoxFuture<'a, Result<Option<PublishAck>, BusError>> {
        Box::pin(bounded("find by UID", self.timeout(), async move {
            let state = self.topic_async(topic).await?;
            let partition = uid_partition(&state.spec, key, event_uid)?;
            let found = fetch::find(&self.core.shared, &state, partition, event_uid).await?;
            Ok(found.map(|offset| PublishAck {
                topic: state.spec.name.clone(),
                partition,
                offset,
            }))
        }))
    }

    fn offsets<'a>(
        &'a self,
        topic: &'a str,
        partition: u32,
    ) -> BoxFuture<'a, Result<PartitionOffsets, BusError>> {
        Box::pin(bounded("offsets", self.timeout(), async move {
            let topic = self.topic_async(topic).await?;
            check_partition(&topic.spec.name, partition, topic.spec.partitions)?;
            fetch::offsets(&self.core.shared, &topic, partition).await
        }))
    }

    fn partitions<'a>(&'a self, topic: &'a str) -> BoxFuture<'a, Result<u32, BusError>> {
        Box::pin(bounded("topic lookup", self.timeout(), async move {
            Ok(self.topic_async(topic).await?.spec.partitions)
        }))
    }

    fn provision<'a>(&'a self, manifest: &'a Manifest) -> BoxFuture<'a, Result<(), BusError>> {
        Box::pin(bounded("provision", self.timeout(), async move {
            manifest.validate()?;
            topics::provision(&self.core.shared, manifest).await
        }))
    }

    fn topics<'a>(&'a self) -> BoxFuture<'a, Result<Vec<String>, BusError>> {
        Box::pin(bounded(
            "list topics",
            self.timeout(),
            topics::names(&self.core.shared),
        ))
    }

    fn topic_spec<'a>(
        &'a self,
        topic: &'a str,
    ) -> BoxFuture<'a, Result<Option<bus_core::TopicSpec>, BusError>> {
        Box::pin(bounded("topic lookup", self.timeout(), async move {
            Ok(Some(self.topic_async(topic).await?.spec.clone()))
        }))
    }

    /// Through the sync call on the blocking pool (it runs on the
    /// connector thread, which it starts): an occasional operator task.
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
            bus_core::EventBus::subscribe(&bus, &topic, selector, start, options)?.into_stream()
        }))
    }
}
