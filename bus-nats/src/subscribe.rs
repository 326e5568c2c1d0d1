//! Live subscriptions (contracts C17–C19): the durable stream read by
//! sequence, woken by a consumer the server pushes to.
//!
//! Per subscribed partition the feed keeps an ordered push consumer
//! (ephemeral, in memory, no acks; async-nats re-creates it after a gap or
//! a reconnect from the last sequence it delivered) started at the stream's
//! last sequence when the subscription was made. One task on the
//! bus's connector runtime awaits all of them: each delivery records the
//! new end of the partition, keeps the message in a bounded buffer and
//! rings the subscription's doorbell. An idle subscription costs nothing
//! but the server's idle heartbeat every 5 s.
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

use bus_core::sync::lock;

use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::consumer::push::OrderedConfig;
use bus_core::subscription::Plan;
use bus_core::{
    BusError, Doorbell, Feed, Selector, StartAt, StoredEvent, SubscribeOptions, Subscription,
};
use futures::{FutureExt as _, StreamExt as _};

use crate::NatsBus;
use crate::bus::Runner;
use crate::cursor::CursorSlot;
use crate::errors::{unavailable, unavailable_caused};
use crate::fetch;
use crate::record::{RawMessage, epoch_ms};
use crate::shared::{Shared, TopicState};
use crate::topics::stream_info;

/// Pushed records buffered per partition; past it they are dropped and
/// read back from the stream when the subscriber gets there.
const BUFFER: usize = 1024;
/// Pushed messages taken between two rings of the doorbell.
const BATCH: usize = 256;

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

    /// Takes one pushed message into its partition's buffer.
    fn take(&self, index: usize, message: async_nats::jetstream::Message) {
        let Some(part) = self.parts.get(index) else {
            return;
        };
        let Ok(info) = message.info() else {
            lock(&part.live).stale = true;
            return;
        };
        let (sequence, stored_at) = (info.stream_sequence, epoch_ms(info.published));
        let message = message.message;
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

    fn mark_stale(&self) {
        for part in &self.parts {
            lock(&part.live).stale = true;
        }
    }
}

