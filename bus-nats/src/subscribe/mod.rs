//! Live subscriptions (contracts C17–C19): the durable stream read by
//! sequence, woken by a consumer the server pushes to.
//!
//! Per subscribed partition the feed keeps a push consumer (ephemeral, in
//! memory, no acks, flow control and an idle heartbeat every 5 s) started
//! just after the stream's last sequence when the subscription was made,
//! and a task on the bus's connector runtime that follows it: each delivery
//! records the new end of the partition, keeps the message in a bounded
//! buffer and rings the subscription's doorbell. An idle subscription costs
//! nothing but the server's idle heartbeat.
//!
//! The task re-creates the consumer, under a new name each attempt, from
//! just after the highest sequence known, whenever it can no longer be
//! trusted: a delivery that does not follow the one before, a heartbeat
//! that says messages were lost, no heartbeat for two intervals, a status
//! such as "consumer deleted". Until a new one delivers, the partition is
//! marked stale so reads ask the server.
//!
//! Why a new name: an R1 consumer created in the first second or so after
//! a node dies may be assigned to that node (the meta leader does not know
//! yet); the server then lists it as "missing" and leaves every create of
//! that name unanswered until the node returns, while new names are placed
//! on live nodes within milliseconds (measured on a 3-node cluster, issue
//! 25). async-nats' ordered consumer, used here before, re-created under
//! one name and retried it forever without yielding anything, so the
//! subscription stopped with no error.
//!
//! [`Feed::read`] serves the records the push brought from that buffer and
//! everything else (the history, anything the buffer dropped when the
//! subscriber fell behind) through `fetch`'s own code with a cursor of the
//! subscription's own; both decode and verify with the code `fetch` uses.
//! A read at the known end of a healthy partition answers at once without
//! a round trip. While the connection is down a read fails at once with
//! [`BusError::Unavailable`]; the first read after it asks the server
//! where the stream ends, so nothing published meanwhile is missed.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bus_core::backend::sync::lock;

use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, push};
use bus_core::backend::Plan;
use bus_core::{BusError, Selector, StartAt, SubscribeOptions, Subscription, backend::Doorbell};
use futures::{FutureExt as _, StreamExt as _};

use crate::NatsBus;
use crate::bus::Runner;
use crate::cursor::CursorSlot;
use crate::errors::unavailable_caused;
use crate::record::{RawMessage, epoch_ms};
use crate::shared::{Shared, TopicState};
use crate::topics::stream_info;

mod feed;

/// Pushed records buffered per partition; past it they are dropped and
/// read back from the stream when the subscriber gets there.
const BUFFER: usize = 1024;
/// Pushed messages taken between two rings of the doorbell.
const BATCH: usize = 256;
/// The idle heartbeat asked of each push consumer.
const HEARTBEAT: Duration = Duration::from_secs(5);
/// No message nor heartbeat for this long: the consumer is gone (its node
/// died, or the connection was lost meanwhile).
const SILENCE: Duration = Duration::from_secs(11);
/// The server removes a push consumer nobody listens to after this long.
const PUSH_INACTIVE: Duration = Duration::from_secs(30);
/// First and longest pause between two failed consumer creations.
const RECREATE_FIRST: Duration = Duration::from_millis(250);
const RECREATE_MAX: Duration = Duration::from_secs(5);
/// The heartbeat header naming the flow-control reply the consumer waits
/// for (the request itself was lost): delivery stops until it comes.
const CONSUMER_STALLED: &str = "Nats-Consumer-Stalled";

impl NatsBus {
    /// `EventBus::subscribe`: see the module documentation.
    pub(crate) fn subscribe_live(
        &self,
        topic: &str,
        selector: &Selector,
        start: StartAt,
        options: SubscribeOptions,
    ) -> Result<Subscription, BusError> {
        let state = self.topic(topic)?;
        let plan = Plan::new(self, topic, selector, start)?;
        let bell = self.shared().bells.register(topic);
        let feed = NatsFeed::start(
            self.runner()?,
            Arc::clone(self.shared()),
            state,
            &plan.partitions,
            Arc::clone(&bell),
        )?;
        Subscription::new(plan, options, Box::new(feed), bell)
    }
}

/// What the push side knows of one partition.
#[derive(Default)]
struct Live {
    /// The highest stream sequence known to be stored.
    end: u64,
    /// Pushed messages with consecutive sequences.
    buffer: VecDeque<RawMessage>,
    /// Whether `end` may be behind (a push error, an outage): the next read
    /// asks the server.
    stale: bool,
}

struct Part {
    partition: u32,
    /// The subscription's own replay cursor for this partition.
    cursor: CursorSlot,
    live: Mutex<Live>,
}

