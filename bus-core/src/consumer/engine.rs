//! The consumer engine shared by every backend: deliveries in flight,
//! redelivery after `ack_wait`, delivery counts, acknowledgement batching
//! and dead-lettering, over an ordinary subscription and a backend's
//! [`CursorStore`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::acked::Acked;

mod external;
use super::store::fenced_error;
use super::{ConsumeOptions, CursorState, CursorStore, OwnerToken, PartitionState, StoredSelector};
use crate::subscription::{Subscription, SubscriptionItem};
use crate::{
    BusError, EventBus, Headers, StoredEvent, StoredRecord, backend::fnv1a64, embedded_uid,
};
pub use external::ExternalAck;

/// One record handed to a durable consumer. Acknowledge it with
/// [`Consumer::ack`] (or cumulatively, [`Consumer::ack_through`]), or
/// reject it with [`Consumer::nack`].
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    /// The topic it came from.
    pub topic: String,
    /// Its partition.
    pub partition: u32,
    /// Its offset.
    pub offset: u64,
    /// How often it was delivered to this consumer, this time included
    /// (counted across restarts as of the last durable cursor write).
    pub delivery_count: u32,
    /// The record.
    pub event: StoredEvent,
    /// Its headers (C25); empty for a record published without any.
    pub headers: Headers,
    consumer: String,
    instance: u64,
}

impl Delivery {
    /// The consumer it was delivered to.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }
}

/// When a delivery made now is due again: `ack_wait` from now, or as far
/// as the clock goes for an `ack_wait` too large to add (no panic on
/// overflow).
fn due_after(ack_wait: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(ack_wait)
        .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 24 * 3600)))
        .unwrap_or(now)
}

#[derive(Debug)]
struct Flight {
    record: StoredRecord,
    count: u32,
    due: Instant,
}

#[derive(Debug)]
struct Part {
    acked: Acked,
    /// Every offset below it was handed out, filtered out by the selector,
    /// expired or reported as an error item.
    seen: u64,
    flights: BTreeMap<u64, Flight>,
    /// Deliveries before a restart of records not delivered again yet.
    earlier: HashMap<u64, u32>,
}

impl Part {
    fn new(state: &PartitionState) -> Self {
        Self {
            acked: Acked::new(state.next, &state.acked),
            seen: state.next,
            flights: BTreeMap::new(),
            earlier: state.deliveries.iter().copied().collect(),
        }
    }
}

/// A durable consumer (C20–C23): a subscription whose position is the
/// cursor the backend stores under (topic, name), with acknowledgement,
/// redelivery, dead-lettering and fencing. Reads happen on the caller's
/// thread inside `recv*`, as with a [`Subscription`]; there is no thread
/// of its own. Dropping it writes pending acknowledgements (best effort;
/// call [`Consumer::flush`] to learn the outcome) and gives up ownership.
pub struct Consumer {
    topic: String,
    name: String,
    sub: Subscription,
    store: Arc<dyn CursorStore>,
    token: Option<OwnerToken>,
    publisher: Arc<dyn EventBus>,
    options: ConsumeOptions,
    selector: StoredSelector,
    parts: BTreeMap<u32, Part>,
    /// Every flight by when it is due again, so finding the next one does
    /// not walk every delivery in flight.
    dues: BTreeSet<(Instant, u32, u64)>,
    pending: u32,
    oldest_pending: Option<Instant>,
    dirty: bool,
    fenced: Option<String>,
    /// The `process` span of the delivery handed out last (feature `otel`).
    #[cfg(feature = "otel")]
    pub(super) deliveries: Option<crate::otel::Deliveries>,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("topic", &self.topic)
            .field("name", &self.name)
            .field("parts", &self.parts)
            .field("fenced", &self.fenced)
            .finish_non_exhaustive()
    }
}

/// What the engine is built from (see `admin::open_consumer`).
pub(crate) struct Parts {
    pub topic: String,
    pub name: String,
    pub sub: Subscription,
    pub store: Arc<dyn CursorStore>,
    pub token: OwnerToken,
    pub publisher: Arc<dyn EventBus>,
    pub options: ConsumeOptions,
    pub state: CursorState,
}

