//! Turning a selector and a start position into partitions and offsets.

use super::{Selector, StartAt};
use crate::{BusError, EventBus, check_partition, partition_for, validate_key};

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
}

impl Plan {
    /// Resolves `selector` and `start` against `bus`: unknown topics and
    /// partitions are their own errors, and an offset start needs a
    /// one-partition selector.
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
                "an offset names a position in one partition: use Selector::Partition or Selector::Key, or start at Beginning, Now or a Time",
            ));
        }
        let partitions = partitions
            .into_iter()
            .map(|partition| Ok((partition, resolve_start(bus, topic, partition, start)?)))
            .collect::<Result<_, BusError>>()?;
        Ok(Self {
            topic: topic.to_owned(),
            partitions,
            key,
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
        StartAt::Offset(offset) => Ok(offset),
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
