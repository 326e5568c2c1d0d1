//! Where a record went when librdkafka reports it stored without an offset
//! (contracts C3, C4, C8).
//!
//! The idempotent producer acknowledges a record with no offset in two
//! cases, both after a produce request timed out or its connection dropped
//! and librdkafka retried it: the broker answers the retry
//! `DUPLICATE_SEQUENCE_NUMBER` (the first attempt was written), or a later
//! request of the same producer succeeds and acknowledges the earlier ones
//! implicitly. The record is stored, so failing the publish would invite the
//! caller to publish it a second time; the bus reads the partition's newest
//! records back instead (and, for a record not among them yet, those
//! appended after, until the deadline) and finds the record by what it
//! stored: key, value, UID, tag and headers, appended no earlier than the
//! publish began (less a clock slack, the broker stamps `LogAppendTime`).
//! A page that comes back short is read on, never taken whole (CI once saw
//! a record of C9's sixty-four threads reported stored and not found in
//! the one page read). Records of one call are
//! matched in produce order, between the offsets the call's other records
//! on the partition were reported at (the idempotent producer keeps a
//! partition's records in order), above the highest offset any delivery
//! report of this bus had named on the partition before the call queued its
//! records (those records were stored first), and never at an offset a
//! recent delivery report or read-back of this bus named: identical records
//! published at once, or one a minute apart, get their own offsets. What
//! this cannot tell apart is an identical record another process stored in
//! the same minute whose offset this bus never saw.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bus_core::BusError;

use crate::Core;
use crate::publish::Prepared;
use crate::reader::RawMessage;
use bus_core::backend::sync::lock;

/// How much earlier than the publish began the broker's clock may stamp a
/// record (bus and broker hosts' clocks differ).
const CLOCK_SLACK_MS: i64 = 60_000;
/// Records read per step, newest page first.
const PAGE: u64 = 2_000;
/// The most records read back for one call: a record acknowledged moments
/// ago is among the newest, unless a flood of other records followed it.
const SCAN_LIMIT: u64 = 1_000_000;

/// Offsets remembered per partition as recently reported or read back.
const RECENT: usize = 1_024;

/// What this bus's delivery reports (and read-backs) named, per Kafka topic
/// and partition: the highest offset, and the most recent ones.
#[derive(Default)]
pub(crate) struct Reported {
    partitions: Mutex<HashMap<(String, u32), Seen>>,
    /// One read-back chooses its offsets at a time (choose, then note).
    choosing: Mutex<()>,
}

#[derive(Default)]
struct Seen {
    max: u64,
    recent: VecDeque<u64>,
}

impl Reported {
    /// Notes that `offset` of `topic`/`partition` was handed to a caller.
    pub(crate) fn note(&self, topic: &str, partition: u32, offset: u64) {
        let mut partitions = lock(&self.partitions);
        let seen = partitions.entry((topic.to_owned(), partition)).or_default();
        seen.max = seen.max.max(offset);
        if seen.recent.len() == RECENT {
            seen.recent.pop_front();
        }
        seen.recent.push_back(offset);
    }

    /// The highest offset reported on `topic`/`partition` so far.
    pub(crate) fn floor(&self, topic: &str, partition: u32) -> Option<u64> {
        lock(&self.partitions)
            .get(&(topic.to_owned(), partition))
            .map(|seen| seen.max)
    }

    fn recently(&self, topic: &str, partition: u32, offset: u64) -> bool {
        lock(&self.partitions)
            .get(&(topic.to_owned(), partition))
            .is_some_and(|seen| seen.recent.contains(&offset))
    }
}

/// The highest offset reported on each partition of `records` before they
/// are queued: each of them will be stored above it.
pub(crate) fn floors(core: &Core, kafka_topic: &str, records: &[Prepared]) -> HashMap<u32, u64> {
    let mut out = HashMap::new();
    for record in records {
        if let Some(floor) = core.reported.floor(kafka_topic, record.partition) {
            out.insert(record.partition, floor);
        }
    }
    out
}

/// One outcome of a delivery: the offset, `None` when the record is stored
/// but its report had no offset, or the error.
pub(crate) type Delivered = Result<Option<u64>, BusError>;

/// When a call began: the wall clock, and the [`floors`] of its partitions.
pub(crate) struct Start {
    pub since_ms: i64,
    pub floors: HashMap<u32, u64>,
}

impl Start {
    pub(crate) fn now(core: &Core, kafka_topic: &str, records: &[Prepared]) -> Self {
        Self {
            since_ms: i64::try_from(bus_core::now_ms()).unwrap_or(i64::MAX),
            floors: floors(core, kafka_topic, records),
        }
    }
}

