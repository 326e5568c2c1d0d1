//! Positioned reads of one partition (contract C5): a pool of consumers,
//! each assigned to one partition at an explicit offset, reused while a
//! caller replays sequentially. Reads stop at the high watermark, so a fetch
//! at the end returns at once instead of long-polling.

use bus_core::backend::sync::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bus_core::BusError;
use rdkafka::Offset;
use rdkafka::TopicPartitionList;
use rdkafka::consumer::Consumer;
use rdkafka::message::{Headers, Message};

use crate::KafkaOptions;
use crate::client::{self, Reader, remaining};
use crate::errors::map_error;

/// Header names of a bus record.
pub(crate) const UID_HEADER: &str = "bus-uid";
/// Hex HMAC tag header (contract C14).
pub(crate) const TAG_HEADER: &str = "bus-tag";

/// How many positioned consumers a bus keeps.
const POOL_SIZE: usize = 8;
/// Pause after which a read without progress re-checks the watermarks.
const STALL: Duration = Duration::from_millis(250);

/// One record as read from Kafka, before any check, borrowed from
/// librdkafka's buffer (nothing is copied until decoded).
#[derive(Debug, Clone)]
pub(crate) struct RawMessage<'a> {
    pub offset: u64,
    pub key: &'a [u8],
    pub value: Option<&'a [u8]>,
    pub uid: Option<&'a str>,
    pub tag: Option<&'a [u8]>,
    pub timestamp: Option<i64>,
    /// The record's other headers than the bus's own, as stored (C25):
    /// empty (no allocation) for a record without any.
    pub headers: Vec<(&'a str, &'a [u8])>,
}

struct Slot {
    consumer: Reader,
    /// The offset the consumer will deliver next, when assigned.
    next: Option<u64>,
    /// The last high watermark seen.
    high: u64,
    /// Fetching is paused (the consumer is at the high watermark).
    paused: bool,
    /// The next positioned read assigns again even at `next`: resumed,
    /// librdkafka may take most of a second to send its next Fetch, while
    /// an assignment fetches at once.
    reassign: bool,
    last_used: u64,
}

/// The consumers of a bus, one per recently read partition, plus one with
/// no assignment for watermark and timestamp queries: an assigned consumer
/// idling at the end keeps a long-polling Fetch in flight, and the broker
/// answers requests on one connection in order, so a query sent through it
/// would wait out `fetch.wait.max.ms`.
pub(crate) struct Pool {
    slots: Mutex<PoolState>,
    /// Replaced when its queries keep failing (see [`Pool::watermarks`]).
    meta: Mutex<Arc<Reader>>,
}

#[derive(Default)]
struct PoolState {
    slots: HashMap<(String, i32), Arc<Mutex<Slot>>>,
    clock: u64,
}

impl Pool {
    /// A pool with its query consumer.
    pub(crate) fn new(options: &KafkaOptions) -> Result<Self, BusError> {
        Ok(Self {
            slots: Mutex::default(),
            meta: Mutex::new(Arc::new(client::reader(options)?)),
        })
    }

    /// The query consumer.
    pub(crate) fn meta(&self) -> Arc<Reader> {
        Arc::clone(&lock(&self.meta))
    }

    /// Replaces the query consumer `failed` (unless another caller did
    /// already): after a clean broker restart librdkafka can keep taking a
    /// partition it saw without a leader for unknown, refreshes included,
    /// while a new client sees it at once.
    fn replace_meta(&self, options: &KafkaOptions, failed: &Arc<Reader>) {
        let Ok(fresh) = client::reader(options) else {
            return;
        };
        let mut meta = lock(&self.meta);
        if Arc::ptr_eq(&meta, failed) {
            tracing::warn!("kafka: the query consumer kept failing; replaced by a new one");
            *meta = Arc::new(fresh);
        }
    }

    fn slot(
        &self,
        options: &KafkaOptions,
        topic: &str,
        partition: i32,
    ) -> Result<Arc<Mutex<Slot>>, BusError> {
        let mut state = lock(&self.slots);
        state.clock += 1;
        let clock = state.clock;
        let key = (topic.to_owned(), partition);
        if let Some(slot) = state.slots.get(&key) {
            if let Ok(mut inner) = slot.try_lock() {
                inner.last_used = clock;
            }
            return Ok(Arc::clone(slot));
        }
        if state.slots.len() >= POOL_SIZE {
            let oldest = state
                .slots
                .iter()
                .filter(|(_, slot)| Arc::strong_count(slot) == 1)
                .min_by_key(|(_, slot)| slot.try_lock().map_or(u64::MAX, |s| s.last_used))
                .map(|(key, _)| key.clone());
            if let Some(oldest) = oldest {
                state.slots.remove(&oldest);
            }
        }
        let slot = Arc::new(Mutex::new(Slot {
            consumer: client::reader(options)?,
            next: None,
            high: 0,
            paused: false,
            reassign: false,
            last_used: clock,
        }));
        state.slots.insert(key, Arc::clone(&slot));
        Ok(slot)
    }