/// What the feed and its push task share.
struct Inner {
    shared: Arc<Shared>,
    topic: Arc<TopicState>,
    parts: Vec<Part>,
    bell: Arc<Doorbell>,
    /// Name prefix of this subscription's push consumers (re-creations add
    /// a suffix), for deleting them on drop.
    consumer: String,
}

impl Inner {
    fn part(&self, partition: u32) -> Result<&Part, BusError> {
        self.parts
            .iter()
            .find(|part| part.partition == partition)
            .ok_or_else(|| {
                BusError::invalid(
                    "partition",
                    format!("partition {partition} is not part of this subscription"),
                )
            })
    }

    fn connected(&self) -> bool {
        self.shared.js.client().connection_state() == async_nats::connection::State::Connected
    }

    fn stream(&self, partition: u32) -> Result<&str, BusError> {
        Ok(&self.topic.partition(partition)?.stream)
    }

    /// Takes one pushed record into its partition's buffer.
    fn take(&self, part: &Part, sequence: u64, stored_at: u64, message: async_nats::Message) {
        let mut live = lock(&part.live);
        live.end = live.end.max(sequence);
        let follows = live
            .buffer
            .back()
            .is_none_or(|last| last.sequence + 1 == sequence);
        if follows && live.buffer.len() < BUFFER {
            live.buffer.push_back(RawMessage {
                sequence,
                headers: message.headers,
                payload: message.payload,
                stored_at,
            });
        }
    }
}

/// The [`Feed`] of one NATS subscription.
pub(crate) struct NatsFeed {
    inner: Arc<Inner>,
    executor: Runner,
    /// One push task per partition.
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl NatsFeed {
    fn start(
        executor: Runner,
        shared: Arc<Shared>,
        topic: Arc<TopicState>,
        partitions: &[(u32, u64)],
        bell: Arc<Doorbell>,
    ) -> Result<Self, BusError> {
        let consumer = format!("bus-sub-{}", unique());
        let inner = Arc::new(Inner {
            parts: partitions
                .iter()
                .map(|&(partition, _)| Part {
                    partition,
                    cursor: CursorSlot::default(),
                    live: Mutex::new(Live::default()),
                })
                .collect(),
            shared,
            topic,
            bell,
            consumer,
        });
        let started = Arc::clone(&inner);
        let timeout = inner.shared.timeout;
        let tasks = executor.run_bounded("subscribe", timeout, move || async move {
            let inner = started;
            let pushes =
                futures::future::join_all((0..inner.parts.len()).map(|index| open(&inner, index)))
                    .await
                    .into_iter()
                    .collect::<Result<Vec<_>, BusError>>()?;
            Ok::<_, BusError>(
                pushes
                    .into_iter()
                    .enumerate()
                    .map(|(index, push)| tokio::spawn(follow(Arc::clone(&inner), index, push)))
                    .collect::<Vec<_>>(),
            )
        });
        match tasks {
            Ok(Ok(tasks)) => Ok(Self {
                inner,
                executor,
                tasks,
            }),
            Ok(Err(error)) | Err(error) => {
                // Consumers made before the failure: gone with their prefix.
                cleanup(&executor, &inner, Vec::new());
                Err(error)
            }
        }
    }
}

/// A process-unique suffix for consumer names.
fn unique() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos());
    format!(
        "{}-{nanos:x}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// One push consumer of a partition and the subscription to its deliveries.
struct Push {
    name: String,
    messages: async_nats::Subscriber,
}

/// The stream's end now, then a push consumer from just after it.
async fn open(inner: &Inner, index: usize) -> Result<Push, BusError> {
    let part = &inner.parts[index];
    let stream = inner.stream(part.partition)?;
    let what = format!(
        "subscribing to topic {:?} partition {}",
        inner.topic.spec.name, part.partition
    );
    let info = stream_info(&inner.shared.js, stream)
        .await
        .map_err(|failure| failure.into_bus(&what, inner.shared.timeout))?
        .ok_or_else(|| BusError::UnknownTopic(inner.topic.spec.name.clone()))?;
    lock(&part.live).end = info.state.last_sequence;
    create(inner, index, 0).await
}

/// A push consumer of partition `index` from just after the highest
/// sequence known, named for the subscription, its partition and the
/// `serial` of the attempt (never reused: a name whose creation got no
/// answer may be stuck on a dead node). Bounded by the operation timeout.
async fn create(inner: &Inner, index: usize, serial: u64) -> Result<Push, BusError> {
    let part = &inner.parts[index];
    let stream = inner.stream(part.partition)?;
    let what = format!(
        "subscribing to topic {:?} partition {}",
        inner.topic.spec.name, part.partition
    );
    let base = format!("{}-{}", inner.consumer, part.partition);
    let name = if serial == 0 {
        base
    } else {
        format!("{base}_{serial}")
    };
    let start = lock(&part.live).end.saturating_add(1);
    let client = inner.shared.js.client();
    let inbox = client.new_inbox();
    let config = push::Config {
        name: Some(name.clone()),
        deliver_subject: inbox.clone(),
        deliver_policy: DeliverPolicy::ByStartSequence {
            start_sequence: start,
        },
        ack_policy: AckPolicy::None,
        max_deliver: 1,
        flow_control: true,
        idle_heartbeat: HEARTBEAT,
        inactive_threshold: PUSH_INACTIVE,
        num_replicas: 1,
        memory_storage: true,
        ..push::Config::default()
    };
    let attempt = async {
        // Subscribed before the consumer exists, so nothing it sends is lost.
        let messages = client
            .subscribe(inbox)
            .await
            .map_err(|error| unavailable_caused(format!("{what}: {error}"), error))?;
        inner
            .shared
            .js
            .create_consumer_on_stream(config, stream)
            .await
            .map_err(|error| {
                unavailable_caused(format!("{what}: creating its consumer: {error}"), error)
            })?;
        Ok(Push {
            name: name.clone(),
            messages,
        })
    };
    match tokio::time::timeout(inner.shared.timeout, attempt).await {
        Ok(Ok(push)) => {
            tracing::debug!(consumer = %push.name, start, "nats: subscription push consumer created");
            Ok(push)
        }
        Ok(Err(error)) => {
            delete_later(inner, part, name);
            Err(error)
        }
        Err(_) => {
            delete_later(inner, part, name);
            Err(BusError::timeout(
                format!("{what}: creating its consumer"),
                inner.shared.timeout,
            ))
        }
    }
}

/// Deletes a push consumer that is given up, in the background (best
/// effort: the server removes it once nobody listens).
fn delete_later(inner: &Inner, part: &Part, name: String) {
    let Ok(stream) = inner.stream(part.partition) else {
        return;
    };
    let (js, stream, timeout) = (
        inner.shared.js.clone(),
        stream.to_owned(),
        inner.shared.timeout,
    );
    tokio::spawn(async move {
        let _ = tokio::time::timeout(timeout, js.delete_consumer_from_stream(&name, &stream)).await;
    });
}

/// Why a push consumer stopped being followed.
enum Ended {
    /// The connection is closed for good.
    Closed,
    /// Neither a message nor a heartbeat for [`SILENCE`].
    Silent,
    /// A delivery or a heartbeat showed messages were lost.
    Lost { expected: u64, got: u64 },
    /// A status other than a heartbeat (the consumer was deleted, ...).
    Status(async_nats::StatusCode),
    /// A delivery without JetStream metadata.
    Malformed,
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Closed => f.write_str("the connection is closed"),
            Self::Silent => write!(f, "no message nor heartbeat for {SILENCE:?}"),
            Self::Lost { expected, got } => write!(
                f,
                "messages lost (consumer sequence {got}, expected {expected})"
            ),
            Self::Status(status) => write!(f, "status {status}"),
            Self::Malformed => f.write_str("a delivery without JetStream metadata"),
        }
    }
}

