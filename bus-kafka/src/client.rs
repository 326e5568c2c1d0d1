//! The librdkafka clients a bus owns, the one place Kafka errors become
//! [`BusError`]s, and the bus-name → Kafka-name mapping.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bus_core::BusError;
use rdkafka::ClientConfig;
use rdkafka::Message as _;
use rdkafka::admin::AdminClient;
use rdkafka::client::{Client, ClientContext, DefaultClientContext};
use rdkafka::consumer::BaseConsumer;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{ProducerContext, ThreadedProducer};

use crate::KafkaOptions;
use crate::errors::map_error;

/// The producer type of the bus: librdkafka's own thread serves delivery
/// reports, which go straight to the waiting caller (no runtime hop).
pub(crate) type Producer = ThreadedProducer<DeliveryContext>;

/// Where a delivery report goes: the record's index in its publish call,
/// and for a record with a UID also a [`Late`] slot that outlives the call.
pub(crate) struct Ticket {
    pub index: usize,
    pub reply: Reply,
    pub late: Option<Arc<Late>>,
}

/// Where a publish call waits for its delivery reports: a sync caller's
/// thread, or an async caller's task (woken by the channel; feature `async`).
#[derive(Clone)]
pub(crate) enum Reply {
    Thread(std::sync::mpsc::Sender<(usize, Result<i64, KafkaError>)>),
    #[cfg(feature = "async")]
    Task(futures::channel::mpsc::UnboundedSender<(usize, Result<i64, KafkaError>)>),
}

/// The delivery report of one UID record, kept after its caller gave up
/// waiting: librdkafka goes on retrying the record (with the same
/// idempotent sequence number) across a leader failover, so a retry of the
/// UID must wait for that report rather than produce a second copy.
#[derive(Default)]
pub(crate) struct Late {
    outcome: Mutex<Option<Result<i64, KafkaError>>>,
    done: Condvar,
}

impl Late {
    /// Records the report (the first one wins) and wakes the waiters.
    pub(crate) fn set(&self, outcome: Result<i64, KafkaError>) {
        let mut slot = bus_core::backend::sync::lock(&self.outcome);
        if slot.is_none() {
            *slot = Some(outcome);
        }
        self.done.notify_all();
    }

    /// The report, if it has come.
    pub(crate) fn peek(&self) -> Option<Result<i64, KafkaError>> {
        bus_core::backend::sync::lock(&self.outcome).clone()
    }

    /// The report, waiting for it until `deadline`.
    pub(crate) fn wait_until(&self, deadline: Instant) -> Option<Result<i64, KafkaError>> {
        let mut slot = bus_core::backend::sync::lock(&self.outcome);
        while slot.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            slot = self
                .done
                .wait_timeout(slot, left)
                .map_or_else(|poisoned| poisoned.into_inner().0, |(slot, _)| slot);
        }
        slot.clone()
    }
}

/// Hands each delivery report to the caller waiting for it, and notes the
/// offset it names (see [`crate::locate::Reported`]).
pub(crate) struct DeliveryContext {
    reported: Arc<crate::locate::Reported>,
    /// When the producer was made, and when it last delivered (epoch ms).
    created_ms: u64,
    delivered_ms: std::sync::atomic::AtomicU64,
}

impl DeliveryContext {
    /// Milliseconds since the producer last delivered a record (or was
    /// made, if it never did).
    pub(crate) fn quiet_ms(&self) -> u64 {
        let last = self
            .delivered_ms
            .load(std::sync::atomic::Ordering::Relaxed)
            .max(self.created_ms);
        bus_core::now_ms().saturating_sub(last)
    }
}

/// Drops a replaced producer off the callers' threads, once no call holds
/// it any more (librdkafka's destroy can take a while, C10).
pub(crate) fn retire(old: Arc<Producer>) {
    let spawned = std::thread::Builder::new()
        .name("bus-kafka-retire".into())
        .spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(300);
            while Arc::strong_count(&old) > 1 && Instant::now() < deadline {
                std::thread::park_timeout(Duration::from_millis(100));
            }
            drop(old);
        });
    if let Err(error) = spawned {
        tracing::warn!(%error, "kafka: no thread to retire a producer; dropped here");
    }
}

impl ClientContext for DeliveryContext {}

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = Box<Ticket>;

    fn delivery(&self, result: &DeliveryResult<'_>, ticket: Box<Ticket>) {
        let outcome = match result {
            Ok(message) => {
                self.delivered_ms
                    .store(bus_core::now_ms(), std::sync::atomic::Ordering::Relaxed);
                if let (Ok(offset), Ok(partition)) = (
                    u64::try_from(message.offset()),
                    u32::try_from(message.partition()),
                ) {
                    self.reported.note(message.topic(), partition, offset);
                }
                Ok(message.offset())
            }
            Err((error, _)) => Err(error.clone()),
        };
        if let Some(late) = &ticket.late {
            late.set(outcome.clone());
        }
        // The caller may have given up (timeout); nobody to tell then.
        match &ticket.reply {
            Reply::Thread(reply) => {
                let _ = reply.send((ticket.index, outcome));
            }
            #[cfg(feature = "async")]
            Reply::Task(reply) => {
                let _ = reply.unbounded_send((ticket.index, outcome));
            }
        }
    }
}
/// The consumer type of the bus (positioned by `assign`, never subscribed).
pub(crate) type Reader = BaseConsumer;

