//! Fetching (contract C5). A read below the partition's known end (the
//! highest sequence seen in acks, reads and consumer pending counts) goes
//! straight to the records; a read past it first asks the stream where it
//! ends, so the end of a partition answers at once instead of waiting for
//! records. Small reads are direct gets by sequence; longer ones go through
//! a per-partition ephemeral pull consumer kept at the next sequence, so
//! sequential replay reuses it. The consumer acks nothing, lives in memory
//! and is removed by the server when left idle.
//!
//! Once a cursor is read a second time in a row (sequential replay), each
//! read also asks for the next page, so it arrives while the caller works
//! on this one; and records are decoded on the caller's thread
//! ([`decode_all`]), not on the connector, which meanwhile receives.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::pull::{Batch, Config as PullConfig};
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, PullConsumer};
use async_nats::jetstream::stream::Stream;
use bus_core::auth::RecordAuth;
use bus_core::{BusError, PartitionOffsets, StoredRecord};
use futures::StreamExt;
use futures::future::join_all;

use crate::cursor::{Ahead, Cursor, CursorSlot};
use crate::errors::unavailable_caused;
use crate::get::Reads;
use crate::record::{RawMessage, decode_record, epoch_ms, from_stream_message};
use crate::shared::{PartitionState, Shared, TopicState};
use crate::topics::stream_info;

/// Reads of at most this many records use direct gets (no consumer).
const DIRECT_MAX: u64 = 8;
/// Records a pull reserves room for up front.
const PREALLOCATE_MAX: usize = 4_096;
/// A cursor idle this long is replaced rather than trusted.
const CURSOR_IDLE: Duration = Duration::from_secs(10);
/// The server drops a cursor's consumer after this much inactivity.
const CONSUMER_INACTIVE: Duration = Duration::from_secs(30);
/// Bytes a read-ahead page may hold: records go up to the topic's size
/// limit, so a page of them is bounded by bytes as well as by count.
const AHEAD_BYTES: usize = 8 << 20;
/// Pages asked for ahead of the reader in sequential replay, in one pull
/// request (the server spreads messages over concurrent pull requests, so
/// there is never more than one): the next page arrives while the caller
/// decodes this one, and the one after is already on its way.
const AHEAD_PAGES: usize = 2;
/// A read-ahead page whose next message takes longer than this is taken
/// for lost (a reconnect forgets pull requests); the cursor is replaced.
const AHEAD_STALL: Duration = Duration::from_secs(2);

/// The stream's first and last sequence, from the server.
async fn bounds(
    shared: &Shared,
    topic: &TopicState,
    state: &PartitionState,
    what: &str,
) -> Result<(u64, u64), BusError> {
    let info = stream_info(&shared.js, &state.stream)
        .await
        .map_err(|failure| failure.into_bus(what, shared.timeout))?;
    let Some(info) = info else {
        shared.forget(&topic.spec.name);
        return Err(BusError::UnknownTopic(topic.spec.name.clone()));
    };
    state.saw(info.state.last_sequence);
    Ok((info.state.first_sequence, info.state.last_sequence))
}

/// The retained offsets of `partition`: one stream info, also right after
/// retention expired every record.
pub(crate) async fn offsets(
    shared: Arc<Shared>,
    topic: Arc<TopicState>,
    partition: u32,
) -> Result<PartitionOffsets, BusError> {
    let state = topic.partition(partition)?;
    let what = format!(
        "offsets of topic {:?} partition {partition}",
        topic.spec.name
    );
    let (first, last) = bounds(&shared, &topic, state, &what).await?;
    Ok(PartitionOffsets {
        first: first.saturating_sub(1).min(last),
        next: last,
    })
}

/// Drops the records of `partition` below `offset` (never past the head):
/// a purge of the stream up to that sequence, which keeps the sequence
/// numbering, so offsets are never reused (C4). What a cold tier calls
/// after archiving (C24).
pub(crate) async fn delete_below(
    shared: Arc<Shared>,
    topic: Arc<TopicState>,
    partition: u32,
    offset: u64,
) -> Result<u64, BusError> {
    let state = topic.partition(partition)?;
    let what = format!(
        "delete_below({offset}) on topic {:?} partition {partition}",
        topic.spec.name
    );
    let (first, last) = bounds(&shared, &topic, state, &what).await?;
    // Offset o is sequence o + 1; purge keeps sequences >= the one given.
    let keep_from = offset.min(last).saturating_add(1);
    if keep_from <= first {
        return Ok(0);
    }
    let stream = shared
        .js
        .get_stream_no_info(&state.stream)
        .await
        .map_err(|error| BusError::backend_caused("nats", format!("{what}: {error}"), error))?;
    let purged = stream
        .purge()
        .sequence(keep_from)
        .await
        .map_err(|error| unavailable_caused(what, error))?;
    Ok(purged.purged)
}