/// The push task of partition `index`: follows its consumer, and re-creates
/// it whenever it can no longer be trusted, until the feed is dropped or
/// the connection is closed for good.
async fn follow(inner: Arc<Inner>, index: usize, first: Push) {
    let part = &inner.parts[index];
    let mut push = first;
    let mut serial = 0;
    loop {
        let ended = track(&inner, part, &mut push.messages).await;
        // Whatever came before may be all there is: reads ask the server.
        lock(&part.live).stale = true;
        inner.bell.ring();
        if matches!(ended, Ended::Closed) {
            return;
        }
        tracing::debug!(
            consumer = %push.name,
            partition = part.partition,
            reason = %ended,
            "nats: re-creating a subscription's push consumer"
        );
        delete_later(&inner, part, std::mem::take(&mut push.name));
        let mut pause = RECREATE_FIRST;
        push = loop {
            serial += 1;
            match create(&inner, index, serial).await {
                Ok(push) => break push,
                Err(error) => {
                    tracing::debug!(
                        partition = part.partition,
                        %error,
                        "nats: re-creating a subscription's push consumer failed; trying again"
                    );
                    lock(&part.live).stale = true;
                    inner.bell.ring();
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RECREATE_MAX);
                }
            }
        };
    }
}

/// Takes one consumer's deliveries into the partition's buffer, ringing
/// the doorbell after each batch, until the consumer can no longer be
/// trusted.
async fn track(inner: &Inner, part: &Part, messages: &mut async_nats::Subscriber) -> Ended {
    // The consumer sequence of the last delivery.
    let mut delivered = 0_u64;
    loop {
        let first = match tokio::time::timeout(SILENCE, messages.next()).await {
            Ok(Some(message)) => message,
            Ok(None) => return Ended::Closed,
            Err(_) => return Ended::Silent,
        };
        let mut next = Some(first);
        let mut records = false;
        for _ in 0..BATCH {
            let Some(message) = next.take() else {
                break;
            };
            match receive(inner, part, message, &mut delivered).await {
                Ok(record) => records |= record,
                Err(ended) => return ended,
            }
            next = messages.next().now_or_never().flatten();
        }
        if let Some(message) = next {
            match receive(inner, part, message, &mut delivered).await {
                Ok(record) => records |= record,
                Err(ended) => return ended,
            }
        }
        if records {
            inner.bell.ring();
        }
    }
}

