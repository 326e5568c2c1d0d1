//! The one consumer behind all live subscriptions of a bus (contract C17).
//!
//! It is assigned (no group membership, no commits) every partition some
//! live subscription watches, from that partition's high watermark at the
//! time the first of them started, and its thread takes whatever records
//! arrive: each is decoded and checked once (as `fetch` does), kept in a
//! bounded window per partition, and the doorbells of that partition's
//! subscriptions are rung. Subscriptions read the window when they are at
//! its tail and fetch through the bus's reader pool when they are behind it,
//! so history and live records come through one code path per position and
//! the seam between them has no gap: the window starts at the watermark
//! queried before the assignment, and a read from below it fetches up to
//! the current watermark.
//!
//! Cost: one consumer (librdkafka's few threads) and one thread per bus,
//! started with its first subscription and kept until the bus and all its
//! subscriptions are gone, whatever the number of subscriptions; a new
//! subscription costs a map entry and, for a partition nobody watched yet,
//! one watermark query and an incremental assignment.
//!
//! The thread owns a small current-thread runtime and awaits the consumer
//! through rdkafka's `StreamConsumer`, which librdkafka wakes through its
//! queue's non-empty callback: idle, it sleeps in the kernel with only the
//! consumer's long-polling Fetch on the wire. A broker outage the consumer
//! reports is kept until a record arrives or a probe reaches the broker;
//! meanwhile subscriptions get it as an error item at once.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bus_core::backend::sync::lock;
use bus_core::{BusError, StoredRecord, backend::Doorbell};
use futures::FutureExt as _;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::Notify;

use crate::errors::map_error;
use crate::{Core, KafkaOptions, fetch, reader};

/// Records kept per watched partition: a subscription further behind than
/// this reads through the reader pool instead.
const WINDOW: usize = 1024;
/// Messages taken from the consumer between two rounds of rings.
const BATCH: usize = 256;
/// While the consumer reports an outage, how often the broker is asked
/// whether it is back (nothing else would clear the error on an idle topic).
const PROBE_EVERY: Duration = Duration::from_millis(500);
/// Bound of one such probe (also bounds how long a drop of the bus waits).
const PROBE_TIMEOUT: Duration = Duration::from_millis(250);
/// How long the broker holds an empty Fetch: a record ends it at once
/// (`fetch.min.bytes=1`), so this only sets how often an idle consumer asks.
const FETCH_WAIT_MS: u128 = 1_000;

/// A record as the window keeps it: decoded, or why its checks failed.
pub(crate) type Kept = (u64, Result<StoredRecord, String>);

/// What the window holds for a read.
pub(crate) enum Lookup {
    /// The records from the read's offset on (empty: none arrived yet; a
    /// ring follows when one does).
    Records(Vec<Kept>),
    /// The read starts below the window: fetch it.
    Behind,
}

/// One watched partition.
struct Watched {
    /// The bus topic (records are decoded and signed under it).
    topic: String,
    /// Subscriptions watching it: their id and doorbell.
    bells: Vec<(u64, Weak<Doorbell>)>,
    /// The window covers every record from `first` up to `next`.
    first: u64,
    next: u64,
    records: VecDeque<Kept>,
}

#[derive(Default)]
struct State {
    parts: HashMap<(String, i32), Watched>,
    /// The last error the consumer reported, until a record arrives or a
    /// probe reaches the broker.
    error: Option<KafkaError>,
    closed: bool,
    ids: u64,
}

impl State {
    fn all_bells(&self) -> Vec<Arc<Doorbell>> {
        self.parts
            .values()
            .flat_map(|part| part.bells.iter().filter_map(|(_, bell)| bell.upgrade()))
            .collect()
    }
}

/// What the handle and the thread share.
struct Shared {
    core: Arc<Core>,
    consumer: StreamConsumer,
    state: Mutex<State>,
    /// Serializes watching and unwatching, so a partition's watermark query
    /// and assignment happen once, outside the state lock the thread takes.
    assigning: Mutex<()>,
    stop: Notify,
}