/// Up to `max` records of `partition` from `offset`, ascending, gap-free,
/// still encoded (see [`decode_all`]).
pub(crate) async fn fetch(
    shared: Arc<Shared>,
    topic: Arc<TopicState>,
    partition: u32,
    offset: u64,
    max: usize,
) -> Result<Vec<RawMessage>, BusError> {
    let slot = &topic.partition(partition)?.cursor;
    fetch_with(&shared, &topic, partition, offset, max, slot).await
}

/// [`fetch`] through the cursor in `slot` (the partition's own, or one a
/// subscription keeps for itself so subscribers never move each other's).
pub(crate) async fn fetch_with(
    shared: &Shared,
    topic: &TopicState,
    partition: u32,
    offset: u64,
    max: usize,
    slot: &CursorSlot,
) -> Result<Vec<RawMessage>, BusError> {
    // A top-up gives up by half the operation timeout, so a fetch whose
    // reader lags returns the prefix it has rather than time out whole.
    let top_up_deadline = Instant::now() + shared.timeout / 2;
    let name = topic.spec.name.as_str();
    let state = topic.partition(partition)?;
    let what = format!("fetch from topic {name:?} partition {partition}");
    let reading = Reading {
        what: &what,
        topic: name,
        partition,
    };
    let clustered = shared.clustered;
    let mut start = offset.saturating_add(1);
    let mut end = state.known_end();
    let mut asked = false;
    let (stream, mut messages, wanted) = loop {
        if start > end || asked {
            let (first, last) = bounds(shared, topic, state, &what).await?;
            (start, end, asked) = (start.max(first), last, true);
            if start > end {
                return Ok(Vec::new());
            }
        }
        let count = (end - start + 1).min(max as u64);
        let stream = shared
            .js
            .get_stream_no_info(&state.stream)
            .await
            .map_err(|error| BusError::backend_caused("nats", format!("{what}: {error}"), error))?;
        let reads = Reads::new(&stream, clustered);
        let messages = if count <= DIRECT_MAX {
            direct(reads, start, count, &what).await?
        } else {
            consume(shared, state, slot, reads, start, count, reading).await?
        };
        // Nothing where records were expected: retention took the front, or
        // the stream is not the one we knew. Ask the server once.
        if messages.is_empty() && !asked {
            state.reset_end();
            asked = true;
            continue;
        }
        break (stream, messages, start + count - 1);
    };
    if clustered {
        let reads = Reads::new(&stream, clustered);
        let more = top_up(shared, state, slot, reads, &mut messages, wanted, reading);
        // Whatever happens, what was read is a gap-free prefix to return.
        match tokio::time::timeout_at(top_up_deadline.into(), more).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::debug!(topic = name, partition, %error, "top-up failed; returning the prefix read");
            }
            Err(_) => {
                tracing::debug!(
                    topic = name,
                    partition,
                    "top-up ran out of time; returning the prefix read"
                );
            }
        }
    }
    if let Some(last) = messages.last() {
        state.saw(last.sequence);
    }
    Ok(messages)
}

/// A replicated stream's reader may sit on a follower that has not yet
/// applied what the leader acked: its read can end before records the
/// caller already knows exist (`wanted`, the last one asked for below the
/// partition's known end). Reads on until they are there, through the
/// leader when the reader makes no progress, so that no fetch sees fewer
/// records than an earlier one or than its caller's own acks. What the
/// leader does not hold either (the stream was replaced) ends the read.
/// The caller bounds it in time; what it appended stays gap-free.
async fn top_up(
    shared: &Shared,
    state: &PartitionState,
    slot: &CursorSlot,
    reads: Reads<'_>,
    messages: &mut Vec<RawMessage>,
    wanted: u64,
    reading: Reading<'_>,
) -> Result<(), BusError> {
    let what = reading.what;
    while let Some(last) = messages.last().map(|message| message.sequence) {
        if last >= wanted {
            break;
        }
        let (start, count) = (last + 1, wanted - last);
        let more = if count <= DIRECT_MAX {
            direct(reads, start, count, what).await?
        } else {
            consume(shared, state, slot, reads, start, count, reading).await?
        };
        // Only what follows without a gap is kept.
        let before = messages.len();
        for (expected, message) in (start..).zip(more) {
            if message.sequence != expected {
                break;
            }
            messages.push(message);
        }
        if messages.len() == before {
            break;
        }
    }
    Ok(())
}

