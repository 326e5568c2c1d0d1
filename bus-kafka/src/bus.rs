//! [`KafkaBus`]: the bus over a Kafka cluster (its clients, the registry of
//! topics, the connector thread) and its [`EventBus`] implementation: each
//! method checks the topic against the manifest first, then does its Kafka
//! work on the connector.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use bus_core::auth::RecordAuth;
use bus_core::backend::ConnectorExecutor;
use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::Producer as _;

use crate::client::{Delivery, Producer};
use crate::registry::{Entry, Registry};
use crate::{KafkaOptions, client, dedup, reader, waker};
use bus_core::{
    BatchRecord, BatchRecordWithHeaders, BusError, Capabilities, DedupHorizon, EventBus, Headers,
    Manifest, PartitionOffsets, PublishAck, Selector, StartAt, StoredEvent, StoredRecord,
    SubscribeOptions, Subscription, backend::BatchItem, backend::check_partition,
    backend::uid_partition,
};

use crate::{fetch, topics};
use bus_core::backend::sync::lock;

/// Extra time the connector waits past the bus timeout, so librdkafka's own
/// (more precise) timeout error arrives first.
const SLACK: Duration = Duration::from_millis(200);

/// A bus over a Kafka cluster.
pub struct KafkaBus {
    // Dropped first: joins the connector before the clients go. Started on
    // first use; shared with the async surface's internal handles.
    pub(crate) executor: Arc<OnceLock<ConnectorExecutor>>,
    pub(crate) core: Arc<Core>,
    /// The live subscriptions' doorbells, shared with the internal handles
    /// and not with the feeds: they end when the bus is dropped (C17).
    pub(crate) subscriptions: Arc<bus_core::backend::SubscriptionOwner>,
    /// The shared subscription consumer, once a subscription started it;
    /// its subscriptions keep it too.
    pub(crate) waker: Arc<Mutex<Option<Arc<waker::Waker>>>>,
}

impl std::fmt::Debug for KafkaBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaBus")
            .field("options", &self.core.options)
            .finish_non_exhaustive()
    }
}

/// Everything the connector's tasks share.
pub(crate) struct Core {
    pub(crate) options: KafkaOptions,
    /// The producers for [`Delivery::Plain`] and [`Delivery::Uid`] records.
    pub(crate) producers: [RwLock<Arc<Producer>>; 2],
    pub(crate) admin: Arc<AdminClient<DefaultClientContext>>,
    pub(crate) registry: Mutex<Registry>,
    pub(crate) pool: reader::Pool,
    pub(crate) partitions: Mutex<HashMap<(String, u32), Arc<dedup::PartitionState>>>,
    /// What delivery reports and read-backs named (crate::locate).
    pub(crate) reported: Arc<crate::locate::Reported>,
    pub(crate) auth: RwLock<Option<RecordAuth>>,
    /// The broker enforces `retention.ms` within seconds.
    pub(crate) native_retention: bool,
    /// Brokers in the cluster at connect (0 when unknown).
    pub(crate) brokers: usize,
    /// The topics the bus provisions are fsynced before each ack (the
    /// option, or every broker's default).
    pub(crate) flushed: bool,
}

/// What the bus learns of the cluster at connect.
pub(crate) struct ClusterFacts {
    /// The brokers enforce `retention.ms` within seconds.
    native_retention: bool,
    /// Brokers in the cluster (0 when unknown).
    brokers: usize,
    /// Every broker fsyncs each message by default
    /// (`log.flush.interval.messages=1`).
    brokers_flush: bool,
}

impl KafkaBus {
    /// Connects by URL: `kafka://h1:9092,h2:9092?timeout_ms=...` (see
    /// [`KafkaOptions::from_url`]).
    pub fn connect(url: &str) -> Result<Self, BusError> {
        Self::connect_with(KafkaOptions::from_url(url)?)
    }

