//! Live subscriptions (contracts C17–C19): one consumer per subscription,
//! assigned (never group-subscribed, never committing) to the
//! subscription's partitions at their start offsets.
//!
//! A thread of the feed owns a small current-thread runtime and awaits the
//! consumer's messages through rdkafka's `StreamConsumer`, which librdkafka
//! wakes through its queue's non-empty callback: an idle subscription sleeps
//! in the kernel, with only the consumer's long-polling Fetch on the wire.
//! A dedicated thread rather than a task on the bus's connector runtime:
//! librdkafka already gives each consumer threads of its own, decoding one
//! subscription never delays another's or the bus's admin work, and the
//! subscription keeps working after the bus handle is dropped.
//!
//! Each message is decoded and checked by the code `fetch` uses, then kept
//! in a bounded buffer per partition (the partition is paused while its
//! buffer is full) until [`Feed::read`] takes it; every arrival rings the
//! subscription's doorbell. Offsets are Kafka offsets, as in `fetch`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bus_core::subscription::Plan;
use bus_core::{
    BusError, Doorbell, Feed, Selector, StartAt, StoredEvent, SubscribeOptions, Subscription,
};
use futures::FutureExt as _;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::Notify;

use crate::client::map_error;
use crate::reader;
use crate::{Core, KafkaBus, KafkaOptions, fetch};
use bus_core::sync::lock;

/// Records buffered per partition before the partition is paused.
const BUFFER: usize = 1024;
/// Messages taken from the consumer between two rings of the doorbell.
const BATCH: usize = 256;
/// While the consumer reports an outage, how often the broker is asked
/// whether it is back (nothing else would clear the error on an idle topic).
const PROBE_EVERY: Duration = Duration::from_millis(500);
/// Bound of one such probe (also bounds how long a drop waits on it).
const PROBE_TIMEOUT: Duration = Duration::from_millis(250);
/// How long the broker holds an empty Fetch: a record ends it at once
/// (`fetch.min.bytes=1`), so this only sets how often an idle subscription
/// asks again.
const FETCH_WAIT_MS: u128 = 1_000;

impl KafkaBus {
    /// `EventBus::subscribe`: see the module documentation.
    pub(crate) fn subscribe_live(
        &self,
        topic: &str,
        selector: &Selector,
        start: StartAt,
        options: SubscribeOptions,
    ) -> Result<Subscription, BusError> {
        let entry = self.entry(topic)?;
        let plan = Plan::new(self, topic, selector, start)?;
        let bell = self.subscriptions.register(topic);
        let feed = KafkaFeed::start(
            Arc::clone(&self.core),
            topic,
            &entry.kafka_topic,
            &plan.partitions,
            Arc::clone(&bell),
        )?;
        Subscription::new(plan, options, Box::new(feed), bell)
    }
}

/// One partition's buffered records.
#[derive(Debug)]
struct Part {
    partition: u32,
    /// The offset the next accepted record must have at least: records
    /// below it were buffered already (a re-fetch after a seek or a
    /// reconnect) and are dropped.
    next: u64,
    /// Decoded records; a record failing its checks keeps its offset and
    /// why it failed.
    buffer: VecDeque<(u64, Result<StoredEvent, String>)>,
    paused: bool,
}

#[derive(Debug, Default)]
struct State {
    parts: Vec<Part>,
    /// The last error the consumer reported, until a record arrives or a
    /// probe reaches the broker.
    error: Option<KafkaError>,
    closed: bool,
}

impl State {
    fn part(&mut self, partition: u32) -> Option<&mut Part> {
        self.parts
            .iter_mut()
            .find(|part| part.partition == partition)
    }

    /// Where each partition's consumption resumes.
    fn positions(&self, topic: &str) -> TopicPartitionList {
        let mut list = TopicPartitionList::new();
        for part in &self.parts {
            let _ = list.add_partition_offset(
                topic,
                kafka_partition(part.partition),
                Offset::Offset(i64::try_from(part.next).unwrap_or(i64::MAX)),
            );
        }
        list
    }
}