impl Consumer {
    /// Builds the engine over a started subscription; when the stored
    /// state has no partitions (a new consumer) the subscription's start
    /// positions become the cursor, written before this returns, so a
    /// restart does not move a `Now` start (C20).
    pub(crate) fn start(parts: Parts) -> Result<Self, BusError> {
        let Parts {
            topic,
            name,
            sub,
            store,
            token,
            publisher,
            options,
            state,
        } = parts;
        let is_new = state.partitions.is_empty();
        let partitions: BTreeMap<u32, PartitionState> = if is_new {
            sub.positions()
                .into_iter()
                .map(|(partition, next)| {
                    (
                        partition,
                        PartitionState {
                            next,
                            ..PartitionState::default()
                        },
                    )
                })
                .collect()
        } else {
            state.partitions
        };
        let mut consumer = Self {
            topic,
            name,
            sub,
            store,
            token: Some(token),
            publisher,
            options,
            selector: state.selector,
            parts: partitions.iter().map(|(&p, s)| (p, Part::new(s))).collect(),
            dues: BTreeSet::new(),
            pending: 0,
            oldest_pending: None,
            dirty: is_new,
            fenced: None,
            #[cfg(feature = "otel")]
            deliveries: None,
        };
        consumer.flush()?;
        Ok(consumer)
    }

    /// The consumed topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The consumer's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Per partition, the first offset not acknowledged (in this instance,
    /// durable or not yet).
    pub fn cursor(&self) -> Vec<(u32, u64)> {
        self.parts
            .iter()
            .map(|(&p, part)| (p, part.acked.next()))
            .collect()
    }

    /// Whether the bus behind it is gone (nothing more will be delivered).
    pub fn is_closed(&self) -> bool {
        self.sub.is_closed()
    }

    /// The next delivery, waiting up to `timeout`; `Ok(None)` when none
    /// came. A delivery due again after `ack_wait` comes before new records.
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Option<Delivery>, BusError> {
        self.next_until(Instant::now().checked_add(timeout))
    }

    /// The next delivery if one can be had without waiting.
    pub fn try_recv(&mut self) -> Result<Option<Delivery>, BusError> {
        self.next_until(Some(Instant::now()))
    }

    /// The next delivery, waiting as long as it takes; `Ok(None)` once the
    /// bus is closed.
    pub fn recv(&mut self) -> Result<Option<Delivery>, BusError> {
        self.next_until(None)
    }

    fn next_until(&mut self, deadline: Option<Instant>) -> Result<Option<Delivery>, BusError> {
        #[cfg(feature = "otel")]
        if self.deliveries.is_some() {
            return self.next_traced(deadline);
        }
        self.next_delivery(deadline)
    }