/// The bus's shared subscription consumer; dropping the last handle stops
/// its thread and closes the consumer.
pub(crate) struct Waker {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Waker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waker").finish_non_exhaustive()
    }
}

impl Waker {
    /// Starts the consumer and its thread.
    pub(crate) fn start(core: Arc<Core>) -> Result<Self, BusError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()?;
        // rdkafka spawns a timer task for `max.poll.interval.ms` onto the
        // current runtime: this one, run by the waker's thread.
        let consumer = {
            let _entered = runtime.enter();
            consumer_config(&core.options)
                .create::<StreamConsumer>()
                .map_err(|error| {
                    map_error(&core.options, "creating the subscription consumer", error)
                })?
        };
        let shared = Arc::new(Shared {
            core,
            consumer,
            state: Mutex::default(),
            assigning: Mutex::new(()),
            stop: Notify::new(),
        });
        let pumped = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("bus-kafka-subs".to_owned())
            .spawn(move || runtime.block_on(pump(&pumped)))?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    fn options(&self) -> &KafkaOptions {
        &self.shared.core.options
    }

    /// Rings `bell` for every record of `partitions` of `kafka_topic` from
    /// now on, assigning the partitions nobody watched yet at their high
    /// watermark. Returns the id [`Waker::unwatch`] takes.
    pub(crate) fn watch(
        &self,
        topic: &str,
        kafka_topic: &str,
        partitions: &[u32],
        bell: &Arc<Doorbell>,
        deadline: Instant,
    ) -> Result<u64, BusError> {
        let shared = &*self.shared;
        let unwatched = |state: &State| -> Vec<i32> {
            partitions
                .iter()
                .map(|&partition| kafka_partition(partition))
                .filter(|&partition| {
                    !state
                        .parts
                        .contains_key(&(kafka_topic.to_owned(), partition))
                })
                .collect()
        };
        // The watermarks before the lock, so a slow broker holds up no other
        // subscription's start or drop; any watermark not above the end will
        // do, the window then just starts lower.
        let mut highs = HashMap::new();
        for partition in unwatched(&lock(&shared.state)) {
            highs.insert(partition, self.high(kafka_topic, partition, deadline)?);
        }
        let _assigning = lock(&shared.assigning);
        let fresh = unwatched(&lock(&shared.state));
        let mut list = TopicPartitionList::new();
        let mut starts = Vec::with_capacity(fresh.len());
        for partition in fresh {
            let high = match highs.get(&partition) {
                Some(&high) => high,
                // Unwatched since (its last subscription dropped meanwhile).
                None => self.high(kafka_topic, partition, deadline)?,
            };
            list.add_partition_offset(
                kafka_topic,
                partition,
                Offset::Offset(i64::try_from(high).unwrap_or(i64::MAX)),
            )
            .map_err(|error| map_error(self.options(), "assigning a subscription", error))?;
            starts.push((partition, high));
        }
        // Known before assigned: a message of the new assignment may arrive
        // at once.
        let id = {
            let mut state = lock(&shared.state);
            for (partition, high) in starts {
                state.parts.insert(
                    (kafka_topic.to_owned(), partition),
                    Watched {
                        topic: topic.to_owned(),
                        bells: Vec::new(),
                        first: high,
                        next: high,
                        records: VecDeque::new(),
                    },
                );
            }
            state.ids += 1;
            let id = state.ids;
            for &partition in partitions {
                if let Some(part) = state
                    .parts
                    .get_mut(&(kafka_topic.to_owned(), kafka_partition(partition)))
                {
                    part.bells.push((id, Arc::downgrade(bell)));
                }
            }
            id
        };
        if list.count() > 0
            && let Err(error) = shared.consumer.incremental_assign(&list)
        {
            forget(&mut lock(&shared.state), id);
            return Err(map_error(self.options(), "assigning a subscription", error));
        }
        Ok(id)
    }