/// Turns `outcomes` (one per record of `records`, produced to `kafka_topic`
/// after `start`) into offsets, finding those the delivery reports left
/// out; a record not found by `deadline` is a `Timeout` (it is stored: a
/// retry with its UID gets it back).
pub(crate) fn resolve(
    core: &Core,
    kafka_topic: &str,
    records: &[Prepared],
    outcomes: Vec<Delivered>,
    start: &Start,
    deadline: Instant,
) -> Vec<Result<u64, BusError>> {
    let mut unknown: HashMap<u32, Vec<usize>> = HashMap::new();
    for (index, outcome) in outcomes.iter().enumerate() {
        if matches!(outcome, Ok(None)) {
            unknown
                .entry(records[index].partition)
                .or_default()
                .push(index);
        }
    }
    let known = |index: usize| match outcomes[index] {
        Ok(Some(offset)) => Some((records[index].partition, offset)),
        _ => None,
    };
    let mut found: HashMap<usize, Result<u64, BusError>> = HashMap::new();
    for (partition, indices) in unknown {
        let wanted: Vec<Wanted<'_>> = indices
            .iter()
            .map(|&i| Wanted {
                record: &records[i],
                above: (0..i)
                    .filter_map(known)
                    .filter(|(p, _)| *p == partition)
                    .map(|(_, offset)| offset)
                    .chain(start.floors.get(&partition).copied())
                    .max(),
                below: (i + 1..outcomes.len())
                    .filter_map(known)
                    .filter(|(p, _)| *p == partition)
                    .map(|(_, offset)| offset)
                    .min(),
            })
            .collect();
        let offsets = locate(
            core,
            kafka_topic,
            partition,
            &wanted,
            start.since_ms,
            deadline,
        );
        for (position, &index) in indices.iter().enumerate() {
            let offset = match &offsets {
                Ok(offsets) => offsets[position].ok_or_else(|| not_found(core, None)),
                Err(error) => Err(not_found(core, Some(error))),
            };
            found.insert(index, offset);
        }
    }
    outcomes
        .into_iter()
        .enumerate()
        .map(|(index, outcome)| match outcome {
            Ok(Some(offset)) => Ok(offset),
            Ok(None) => found
                .remove(&index)
                .unwrap_or_else(|| Err(not_found(core, None))),
            Err(error) => Err(error),
        })
        .collect()
}

/// The error of a stored record whose offset could not be found (a
/// `Timeout`: the outcome is known only to a retry with the record's UID),
/// with the error that stopped the read-back, if one did.
fn not_found(core: &Core, cause: Option<&BusError>) -> BusError {
    let what = match cause {
        None => "publish (the broker stored the record without reporting its offset, and it was not found reading back)".to_owned(),
        Some(cause) => format!("publish (the broker stored the record without reporting its offset, and reading back failed: {cause})"),
    };
    crate::errors::timed_out(&core.options, &what)
}

/// A record to find, strictly between the offsets its call's neighbours
/// on the partition were reported at.
struct Wanted<'a> {
    record: &'a Prepared,
    above: Option<u64>,
    below: Option<u64>,
}

/// The offsets of `records` (all on `partition`, in produce order), `None`
/// for one not found by `deadline`. The partition's newest records are
/// read first; a record still missing then is looked for among the
/// records appended after that read until `deadline` (its report said it
/// is stored, so it shows up once the broker makes it visible).
fn locate(
    core: &Core,
    kafka_topic: &str,
    partition: u32,
    records: &[Wanted<'_>],
    since_ms: i64,
    deadline: Instant,
) -> Result<Vec<Option<u64>>, BusError> {
    let kafka_partition = i32::try_from(partition).unwrap_or(i32::MAX);
    let (low, high) =
        core.pool
            .watermarks(&core.options, kafka_topic, kafka_partition, deadline)?;
    let oldest = since_ms.saturating_sub(CLOCK_SLACK_MS);
    let classify = |message: RawMessage<'_>| {
        let fresh = message.timestamp.is_none_or(|t| t >= oldest);
        let matching: Vec<usize> = records
            .iter()
            .enumerate()
            .filter(|(_, wanted)| fresh && same(wanted.record, &message))
            .map(|(i, _)| i)
            .collect();
        (message.offset, fresh, matching)
    };
    let read = |from: u64, to: u64| {
        read_range(
            core,
            kafka_topic,
            kafka_partition,
            from,
            to,
            deadline,
            &classify,
        )
    };
    // Nothing at or below every record's lower bound can be one of them.
    let bottom = records
        .iter()
        .map(|wanted| wanted.above.map_or(low, |above| above + 1))
        .min()
        .unwrap_or(low)
        .max(low);
    // Matching records newest page first, until a page is all older than
    // the publish or below every bound.
    let mut candidates: Vec<(u64, Vec<usize>)> = Vec::new();
    let mut end = high;
    while end > bottom && high - end < SCAN_LIMIT {
        let start = bottom.max(end.saturating_sub(PAGE));
        let page = read(start, end)?;
        let any_fresh = page.iter().any(|(_, fresh, _)| *fresh);
        candidates.extend(matches(page));
        if !any_fresh {
            break;
        }
        end = start;
    }
    let mut out = vec![None; records.len()];
    choose(core, kafka_topic, partition, records, candidates, &mut out);
    #[cfg(test)]
    after_scan::run();
    // Still missing: watch the records appended since.
    let mut seen = high;
    while out.iter().any(Option::is_none) && Instant::now() + HEAD_POLL < deadline {
        std::thread::park_timeout(HEAD_POLL);
        // An error here leaves the records found so far standing.
        let Ok((_, now)) =
            core.pool
                .watermarks(&core.options, kafka_topic, kafka_partition, deadline)
        else {
            break;
        };
        if now > seen {
            let Ok(page) = read(seen, now) else {
                break;
            };
            choose(
                core,
                kafka_topic,
                partition,
                records,
                matches(page).collect(),
                &mut out,
            );
            seen = now;
        }
    }
    Ok(out)
}