/// One delivery: a record (taken, `true`), a heartbeat or a flow-control
/// request (answered, `false`), or why the consumer is done.
async fn receive(
    inner: &Inner,
    part: &Part,
    message: async_nats::Message,
    delivered: &mut u64,
) -> Result<bool, Ended> {
    match message.status {
        None => {}
        Some(async_nats::StatusCode::IDLE_HEARTBEAT) => {
            let client = inner.shared.js.client();
            if let Some(reply) = message.reply {
                // Flow control: the consumer waits for this answer.
                let _ = client.publish(reply, bytes::Bytes::new()).await;
                return Ok(false);
            }
            let header = |name: &str| {
                message
                    .headers
                    .as_ref()
                    .and_then(|headers| headers.get(name))
                    .map(|value| value.as_str().to_owned())
            };
            if let Some(stalled) = header(CONSUMER_STALLED) {
                // A flow-control request was lost: answer it now.
                let _ = client.publish(stalled, bytes::Bytes::new()).await;
            }
            if let Some(last) = header("Nats-Last-Consumer").and_then(|last| last.parse().ok())
                && last != *delivered
            {
                return Err(Ended::Lost {
                    expected: *delivered,
                    got: last,
                });
            }
            return Ok(false);
        }
        Some(status) => return Err(Ended::Status(status)),
    }
    let message = async_nats::jetstream::Message {
        message,
        context: inner.shared.js.clone(),
    };
    let Ok(info) = message.info() else {
        return Err(Ended::Malformed);
    };
    let (consumer_sequence, sequence, stored_at) = (
        info.consumer_sequence,
        info.stream_sequence,
        epoch_ms(info.published),
    );
    if consumer_sequence != *delivered + 1 {
        return Err(Ended::Lost {
            expected: *delivered + 1,
            got: consumer_sequence,
        });
    }
    *delivered = consumer_sequence;
    tracing::trace!(partition = part.partition, sequence, "nats: pushed");
    inner.take(part, sequence, stored_at, message.message);
    Ok(true)
}

/// Stops the push task and deletes the subscription's consumers (push and
/// replay) in the background; the server would expire them anyway.
fn cleanup(executor: &Runner, inner: &Arc<Inner>, tasks: Vec<tokio::task::JoinHandle<()>>) {
    for task in tasks {
        task.abort();
    }
    let inner = Arc::clone(inner);
    executor.spawn(async move {
        let js = &inner.shared.js;
        let deletes = inner.parts.iter().map(|part| {
            let inner = &inner;
            async move {
                let Ok(stream) = inner.stream(part.partition) else {
                    return;
                };
                if let Some(cursor) = part.cursor.lock().await.take() {
                    let (stream, name) = cursor.id();
                    let _ = js.delete_consumer_from_stream(&name, &stream).await;
                }
                // The push consumer, under whatever name its last
                // re-creation gave it.
                let prefix = format!("{}-{}", inner.consumer, part.partition);
                let Ok(handle) = js.get_stream_no_info(stream).await else {
                    return;
                };
                let names: Vec<String> = handle
                    .consumer_names()
                    .filter_map(|name| async move { name.ok() })
                    .filter(|name| {
                        let ours = name == &prefix
                            || name
                                .strip_prefix(prefix.as_str())
                                .is_some_and(|rest| rest.starts_with('_'));
                        futures::future::ready(ours)
                    })
                    .collect()
                    .await;
                for name in names {
                    let _ = js.delete_consumer_from_stream(&name, stream).await;
                }
            }
        });
        let _ =
            tokio::time::timeout(inner.shared.timeout, futures::future::join_all(deletes)).await;
    });
}

impl Drop for NatsFeed {
    fn drop(&mut self) {
        let tasks = std::mem::take(&mut self.tasks);
        cleanup(&self.executor, &self.inner, tasks);
    }
}
