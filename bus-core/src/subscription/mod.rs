//! Live subscriptions (contract C17–C19): history, then the live tail, read
//! by offset from the durable log, so the seam between the two has no gap and
//! no duplicate.
//!
//! A backend supplies two things: a [`Feed`] that reads a partition from an
//! offset without waiting, and a [`Doorbell`] it rings whenever a record of
//! the subscription's topic becomes visible. The [`Subscription`] handle does
//! the rest on the caller's thread: start positions, the key filter, the
//! `max_lag` bound, lag from retention, integrity errors that name their
//! offset, and outages reported as error items.

mod doorbell;
mod handle;
#[cfg(feature = "otel")]
mod otel;
mod plan;
mod stream;

pub use doorbell::{Doorbell, DoorbellRegistry, SubscriptionOwner};
pub use handle::{Feed, Subscription};
pub use plan::{Plan, resolve_start};
pub use stream::SubscriptionStream;

use crate::{BusError, Headers, StoredEvent};

/// Which records of a topic a subscription delivers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// Every record of one partition.
    Partition(u32),
    /// Only the records with this key, read from the key's partition
    /// (`partition_for(key, n)`).
    Key(String),
    /// Every partition of the topic, each in offset order.
    Topic,
}

/// Where a subscription starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartAt {
    /// The oldest retained record of each partition.
    Beginning,
    /// This offset (one-partition and key selectors only). An offset past
    /// the partition's head is [`BusError::InvalidArgument`] naming the
    /// head: the log never silently skips what is published later.
    Offset(u64),
    /// The head of each partition when `subscribe` returns: every record
    /// acked after that is delivered, none acked before.
    Now,
    /// The first record with `stored_at >=` this epoch-millisecond time;
    /// a time in the future delivers only records stored at or after it.
    Time(u64),
    /// Per partition, the offset to go on at: what
    /// [`Subscription::positions`] returned, to resume a checkpoint with no
    /// gap and no duplicate. A partition of the selector that the list
    /// omits starts at its oldest retained record (nothing is skipped); a
    /// partition outside the selector, a partition named twice or an offset
    /// past a partition's head is [`BusError::InvalidArgument`].
    Positions(Vec<(u32, u64)>),
}

/// Options of a subscription.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SubscribeOptions {
    /// When more than this many records behind a partition's head, jump
    /// forward to keep only the newest `max_lag` and report
    /// [`SubscriptionItem::Lagged`] first. `None`: read everything retained.
    /// At least 1 (`subscribe` refuses 0 as an invalid argument).
    pub max_lag: Option<u64>,
}

impl SubscribeOptions {
    /// Sets `max_lag` (checked by `subscribe`: 0 is refused).
    #[must_use]
    pub fn max_lag(mut self, max_lag: u64) -> Self {
        self.max_lag = Some(max_lag);
        self
    }

    /// Refuses what no subscription can honour: `max_lag(0)` would skip
    /// every record.
    pub fn validate(&self) -> Result<(), BusError> {
        if self.max_lag == Some(0) {
            return Err(BusError::invalid(
                "max_lag",
                "must be at least 1 (0 would skip every record); leave it unset to read everything retained",
            ));
        }
        Ok(())
    }
}

/// One item of a subscription.
#[derive(Debug, Clone, PartialEq)]
pub enum SubscriptionItem {
    /// A stored record.
    Record {
        /// The record's topic.
        topic: String,
        /// The record.
        event: StoredEvent,
        /// Its headers (C25); empty for a record published without any.
        headers: Headers,
    },
    /// Records of `partition` were skipped: `skipped` of them, by the
    /// `max_lag` bound or because retention expired them before they were
    /// read. Delivery goes on at `next_offset`. A key subscription's
    /// `max_lag` skip counts only that key's records (the other keys were
    /// never going to be delivered), plus any records of the partition that
    /// retention expired before they were read.
    Lagged {
        /// The partition concerned.
        partition: u32,
        /// How many records were skipped.
        skipped: u64,
        /// The offset delivery continues at.
        next_offset: u64,
    },
}

impl SubscriptionItem {
    /// The record, when this item is one.
    pub fn event(&self) -> Option<&StoredEvent> {
        match self {
            Self::Record { event, .. } => Some(event),
            Self::Lagged { .. } => None,
        }
    }

    /// The record's headers, when this item is one (C25).
    pub fn headers(&self) -> Option<&Headers> {
        match self {
            Self::Record { headers, .. } => Some(headers),
            Self::Lagged { .. } => None,
        }
    }
}