/// Decodes and verifies fetched messages (on the caller's thread). The
/// authentic prefix is returned; a bad record fails the fetch that starts
/// at it, naming its offset.
pub(crate) fn decode_all(
    topic: &str,
    partition: u32,
    auth: Option<&RecordAuth>,
    messages: &[RawMessage],
) -> Result<Vec<StoredRecord>, BusError> {
    let mut events = Vec::with_capacity(messages.len());
    for message in messages {
        match decode_record(topic, partition, auth, message) {
            Ok(event) => events.push(event),
            Err(error) if events.is_empty() => return Err(error),
            Err(_) => break,
        }
    }
    Ok(events)
}

/// Point reads of `start..start + count`, sent together.
async fn direct(
    reads: Reads<'_>,
    start: u64,
    count: u64,
    what: &str,
) -> Result<Vec<RawMessage>, BusError> {
    let results = join_all((start..start + count).map(|sequence| reads.sequence(sequence))).await;
    let mut out = Vec::with_capacity(results.len());
    for result in results {
        match result {
            Ok(Some(message)) => out.push(from_stream_message(message)),
            // Expired since the stream info was read: only the front goes.
            Ok(None) => {
                if out.is_empty() {
                    continue;
                }
                break;
            }
            Err(error) => return Err(unavailable_caused(format!("{what}: {error}"), error)),
        }
    }
    Ok(out)
}

/// `count` records from `start` through the partition's cursor, replacing
/// it when it is elsewhere or broken; direct gets as the last resort.
async fn consume(
    shared: &Shared,
    state: &PartitionState,
    cursor_slot: &CursorSlot,
    reads: Reads<'_>,
    start: u64,
    count: u64,
    reading: Reading<'_>,
) -> Result<Vec<RawMessage>, BusError> {
    let what = reading.what;
    let mut slot = cursor_slot.lock().await;
    for attempt in 1..=2_u32 {
        let reusable = slot
            .as_ref()
            .is_some_and(|cursor| cursor.next == start && cursor.used.elapsed() < CURSOR_IDLE);
        if !reusable {
            if let Some(old) = slot.take() {
                discard(shared, old);
            }
            *slot = Some(open(reads.stream(), &state.stream, start, what).await?);
        }
        let Some(cursor) = slot.as_mut() else { break };
        match read(cursor, count, state, !reusable).await {
            Ok(messages) => {
                if let Some(last) = messages.last() {
                    cursor.next = last.sequence + 1;
                }
                cursor.used = Instant::now();
                cursor.sequential = if reusable { cursor.sequential + 1 } else { 0 };
                if cursor.sequential > 0 {
                    read_ahead(cursor, count).await;
                }
                return Ok(messages);
            }
            // The consumer is gone (server restart, idle expiry), lost
            // messages or failed: try a new one.
            Err(broken) => {
                tracing::warn!(
                    topic = reading.topic,
                    partition = reading.partition,
                    stream = %state.stream,
                    attempt,
                    error = %broken,
                    "nats: discarding a read cursor; reading through a new one"
                );
                if let Some(old) = slot.take() {
                    discard(shared, old);
                }
            }
        }
    }
    tracing::warn!(
        topic = reading.topic,
        partition = reading.partition,
        stream = %state.stream,
        "nats: no read cursor delivered; falling back to point reads"
    );
    direct(reads, start, count.min(DIRECT_MAX), what).await
}

/// Why a read cursor can no longer be trusted.
#[derive(Debug)]
enum Broken {
    /// Nothing came although the stream holds the records.
    Empty,
    /// Its read-ahead request stalled (a reconnect forgets pull requests).
    Stalled,
    /// A delivered message did not follow the one before.
    Gap,
    /// The pull request failed.
    Failed(async_nats::Error),
}

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Empty => f.write_str("nothing delivered where records are stored"),
            Self::Stalled => f.write_str("its read-ahead request stalled"),
            Self::Gap => f.write_str("a gap in the delivered messages"),
            Self::Failed(error) => write!(f, "pull failed: {error}"),
        }
    }
}

/// What a read is for: the operation's name for errors, and the topic and
/// partition for logs.
#[derive(Clone, Copy)]
struct Reading<'a> {
    what: &'a str,
    topic: &'a str,
    partition: u32,
}

