//! The synchronous [`EventBus`] over the connector runtime.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use bus_core::auth::RecordAuth;
use bus_core::backend::BatchItem;
use bus_core::backend::Plan;
use bus_core::{
    BatchRecord, BatchRecordWithHeaders, BusError, Capabilities, DedupHorizon, EventBus, Headers,
    Manifest, PartitionOffsets, PublishAck, Selector, StartAt, StoredEvent, StoredRecord,
    SubscribeOptions, Subscription, backend::ConnectorExecutor, backend::check_partition,
    backend::uid_partition, backend::validate_uid,
};

use crate::errors::pool;
use crate::inner::Core;
use crate::options::PostgresOptions;
use crate::publish::{append, prepare};
use crate::queue::Prepared;
use crate::shared::{Shared, Topic};
use crate::subscribe::PgFeed;
use crate::{fetch, listen, topics};

/// A bus whose topics live in PostgreSQL tables (see the crate docs).
pub struct PostgresBus {
    pub(crate) core: Arc<Core>,
}

impl std::fmt::Debug for PostgresBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresBus")
            .field("options", &self.core.shared.options)
            .finish_non_exhaustive()
    }
}

impl PostgresBus {
    /// Connects to `postgres://USER:PASSWORD@HOST:PORT/DB[?schema=S&timeout_ms=N&pool_size=N]`.
    pub fn connect(url: &str) -> Result<Self, BusError> {
        Self::connect_with(PostgresOptions::from_url(url)?)
    }

    /// Connects with `options`; refuses a schema written by a newer version.
    pub fn connect_with(options: PostgresOptions) -> Result<Self, BusError> {
        options.check()?;
        let executor = ConnectorExecutor::with_timeout("bus-postgres", options.timeout)?;
        let shared = Arc::new(Shared::new(options)?);
        let core = Arc::new(Core {
            executor: OnceLock::from(executor),
            shared,
        });
        core.run("connect", |shared| async move {
            let client = shared.pool.get().await.map_err(pool)?;
            topics::check_version(&shared, &**client).await
        })?;
        Ok(Self { core })
    }

    /// Whether this bus has started its connector thread: a bus made by
    /// `connect_async` (feature `async`) starts it at its first
    /// synchronous call or subscription.
    pub fn connector_started(&self) -> bool {
        self.core.connector_started()
    }

    /// A batch, with or without headers (C25); UIDs checked by the caller.
    fn publish_records(
        &self,
        topic: &str,
        records: &[BatchItem<'_>],
    ) -> Result<Vec<PublishAck>, BusError> {
        let topic = self.core.topic(topic)?;
        let Some(rounds) = Rounds::prepare(&topic, records)? else {
            return Ok(Vec::new());
        };
        let name = topic.spec.name.clone();
        let offsets = self.core.run("publish", move |shared| async move {
            rounds.append(shared, topic).await
        })?;
        Rounds::acks(&name, offsets)
    }

    fn publish_one(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
        uid: Option<&str>,
        headers: &Headers,
    ) -> Result<PublishAck, BusError> {
        let topic = self.core.topic(topic)?;
        let prepared = prepare(&topic, key, value, uid, headers)?;
        let rounds = Rounds::group(vec![prepared]);
        let name = topic.spec.name.clone();
        let offsets = self.core.run("publish", move |shared| async move {
            rounds.append(shared, topic).await
        })?;
        Rounds::acks(&name, offsets)?
            .into_iter()
            .next()
            .ok_or_else(|| BusError::backend("postgres", "publish returned no ack"))
    }
}

impl EventBus for PostgresBus {
    fn set_control_key(&self, key: [u8; 32]) -> Result<(), BusError> {
        self.core.shared.set_auth(RecordAuth::new(&key));
        Ok(())
    }

    fn publish(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
    ) -> Result<PublishAck, BusError> {
        self.publish_one(topic, key, value, None, &Headers::new())
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
        self.publish_one(topic, key, value, Some(event_uid), &Headers::new())
    }