/// Longest Kafka topic name.
const KAFKA_NAME_MAX: usize = 249;

/// The Kafka topic of a bus topic. Kafka refuses two topics whose names
/// differ only by `.` versus `_` (they collide in its metric names), which
/// bus names may, so `_` becomes `-u` and `-` becomes `--`: the mapping is
/// injective and its results never contain `_`. A result longer than Kafka
/// allows keeps a prefix plus a hash of the whole name.
pub fn kafka_topic_name(bus_name: &str) -> String {
    let mut out = String::with_capacity(bus_name.len() + 8);
    for c in bus_name.chars() {
        match c {
            '-' => out.push_str("--"),
            '_' => out.push_str("-u"),
            other => out.push(other),
        }
    }
    if out.len() > KAFKA_NAME_MAX {
        let hash = bus_core::backend::fnv1a64(bus_name.as_bytes());
        out.truncate(KAFKA_NAME_MAX - 18);
        out.push_str(&format!("-h{hash:016x}"));
    }
    out
}

/// Which of a bus's two producers a record goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// Records without a UID: librdkafka gives up on a record one bus
    /// timeout after it was handed over. A longer wait would hold up
    /// publishing after a broker restart: an idempotent producer whose
    /// requests were cut off drains every record in flight before it goes
    /// on, and records queued through the outage drain only by delivery or
    /// by their own timeout.
    Plain,
    /// Records with a UID (and batches holding one): librdkafka keeps
    /// trying for [`UID_DELIVERY_FLOOR`] or three bus timeouts, long enough
    /// to outlast a partition leader failover (the controller fences a dead
    /// broker after its session timeout, then elects a new leader). A
    /// record in flight at the failover is then delivered once by the
    /// idempotent producer and a retry of its UID gets its offset (see
    /// [`Late`]), instead of failing as "possibly persisted" and being
    /// produced a second time.
    Uid,
}

/// The least time the UID producer keeps trying to deliver a record.
const UID_DELIVERY_FLOOR: Duration = Duration::from_secs(30);

/// Builds an idempotent producer: `acks=all`, requests bounded by the bus
/// timeout, delivery retried as [`Delivery`] says, partitions always chosen
/// by the bus.
pub(crate) fn producer(
    options: &KafkaOptions,
    kind: Delivery,
    reported: Arc<crate::locate::Reported>,
) -> Result<Producer, BusError> {
    producer_config(options, kind)
        .create_with_context(DeliveryContext {
            reported,
            created_ms: bus_core::now_ms(),
            delivered_ms: std::sync::atomic::AtomicU64::new(0),
        })
        .map_err(|error| map_error(options, "creating the Kafka producer", error))
}

/// The settings of the producer of `kind`.
pub(crate) fn producer_config(options: &KafkaOptions, kind: Delivery) -> ClientConfig {
    let mut config = options.client_config();
    let delivery = match kind {
        Delivery::Plain => options.timeout,
        Delivery::Uid => (options.timeout * 3).max(UID_DELIVERY_FLOOR),
    };
    config
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", delivery.as_millis().to_string())
        .set("request.timeout.ms", options.timeout_ms())
        .set("linger.ms", options.linger.as_millis().to_string())
        // A batch must stay below the smallest topic limit (max_record_bytes
        // + TOPIC_SLACK_BYTES); a bigger single record gets a batch of its own.
        .set("batch.size", "900000")
        .set("message.max.bytes", "100000000");
    config
}

/// A consumer for positioned reads: no group membership, no commits, no
/// topic auto-creation.
pub(crate) fn reader(options: &KafkaOptions) -> Result<Reader, BusError> {
    reader_config(options)
        .create()
        .map_err(|error| map_error(options, "creating a Kafka consumer", error))
}

/// The positioned readers' settings.
pub(crate) fn reader_config(options: &KafkaOptions) -> ClientConfig {
    let mut config = options.client_config();
    config
        .set(
            "group.id",
            format!("bus-reader-{}", uuid::Uuid::new_v4().simple()),
        )
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("allow.auto.create.topics", "false")
        .set("enable.partition.eof", "false")
        .set("fetch.wait.max.ms", "10")
        .set("fetch.error.backoff.ms", "50")
        // librdkafka pauses fetching for a second once its queue is full;
        // a replaying caller drains it in milliseconds.
        .set("fetch.queue.backoff.ms", "5")
        .set("queued.min.messages", "100000")
        .set("queued.max.messages.kbytes", "16384")
        .set("session.timeout.ms", "45000");
    config
}

/// The admin client (topic creation, deletion, configs).
pub(crate) fn admin(options: &KafkaOptions) -> Result<AdminClient<DefaultClientContext>, BusError> {
    admin_config(options)
        .create()
        .map_err(|error| map_error(options, "creating the Kafka admin client", error))
}

