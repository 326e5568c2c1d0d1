//! [`NatsBus`]: the [`EventBus`] over JetStream. Every async call of the
//! sync surface runs on the bus's own connector thread
//! ([`ConnectorExecutor`]), bounded by the operation timeout; callers block
//! only on their own thread. The connector starts with the first sync call
//! (or with [`NatsBus::connect`]); the async surface (feature `async`)
//! awaits the same code on the caller's runtime instead.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_nats::jetstream;
use bus_core::auth::RecordAuth;
use bus_core::backend::BatchItem;
use bus_core::{
    BatchRecord, BatchRecordWithHeaders, BusError, Capabilities, DedupHorizon, EventBus, Headers,
    Manifest, PartitionOffsets, PublishAck, Selector, StartAt, StoredEvent, StoredRecord,
    SubscribeOptions, Subscription, backend::ConnectorExecutor, backend::check_partition,
    backend::uid_partition, backend::validate_topic,
};

use crate::errors::{BACKEND, unavailable, unavailable_caused};
use crate::get::Reads;
use crate::naming::record_subject_as;
use crate::options::NatsOptions;
use crate::publish::{prepare, send_all};
use crate::shared::{Shared, TopicState};
use crate::uid::{Resolved, UidSubject};
use crate::{fetch, topics};

/// Acks a single connection may leave outstanding (pipelined batches).
const MAX_ACKS_IN_FLIGHT: usize = 65_536;
/// How long dropping a bus waits to delete its readers' consumers.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(1);

/// A bus on NATS JetStream: one stream per topic partition.
///
/// ```no_run
/// use bus_core::{EventBus, Manifest, TopicSpec};
///
/// let bus = bus_nats::NatsBus::connect("nats://127.0.0.1:4222?prefix=demo").unwrap();
/// bus.provision(&Manifest::new([TopicSpec::new("audit", 4)])).unwrap();
/// let ack = bus.publish("audit", "agent-1", &serde_json::json!({"n": 1})).unwrap();
/// assert_eq!(bus.fetch("audit", ack.partition, ack.offset, 1).unwrap().len(), 1);
/// ```
pub struct NatsBus {
    pub(crate) shared: Arc<Shared>,
    /// Started by the first sync call (see [`NatsBus::executor`]); shared
    /// with the bus's subscriptions, whose feeds stop with them (a dropped
    /// bus closes their doorbells, so they end).
    pub(crate) executor: Arc<OnceLock<Arc<ConnectorExecutor>>>,
    /// False for the internal handles the async surface moves onto the
    /// blocking pool: dropping one cleans nothing up.
    pub(crate) primary: bool,
    /// Set on those handles: their sync calls run on this runtime (the
    /// async caller's) instead of the connector.
    pub(crate) on_runtime: Option<tokio::runtime::Handle>,
}

/// Where a bus's sync code runs its futures: the connector, or (for the
/// async surface's handles) the caller's runtime, from a thread that is not
/// one of its workers.
#[derive(Clone)]
pub(crate) enum Runner {
    Connector(Arc<ConnectorExecutor>),
    Runtime(tokio::runtime::Handle),
}

