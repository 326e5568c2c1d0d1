//! Turning a selector and a start position into partitions and offsets.

use super::{Selector, StartAt};
use crate::{BusError, EventBus, backend::check_partition, backend::validate_key, partition_for};

/// What a subscription reads: its topic, each partition with the offset to
/// start at, and the key filter of a key selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The topic.
    pub topic: String,
    /// Each partition read, with the offset delivery starts at.
    pub partitions: Vec<(u32, u64)>,
    /// Only records with this key are delivered (a key selector).
    pub key: Option<String>,
    /// A `StartAt::Time` start: records stored before this epoch-ms time
    /// are not delivered (the start offset of a time in the future is the
    /// head, and records published before that time may still follow).
    pub not_before: Option<u64>,
}

impl Plan {
    /// Resolves `selector` and `start` against `bus`: unknown topics and
    /// partitions are their own errors, an offset start needs a
    /// one-partition selector, and positions must name the selector's
    /// partitions once each.
    pub fn new<B: EventBus + ?Sized>(
        bus: &B,
        topic: &str,
        selector: &Selector,
        start: StartAt,
    ) -> Result<Self, BusError> {
        let count = bus.partitions(topic)?;
        let (partitions, key) = match selector {
            Selector::Partition(partition) => {
                check_partition(topic, *partition, count)?;
                (vec![*partition], None)
            }
            Selector::Key(key) => {
                validate_key(key)?;
                (vec![partition_for(key, count)], Some(key.clone()))
            }
            Selector::Topic => ((0..count).collect(), None),
        };
        if matches!(start, StartAt::Offset(_)) && partitions.len() != 1 {
            return Err(BusError::invalid(
                "start",
                "an offset names a position in one partition: use Selector::Partition or Selector::Key, StartAt::Positions, or start at Beginning, Now or a Time",
            ));
        }
        if let StartAt::Positions(positions) = &start {
            let mut seen = Vec::with_capacity(positions.len());
            for &(partition, _) in positions {
                if !partitions.contains(&partition) {
                    return Err(BusError::invalid(
                        "start",
                        format!(
                            "position for partition {partition} of topic {topic:?}, which the selector does not read (it reads {partitions:?})"
                        ),
                    ));
                }
                if seen.contains(&partition) {
                    return Err(BusError::invalid(
                        "start",
                        format!("partition {partition} has two positions; give one"),
                    ));
                }
                seen.push(partition);
            }
        }
        let not_before = match start {
            StartAt::Time(time) => Some(time),
            _ => None,
        };
        let partitions = partitions
            .into_iter()
            .map(|partition| {
                Ok((
                    partition,
                    resolve_start(bus, topic, partition, start.clone())?,
                ))
            })
            .collect::<Result<_, BusError>>()?;
        Ok(Self {
            topic: topic.to_owned(),
            partitions,
            key,
            not_before,
        })
    }
}

/// The offset `start` names in one partition.
///
/// `Time` is a binary search over the retained range by `stored_at` (a few
/// fetches of one record, not a scan).
pub fn resolve_start<B: EventBus + ?Sized>(
    bus: &B,
    topic: &str,
    partition: u32,
    start: StartAt,
) -> Result<u64, BusError> {
    match start {
        StartAt::Offset(offset) => within_head(bus, topic, partition, offset),
        StartAt::Positions(positions) => match positions.iter().find(|(p, _)| *p == partition) {
            Some(&(_, offset)) => within_head(bus, topic, partition, offset),
            None => Ok(bus.offsets(topic, partition)?.first),
        },
        StartAt::Beginning => Ok(bus.offsets(topic, partition)?.first),
        StartAt::Now => Ok(bus.offsets(topic, partition)?.next),
        StartAt::Time(time) => {
            let range = bus.offsets(topic, partition)?;
            let (mut low, mut high) = (range.first, range.next);
            while low < high {
                let mid = low + (high - low) / 2;
                match stored_at_from(bus, topic, partition, mid)? {
                    Some((offset, stored_at)) if stored_at < time => low = offset + 1,
                    Some(_) => high = mid,
                    None => high = mid,
                }
            }
            Ok(low)
        }
    }
}

/// `offset`, unless it is past the partition's head: the offset of a
/// record not yet published would make the subscription wait for the log
/// to get there and miss everything published before, silently.
fn within_head<B: EventBus + ?Sized>(
    bus: &B,
    topic: &str,
    partition: u32,
    offset: u64,
) -> Result<u64, BusError> {
    let next = bus.offsets(topic, partition)?.next;
    if offset > next {
        return Err(BusError::invalid(
            "start",
            format!(
                "offset {offset} is past the head of topic {topic:?} partition {partition}, whose next offset is {next}; start at or below {next}, or at StartAt::Now"
            ),
        ));
    }
    Ok(offset)
}

/// The offset and `stored_at` of the first readable record at or after
/// `offset`; a forged record (an integrity failure) is stepped over.
fn stored_at_from<B: EventBus + ?Sized>(
    bus: &B,
    topic: &str,
    partition: u32,
    mut offset: u64,
) -> Result<Option<(u64, u64)>, BusError> {
    loop {
        match bus.fetch(topic, partition, offset, 1) {
            Ok(events) => return Ok(events.first().map(|e| (e.offset, e.stored_at))),
            Err(BusError::Integrity { offset: bad, .. }) if bad >= offset => offset = bad + 1,
            Err(error) => return Err(error),
        }
    }
}