/// The [`Feed`] of one NATS subscription.
pub(crate) struct NatsFeed {
    inner: Arc<Inner>,
    executor: Runner,
    task: Option<tokio::task::JoinHandle<()>>,
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
        let task = executor.run_bounded("subscribe", timeout, move || async move {
            let inner = started;
            let consumers =
                futures::future::join_all((0..inner.parts.len()).map(|index| open(&inner, index)))
                    .await
                    .into_iter()
                    .collect::<Result<Vec<_>, BusError>>()?;
            let merged = futures::stream::select_all(
                consumers
                    .into_iter()
                    .enumerate()
                    .map(|(index, messages)| messages.map(move |item| (index, item))),
            );
            Ok::<_, BusError>(tokio::spawn(watch(inner, merged)))
        });
        match task {
            Ok(Ok(task)) => Ok(Self {
                inner,
                executor,
                task: Some(task),
            }),
            Ok(Err(error)) | Err(error) => {
                // Consumers made before the failure: gone with their prefix.
                cleanup(&executor, &inner, None);
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

/// The stream's end now, then an ordered push consumer from just after it.
async fn open(
    inner: &Inner,
    index: usize,
) -> Result<async_nats::jetstream::consumer::push::Ordered, BusError> {
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
    let end = info.state.last_sequence;
    lock(&part.live).end = end;
    let config = OrderedConfig {
        name: Some(format!("{}-{}", inner.consumer, part.partition)),
        deliver_subject: inner.shared.js.client().new_inbox(),
        // From the last stored record rather than just after it: its
        // delivery (dropped by the reader as already known) sets where
        // async-nats re-creates the consumer after a reconnect; before any
        // delivery it would replay the whole stream.
        deliver_policy: DeliverPolicy::ByStartSequence {
            start_sequence: end.max(1),
        },
        ..OrderedConfig::default()
    };
    let consumer = inner
        .shared
        .js
        .create_consumer_on_stream(config, stream)
        .await
        .map_err(|error| {
            unavailable_caused(format!("{what}: creating its consumer: {error}"), error)
        })?;
    consumer
        .messages()
        .await
        .map_err(|error| unavailable_caused(format!("{what}: {error}"), error))
}

/// The push task: buffers deliveries and rings, until the feed is dropped.
async fn watch<S>(inner: Arc<Inner>, mut merged: S)
where
    S: futures::Stream<
            Item = (
                usize,
                Result<
                    async_nats::jetstream::Message,
                    async_nats::jetstream::consumer::push::OrderedError,
                >,
            ),
        > + Unpin,
{
    loop {
        let Some(first) = merged.next().await else {
            break;
        };
        let mut item = Some(first);
        for _ in 0..BATCH {
            let Some((index, result)) = item.take() else {
                break;
            };
            match result {
                Ok(message) => inner.take(index, message),
                // A missed heartbeat or a failed re-creation: the consumer
                // may have skipped something; reads ask the server.
                Err(_) => inner.mark_stale(),
            }
            item = merged.next().now_or_never().flatten();
        }
        if let Some((index, result)) = item {
            match result {
                Ok(message) => inner.take(index, message),
                Err(_) => inner.mark_stale(),
            }
        }
        inner.bell.ring();
    }
    // The connection is closed for good.
    inner.mark_stale();
    inner.bell.ring();
}

impl Feed for NatsFeed {
    fn read(
        &mut self,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, BusError> {
        let inner = &*self.inner;
        let part = inner.part(partition)?;
        let auth = inner.shared.auth();
        let name = inner.topic.spec.name.as_str();
        if !inner.connected() {
            lock(&part.live).stale = true;
            return Err(unavailable(format!(
                "subscription to topic {name:?} partition {partition}: the connection to NATS is down"
            )));
        }
        let wanted = from.saturating_add(1);
        let limit = {
            let mut live = lock(&part.live);
            while live.buffer.front().is_some_and(|m| m.sequence < wanted) {
                live.buffer.pop_front();
            }
            match live.buffer.front() {
                Some(front) if front.sequence == wanted => {
                    let count = live.buffer.len().min(max);
                    let taken: Vec<RawMessage> = live.buffer.drain(..count).collect();
                    drop(live);
                    return self.decode_buffered(partition, taken, auth.as_ref());
                }
                // The push started (or resumed) further on: fetch up to it.
                Some(front) => usize::try_from(front.sequence - wanted)
                    .unwrap_or(usize::MAX)
                    .min(max),
                None if !live.stale && wanted > live.end => return Ok(Vec::new()),
                None => max,
            }
        };
        let (shared, topic) = (Arc::clone(&inner.shared), Arc::clone(&inner.topic));
        let reader = Arc::clone(&self.inner);
        let messages =
            self.executor
                .run_watching(&inner.bell, "subscription read", shared.timeout, {
                    move || async move {
                        let part = reader.part(partition)?;
                        fetch::fetch_with(&shared, &topic, partition, from, limit, &part.cursor)
                            .await
                    }
                })??;
        {
            let mut live = lock(&part.live);
            match messages.last() {
                Some(last) => live.end = live.end.max(last.sequence),
                // The server was asked where the stream ends: nothing more.
                None => live.stale = false,
            }
        }
        fetch::decode_all(name, partition, auth.as_ref(), &messages)
    }

    fn head(&mut self, partition: u32) -> Result<u64, BusError> {
        let inner = &*self.inner;
        inner.part(partition)?;
        if !inner.connected() {
            return Err(unavailable(format!(
                "subscription to topic {:?} partition {partition}: the connection to NATS is down",
                inner.topic.spec.name
            )));
        }
        let (shared, topic) = (Arc::clone(&inner.shared), Arc::clone(&inner.topic));
        let offsets = self.executor.run_watching(
            &inner.bell,
            "subscription head",
            shared.timeout,
            move || fetch::offsets(shared, topic, partition),
        )??;
        Ok(offsets.next)
    }
}

impl NatsFeed {
    /// Decodes buffered messages on the caller's thread; those after a
    /// forged one go back to the buffer's front for the next read.
    fn decode_buffered(
        &self,
        partition: u32,
        mut taken: Vec<RawMessage>,
        auth: Option<&bus_core::auth::RecordAuth>,
    ) -> Result<Vec<StoredEvent>, BusError> {
        let name = self.inner.topic.spec.name.as_str();
        let result = fetch::decode_all(name, partition, auth, &taken);
        let used = match &result {
            Ok(events) => events.len(),
            Err(_) => 0,
        };
        if used < taken.len() {
            let part = self.inner.part(partition)?;
            let mut live = lock(&part.live);
            for message in taken.drain(used..).rev() {
                live.buffer.push_front(message);
            }
        }
        result
    }
}

/// Stops the push task and deletes the subscription's consumers (push and
/// replay) in the background; the server would expire them anyway.
fn cleanup(executor: &Runner, inner: &Arc<Inner>, task: Option<tokio::task::JoinHandle<()>>) {
    if let Some(task) = task {
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
        let task = self.task.take();
        cleanup(&self.executor, &self.inner, task);
    }
}