/// What the feed and its thread share.
struct Shared {
    core: Arc<Core>,
    topic: String,
    kafka_topic: String,
    consumer: StreamConsumer,
    state: Mutex<State>,
    /// Wakes the thread for shutdown.
    stop: Notify,
    bell: Arc<Doorbell>,
}

impl Shared {
    fn options(&self) -> &KafkaOptions {
        &self.core.options
    }

    fn map(&self, error: KafkaError) -> BusError {
        map_error(self.options(), "subscription", error)
    }

    /// Pauses or resumes one partition of the consumer.
    fn set_paused(&self, partition: u32, paused: bool) -> Result<(), KafkaError> {
        let mut list = TopicPartitionList::new();
        list.add_partition(&self.kafka_topic, kafka_partition(partition));
        if paused {
            self.consumer.pause(&list)
        } else {
            self.consumer.resume(&list)
        }
    }
}

/// The [`Feed`] of one Kafka subscription.
pub(crate) struct KafkaFeed {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl KafkaFeed {
    fn start(
        core: Arc<Core>,
        topic: &str,
        kafka_topic: &str,
        partitions: &[(u32, u64)],
        bell: Arc<Doorbell>,
    ) -> Result<Self, BusError> {
        let options = &core.options;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()?;
        // rdkafka spawns a timer task for `max.poll.interval.ms` onto the
        // current runtime: this one, run by the feed's thread.
        let consumer = {
            let _entered = runtime.enter();
            consumer_config(options)
                .create::<StreamConsumer>()
                .map_err(|error| map_error(options, "creating a subscription consumer", error))?
        };
        let state = State {
            parts: partitions
                .iter()
                .map(|&(partition, next)| Part {
                    partition,
                    next,
                    buffer: VecDeque::new(),
                    paused: false,
                })
                .collect(),
            error: None,
            closed: false,
        };
        consumer
            .assign(&state.positions(kafka_topic))
            .map_err(|error| map_error(options, "assigning a subscription", error))?;
        let shared = Arc::new(Shared {
            core: Arc::clone(&core),
            topic: topic.to_owned(),
            kafka_topic: kafka_topic.to_owned(),
            consumer,
            state: Mutex::new(state),
            stop: Notify::new(),
            bell,
        });
        let pumped = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("bus-kafka-sub-{topic}"))
            .spawn(move || runtime.block_on(pump(&pumped)))?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }
}

/// The subscription consumer's settings: positioned by `assign` with a
/// throwaway group (librdkafka wants one), no commits, back to the log start
/// when the position expired (the engine then reports the gap as `Lagged`),
/// and small queues, since every subscription owns one.
pub(crate) fn consumer_config(options: &KafkaOptions) -> rdkafka::ClientConfig {
    // librdkafka wants the socket timeout at least a second above the wait.
    let wait = FETCH_WAIT_MS.min(options.timeout.as_millis().saturating_sub(1_000).max(10));
    let mut config = options.client_config();
    config
        .set(
            "group.id",
            format!("bus-subscription-{}", uuid::Uuid::new_v4().simple()),
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
        .set("queued.max.messages.kbytes", "2048")
        // An idle connection closed by the broker is no outage.
        .set("log.connection.close", "false")
        .set("session.timeout.ms", "45000");
    config
}

/// The feed's thread: takes messages as librdkafka queues them until the
/// feed is dropped.
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
        take(shared, first);
        // Whatever else is queued already, then one ring for all of it.
        for _ in 1..BATCH {
            match shared.consumer.recv().now_or_never() {
                Some(message) => take(shared, message),
                None => break,
            }
        }
        shared.bell.ring();
    }
}