    /// Drops the consumers of `topic` (after it is deleted).
    pub(crate) fn forget(&self, topic: &str) {
        lock(&self.slots).slots.retain(|(name, _), _| name != topic);
    }

    /// The low and high watermarks of a partition.
    pub(crate) fn watermarks(
        &self,
        options: &KafkaOptions,
        topic: &str,
        partition: i32,
        deadline: Instant,
    ) -> Result<(u64, u64), BusError> {
        // Half the time left through the query consumer; if that fails
        // retryably, the rest through a new one.
        let meta = self.meta();
        let first = Instant::now() + remaining(deadline) / 2;
        match watermarks(options, &meta, topic, partition, first) {
            Err(error) if error.is_transient() && Instant::now() < deadline => {
                self.replace_meta(options, &meta);
                watermarks(options, &self.meta(), topic, partition, deadline)
            }
            done => done,
        }
    }

    /// The first offset whose timestamp is at or after `timestamp_ms`, or
    /// the high watermark when there is none.
    pub(crate) fn offset_for_time(
        &self,
        options: &KafkaOptions,
        topic: &str,
        partition: i32,
        timestamp_ms: i64,
        deadline: Instant,
    ) -> Result<u64, BusError> {
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(topic, partition, Offset::Offset(timestamp_ms))
            .map_err(|error| map_error(options, "offsets_for_times", error))?;
        let meta = self.meta();
        let found = client::retry(
            options,
            "offsets_for_times",
            deadline,
            meta.client(),
            || meta.offsets_for_times(list.clone(), remaining(deadline).min(STALL * 4)),
        )?;
        let offset = found
            .find_partition(topic, partition)
            .map(|elem| elem.offset());
        match offset {
            Some(Offset::Offset(offset)) => Ok(u64::try_from(offset).unwrap_or(0)),
            _ => Ok(self.watermarks(options, topic, partition, deadline)?.1),
        }
    }