    /// The high watermark of a partition.
    fn high(&self, kafka_topic: &str, partition: i32, deadline: Instant) -> Result<u64, BusError> {
        let pool = &self.shared.core.pool;
        Ok(pool
            .watermarks(self.options(), kafka_topic, partition, deadline)?
            .1)
    }

    /// Forgets subscription `id`; partitions nobody watches any more are
    /// unassigned and their windows dropped.
    pub(crate) fn unwatch(&self, id: u64) {
        let shared = &*self.shared;
        let _assigning = lock(&shared.assigning);
        let list = forget(&mut lock(&shared.state), id);
        if list.count() > 0
            && let Err(error) = shared.consumer.incremental_unassign(&list)
        {
            tracing::warn!(%error, "kafka: unassigning a dropped subscription's partitions");
        }
    }

    /// The window's records of a partition from `from` on, at most `max`.
    pub(crate) fn lookup(
        &self,
        kafka_topic: &str,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Lookup {
        let state = lock(&self.shared.state);
        let Some(part) = state
            .parts
            .get(&(kafka_topic.to_owned(), kafka_partition(partition)))
        else {
            return Lookup::Behind;
        };
        if from < part.first {
            return Lookup::Behind;
        }
        let skip = part.records.partition_point(|(offset, _)| *offset < from);
        Lookup::Records(part.records.iter().skip(skip).take(max).cloned().collect())
    }

    /// The outage the consumer reported, if it is not over.
    pub(crate) fn error(&self) -> Option<BusError> {
        let error = lock(&self.shared.state).error.clone()?;
        Some(map_error(self.options(), "subscription", error))
    }
}

/// Removes subscription `id`'s doorbells; returns the partitions nobody
/// watches any more (dropped from the state, still to unassign).
fn forget(state: &mut State, id: u64) -> TopicPartitionList {
    let mut list = TopicPartitionList::new();
    state.parts.retain(|(topic, partition), part| {
        part.bells.retain(|(watcher, _)| *watcher != id);
        let keep = !part.bells.is_empty();
        if !keep {
            list.add_partition(topic, *partition);
        }
        keep
    });
    list
}

impl Drop for Waker {
    fn drop(&mut self) {
        lock(&self.shared.state).closed = true;
        self.shared.stop.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        // The consumer closes with the last `Shared` (this one).
    }
}

/// The consumer's settings: positioned by `assign` with a throwaway group
/// (librdkafka wants one), no commits, back to the log start when the
/// position expired, and small queues (it only ever reads the tails).
pub(crate) fn consumer_config(options: &KafkaOptions) -> rdkafka::ClientConfig {
    // librdkafka wants the socket timeout at least a second above the wait.
    let wait = FETCH_WAIT_MS.min(options.timeout.as_millis().saturating_sub(1_000).max(10));
    let mut config = options.client_config();
    config
        .set(
            "group.id",
            format!("bus-subscriptions-{}", uuid::Uuid::new_v4().simple()),
        )
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("allow.auto.create.topics", "false")
        .set("enable.partition.eof", "false")
        .set("fetch.min.bytes", "1")
        .set("fetch.wait.max.ms", wait.to_string())
        .set("fetch.error.backoff.ms", "50")
        .set("fetch.queue.backoff.ms", "10")
        .set("queued.min.messages", "1000")
        .set("queued.max.messages.kbytes", "4096")
        // An idle connection closed by the broker is no outage.
        .set("log.connection.close", "false")
        .set("session.timeout.ms", "45000");
    config
}

/// The waker's thread: takes messages as librdkafka queues them until the
/// last handle is dropped.
async fn pump(shared: &Shared) {
    loop {
        let (closed, failing) = {
            let state = lock(&shared.state);
            (state.closed, state.error.is_some())
        };
        if closed {
            return;
        }
        let first = tokio::select! {
            biased;
            () = shared.stop.notified() => continue,
            message = shared.consumer.recv() => Some(message),
            () = tokio::time::sleep(PROBE_EVERY), if failing => None,
        };
        let Some(first) = first else {
            probe(shared);
            continue;
        };
        let mut rings = Rings::default();
        take(shared, first, &mut rings);
        // Whatever else is queued already, then one ring per doorbell.
        for _ in 1..BATCH {
            match shared.consumer.recv().now_or_never() {
                Some(message) => take(shared, message, &mut rings),
                None => break,
            }
        }
        rings.ring(shared);
    }
}

/// The doorbells a batch of messages rings.
#[derive(Default)]
struct Rings {
    partitions: Vec<(String, i32)>,
    /// An outage began or ended: every subscription learns it.
    all: bool,
}

impl Rings {
    fn ring(self, shared: &Shared) {
        let bells: Vec<Arc<Doorbell>> = {
            let state = lock(&shared.state);
            if self.all {
                state.all_bells()
            } else {
                self.partitions
                    .iter()
                    .filter_map(|key| state.parts.get(key))
                    .flat_map(|part| part.bells.iter().filter_map(|(_, bell)| bell.upgrade()))
                    .collect()
            }
        };
        for bell in bells {
            bell.ring();
        }
    }
}

/// Keeps one message in its partition's window (or notes one error).
fn take(
    shared: &Shared,
    message: Result<rdkafka::message::BorrowedMessage<'_>, KafkaError>,
    rings: &mut Rings,
) {
    let message = match message {
        Ok(message) => message,
        Err(error) => {
            lock(&shared.state).error = Some(error);
            rings.all = true;
            return;
        }
    };
    let (partition, Ok(offset)) = (message.partition(), u64::try_from(message.offset())) else {
        return;
    };
    let key = (message.topic().to_owned(), partition);
    let Some(topic) = lock(&shared.state)
        .parts
        .get(&key)
        .map(|part| part.topic.clone())
    else {
        return;
    };
    let auth = shared.core.auth();
    let bus_partition = u32::try_from(partition).unwrap_or(0);
    let decoded = fetch::decode_one(
        &topic,
        bus_partition,
        reader::raw(&message, offset),
        auth.as_ref(),
    )
    .map_err(|error| match error {
        BusError::Integrity { reason, .. } => reason,
        other => other.to_string(),
    });
    let mut state = lock(&shared.state);
    if state.error.take().is_some() {
        rings.all = true;
    }
    let Some(part) = state.parts.get_mut(&key) else {
        return;
    };
    if offset < part.next {
        // Fetched again after a reconnect: kept already.
        return;
    }
    if offset > part.next {
        // Not the next offset (a message of a partition's earlier
        // assignment was passed over, or the log has a hole): the window
        // starts again here, and reads from below it fetch.
        part.records.clear();
        part.first = offset;
    }
    part.next = offset + 1;
    part.records.push_back((offset, decoded));
    if part.records.len() > WINDOW
        && let Some((dropped, _)) = part.records.pop_front()
    {
        part.first = dropped + 1;
    }
    if !rings.partitions.contains(&key) {
        rings.partitions.push(key);
    }
}

/// Asks the broker (through the bus's query consumer, which never holds a
/// long-polling Fetch) whether it answers again; if so the outage is over.
fn probe(shared: &Shared) {
    let watched = lock(&shared.state).parts.keys().next().cloned();
    let reached = watched.is_none_or(|(topic, partition)| {
        shared
            .core
            .pool
            .watermarks(
                &shared.core.options,
                &topic,
                partition,
                Instant::now() + PROBE_TIMEOUT,
            )
            .is_ok()
    });
    if reached {
        lock(&shared.state).error = None;
        Rings {
            partitions: Vec::new(),
            all: true,
        }
        .ring(shared);
    }
}

pub(crate) fn kafka_partition(partition: u32) -> i32 {
    i32::try_from(partition).unwrap_or(i32::MAX)
}