/// The cursor's next `count` messages (all known to be stored): first
/// what the read-ahead request brought, then a pull for the rest. Ends
/// early, without waiting, when the consumer has nothing more. [`Broken`]
/// when the cursor cannot be trusted any more (nothing delivered, an error,
/// a stalled request or a gap). A `fresh` cursor may start past its start sequence (retention
/// took the front); a reused one must continue exactly where it stopped.
async fn read(
    cursor: &mut Cursor,
    count: u64,
    state: &PartitionState,
    fresh: bool,
) -> Result<Vec<RawMessage>, Broken> {
    let wanted = usize::try_from(count).unwrap_or(usize::MAX);
    let mut run = Run {
        out: Vec::with_capacity(wanted.min(PREALLOCATE_MAX)),
        expected: cursor.next,
        exact: !fresh,
        end: 0,
    };
    while run.out.len() < wanted {
        let Some(ahead) = cursor.ahead.as_mut() else {
            break;
        };
        match tokio::time::timeout(AHEAD_STALL, ahead.batch.next()).await {
            Ok(Some(Ok(message))) => {
                run.push(message).ok_or(Broken::Gap)?;
                ahead.left -= 1;
                if ahead.left == 0 {
                    cursor.ahead = None;
                }
            }
            // The request is answered (also when the server ended it at its
            // byte limit: every message it held came first).
            Ok(None | Some(Err(_))) => cursor.ahead = None,
            Err(_) => return Err(Broken::Stalled),
        }
    }
    if run.out.is_empty() {
        let mut batch = request(&cursor.consumer, count, usize::MAX)
            .await
            .map_err(Broken::Failed)?;
        while run.out.len() < wanted {
            match batch.next().await {
                Some(Ok(message)) => run.push(message).ok_or(Broken::Gap)?,
                Some(Err(error)) => return Err(Broken::Failed(error)),
                None => break,
            }
        }
    }
    if run.out.is_empty() {
        return Err(Broken::Empty);
    }
    state.saw(run.end);
    Ok(run.out)
}

/// Messages read in one call, checked to follow each other.
struct Run {
    out: Vec<RawMessage>,
    /// The sequence the next message must have.
    expected: u64,
    /// Whether it must have exactly that one (else at least).
    exact: bool,
    /// The stream's end as the last message's pending count tells it.
    end: u64,
}

impl Run {
    /// Appends a delivered message; `None` at a gap (the subscription lost
    /// messages, or a request's were dropped).
    fn push(&mut self, message: async_nats::jetstream::Message) -> Option<()> {
        let (sequence, stored_at, pending) = {
            let info = message.info().ok()?;
            (info.stream_sequence, epoch_ms(info.published), info.pending)
        };
        if sequence < self.expected || (self.exact && sequence != self.expected) {
            return None;
        }
        self.expected = sequence + 1;
        self.exact = true;
        self.end = sequence.saturating_add(pending);
        let message = message.message;
        self.out.push(RawMessage {
            sequence,
            headers: message.headers,
            payload: message.payload,
            stored_at,
        });
        Some(())
    }
}

/// Asks for the next [`AHEAD_PAGES`] pages of `count` once the last
/// read-ahead request is used up.
async fn read_ahead(cursor: &mut Cursor, count: u64) {
    if cursor.ahead.is_none() {
        let pages = count.saturating_mul(AHEAD_PAGES as u64);
        cursor.ahead = request(&cursor.consumer, pages, AHEAD_BYTES)
            .await
            .ok()
            .map(|batch| Ahead {
                batch,
                left: usize::try_from(pages).unwrap_or(usize::MAX),
            });
    }
}

async fn open(stream: &Stream<()>, name: &str, start: u64, what: &str) -> Result<Cursor, BusError> {
    tracing::debug!(stream = name, start, "nats: opening a read cursor");
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
    let consumer = stream.create_consumer(config).await.map_err(|error| {
        unavailable_caused(format!("{what}: creating a reader: {error}"), error)
    })?;
    Ok(Cursor {
        consumer,
        stream: name.to_owned(),
        next: start,
        used: Instant::now(),
        sequential: 0,
        ahead: None,
    })
}

/// Sends a pull request for up to `count` messages and `max_bytes`,
/// answered at once with what is stored (no wait at the end).
async fn request(
    consumer: &PullConsumer,
    count: u64,
    max_bytes: usize,
) -> Result<Batch, async_nats::Error> {
    let mut fetch = consumer
        .fetch()
        .max_messages(usize::try_from(count).unwrap_or(usize::MAX));
    if max_bytes < usize::MAX {
        fetch = fetch.max_bytes(max_bytes);
    }
    Ok(fetch.messages().await?)
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