/// The admin client's settings.
pub(crate) fn admin_config(options: &KafkaOptions) -> ClientConfig {
    let mut config = options.client_config();
    config.set("request.timeout.ms", options.timeout_ms());
    config
}

/// Partition counts of every topic the cluster lists. Always asks for all
/// topics: a metadata request naming a topic could auto-create it.
pub(crate) fn list_topics<C: ClientContext>(
    options: &KafkaOptions,
    reader: &Client<C>,
    deadline: Instant,
) -> Result<HashMap<String, usize>, BusError> {
    let metadata = reader
        .fetch_metadata(None, remaining(deadline))
        .map_err(|error| map_error(options, "listing topics", error))?;
    Ok(metadata
        .topics()
        .iter()
        .filter(|topic| topic.error().is_none())
        .map(|topic| (topic.name().to_owned(), topic.partitions().len()))
        .collect())
}

/// Whether metadata shows `topic` with `partitions` partitions, each led.
pub(crate) fn topic_ready<C: ClientContext>(
    options: &KafkaOptions,
    reader: &Client<C>,
    topic: &str,
    partitions: usize,
    deadline: Instant,
) -> Result<bool, BusError> {
    let metadata = reader
        .fetch_metadata(None, remaining(deadline))
        .map_err(|error| map_error(options, "reading metadata", error))?;
    Ok(metadata.topics().iter().any(|found| {
        found.name() == topic
            && found.error().is_none()
            && found.partitions().len() == partitions
            && found
                .partitions()
                .iter()
                .all(|p| p.error().is_none() && p.leader() >= 0)
    }))
}

/// Time left until `deadline` (at least 1 ms so librdkafka does not block).
pub(crate) fn remaining(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

/// Runs `attempt`, a query through `client`, until it succeeds or
/// `deadline` passes, pausing between tries: right after a topic is
/// created, or while a broker restarts, metadata answers "not leader" or
/// "unknown partition" for a moment. After an error that says `client`'s
/// metadata may be stale, its cache is refreshed first: librdkafka takes a
/// partition it last saw without a leader (as every partition is while a
/// broker shuts down cleanly) for a permanent error, or sends the query to
/// a killed leader, and a client with no topic handles of its own would
/// keep that until `metadata.max.age.ms` (15 minutes) passes.
pub(crate) fn retry<C: ClientContext, T>(
    options: &KafkaOptions,
    what: &str,
    deadline: Instant,
    client: &Client<C>,
    mut attempt: impl FnMut() -> Result<T, KafkaError>,
) -> Result<T, BusError> {
    let mut pause = Duration::from_millis(2);
    let mut tries = 0u32;
    loop {
        let error = match attempt() {
            Ok(value) => return Ok(value),
            Err(error) => error,
        };
        tries += 1;
        let stale = stale_metadata(&error);
        if stale {
            // Fails too while the broker is down; the next try tells.
            let _ = client.fetch_metadata(None, remaining(deadline).min(METADATA_REFRESH));
        }
        if Instant::now() + pause >= deadline {
            tracing::warn!(operation = what, tries, %error, "kafka: gave up retrying at the deadline");
            return Err(map_error(options, what, error));
        }
        tracing::debug!(operation = what, tries, %error, metadata_refreshed = stale, "kafka: retrying");
        std::thread::park_timeout(pause);
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// The longest a metadata refresh between two tries may take.
const METADATA_REFRESH: Duration = Duration::from_secs(1);

/// Errors after which a client's cached metadata may be out of date. A
/// timeout or a lost connection counts: after its partition leader is
/// killed, a query keeps going to the dead broker, which the cache names
/// as leader until refreshed.
fn stale_metadata(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::OperationTimedOut
                | RDKafkaErrorCode::RequestTimedOut
                | RDKafkaErrorCode::TimedOutQueue
                | RDKafkaErrorCode::BrokerTransportFailure
                | RDKafkaErrorCode::AllBrokersDown
                | RDKafkaErrorCode::NetworkException
                | RDKafkaErrorCode::BrokerNotAvailable
                | RDKafkaErrorCode::UnknownPartition
                | RDKafkaErrorCode::UnknownTopic
                | RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::LeaderNotAvailable
                | RDKafkaErrorCode::NotLeaderForPartition
                | RDKafkaErrorCode::FencedLeaderEpoch
                | RDKafkaErrorCode::UnknownLeaderEpoch
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_never_collide_and_never_hold_underscores() {
        let names = ["x", "x.0", "x_0", "X", "x-0", "x..0", "x-u0", "x--0"];
        let mapped: std::collections::HashSet<String> =
            names.iter().map(|name| kafka_topic_name(name)).collect();
        assert_eq!(mapped.len(), names.len());
        let folded: std::collections::HashSet<String> =
            mapped.iter().map(|name| name.replace('.', "_")).collect();
        assert_eq!(folded.len(), names.len(), "collide under . vs _");
        assert_eq!(kafka_topic_name("a-b_c.d"), "a--b-uc.d");
        assert!(kafka_topic_name(&"_".repeat(200)).len() <= KAFKA_NAME_MAX);
    }
}
