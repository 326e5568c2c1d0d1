//! Fetching (contract C5). Each fetch asks the stream for its first and
//! last sequence, so the end of a partition answers at once instead of
//! waiting for records. Small reads are direct gets by sequence; longer
//! ones go through a per-partition ephemeral pull consumer kept at the next
//! sequence, so sequential replay reuses it. The consumer acks nothing,
//! lives in memory and is removed by the server when left idle.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::pull::Config as PullConfig;
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, PullConsumer};
use async_nats::jetstream::stream::{DirectGetErrorKind, Stream};
use bus_core::{BusError, StoredEvent};
use futures::StreamExt;
use futures::future::join_all;

use crate::errors::unavailable;
use crate::record::{RawMessage, decode, epoch_ms};
use crate::shared::{PartitionState, Shared, TopicState};
use crate::topics::stream_info;

/// Reads of at most this many records use direct gets (no consumer).
const DIRECT_MAX: u64 = 8;
/// A cursor idle this long is replaced rather than trusted.
const CURSOR_IDLE: Duration = Duration::from_secs(10);
/// The server drops a cursor's consumer after this much inactivity.
const CONSUMER_INACTIVE: Duration = Duration::from_secs(30);

/// A partition's reader for sequential replay.
pub(crate) struct Cursor {
    consumer: PullConsumer,
    stream: String,
    /// The stream sequence the consumer delivers next.
    next: u64,
    used: Instant,
}

impl Cursor {
    /// The consumer's stream and name, for deleting it.
    pub(crate) fn id(&self) -> (String, String) {
        (
            self.stream.clone(),
            self.consumer.cached_info().name.clone(),
        )
    }
}

/// Up to `max` records of `partition` from `offset`, ascending, gap-free.
pub(crate) async fn fetch(
    shared: Arc<Shared>,
    topic: Arc<TopicState>,
    partition: u32,
    offset: u64,
    max: usize,
) -> Result<Vec<StoredEvent>, BusError> {
    let name = topic.spec.name.as_str();
    let state = topic
        .partitions
        .get(partition as usize)
        .ok_or_else(|| BusError::Backend(format!("topic {name:?} lost partition {partition}")))?;
    let what = format!("fetch from topic {name:?} partition {partition}");
    let info = stream_info(&shared.js, &state.stream)
        .await
        .map_err(|failure| failure.into_bus(&what, shared.timeout))?;
    let Some(info) = info else {
        shared.forget(name);
        return Err(BusError::UnknownTopic(name.to_owned()));
    };
    let (first, last) = (info.state.first_sequence.max(1), info.state.last_sequence);
    let start = offset.saturating_add(1).max(first);
    if start > last {
        return Ok(Vec::new());
    }
    let count = (last - start + 1).min(max as u64);
    let stream = shared
        .js
        .get_stream_no_info(&state.stream)
        .await
        .map_err(|error| BusError::Backend(format!("{what}: {error}")))?;
    let messages = if count <= DIRECT_MAX {
        direct(&stream, start, count, &what).await?
    } else {
        consume(&shared, state, &stream, start, count, &what).await?
    };
    let auth = shared.auth();
    let mut events = Vec::with_capacity(messages.len());
    for message in &messages {
        match decode(name, partition, auth.as_ref(), message) {
            Ok(event) => events.push(event),
            // The authentic prefix is returned; the bad record fails the
            // fetch that starts at it, naming its offset.
            Err(error) if events.is_empty() => return Err(error),
            Err(_) => break,
        }
    }
    Ok(events)
}

/// Direct gets of `start..start + count`, sent together.
async fn direct(
    stream: &Stream<()>,
    start: u64,
    count: u64,
    what: &str,
) -> Result<Vec<RawMessage>, BusError> {
    let results =
        join_all((start..start + count).map(|sequence| stream.direct_get(sequence))).await;
    let mut out = Vec::with_capacity(results.len());
    for result in results {
        match result {
            Ok(message) => out.push(RawMessage {
                sequence: message.sequence,
                headers: Some(message.headers),
                payload: message.payload,
                stored_at: epoch_ms(message.time),
            }),
            // Expired since the stream info was read: only the front goes.
            Err(error) if error.kind() == DirectGetErrorKind::NotFound => {
                if out.is_empty() {
                    continue;
                }
                break;
            }
            Err(error) => return Err(unavailable(format!("{what}: {error}"))),
        }
    }
    Ok(out)
}

/// `count` records from `start` through the partition's cursor, replacing
/// it when it is elsewhere or broken; direct gets as the last resort.
async fn consume(
    shared: &Shared,
    state: &PartitionState,
    stream: &Stream<()>,
    start: u64,
    count: u64,
    what: &str,
) -> Result<Vec<RawMessage>, BusError> {
    let mut slot = state.cursor.lock().await;
    for _attempt in 0..2 {
        let reusable = slot
            .as_ref()
            .is_some_and(|cursor| cursor.next == start && cursor.used.elapsed() < CURSOR_IDLE);
        if !reusable {
            if let Some(old) = slot.take() {
                discard(shared, old);
            }
            *slot = Some(open(stream, &state.stream, start, what).await?);
        }
        let Some(cursor) = slot.as_mut() else { break };
        match pull(cursor, count).await {
            Ok(messages) if !messages.is_empty() => {
                if let Some(last) = messages.last() {
                    cursor.next = last.sequence + 1;
                }
                cursor.used = Instant::now();
                return Ok(messages);
            }
            // Empty although the stream holds records, or an error: the
            // consumer is gone (server restart, idle expiry). Try a new one.
            Ok(_) | Err(_) => {
                if let Some(old) = slot.take() {
                    discard(shared, old);
                }
            }
        }
    }
    direct(stream, start, count.min(DIRECT_MAX), what).await
}

async fn open(stream: &Stream<()>, name: &str, start: u64, what: &str) -> Result<Cursor, BusError> {
    let config = PullConfig {
        deliver_policy: DeliverPolicy::ByStartSequence {
            start_sequence: start,
        },
        ack_policy: AckPolicy::None,
        inactive_threshold: CONSUMER_INACTIVE,
        memory_storage: true,
        num_replicas: 1,
        ..PullConfig::default()
    };
    let consumer = stream
        .create_consumer(config)
        .await
        .map_err(|error| unavailable(format!("{what}: creating a reader: {error}")))?;
    Ok(Cursor {
        consumer,
        stream: name.to_owned(),
        next: start,
        used: Instant::now(),
    })
}

/// The next `count` messages, ending early (no wait) when the consumer has
/// nothing more.
async fn pull(cursor: &Cursor, count: u64) -> Result<Vec<RawMessage>, async_nats::Error> {
    let wanted = usize::try_from(count).unwrap_or(usize::MAX);
    let mut batch = cursor
        .consumer
        .fetch()
        .max_messages(wanted)
        .messages()
        .await?;
    let mut out = Vec::with_capacity(wanted);
    while let Some(message) = batch.next().await {
        let message = message?;
        let info = message.info()?;
        let (sequence, stored_at) = (info.stream_sequence, epoch_ms(info.published));
        out.push(RawMessage {
            sequence,
            headers: message.message.headers.clone(),
            payload: message.message.payload.clone(),
            stored_at,
        });
        if out.len() >= wanted {
            break;
        }
    }
    Ok(out)
}

/// Deletes a replaced cursor's consumer in the background (best effort:
/// the server expires it anyway).
fn discard(shared: &Shared, cursor: Cursor) {
    let js = shared.js.clone();
    let (stream, name) = cursor.id();
    tokio::spawn(async move {
        let _ = js.delete_consumer_from_stream(&name, &stream).await;
    });
}