impl Runner {
    /// Runs `operation` bounded by `timeout`, blocking the calling thread.
    pub(crate) fn run_bounded<F, Fut, T>(
        &self,
        what: &str,
        timeout: Duration,
        operation: F,
    ) -> Result<T, BusError>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let runtime = match self {
            Self::Connector(executor) => return executor.run_bounded(what, timeout, operation),
            Self::Runtime(runtime) => runtime,
        };
        let (sender, receiver) = std::sync::mpsc::sync_channel(1);
        runtime.spawn(async move {
            let result = tokio::time::timeout(timeout, operation()).await;
            let _ = sender.send(result.ok());
        });
        match receiver.recv_timeout(timeout + CLEANUP_TIMEOUT) {
            Ok(Some(value)) => Ok(value),
            Ok(None) | Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                Err(BusError::timeout(what, timeout))
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(unavailable(format!(
                "{what}: the runtime it ran on has shut down"
            ))),
        }
    }

    /// [`Runner::run_bounded`] for a subscription's reads, which run on the
    /// subscription's own thread: on the caller's runtime, the wait also
    /// ends when the subscription's `bell` is closed, so dropping the
    /// subscription from a task of that runtime (which may be the one
    /// thread the read's future needs) never waits for the read.
    pub(crate) fn run_watching<F, Fut, T>(
        &self,
        bell: &Arc<bus_core::backend::Doorbell>,
        what: &str,
        timeout: Duration,
        operation: F,
    ) -> Result<T, BusError>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let runtime = match self {
            Self::Connector(executor) => return executor.run_bounded(what, timeout, operation),
            Self::Runtime(runtime) => runtime,
        };
        let (sender, receiver) = std::sync::mpsc::sync_channel(1);
        let rung = Arc::clone(bell);
        runtime.spawn(async move {
            let result = tokio::time::timeout(timeout, operation()).await;
            let _ = sender.send(result.ok());
            // The subscription re-reads after a ring: a spurious one costs
            // a read at the known end, answered without a round trip.
            rung.ring();
        });
        let deadline = std::time::Instant::now() + timeout + CLEANUP_TIMEOUT;
        loop {
            let seen = bell.generation();
            match receiver.try_recv() {
                Ok(Some(value)) => return Ok(value),
                Ok(None) => break,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    return Err(unavailable(format!(
                        "{what}: the runtime it ran on has shut down"
                    )));
                }
                Err(std::sync::mpsc::TryRecvError::Empty) => {}
            }
            if bell.is_closed() {
                return Err(unavailable(format!("{what}: the subscription was closed")));
            }
            if !bell.wait_past(seen, deadline) {
                break;
            }
        }
        Err(BusError::timeout(what, timeout))
    }

    /// Spawns background work.
    pub(crate) fn spawn(&self, work: impl Future<Output = ()> + Send + 'static) {
        match self {
            Self::Connector(executor) => {
                executor.handle().spawn(work);
            }
            Self::Runtime(runtime) => {
                runtime.spawn(work);
            }
        }
    }
}

impl std::fmt::Debug for NatsBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsBus")
            .field("prefix", &self.shared.prefix)
            .field("timeout", &self.shared.timeout)
            .finish_non_exhaustive()
    }
}

impl NatsBus {
    /// Connects using a `nats://` URL (see [`NatsOptions::from_url`]).
    pub fn connect(url: &str) -> Result<Self, BusError> {
        Self::connect_with(NatsOptions::from_url(url)?)
    }

    /// Connects with `options`. Fails within the connect timeout when no
    /// server answers; after that, lost connections are re-established in
    /// the background and calls fail within the operation timeout meanwhile.
    pub fn connect_with(options: NatsOptions) -> Result<Self, BusError> {
        options.check()?;
        let executor = ConnectorExecutor::with_timeout("bus-nats", options.timeout)?;
        let connect_timeout = options.connect_timeout + options.timeout;
        let (timeout, prefix) = (options.timeout, options.prefix.clone());
        let connected =
            executor.run_bounded("nats connect", connect_timeout, move || async move {
                let client = connect_client(&options).await?;
                jetstream_of(client, options.timeout).await
            })??;
        let bus = Self::from_parts(connected, prefix, timeout);
        let _ = bus.executor.set(Arc::new(executor));
        Ok(bus)
    }

    /// A bus over a connected JetStream context; starts no thread.
    pub(crate) fn from_parts(js: jetstream::Context, prefix: String, timeout: Duration) -> Self {
        let info = js.client().server_info();
        let (max_payload, clustered) = (info.max_payload, info.cluster.is_some());
        let mut shared = Shared::new(js, prefix, timeout, max_payload);
        shared.clustered = clustered;
        Self {
            shared: Arc::new(shared),
            executor: Arc::default(),
            primary: true,
            on_runtime: None,
        }
    }

