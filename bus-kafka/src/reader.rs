//! Positioned reads of one partition (contract C5): a pool of consumers,
//! each assigned to one partition once and moved by `seek` from read to
//! read (a sequential replay goes on where the last read stopped). Reads
//! stop at the high watermark, so a fetch at the end returns at once
//! instead of long-polling.

use bus_core::backend::sync::lock;
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
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

/// How many idle positioned consumers a bus keeps, over all partitions.
const POOL_SIZE: usize = 8;
/// How many consumers of one partition may serve reads at once; more
/// concurrent readers of it wait for one to come back.
const PER_PARTITION: usize = 4;
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

/// A consumer of one partition, assigned once and moved by `seek`.
struct Slot {
    consumer: Reader,
    /// The consumer has the partition assigned.
    assigned: bool,
    /// The offset the consumer will deliver next, when known.
    next: Option<u64>,
    /// The highest high watermark seen: offsets below it hold records
    /// (or lie below the log start), so a read there needs no query.
    high: u64,
    /// Fetching is paused (the consumer is at the high watermark).
    paused: bool,
    /// The next positioned read assigns again even at `next`: resumed,
    /// librdkafka may take most of a second to send its next Fetch, while
    /// an assignment fetches at once.
    reassign: bool,
    last_used: u64,
}

/// The consumers of one partition: those idle, and how many serve reads.
struct Lane {
    idle: Vec<Slot>,
    out: usize,
    /// The highest high watermark any of them saw.
    high: u64,
    /// Tells a consumer coming back to a lane that was forgotten (its
    /// topic deleted) and made again from a new one.
    generation: u64,
}

/// The consumers of a bus, per recently read partition a few (a read takes
/// one, seeks it, and gives it back; one that failed is dropped, never
/// reused), plus one with no assignment for watermark and timestamp
/// queries: an assigned consumer idling at the end keeps a long-polling
/// Fetch in flight, and the broker answers requests on one connection in
/// order, so a query sent through it would wait out `fetch.wait.max.ms`.
pub(crate) struct Pool {
    state: Mutex<PoolState>,
    /// Signalled when a consumer comes back.
    returned: Condvar,
    /// Replaced when its queries keep failing (see [`Pool::watermarks`]).
    meta: Mutex<Arc<Reader>>,
}

#[derive(Default)]
struct PoolState {
    lanes: HashMap<(String, i32), Lane>,
    clock: u64,
    generations: u64,
}

/// A consumer taken from a lane: given back when dropped, kept only when
/// its read succeeded.
struct Lease<'p> {
    pool: &'p Pool,
    key: (String, i32),
    generation: u64,
    slot: Option<Slot>,
    keep: bool,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let slot = self.slot.take();
        let kept = if self.keep { slot } else { None };
        self.pool.give_back(&self.key, self.generation, kept);
    }
}