    pub(super) fn next_delivery(
        &mut self,
        deadline: Option<Instant>,
    ) -> Result<Option<Delivery>, BusError> {
        self.check_fenced()?;
        loop {
            self.flush_if_due()?;
            let now = Instant::now();
            if let Some((partition, offset)) = self.due_flight(now) {
                match self.redeliver(partition, offset)? {
                    Some(delivery) => return Ok(Some(delivery)),
                    None => continue,
                }
            }
            // Wake for the first delivery due again, and for an interval
            // write of pending acks, whichever comes first.
            let flush_at = self
                .options
                .ack_interval
                .zip(self.oldest_pending)
                .and_then(|(every, oldest)| oldest.checked_add(every));
            let wake = self
                .dues
                .first()
                .map(|&(due, _, _)| due)
                .into_iter()
                .chain(flush_at)
                .min();
            let until = match (deadline, wake) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let item = match until {
                Some(until) => self.sub.recv_timeout(until.saturating_duration_since(now)),
                None => match self.sub.recv() {
                    Some(item) => item.map(Some),
                    None => {
                        self.note_positions();
                        return Ok(None);
                    }
                },
            };
            match item {
                Err(error) => {
                    // An error item (C19): the subscription goes on past it.
                    self.note_positions();
                    return Err(error);
                }
                Ok(Some(SubscriptionItem::Record { event, headers, .. })) => {
                    if let Some(delivery) = self.first_delivery(StoredRecord { event, headers })? {
                        return Ok(Some(delivery));
                    }
                }
                Ok(Some(SubscriptionItem::Lagged { .. })) => self.note_positions(),
                Ok(None) => {
                    self.note_positions();
                    if deadline.is_some_and(|at| Instant::now() >= at) {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// Offsets the subscription passed without handing them out (another
    /// key's records, records retention expired, error items) count as
    /// acknowledged: nothing will ever deliver them to this consumer.
    fn note_positions(&mut self) {
        for (partition, position) in self.sub.positions() {
            if let Some(part) = self.parts.get_mut(&partition)
                && position > part.seen
            {
                part.acked.insert(part.seen, position);
                part.seen = position;
                self.dirty = true;
            }
        }
    }

    fn due_flight(&self, now: Instant) -> Option<(u32, u64)> {
        self.dues
            .first()
            .filter(|(due, _, _)| *due <= now)
            .map(|&(_, p, o)| (p, o))
    }

    /// Moves the flight at (partition, offset) to be due at `due`.
    fn set_due(&mut self, partition: u32, offset: u64, due: Instant) {
        if let Some(flight) = self
            .parts
            .get_mut(&partition)
            .and_then(|part| part.flights.get_mut(&offset))
        {
            self.dues.remove(&(flight.due, partition, offset));
            flight.due = due;
            self.dues.insert((due, partition, offset));
        }
    }

    fn delivery(&self, record: &StoredRecord, count: u32) -> Delivery {
        let event = &record.event;
        Delivery {
            topic: self.topic.clone(),
            partition: event.partition,
            offset: event.offset,
            delivery_count: count,
            event: event.clone(),
            headers: record.headers.clone(),
            consumer: self.name.clone(),
            instance: self.token.as_ref().map_or(0, |token| token.id),
        }
    }

    fn first_delivery(&mut self, record: StoredRecord) -> Result<Option<Delivery>, BusError> {
        let (partition, offset) = (record.event.partition, record.event.offset);
        let Some(part) = self.parts.get_mut(&partition) else {
            return Ok(None);
        };
        if offset > part.seen {
            part.acked.insert(part.seen, offset);
        }
        part.seen = part.seen.max(offset.saturating_add(1));
        if part.acked.contains(offset) {
            // Acknowledged out of order before a restart (C21).
            return Ok(None);
        }
        let earlier = part.earlier.remove(&offset).unwrap_or(0);
        let due = due_after(self.options.ack_wait);
        part.flights.insert(
            offset,
            Flight {
                record: record.clone(),
                count: earlier,
                due,
            },
        );
        self.dues.insert((due, partition, offset));
        if self.options.max_deliver.is_some_and(|max| earlier >= max) {
            self.dead_letter(partition, offset, "max_deliver reached")?;
            return Ok(None);
        }
        let count = earlier.saturating_add(1);
        // The count goes out with the next cursor write (an ack, a flush,
        // the drop); a delivery alone writes nothing.
        self.dirty = true;
        if let Some(flight) = self
            .parts
            .get_mut(&partition)
            .and_then(|part| part.flights.get_mut(&offset))
        {
            flight.count = count;
        }
        Ok(Some(self.delivery(&record, count)))
    }

    fn redeliver(&mut self, partition: u32, offset: u64) -> Result<Option<Delivery>, BusError> {
        let max = self.options.max_deliver;
        // Due again later whatever happens, so a failing dead-letter write
        // is retried after ack_wait rather than in a tight loop.
        self.set_due(partition, offset, due_after(self.options.ack_wait));
        let Some(flight) = self
            .parts
            .get_mut(&partition)
            .and_then(|part| part.flights.get_mut(&offset))
        else {
            return Ok(None);
        };
        if max.is_some_and(|max| flight.count >= max) {
            self.dead_letter(partition, offset, "max_deliver reached")?;
            return Ok(None);
        }
        flight.count = flight.count.saturating_add(1);
        let (record, count) = (flight.record.clone(), flight.count);
        self.dirty = true;
        Ok(Some(self.delivery(&record, count)))
    }

    fn check_fenced(&self) -> Result<(), BusError> {
        match &self.fenced {
            Some(reason) => Err(fenced_error(&self.topic, &self.name, reason)),
            None => Ok(()),
        }
    }

    fn check_mine(&self, delivery: &Delivery) -> Result<(), BusError> {
        let instance = self.token.as_ref().map_or(0, |token| token.id);
        if delivery.topic != self.topic || delivery.consumer != self.name {
            return Err(BusError::invalid(
                "delivery",
                format!(
                    "belongs to consumer {:?} of topic {:?}, not to {:?} of {:?}",
                    delivery.consumer, delivery.topic, self.name, self.topic
                ),
            ));
        }
        if delivery.instance != instance {
            return Err(BusError::invalid(
                "delivery",
                "was handed out by another instance of this consumer (acknowledge through the instance that received it)",
            ));
        }
        Ok(())
    }

    /// Acknowledges one delivery (C21). With `ack_every(1)` (the default)
    /// it is durable when this returns. A second ack of the same delivery,
    /// or of one already covered by [`Consumer::ack_through`], is harmless:
    /// `Ok` and no change, except that when an earlier write of pending
    /// acks failed (the error was returned then), it is tried again here:
    /// retrying a failed ack is how to make it durable. A fenced instance
    /// gets [`BusError::Fenced`].
    pub fn ack(&mut self, delivery: &Delivery) -> Result<(), BusError> {
        self.check_fenced()?;
        self.check_mine(delivery)?;
        let (partition, offset) = (delivery.partition, delivery.offset);
        let Some(part) = self.parts.get(&partition) else {
            return Err(BusError::invalid("delivery", "partition not consumed"));
        };
        if part.acked.contains(offset) {
            // Harmless, but not a way around durability: when the write of
            // an earlier ack failed (the acks are still pending), this one
            // writes again, so `Ok` keeps meaning durable (C21).
            return self.after_ack();
        }
        if !part.flights.contains_key(&offset) {
            return Err(BusError::invalid(
                "delivery",
                format!("offset {offset} of partition {partition} was not delivered"),
            ));
        }
        self.mark_acked(partition, offset, offset.saturating_add(1));
        self.after_ack()
    }

    /// Acknowledges every record of `partition` up to and including
    /// `offset` (cumulative, C21). An offset not yet delivered, or a
    /// partition the consumer does not read, is
    /// [`BusError::InvalidArgument`] and changes nothing.
    pub fn ack_through(&mut self, partition: u32, offset: u64) -> Result<(), BusError> {
        self.check_fenced()?;
        let Some(part) = self.parts.get(&partition) else {
            return Err(BusError::invalid(
                "partition",
                format!(
                    "consumer {:?} of topic {:?} does not read partition {partition}",
                    self.name, self.topic
                ),
            ));
        };
        if offset >= part.seen {
            return Err(BusError::invalid(
                "offset",
                format!(
                    "{offset} of partition {partition} was not delivered yet (delivered below {})",
                    part.seen
                ),
            ));
        }
        self.mark_acked(partition, 0, offset.saturating_add(1));
        self.after_ack()
    }

    /// Rejects a delivery (C22): with a dead-letter topic, the record is
    /// written there with `reason`, then acknowledged; a failed write
    /// leaves it unacknowledged and is returned. Without one, the record is
    /// delivered again on the next `recv`.
    pub fn nack(&mut self, delivery: &Delivery, reason: &str) -> Result<(), BusError> {
        self.check_fenced()?;
        self.check_mine(delivery)?;
        let (partition, offset) = (delivery.partition, delivery.offset);
        let Some(part) = self.parts.get_mut(&partition) else {
            return Err(BusError::invalid("delivery", "partition not consumed"));
        };
        if part.acked.contains(offset) {
            return Ok(());
        }
        if !part.flights.contains_key(&offset) {
            return Err(BusError::invalid(
                "delivery",
                format!("offset {offset} of partition {partition} was not delivered"),
            ));
        }
        if self.options.dead_letter.is_none() {
            self.set_due(partition, offset, Instant::now());
            return Ok(());
        }
        self.dead_letter(partition, offset, reason)
    }

    /// Writes the record in flight at (partition, offset) to the
    /// dead-letter topic, then acknowledges it (C22). The write carries a
    /// UID made of the consumer, partition and offset, so writing it again
    /// after a crash between the two steps is deduplicated (C6) within the
    /// dead-letter topic's dedup window.
    fn dead_letter(&mut self, partition: u32, offset: u64, reason: &str) -> Result<(), BusError> {
        let Some(dlq) = self.options.dead_letter.clone() else {
            return Ok(());
        };
        let Some(flight) = self
            .parts
            .get(&partition)
            .and_then(|part| part.flights.get(&offset))
        else {
            return Ok(());
        };
        let event = &flight.record.event;
        let value = serde_json::json!({
            "dead_letter": {
                "topic": self.topic,
                "partition": partition,
                "offset": offset,
                "key": event.key,
                "uid": embedded_uid(&event.value),
                "stored_at": event.stored_at,
                "consumer": self.name,
                "reason": reason,
                "delivery_count": flight.count,
            },
            "value": event.value,
        });
        let identity = fnv1a64(format!("{}\0{}", self.topic, self.name).as_bytes());
        let uid = format!("dead-letter-{identity:016x}-{partition}-{offset}");
        // The dead letter keeps the record's headers (C25), so its trace
        // context and metadata travel on with it.
        self.publisher.publish_with_headers(
            &dlq,
            &event.key,
            &value,
            Some(&uid),
            &flight.record.headers,
        )?;
        self.mark_acked(partition, offset, offset.saturating_add(1));
        self.after_ack()
    }

    fn mark_acked(&mut self, partition: u32, start: u64, end: u64) {
        if let Some(part) = self.parts.get_mut(&partition) {
            part.acked.insert(start, end);
            // Split out the flights in [start, end): no walk over the rest.
            let mut acked = part.flights.split_off(&start);
            let mut above = acked.split_off(&end);
            part.flights.append(&mut above);
            for (offset, flight) in acked {
                self.dues.remove(&(flight.due, partition, offset));
            }
            if end == start.saturating_add(1) {
                part.earlier.remove(&start);
            } else {
                part.earlier
                    .retain(|&offset, _| offset < start || offset >= end);
            }
        }
        self.pending = self.pending.saturating_add(1);
        self.oldest_pending.get_or_insert_with(Instant::now);
        self.dirty = true;
    }

    fn after_ack(&mut self) -> Result<(), BusError> {
        if self.pending >= self.options.ack_every {
            return self.flush();
        }
        self.flush_if_due()
    }

    fn flush_if_due(&mut self) -> Result<(), BusError> {
        match (self.options.ack_interval, self.oldest_pending) {
            (Some(every), Some(oldest)) if oldest.elapsed() >= every => self.flush(),
            _ => Ok(()),
        }
    }

    /// Writes the cursor now if anything changed since the last write, and
    /// returns when it is durable (C21). A fenced instance gets
    /// [`BusError::Fenced`] and writes nothing.
    pub fn flush(&mut self) -> Result<(), BusError> {
        self.check_fenced()?;
        if !self.dirty {
            return Ok(());
        }
        let Some(token) = &self.token else {
            return Ok(());
        };
        let state = self.state();
        match self.store.store(&self.topic, &self.name, token, &state) {
            Ok(()) => {
                self.pending = 0;
                self.oldest_pending = None;
                self.dirty = false;
                Ok(())
            }
            Err(BusError::Fenced { reason, .. }) => {
                self.fenced = Some(reason.clone());
                Err(fenced_error(&self.topic, &self.name, &reason))
            }
            Err(error) => Err(error),
        }
    }

    fn state(&self) -> CursorState {
        CursorState {
            selector: self.selector.clone(),
            partitions: self
                .parts
                .iter()
                .map(|(&p, part)| {
                    let mut deliveries: Vec<(u64, u32)> = part
                        .flights
                        .iter()
                        .map(|(&o, f)| (o, f.count))
                        .chain(part.earlier.iter().map(|(&o, &c)| (o, c)))
                        .collect();
                    deliveries.sort_unstable();
                    (
                        p,
                        PartitionState {
                            next: part.acked.next(),
                            acked: part.acked.ranges(),
                            deliveries,
                        },
                    )
                })
                .collect(),
            owner: self.token.as_ref().map(|token| token.id),
        }
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        if self.fenced.is_none() && self.dirty {
            // Best effort: the caller who needs to know calls flush().
            let _ = self.flush();
        }
        if let Some(token) = self.token.take() {
            self.store.release(&self.topic, &self.name, token);
        }
    }
}