    /// Whether this bus's connector thread has been started (by
    /// [`NatsBus::connect`] or a sync call): the async surface of a bus
    /// made by `connect_async` or `from_client` never starts it.
    pub fn connector_started(&self) -> bool {
        self.executor.get().is_some()
    }

    /// The stream-name prefix this bus uses.
    pub fn prefix(&self) -> &str {
        &self.shared.prefix
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Where this bus's sync code runs its futures.
    pub(crate) fn runner(&self) -> Result<Runner, BusError> {
        match &self.on_runtime {
            Some(runtime) => Ok(Runner::Runtime(runtime.clone())),
            None => Ok(Runner::Connector(Arc::clone(self.executor()?))),
        }
    }

    /// The connector, started on first use.
    pub(crate) fn executor(&self) -> Result<&Arc<ConnectorExecutor>, BusError> {
        if let Some(executor) = self.executor.get() {
            return Ok(executor);
        }
        let started = ConnectorExecutor::with_timeout("bus-nats", self.shared.timeout)?;
        // A racing caller may have started one first: this one is dropped.
        let _ = self.executor.set(Arc::new(started));
        self.executor
            .get()
            .ok_or_else(|| BusError::backend("nats", "the connector did not start"))
    }

    pub(crate) fn run<T, Fut>(
        &self,
        what: &str,
        operation: impl FnOnce(Arc<Shared>) -> Fut + Send + 'static,
    ) -> Result<T, BusError>
    where
        Fut: Future<Output = Result<T, BusError>> + Send + 'static,
        T: Send + 'static,
    {
        let shared = Arc::clone(&self.shared);
        self.runner()?
            .run_bounded(what, self.shared.timeout, move || operation(shared))?
    }

    /// The topic from the cache, else from the server (another process may
    /// have provisioned it). Unknown topics create nothing (contract C2).
    pub(crate) fn topic(&self, name: &str) -> Result<Arc<TopicState>, BusError> {
        validate_topic(name)?;
        if let Some(state) = self.shared.cached(name) {
            return Ok(state);
        }
        let owned = name.to_owned();
        let spec = self.run("topic lookup", move |shared| async move {
            topics::lookup(&shared, &owned).await
        })?;
        match spec {
            Some(spec) => Ok(self.shared.remember(spec)),
            None => Err(BusError::UnknownTopic(name.to_owned())),
        }
    }

    fn publish_records(
        &self,
        topic: &str,
        records: &[BatchItem<'_>],
    ) -> Result<Vec<PublishAck>, BusError> {
        let state = self.topic(topic)?;
        let prepared = records
            .iter()
            .map(|r| prepare(&self.shared, &state, r.key, r.value, r.uid, r.headers))
            .collect::<Result<Vec<_>, _>>()?;
        if prepared.is_empty() {
            return Ok(Vec::new());
        }
        self.run("publish", move |shared| send_all(shared, state, prepared))
    }

    fn publish_one(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
        uid: Option<&str>,
        headers: &Headers,
    ) -> Result<PublishAck, BusError> {
        let state = self.topic(topic)?;
        let prepared = prepare(&self.shared, &state, key, value, uid, headers)?;
        let acks = self.run("publish", move |shared| {
            send_all(shared, state, vec![prepared])
        })?;
        acks.into_iter()
            .next()
            .ok_or_else(|| BusError::backend("nats", "publish returned no ack"))
    }
}

impl EventBus for NatsBus {
    fn set_control_key(&self, key: [u8; 32]) -> Result<(), BusError> {
        self.shared.set_auth(RecordAuth::new(&key));
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

    /// Headers as NATS message headers beside the bus's own (C25).
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
        let state = self.topic(topic)?;
        check_partition(topic, partition, state.spec.partitions)?;
        if max == 0 {
            return Ok(Vec::new());
        }
        let messages = self.run("fetch", move |shared| {
            fetch::fetch(shared, state, partition, offset, max)
        })?;
        fetch::decode_all(topic, partition, self.shared.auth().as_ref(), &messages)
    }
    fn find_event_by_uid(
        &self,
        topic: &str,
        key: &str,
        event_uid: &str,
    ) -> Result<Option<PublishAck>, BusError> {
        let state = self.topic(topic)?;
        let partition = uid_partition(&state.spec, key, event_uid)?;
        let stream = state
            .partitions
            .get(partition as usize)
            .map(|p| p.stream.clone())
            .ok_or_else(|| {
                BusError::backend(
                    "nats",
                    format!("topic {topic:?} lost partition {partition}"),
                )
            })?;
        let subject = record_subject_as(&stream, Some(event_uid), state.uid_subjects);
        let (name, uid) = (topic.to_owned(), event_uid.to_owned());
        let sequence = self.run("find_event_by_uid", move |shared| async move {
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
                topic: &name,
                partition,
                uid: &uid,
                auth: auth.as_ref(),
                what: &what,
            };
            Ok(match lookup.resolve().await? {
                Resolved::Authentic(sequence) => Some(sequence),
                Resolved::Absent { .. } => None,
            })
        })?;
        Ok(sequence.map(|sequence| PublishAck {
            topic: topic.to_owned(),
            partition,
            offset: sequence.saturating_sub(1),
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
            .fetch_with_headers(topic, partition, offset, max)?
            .into_iter()
            .map(|record| record.event)
            .collect())
    }
    fn delete_below(&self, topic: &str, partition: u32, offset: u64) -> Result<u64, BusError> {
        let state = self.topic(topic)?;
        check_partition(topic, partition, state.spec.partitions)?;
        self.run("delete_below", move |shared| {
            fetch::delete_below(shared, state, partition, offset)
        })
    }

    fn offsets(&self, topic: &str, partition: u32) -> Result<PartitionOffsets, BusError> {
        let state = self.topic(topic)?;
        check_partition(topic, partition, state.spec.partitions)?;
        self.run("offsets", move |shared| {
            fetch::offsets(shared, state, partition)
        })
    }

    fn partitions(&self, topic: &str) -> Result<u32, BusError> {
        Ok(self.topic(topic)?.spec.partitions)
    }

    fn topics(&self) -> Vec<String> {
        match self.run(
            "topics",
            |shared| async move { topics::list(&shared).await },
        ) {
            Ok(specs) => {
                let mut names: Vec<String> = specs
                    .into_iter()
                    .map(|spec| self.shared.remember(spec).spec.name.clone())
                    .collect();
                names.sort();
                names
            }
            // The trait gives no room for an error: answer from the cache.
            Err(_) => self.shared.cached_names(),
        }
    }
    fn provision(&self, manifest: &Manifest) -> Result<(), BusError> {
        manifest.validate()?;
        let owned = manifest.clone();
        let specs = self.run("provision", move |shared| async move {
            topics::provision(&shared, &owned).await
        })?;
        for spec in specs {
            self.shared.remember(spec);
        }
        Ok(())
    }

    /// The spec recorded on the topic's partition-0 stream, the record
    /// `provision` verifies an existing topic against (C1). Read from the
    /// server, not the cache, so a topic re-provisioned or deleted by
    /// another process shows as it is.
    fn topic_spec(&self, topic: &str) -> Result<Option<bus_core::TopicSpec>, BusError> {
        validate_topic(topic)?;
        let owned = topic.to_owned();
        let spec = self.run("describing a topic", move |shared| async move {
            topics::lookup(&shared, &owned).await
        })?;
        match spec {
            Some(spec) => Ok(Some(self.shared.remember(spec).spec.clone())),
            None => {
                self.shared.forget(topic);
                Err(BusError::UnknownTopic(topic.to_owned()))
            }
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::minimal(BACKEND)
            .durable(true)
            .dedup_horizon(DedupHorizon::Retained)
            .native_retention(true)
            .native_batch(true)
            .headers(true)
            // Acks are fsynced only under the server's `sync_interval:
            // always`, which a client cannot read (scripts/nats*.sh set it).
            .ack_durability(bus_core::AckDurability::Unknown)
    }
    fn publish_batch(
        &self,
        topic: &str,
        records: &[BatchRecord],
    ) -> Result<Vec<PublishAck>, BusError> {
        self.publish_records(topic, &BatchItem::all(records))
    }
    /// Headers as NATS message headers of each record (C25).
    fn publish_batch_with_headers(
        &self,
        topic: &str,
        records: &[BatchRecordWithHeaders],
    ) -> Result<Vec<PublishAck>, BusError> {
        self.publish_records(topic, &BatchItem::all(records))
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

impl Drop for NatsBus {
    fn drop(&mut self) {
        if !self.primary {
            return;
        }
        // Its subscriptions end (their feeds stop with them).
        self.shared.bells.close_all();
        // Delete the readers' consumers now rather than leaving them to the
        // server's inactivity expiry.
        let cursors: Vec<(String, String)> = self
            .shared
            .all_cached()
            .iter()
            .flat_map(|topic| topic.partitions.iter())
            .filter_map(|partition| {
                partition
                    .cursor
                    .try_lock()
                    .ok()?
                    .as_ref()
                    .map(crate::cursor::Cursor::id)
            })
            .collect();
        if cursors.is_empty() {
            return;
        }
        let js = self.shared.js.clone();
        let cleanup = async move {
            let deletes = cursors
                .iter()
                .map(|(stream, name)| js.delete_consumer_from_stream(name, stream));
            let _ = tokio::time::timeout(CLEANUP_TIMEOUT, futures::future::join_all(deletes)).await;
        };
        match (self.executor.get(), tokio::runtime::Handle::try_current()) {
            (Some(executor), _) => {
                let _ = executor.run_bounded("closing readers", CLEANUP_TIMEOUT, move || cleanup);
            }
            // A bus used only through the async surface: in the background
            // on the caller's runtime (the server expires them otherwise).
            (None, Ok(runtime)) => {
                runtime.spawn(cleanup);
            }
            (None, Err(_)) => {}
        }
    }
}

/// Connects a client as `options` say.
pub(crate) async fn connect_client(options: &NatsOptions) -> Result<async_nats::Client, BusError> {
    options
        .connect_options()
        .await?
        .connect(options.servers.clone())
        .await
        .map_err(|error| {
            let reason = format!("connecting to {:?}: {error}", options.servers);
            unavailable_caused(reason, error)
        })
}

/// The bus's JetStream context over `client`, once JetStream answers
/// (within `timeout`).
///
/// The account query is asked again while it goes unanswered: a server of a
/// cluster that has just formed can drop it while the meta group elects its
/// leader (a CI rehearsal's first connect to a new 3-node cluster waited out
/// its whole timeout on one unanswered request while the others connected).
pub(crate) async fn jetstream_of(
    client: async_nats::Client,
    timeout: Duration,
) -> Result<jetstream::Context, BusError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let attempt = (timeout / 4).clamp(Duration::from_millis(500), Duration::from_secs(5));
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let probe = jetstream::ContextBuilder::new()
            .timeout(attempt.min(left).max(Duration::from_millis(1)))
            .build(client.clone());
        match probe.query_account().await {
            Ok(_) => break,
            Err(error)
                if matches!(error.kind(), jetstream::context::AccountErrorKind::TimedOut)
                    && tokio::time::Instant::now() < deadline => {}
            Err(error) => {
                return Err(unavailable_caused(
                    format!("JetStream is not available: {error}"),
                    error,
                ));
            }
        }
    }
    Ok(jetstream::ContextBuilder::new()
        .timeout(timeout)
        .max_ack_inflight(MAX_ACKS_IN_FLIGHT)
        .build(client))
}