    /// Connects with explicit options; creates the manifest topic if missing
    /// and reads what [`EventBus::capabilities`] reports of the cluster.
    ///
    /// # Errors
    /// `Timeout` or `Unavailable` (retryable) when the brokers do not answer
    /// within [`KafkaOptions::timeout`], the cluster facts included: a bus
    /// never reports less than the brokers promise because they were slow
    /// to say it. A fact the brokers refuse (an ACL) reads as unknown.
    pub fn connect_with(options: KafkaOptions) -> Result<Self, BusError> {
        options.validate()?;
        let executor = ConnectorExecutor::with_timeout("bus-kafka", options.timeout + SLACK)?;
        let admin = Arc::new(client::admin(&options)?);
        let (facts_options, facts_admin) = (options.clone(), Arc::clone(&admin));
        let timeout = options.timeout;
        let facts = executor.run_bounded(
            "creating the manifest topic",
            timeout + SLACK,
            move || async move {
                let deadline = Instant::now() + timeout;
                tokio::task::spawn_blocking(move || {
                    cluster_facts(&facts_options, &facts_admin, deadline)
                })
                .await
                .unwrap_or_else(|_| {
                    Err(BusError::backend(
                        "kafka",
                        "creating the manifest topic panicked".to_owned(),
                    ))
                })
            },
        )??;
        let bus = Self::assemble(options, admin, facts)?;
        let _ = bus.executor.set(executor);
        Ok(bus)
    }

    /// The bus over `admin`, once the manifest topic exists; starts no
    /// connector.
    pub(crate) fn assemble(
        options: KafkaOptions,
        admin: Arc<AdminClient<DefaultClientContext>>,
        facts: ClusterFacts,
    ) -> Result<Self, BusError> {
        let reported = Arc::new(crate::locate::Reported::default());
        let producers = [
            RwLock::new(Arc::new(client::producer(
                &options,
                Delivery::Plain,
                Arc::clone(&reported),
            )?)),
            RwLock::new(Arc::new(client::producer(
                &options,
                Delivery::Uid,
                Arc::clone(&reported),
            )?)),
        ];
        let bus = Self {
            executor: Arc::default(),
            core: Arc::new(Core {
                producers,
                admin,
                registry: Mutex::new(Registry::open(&options)?),
                pool: reader::Pool::new(&options)?,
                partitions: Mutex::new(HashMap::new()),
                reported,
                auth: RwLock::new(None),
                native_retention: facts.native_retention,
                brokers: facts.brokers,
                flushed: options.flush_each_message || facts.brokers_flush,
                options,
            }),
            subscriptions: Arc::default(),
            waker: Arc::default(),
        };
        let core = &bus.core;
        lock(&core.registry).refresh(&core.options, &core.pool.meta(), bus.deadline())?;
        Ok(bus)
    }

    /// Whether this bus's connector thread has been started (by
    /// [`KafkaBus::connect`], provisioning or deleting topics through the
    /// sync surface): a bus made by `connect_async` and used through the
    /// async surface never starts it.
    pub fn connector_started(&self) -> bool {
        self.executor.get().is_some()
    }

    /// The connector, started on first use.
    pub(crate) fn executor(&self) -> Result<&ConnectorExecutor, BusError> {
        if let Some(executor) = self.executor.get() {
            return Ok(executor);
        }
        let timeout = self.core.options.timeout + SLACK;
        let started = ConnectorExecutor::with_timeout("bus-kafka", timeout)?;
        // A racing caller may have started one first: this one is dropped.
        let _ = self.executor.set(started);
        self.executor
            .get()
            .ok_or_else(|| BusError::backend("kafka", "the connector did not start"))
    }

    /// The options this bus was built with.
    pub fn options(&self) -> &KafkaOptions {
        &self.core.options
    }

    /// Deletes bus topics (their Kafka topics and manifest entries): for
    /// tests and tooling. Records are lost.
    pub fn delete_topics(&self, names: &[String]) -> Result<(), BusError> {
        let names = names.to_vec();
        self.blocking("deleting topics", move |core, deadline| {
            topics::delete_topics(core, &names, deadline)
        })
    }