    /// Up to `max` records of `topic`/`partition` from `from` on (from the
    /// log start when `from` is below it), never waiting past the high
    /// watermark; each record is handed to `each` as it is read.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn read<T>(
        &self,
        options: &KafkaOptions,
        topic: &str,
        partition: i32,
        from: u64,
        max: usize,
        deadline: Instant,
        each: impl FnMut(RawMessage<'_>) -> T,
    ) -> Result<Vec<T>, BusError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let slot = self.slot(options, topic, partition)?;
        let mut slot = lock(&slot);
        if slot.paused {
            slot.paused = false;
            pause(options, &slot.consumer, topic, partition, false)?;
            slot.reassign = true;
        }
        let read = self.read_slot(
            options, &mut slot, topic, partition, from, max, deadline, each,
        );
        // Caught up: stop fetching until the next read, so an idle slot
        // sends no Fetch requests.
        if slot.next.is_some_and(|next| next >= slot.high)
            && pause(options, &slot.consumer, topic, partition, true).is_ok()
        {
            slot.paused = true;
        }
        read
    }

    #[allow(clippy::too_many_arguments)]
    fn read_slot<T>(
        &self,
        options: &KafkaOptions,
        slot: &mut Slot,
        topic: &str,
        partition: i32,
        from: u64,
        max: usize,
        deadline: Instant,
        mut each: impl FnMut(RawMessage<'_>) -> T,
    ) -> Result<Vec<T>, BusError> {
        let sequential = slot.next == Some(from) && from < slot.high;
        // Below a high watermark this slot saw, the record exists (unless
        // retention took it: the consumer then resets to the log start, as
        // the query would have): no round trip to ask first. The page still
        // asks before it ends at that high watermark (below), so a record
        // acked since is never left out.
        let known = !sequential && from < slot.high;
        let mut next = from;
        if !sequential {
            if !known {
                let (low, high) = self.watermarks(options, topic, partition, deadline)?;
                slot.high = high;
                next = from.max(low);
                if next >= high {
                    return Ok(Vec::new());
                }
            }
            if slot.next != Some(next) || slot.reassign {
                assign(options, &slot.consumer, topic, partition, next)?;
                slot.next = Some(next);
                slot.reassign = false;
            }
        }
        let mut out = Vec::with_capacity(max.min(4_096));
        let mut last_error = None;
        let mut quiet_since = Instant::now();
        // A sequential read trusts the high watermark the last read saw;
        // records acked since then lie past it, so a read that reaches it
        // with room left asks the broker once more (a page stopped there
        // was short in the middle of the log: C5, seen under a cold tier).
        let mut fresh_high = !sequential && !known;
        loop {
            if out.len() >= max {
                break;
            }
            if next >= slot.high {
                if fresh_high {
                    break;
                }
                fresh_high = true;
                // Without an answer, the page read so far stands.
                match self.watermarks(options, topic, partition, deadline) {
                    Ok((_, high)) if high > next => slot.high = high,
                    _ => break,
                }
            }
            if Instant::now() >= deadline {
                slot.next = None;
                return Err(
                    last_error.unwrap_or_else(|| crate::errors::timed_out(options, "fetch"))
                );
            }
            match slot.consumer.poll(remaining(deadline).min(STALL)) {
                Some(Ok(message)) => {
                    let Ok(offset) = u64::try_from(message.offset()) else {
                        continue;
                    };
                    if offset < next {
                        continue;
                    }
                    out.push(each(raw(&message, offset)));
                    next = offset + 1;
                    slot.high = slot.high.max(next);
                    slot.next = Some(next);
                    quiet_since = Instant::now();
                }
                Some(Err(error)) => {
                    last_error = Some(map_error(options, "fetch", error));
                }
                None => {
                    if quiet_since.elapsed() >= STALL {
                        // Records may have expired under the consumer.
                        if let Ok((low, high)) =
                            self.watermarks(options, topic, partition, deadline)
                        {
                            slot.high = high;
                            if next < low && out.is_empty() {
                                next = low;
                                assign(options, &slot.consumer, topic, partition, low)?;
                                slot.next = Some(low);
                            }
                        }
                        quiet_since = Instant::now();
                    }
                }
            }
        }
        Ok(out)
    }
}

fn assign(
    options: &KafkaOptions,
    consumer: &Reader,
    topic: &str,
    partition: i32,
    offset: u64,
) -> Result<(), BusError> {
    let mut list = TopicPartitionList::new();
    let offset = i64::try_from(offset).unwrap_or(i64::MAX);
    list.add_partition_offset(topic, partition, Offset::Offset(offset))
        .and_then(|()| consumer.assign(&list))
        .map_err(|error| map_error(options, "assigning a partition", error))
}

/// Pauses or resumes fetching one partition.
pub(crate) fn pause(
    options: &KafkaOptions,
    consumer: &Reader,
    topic: &str,
    partition: i32,
    paused: bool,
) -> Result<(), BusError> {
    let mut list = TopicPartitionList::new();
    list.add_partition(topic, partition);
    let done = if paused {
        consumer.pause(&list)
    } else {
        consumer.resume(&list)
    };
    done.map_err(|error| map_error(options, "pausing a partition", error))
}

pub(crate) fn watermarks(
    options: &KafkaOptions,
    consumer: &Reader,
    topic: &str,
    partition: i32,
    deadline: Instant,
) -> Result<(u64, u64), BusError> {
    let (low, high) = client::retry(
        options,
        "reading watermarks",
        deadline,
        consumer.client(),
        || consumer.fetch_watermarks(topic, partition, remaining(deadline).min(STALL * 4)),
    )?;
    Ok((
        u64::try_from(low).unwrap_or(0),
        u64::try_from(high).unwrap_or(0),
    ))
}

pub(crate) fn raw<M: Message>(message: &M, offset: u64) -> RawMessage<'_> {
    let mut uid = None;
    let mut tag = None;
    let mut headers = Vec::new();
    if let Some(block) = message.headers() {
        for header in block.iter() {
            match header.key {
                UID_HEADER => {
                    uid = header
                        .value
                        .and_then(|bytes| std::str::from_utf8(bytes).ok())
                }
                TAG_HEADER => tag = header.value,
                name if !bus_core::is_reserved_header(name) => {
                    headers.push((name, header.value.unwrap_or_default()));
                }
                _ => {}
            }
        }
    }
    RawMessage {
        offset,
        key: message.key().unwrap_or_default(),
        value: message.payload(),
        uid,
        tag,
        timestamp: message.timestamp().to_millis(),
        headers,
    }
}