    /// Headers in the `headers` column, covered by the placed tag (C25).
    fn publish_with_headers(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
        event_uid: Option<&str>,
        headers: &Headers,
    ) -> Result<PublishAck, BusError> {
        if let Some(uid) = event_uid {
            bus_core::backend::validate_uid(uid)?;
        }
        self.publish_one(topic, key, value, event_uid, headers)
    }

    fn fetch_with_headers(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> Result<Vec<StoredRecord>, BusError> {
        self.core.fetch(topic, partition, offset, max)
    }
    fn find_event_by_uid(
        &self,
        topic: &str,
        key: &str,
        event_uid: &str,
    ) -> Result<Option<PublishAck>, BusError> {
        let state = self.core.topic(topic)?;
        let partition = uid_partition(&state.spec, key, event_uid)?;
        let uid = event_uid.to_owned();
        let name = state.spec.name.clone();
        let found = self.core.run("find by UID", move |shared| async move {
            fetch::find(&shared, &state, partition, &uid).await
        })?;
        Ok(found.map(|offset| PublishAck {
            topic: name,
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
        Ok(self
            .core
            .fetch(topic, partition, offset, max)?
            .into_iter()
            .map(|record| record.event)
            .collect())
    }

    fn partitions(&self, topic: &str) -> Result<u32, BusError> {
        Ok(self.core.topic(topic)?.spec.partitions)
    }

    fn topics(&self) -> Vec<String> {
        self.core
            .run("list topics", |shared| async move {
                topics::names(&shared).await
            })
            .unwrap_or_else(|error| {
                tracing::warn!(
                    "bus-postgres: listing topics failed, answering from the cache: {error}"
                );
                self.core.shared.cached_names()
            })
    }
    fn maintenance(&self, now_ms: u64) -> Result<u64, BusError> {
        let names = self.core.run("list topics", |shared| async move {
            topics::names(&shared).await
        })?;
        let mut expired = 0;
        for name in names {
            let topic = self.core.topic(&name)?;
            if topic.spec.retention_ms.is_none() {
                continue;
            }
            expired += self.core.run("retention", move |shared| async move {
                fetch::expire(&shared, &topic, now_ms).await
            })?;
        }
        Ok(expired)
    }
    fn provision(&self, manifest: &Manifest) -> Result<(), BusError> {
        manifest.validate()?;
        let manifest = manifest.clone();
        self.core.run("provision", move |shared| async move {
            topics::provision(&shared, &manifest).await
        })
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::minimal("postgres")
            .durable(true)
            .dedup_horizon(DedupHorizon::Retained)
            .maintenance_retention(true)
            .native_batch(true)
            .headers(true)
    }

    /// The spec from the topics table (cached after the first lookup).
    fn topic_spec(&self, topic: &str) -> Result<Option<bus_core::TopicSpec>, BusError> {
        Ok(Some(self.core.topic(topic)?.spec.clone()))
    }
    fn offsets(&self, topic: &str, partition: u32) -> Result<PartitionOffsets, BusError> {
        self.core.offsets(topic, partition)
    }
    /// Moves the partition's recorded log start up to `offset` (never past
    /// the counter) and deletes the rows below it, in one statement under
    /// the counter row's lock (C24): reads then begin there, and a row
    /// missing above it is still damage.
    fn delete_below(&self, topic: &str, partition: u32, offset: u64) -> Result<u64, BusError> {
        let topic = self.core.topic(topic)?;
        check_partition(&topic.spec.name, partition, topic.spec.partitions)?;
        self.core.run("delete below", move |shared| async move {
            fetch::delete_below(&shared, &topic, partition, offset).await
        })
    }
    fn publish_batch(
        &self,
        topic: &str,
        records: &[BatchRecord],
    ) -> Result<Vec<PublishAck>, BusError> {
        for record in records {
            if let Some(uid) = &record.uid {
                validate_uid(uid)?;
            }
        }
        self.publish_records(topic, &BatchItem::all(records))
    }
    /// Headers in each record's `headers` column (C25).
    fn publish_batch_with_headers(
        &self,
        topic: &str,
        records: &[BatchRecordWithHeaders],
    ) -> Result<Vec<PublishAck>, BusError> {
        for uid in records.iter().filter_map(|r| r.record.uid.as_deref()) {
            validate_uid(uid)?;
        }
        self.publish_records(topic, &BatchItem::all(records))
    }
    fn subscribe(
        &self,
        topic: &str,
        selector: Selector,
        start: StartAt,
        options: SubscribeOptions,
    ) -> Result<Subscription, BusError> {
        let state = self.core.topic(topic)?;
        // Listen before the start positions are read: a record committed
        // after that read then rings this bell (or is seen by the first read).
        let bell = self.core.shared.listener.register(&state.spec.name);
        self.core
            .run("subscribe", move |shared| listen::listen(shared, state))?;
        let plan = Plan::new(self, topic, &selector, start)?;
        let feed = PgFeed::new(&self.core, topic);
        Subscription::new(plan, options, Box::new(feed), bell)
    }
}

/// A batch's records split by partition, each partition's records in
/// order as one request of its queue; shared by both surfaces.
pub(crate) struct Rounds {
    count: usize,
    by_partition: BTreeMap<u32, (Vec<usize>, Vec<Prepared>)>,
}

impl Rounds {
    /// Checks and encodes `records`; `None` for an empty batch.
    pub(crate) fn prepare(
        topic: &Topic,
        records: &[BatchItem<'_>],
    ) -> Result<Option<Self>, BusError> {
        let prepared = records
            .iter()
            .map(|r| prepare(topic, r.key, r.value, r.uid, r.headers))
            .collect::<Result<Vec<_>, _>>()?;
        if prepared.is_empty() {
            return Ok(None);
        }
        Ok(Some(Self::group(prepared)))
    }

    /// Prepared records split by partition, in order.
    pub(crate) fn group(prepared: Vec<Prepared>) -> Self {
        let count = prepared.len();
        let mut by_partition: BTreeMap<u32, (Vec<usize>, Vec<Prepared>)> = BTreeMap::new();
        for (index, record) in prepared.into_iter().enumerate() {
            let entry = by_partition.entry(record.partition).or_default();
            entry.0.push(index);
            entry.1.push(record);
        }
        Self {
            count,
            by_partition,
        }
    }

    /// Appends every partition's records (their rounds run concurrently);
    /// each record's partition and offset, in the batch's order.
    pub(crate) async fn append(
        self,
        shared: Arc<Shared>,
        topic: Arc<Topic>,
    ) -> Result<Vec<Option<(u32, u64)>>, BusError> {
        let mut places = Vec::new();
        let mut rounds = Vec::new();
        for (partition, (indexes, records)) in self.by_partition {
            places.push((partition, indexes));
            rounds.push(append(
                Arc::clone(&shared),
                Arc::clone(&topic),
                partition,
                records,
            ));
        }
        let results = futures::future::join_all(rounds).await;
        let mut offsets = vec![None; self.count];
        for ((partition, indexes), result) in places.into_iter().zip(results) {
            for (index, offset) in indexes.into_iter().zip(result?) {
                offsets[index] = Some((partition, offset));
            }
        }
        Ok(offsets)
    }

    /// The acks of [`Rounds::append`]'s answer.
    pub(crate) fn acks(
        topic: &str,
        offsets: Vec<Option<(u32, u64)>>,
    ) -> Result<Vec<PublishAck>, BusError> {
        offsets
            .into_iter()
            .map(|slot| {
                let (partition, offset) =
                    slot.ok_or_else(|| BusError::backend("postgres", "publish returned no ack"))?;
                Ok(PublishAck {
                    topic: topic.to_owned(),
                    partition,
                    offset,
                })
            })
            .collect()
    }
}