    /// Runs `work` on the connector's blocking pool, bounded by the bus
    /// timeout; `work` gets the deadline it must finish by and may
    /// `Handle::current().block_on` rdkafka futures (it is not the caller's
    /// thread nor a runtime worker).
    pub(crate) fn blocking<T, F>(&self, what: &str, work: F) -> Result<T, BusError>
    where
        T: Send + 'static,
        F: FnOnce(&Arc<Core>, Instant) -> Result<T, BusError> + Send + 'static,
    {
        let core = Arc::clone(&self.core);
        let timeout = core.options.timeout;
        let name = what.to_owned();
        self.executor()?
            .run_bounded(what, timeout + SLACK, move || async move {
                let deadline = Instant::now() + timeout;
                tokio::task::spawn_blocking(move || work(&core, deadline))
                    .await
                    .unwrap_or_else(|_| Err(BusError::backend("kafka", format!("{name} panicked"))))
            })?
    }

    /// The deadline of an operation starting now.
    pub(crate) fn deadline(&self) -> Instant {
        Instant::now() + self.core.options.timeout
    }

    /// The manifest entry of `topic`: from the cache, else after reading
    /// what other buses provisioned; [`BusError::UnknownTopic`] otherwise.
    pub(crate) fn entry(&self, topic: &str) -> Result<Entry, BusError> {
        bus_core::backend::validate_topic(topic)?;
        if let Some(entry) = lock(&self.core.registry).cached(topic) {
            return Ok(entry.clone());
        }
        let core = &self.core;
        let mut registry = lock(&core.registry);
        registry.refresh(&core.options, &core.pool.meta(), self.deadline())?;
        registry
            .cached(topic)
            .cloned()
            .ok_or_else(|| BusError::UnknownTopic(topic.to_owned()))
    }
}

/// Creates the manifest topic if missing (it must exist before its
/// consumer is made, or that consumer caches the topic as unknown), and
/// learns whether the brokers enforce retention promptly, how many there
/// are and whether they flush each message. Blocks: runs on a
/// blocking-pool thread.
///
/// A fact the brokers refuse to tell (an ACL on DescribeConfigs, say) is
/// unknown and promises nothing (a warning says so); one they did not
/// answer in time fails the connect as `Timeout`/`Unavailable`, which the
/// caller may retry: a bus connected a moment after its broker started
/// must not report `AckDurability::None` for brokers that flush each
/// message only because the connect's deadline ran out first (a flake of
/// tests/power_cut.rs under load).
pub(crate) fn cluster_facts(
    options: &KafkaOptions,
    admin: &AdminClient<DefaultClientContext>,
    deadline: Instant,
) -> Result<ClusterFacts, BusError> {
    topics::ensure_manifest_topic(options, admin, deadline)?;
    Ok(ClusterFacts {
        native_retention: best_effort(
            "whether the brokers check retention promptly",
            topics::broker_checks_retention_promptly(options, admin, deadline),
            false,
        )?,
        brokers: best_effort(
            "how many brokers there are",
            topics::broker_count(options, admin, deadline),
            0,
        )?,
        brokers_flush: best_effort(
            "whether the brokers flush each message",
            crate::flush::brokers_flush_each_message(options, admin, deadline),
            false,
        )?,
    })
}

/// `answer`, or `unknown` with a warning when the brokers refused it; a
/// transient error (no answer in time) is returned.
fn best_effort<T>(fact: &str, answer: Result<T, BusError>, unknown: T) -> Result<T, BusError> {
    match answer {
        Err(error) if !error.is_transient() => {
            tracing::warn!(%error, "kafka: cannot tell {fact}; capabilities promise nothing of it");
            Ok(unknown)
        }
        answer => answer,
    }
}

impl Core {
    pub(crate) fn producer_slot(&self, kind: Delivery) -> &RwLock<Arc<Producer>> {
        &self.producers[usize::from(kind == Delivery::Uid)]
    }