/// Buffers one message (or notes one error) from the consumer.
fn take(shared: &Shared, message: Result<rdkafka::message::BorrowedMessage<'_>, KafkaError>) {
    let message = match message {
        Ok(message) => message,
        Err(error) => {
            lock(&shared.state).error = Some(error);
            return;
        }
    };
    let (Ok(partition), Ok(offset)) = (
        u32::try_from(message.partition()),
        u64::try_from(message.offset()),
    ) else {
        return;
    };
    let auth = shared.core.auth();
    let decoded = fetch::decode_one(
        &shared.topic,
        partition,
        reader::raw(&message, offset),
        auth.as_ref(),
    )
    .map_err(|error| match error {
        BusError::Integrity { reason, .. } => reason,
        other => other.to_string(),
    });
    let mut state = lock(&shared.state);
    state.error = None;
    let Some(part) = state.part(partition) else {
        return;
    };
    if offset < part.next {
        return;
    }
    part.next = offset + 1;
    part.buffer.push_back((offset, decoded));
    if part.buffer.len() >= BUFFER && !part.paused {
        // Under the lock, so a read's resume cannot come in between.
        part.paused = shared.set_paused(partition, true).is_ok();
    }
}

/// Asks the broker (through the bus's query consumer, which never holds a
/// long-polling Fetch) whether it answers again; if so the outage is over.
fn probe(shared: &Shared) {
    let Some(&Part { partition, .. }) = lock(&shared.state).parts.first() else {
        return;
    };
    let reached = shared
        .core
        .pool
        .watermarks(
            shared.options(),
            &shared.kafka_topic,
            kafka_partition(partition),
            Instant::now() + PROBE_TIMEOUT,
        )
        .is_ok();
    if reached {
        lock(&shared.state).error = None;
        shared.bell.ring();
    }
}

fn kafka_partition(partition: u32) -> i32 {
    i32::try_from(partition).unwrap_or(i32::MAX)
}

impl Feed for KafkaFeed {
    fn read(
        &mut self,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, BusError> {
        let shared = &*self.shared;
        let mut state = lock(&shared.state);
        let error = state.error.clone();
        let Some(index) = state.parts.iter().position(|p| p.partition == partition) else {
            return Err(BusError::invalid(
                "partition",
                format!("partition {partition} is not part of this subscription"),
            ));
        };
        let part = &mut state.parts[index];
        while part
            .buffer
            .front()
            .is_some_and(|(offset, _)| *offset < from)
        {
            part.buffer.pop_front();
        }
        if part.buffer.is_empty() && from > part.next {
            // A jump forward (max_lag): consume from there on.
            part.next = from;
            let positions = state.positions(&shared.kafka_topic);
            shared
                .consumer
                .assign(&positions)
                .map_err(|error| shared.map(error))?;
            for part in &mut state.parts {
                part.paused = false;
            }
            return Ok(Vec::new());
        }
        let ready = part
            .buffer
            .iter()
            .take(max)
            .take_while(|(_, decoded)| decoded.is_ok())
            .count();
        if ready == 0 {
            return match (part.buffer.front(), error) {
                (Some((offset, Err(reason))), _) => Err(BusError::Integrity {
                    topic: shared.topic.clone(),
                    partition,
                    offset: *offset,
                    reason: reason.clone(),
                }),
                (_, Some(error)) => Err(shared.map(error)),
                _ => Ok(Vec::new()),
            };
        }
        let events = part
            .buffer
            .drain(..ready)
            .filter_map(|(_, decoded)| decoded.ok())
            .collect();
        if part.paused && part.buffer.len() <= BUFFER / 2 {
            shared
                .set_paused(partition, false)
                .map_err(|error| shared.map(error))?;
            part.paused = false;
        }
        Ok(events)
    }

    fn head(&mut self, partition: u32) -> Result<u64, BusError> {
        let shared = &*self.shared;
        if let Some(error) = lock(&shared.state).error.clone() {
            // Known down: say so now rather than wait out the timeout.
            return Err(shared.map(error));
        }
        let options = shared.options();
        let (_, high) = shared.core.pool.watermarks(
            options,
            &shared.kafka_topic,
            kafka_partition(partition),
            Instant::now() + options.timeout,
        )?;
        Ok(high)
    }
}

impl Drop for KafkaFeed {
    fn drop(&mut self) {
        lock(&self.shared.state).closed = true;
        self.shared.stop.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        // The consumer closes with the last `Shared` (this one).
    }
}