/// A record read back: its offset, whether it is recent enough to be one
/// looked for, and the slots of the records it matches.
type Classified = (u64, bool, Vec<usize>);

/// How often the read-back asks for records appended since it last read.
const HEAD_POLL: Duration = Duration::from_millis(20);

/// The offsets of a page that match some record, with the records' slots.
fn matches(page: Vec<Classified>) -> impl Iterator<Item = (u64, Vec<usize>)> {
    page.into_iter()
        .filter(|(_, _, matching)| !matching.is_empty())
        .map(|(offset, _, matching)| (offset, matching))
}

/// Every record of `from..to` (which exist: the range lies between the log
/// start and the high watermark), read until the last one; a read that
/// stops short (the deadline came) is an error, never a page taken whole.
fn read_range(
    core: &Core,
    kafka_topic: &str,
    partition: i32,
    from: u64,
    to: u64,
    deadline: Instant,
    each: &impl Fn(RawMessage<'_>) -> Classified,
) -> Result<Vec<Classified>, BusError> {
    let mut out = Vec::new();
    let mut next = from;
    while next < to {
        let count = usize::try_from(to - next).unwrap_or(usize::MAX);
        let page = core.pool.read(
            &core.options,
            kafka_topic,
            partition,
            next,
            count,
            deadline,
            each,
        )?;
        let Some(&(last, _, _)) = page.last() else {
            // A new leader's high watermark may lag the one read a moment
            // ago: the records are there, ask again.
            if Instant::now() + HEAD_POLL < deadline {
                std::thread::park_timeout(HEAD_POLL);
                continue;
            }
            return Err(crate::errors::timed_out(
                &core.options,
                &format!("reading records back (stopped at offset {next} of {to})"),
            ));
        };
        out.extend(page.into_iter().filter(|(offset, _, _)| *offset < to));
        next = last + 1;
    }
    Ok(out)
}

/// Fills the open slots of `out` from `candidates` (offsets matching some
/// of `records`), in produce order: a record's offset lies above the
/// offsets found for the call's earlier records and its lower bound, below
/// those found for its later records and its upper bound, and is no offset
/// a recent report or read-back of this bus named. Each offset chosen is
/// noted as reported.
fn choose(
    core: &Core,
    kafka_topic: &str,
    partition: u32,
    records: &[Wanted<'_>],
    mut candidates: Vec<(u64, Vec<usize>)>,
    out: &mut [Option<u64>],
) {
    candidates.sort_unstable_by_key(|(offset, _)| *offset);
    let _one_at_a_time = lock(&core.reported.choosing);
    // Offsets a recent report or read-back named belong to other records.
    candidates.retain(|(offset, _)| !core.reported.recently(kafka_topic, partition, *offset));
    for slot in 0..out.len() {
        if out[slot].is_some() {
            continue;
        }
        let wanted = &records[slot];
        let above = out[..slot]
            .iter()
            .flatten()
            .copied()
            .max()
            .max(wanted.above);
        let below = out[slot + 1..]
            .iter()
            .flatten()
            .copied()
            .chain(wanted.below)
            .min();
        let hit = candidates.iter().find(|(offset, matching)| {
            above.is_none_or(|above| *offset > above)
                && below.is_none_or(|below| *offset < below)
                && matching.contains(&slot)
        });
        if let Some(&(offset, _)) = hit {
            core.reported.note(kafka_topic, partition, offset);
            out[slot] = Some(offset);
        }
    }
}

/// Whether `message` holds what `record` stored.
fn same(record: &Prepared, message: &RawMessage<'_>) -> bool {
    message.key == record.key.as_bytes()
        && message.value.unwrap_or_default() == record.value.as_slice()
        && message.uid == record.uid.as_deref()
        && message.tag == record.tag.as_deref().map(str::as_bytes)
        && message.headers.len() == record.headers.len()
        && message.headers.iter().zip(record.headers.iter()).all(
            |((name, value), (want_name, want_value))| {
                *name == want_name && *value == want_value.as_bytes()
            },
        )
}

/// A step a test runs right after the read-back's first scan (to append a
/// record the scan cannot have seen).
#[cfg(test)]
pub(crate) mod after_scan {
    use std::cell::RefCell;

    thread_local! {
        static STEP: RefCell<Option<Box<dyn FnOnce()>>> = RefCell::new(None);
    }

    /// Runs `step` after the next first scan on this thread.
    pub(crate) fn set(step: impl FnOnce() + 'static) {
        STEP.with(|slot| *slot.borrow_mut() = Some(Box::new(step)));
    }

    pub(super) fn run() {
        if let Some(step) = STEP.with(|slot| slot.borrow_mut().take()) {
            step();
        }
    }
}