impl Pool {
    /// A pool with its query consumer.
    pub(crate) fn new(options: &KafkaOptions) -> Result<Self, BusError> {
        Ok(Self {
            state: Mutex::default(),
            returned: Condvar::new(),
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

    /// A consumer of `topic`/`partition` for a read from `from`: an idle
    /// one (the one positioned at `from` if any), else a new one, else,
    /// when [`PER_PARTITION`] are out, the first to come back before
    /// `deadline`.
    fn take(
        &self,
        options: &KafkaOptions,
        topic: &str,
        partition: i32,
        from: u64,
        deadline: Instant,
    ) -> Result<Lease<'_>, BusError> {
        let key = (topic.to_owned(), partition);
        let mut state = lock(&self.state);
        let (idle, generation, high) = loop {
            let PoolState {
                lanes, generations, ..
            } = &mut *state;
            let lane = lanes.entry(key.clone()).or_insert_with(|| {
                *generations += 1;
                Lane {
                    idle: Vec::new(),
                    out: 0,
                    high: 0,
                    generation: *generations,
                }
            });
            if !lane.idle.is_empty() || lane.out < PER_PARTITION {
                let at = lane.idle.iter().position(|slot| slot.next == Some(from));
                let idle = at
                    .or(lane.idle.len().checked_sub(1))
                    .map(|at| lane.idle.swap_remove(at));
                lane.out += 1;
                break (idle, lane.generation, lane.high);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(crate::errors::timed_out(
                    options,
                    "fetch (every reader busy)",
                ));
            }
            state = self
                .returned
                .wait_timeout(state, left)
                .map_or_else(|poisoned| poisoned.into_inner().0, |(state, _)| state);
        };
        drop(state);
        let mut lease = Lease {
            pool: self,
            key,
            generation,
            slot: None,
            keep: false,
        };
        let mut slot = match idle {
            Some(slot) => slot,
            // Made outside the lock; a failure gives the place back.
            None => Slot {
                consumer: client::reader(options)?,
                assigned: false,
                next: None,
                high: 0,
                paused: false,
                reassign: false,
                last_used: 0,
            },
        };
        slot.high = slot.high.max(high);
        lease.slot = Some(slot);
        Ok(lease)
    }

    /// Returns a lane's place, and `slot` to its idle consumers; drops the
    /// least recently used beyond [`POOL_SIZE`] (outside the lock: closing
    /// a consumer talks to the broker).
    fn give_back(&self, key: &(String, i32), generation: u64, slot: Option<Slot>) {
        let mut dropped = Vec::new();
        {
            let mut state = lock(&self.state);
            state.clock += 1;
            let clock = state.clock;
            match state.lanes.get_mut(key) {
                Some(lane) if lane.generation == generation => {
                    lane.out = lane.out.saturating_sub(1);
                    if let Some(mut slot) = slot {
                        lane.high = lane.high.max(slot.high);
                        slot.last_used = clock;
                        lane.idle.push(slot);
                    }
                }
                _ => dropped.extend(slot),
            }
            let mut idle: usize = state.lanes.values().map(|lane| lane.idle.len()).sum();
            while idle > POOL_SIZE {
                let oldest = state
                    .lanes
                    .iter()
                    .flat_map(|(key, lane)| {
                        lane.idle
                            .iter()
                            .enumerate()
                            .map(move |(at, slot)| (slot.last_used, key, at))
                    })
                    .min_by_key(|&(used, _, _)| used)
                    .map(|(_, key, at)| (key.clone(), at));
                let Some((oldest, at)) = oldest else {
                    break;
                };
                if let Some(lane) = state.lanes.get_mut(&oldest) {
                    dropped.push(lane.idle.swap_remove(at));
                }
                idle -= 1;
            }
            state
                .lanes
                .retain(|_, lane| !lane.idle.is_empty() || lane.out > 0);
        }
        self.returned.notify_all();
        drop(dropped);
    }

    /// Drops the consumers of `topic` (after it is deleted); those serving
    /// a read are dropped when it ends.
    pub(crate) fn forget(&self, topic: &str) {
        let dropped: Vec<Lane> = {
            let mut state = lock(&self.state);
            let names: Vec<(String, i32)> = state
                .lanes
                .keys()
                .filter(|(name, _)| name == topic)
                .cloned()
                .collect();
            names
                .iter()
                .filter_map(|key| state.lanes.remove(key))
                .collect()
        };
        self.returned.notify_all();
        drop(dropped);
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
        let mut lease = self.take(options, topic, partition, from, deadline)?;
        let Some(slot) = lease.slot.as_mut() else {
            return Err(BusError::backend(
                "kafka",
                "a reader lease without a reader",
            ));
        };
        if slot.paused {
            slot.paused = false;
            pause(options, &slot.consumer, topic, partition, false)?;
            slot.reassign = true;
        }
        let read = self.read_slot(options, slot, topic, partition, from, max, deadline, each);
        if read.is_err() {
            return read;
        }
        // Caught up: stop fetching until the next read, so an idle
        // consumer sends no Fetch requests.
        if slot.next.is_some_and(|next| next >= slot.high) {
            if pause(options, &slot.consumer, topic, partition, true).is_err() {
                return read;
            }
            slot.paused = true;
        }
        lease.keep = true;
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
        let sequential = slot.next == Some(from) && from < slot.high && !slot.reassign;
        let mut next = from;
        if !sequential {
            // Below a high watermark seen there are records (or the log
            // start is past `from`, and the consumer's offset reset to the
            // earliest delivers from there): no query. At or past it the
            // broker is asked, so a read at the end returns at once.
            if from >= slot.high {
                let (low, high) = self.watermarks(options, topic, partition, deadline)?;
                slot.high = high;
                next = from.max(low);
                if next >= high {
                    return Ok(Vec::new());
                }
            }
            if !slot.assigned || slot.reassign {
                assign(options, &slot.consumer, topic, partition, next)?;
                slot.assigned = true;
                slot.reassign = false;
            } else if slot.next != Some(next) {
                seek(options, &slot.consumer, topic, partition, next, deadline)?;
            }
            slot.next = Some(next);
        }
        let mut out = Vec::with_capacity(max.min(4_096));
        let mut last_error = None;
        let mut quiet_since = Instant::now();
        while out.len() < max && next < slot.high {
            if Instant::now() >= deadline {
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
                        // Records may have expired under the consumer, or
                        // the log been cut below a watermark seen before.
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

/// Moves the assigned `consumer` to `offset`: librdkafka drops what it
/// fetched ahead and fetches from there, without a new assignment.
fn seek(
    options: &KafkaOptions,
    consumer: &Reader,
    topic: &str,
    partition: i32,
    offset: u64,
    deadline: Instant,
) -> Result<(), BusError> {
    let offset = Offset::Offset(i64::try_from(offset).unwrap_or(i64::MAX));
    consumer
        .seek(topic, partition, offset, remaining(deadline).min(STALL * 4))
        .map_err(|error| map_error(options, "seeking a partition", error))
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