    /// The current producer of `kind`.
    pub(crate) fn producer(&self, kind: Delivery) -> Arc<Producer> {
        match self.producer_slot(kind).read() {
            Ok(guard) => Arc::clone(&guard),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Replaces the producer after librdkafka declared it fatally failed
    /// (an idempotent producer can, e.g. after lost sequence numbers), so
    /// the bus recovers without the caller rebuilding it.
    pub(crate) fn heal_producer(&self, kind: Delivery, failed: &Arc<Producer>) {
        if let Some((_, reason)) = failed.client().fatal_error() {
            self.replace_producer(kind, failed, &format!("failed fatally: {reason}"));
        }
    }

    /// Replaces the plain producer when it has delivered nothing for two
    /// bus timeouts while calls kept timing out: after a broker restarts,
    /// librdkafka's idempotent producer can stay in its drain of cut-off
    /// requests while every new record times out behind it (CI saw a minute
    /// of it). A fresh producer gets a new producer id and delivers at once.
    /// Records the old one held were already reported to their callers as
    /// timed out (outcome unknown, C10). The UID producer is never replaced
    /// this way: its late reports keep a retried UID from a second copy.
    pub(crate) fn heal_stalled(&self, kind: Delivery, stalled: &Arc<Producer>) {
        if kind != Delivery::Plain {
            return;
        }
        let quiet_ms = stalled.context().quiet_ms();
        let limit = u64::try_from(self.options.timeout.as_millis() * 2).unwrap_or(u64::MAX);
        if quiet_ms >= limit {
            self.replace_producer(
                kind,
                stalled,
                &format!("delivered nothing for {quiet_ms} ms"),
            );
        }
    }

    fn replace_producer(&self, kind: Delivery, old: &Arc<Producer>, why: &str) {
        let mut slot = self
            .producer_slot(kind)
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !Arc::ptr_eq(&slot, old) {
            return;
        }
        match client::producer(&self.options, kind, Arc::clone(&self.reported)) {
            Ok(fresh) => {
                tracing::warn!(why, ?kind, "kafka: a producer was replaced by a new one");
                let retired = std::mem::replace(&mut *slot, Arc::new(fresh));
                client::retire(retired);
            }
            Err(error) => tracing::error!(
                %error,
                why,
                "kafka: a producer could not be replaced"
            ),
        }
    }

    /// The record signer, when a control key is set.
    pub(crate) fn auth(&self) -> Option<RecordAuth> {
        match self.auth.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

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

    /// Headers as Kafka record headers beside `bus-uid` and `bus-tag` (C25).
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

    fn fetch(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, BusError> {
        Ok(self
            .fetch_with_headers(topic, partition, offset, max)?
            .into_iter()
            .map(|record| record.event)
            .collect())
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
    fn fetch_with_headers(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> Result<Vec<StoredRecord>, BusError> {
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

    fn delete_below(&self, topic: &str, partition: u32, offset: u64) -> Result<u64, BusError> {
        let entry = self.entry(topic)?;
        check_partition(topic, partition, entry.spec.partitions)?;
        let kafka_topic = entry.kafka_topic.clone();
        let partition = i32::try_from(partition).unwrap_or(i32::MAX);
        self.blocking("delete_below", move |core, deadline| {
            topics::delete_below(core, &kafka_topic, partition, offset, deadline)
        })
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
            .headers(true)
            .native_retention(self.core.native_retention)
            // Flushed per message, the ack comes after the fsync (of the
            // leader and of every in-sync follower that acked). Otherwise a
            // broker never fsyncs by itself: an ack is durable only by
            // replication, which needs three brokers (topics at RF >= 3 get
            // min.insync.replicas = 2).
            .ack_durability(if self.core.flushed {
                bus_core::AckDurability::Disk
            } else if self.core.brokers >= 3 {
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
        self.publish_many(topic, &BatchItem::all(records))
    }
    /// Headers as Kafka record headers of each record (C25).
    fn publish_batch_with_headers(
        &self,
        topic: &str,
        records: &[BatchRecordWithHeaders],
    ) -> Result<Vec<PublishAck>, BusError> {
        self.publish_many(topic, &BatchItem::all(records))
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
