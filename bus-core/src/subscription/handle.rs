//! The synchronous subscription handle and the loop that fills it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Doorbell, Plan, SubscribeOptions, SubscriptionItem};
use crate::{BusError, StoredEvent, StoredRecord};

/// How a backend reads for a subscription. Reads never wait for new
/// records: the [`Doorbell`] says when to read again.
pub trait Feed: Send {
    /// Up to `max` records of `partition` from offset `from` on, ascending
    /// and without holes, starting at the log start when `from` is below it;
    /// empty at the end. A forged record is [`BusError::Integrity`] naming
    /// its offset.
    fn read(&mut self, partition: u32, from: u64, max: usize)
    -> Result<Vec<StoredEvent>, BusError>;

    /// The offset the next record of `partition` will get, counting only
    /// acked (visible) records. Asked only by subscriptions with `max_lag`.
    fn head(&mut self, partition: u32) -> Result<u64, BusError>;

    /// [`Feed::read`] of offsets the caller knows exist: below a head
    /// [`Feed::head`] just gave. A feed whose `read` answers empty at the
    /// end of what it has buffered so far (a live tail fed by a consumer
    /// that can trail the broker) must read through to the store here, so
    /// a catch-up to that head sees every record below it whenever it runs
    /// (C18). The default is `read`.
    fn read_below_head(
        &mut self,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, BusError> {
        self.read(partition, from, max)
    }

    /// [`Feed::read`] with each record's headers (C25). The default reads
    /// and gives every record empty headers: right for a backend that
    /// stores none, and a feed of one that does overrides it.
    fn read_records(
        &mut self,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredRecord>, BusError> {
        Ok(self
            .read(partition, from, max)?
            .into_iter()
            .map(StoredRecord::from)
            .collect())
    }

    /// [`Feed::read_below_head`] with each record's headers. The default is
    /// `read_below_head` with empty headers.
    fn read_records_below_head(
        &mut self,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredRecord>, BusError> {
        Ok(self
            .read_below_head(partition, from, max)?
            .into_iter()
            .map(StoredRecord::from)
            .collect())
    }
}

/// Records read per partition per refill.
const PAGE: usize = 512;
/// First and longest pause before a partition that failed is read again.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct Cursor {
    partition: u32,
    /// The next offset to read (records up to it are queued or skipped).
    next: u64,
    /// The next offset not yet handed to the caller: what
    /// [`Subscription::positions`] reports.
    delivered: u64,
    /// A time start: records stored before it are passed over until the
    /// first one at or after it.
    not_before: Option<u64>,
    retry_at: Option<Instant>,
    retry_pause: Duration,
}

/// A queued item and where its partition's delivery stands once it is
/// handed out; an entry without an item only moves that position (records
/// the key or time filter passed over).
#[derive(Debug)]
struct Pending {
    cursor: usize,
    position: Option<u64>,
    item: Option<Result<SubscriptionItem, BusError>>,
}

/// A live subscription: history from its start, then the live tail.
///
/// Reads happen on the caller's thread inside [`Subscription::recv_timeout`]
/// and friends; between reads it sleeps on its [`Doorbell`], so an idle
/// subscription costs no CPU. Dropping it releases what the backend holds
/// for it (its feed and doorbell) at once.
pub struct Subscription {
    topic: String,
    key: Option<String>,
    max_lag: Option<u64>,
    cursors: Vec<Cursor>,
    turn: usize,
    pending: VecDeque<Pending>,
    feed: Box<dyn Feed>,
    bell: Arc<Doorbell>,
    /// The `process` span of the record handed out last (feature `otel`,
    /// set by `Traced`).
    #[cfg(feature = "otel")]
    pub(super) deliveries: Option<crate::otel::Deliveries>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("topic", &self.topic)
            .field("key", &self.key)
            .field("max_lag", &self.max_lag)
            .field("cursors", &self.cursors)
            .finish_non_exhaustive()
    }
}

impl Subscription {
    /// A subscription over `plan`, reading through `feed` and woken by
    /// `bell`; options no subscription can honour are
    /// [`BusError::InvalidArgument`].
    pub fn new(
        plan: Plan,
        options: SubscribeOptions,
        feed: Box<dyn Feed>,
        bell: Arc<Doorbell>,
    ) -> Result<Self, BusError> {
        options.validate()?;
        let cursors = plan
            .partitions
            .into_iter()
            .map(|(partition, next)| Cursor {
                partition,
                next,
                delivered: next,
                not_before: plan.not_before,
                retry_at: None,
                retry_pause: RETRY_FIRST,
            })
            .collect();
        Ok(Self {
            topic: plan.topic,
            key: plan.key,
            max_lag: options.max_lag,
            cursors,
            turn: 0,
            pending: VecDeque::new(),
            feed,
            bell,
            #[cfg(feature = "otel")]
            deliveries: None,
        })
    }

    /// The subscribed topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Per partition, the next offset not yet handed to the caller: where
    /// delivery continues. Records read ahead but not yet received do not
    /// count, so a checkpoint of this, given back as
    /// [`super::StartAt::Positions`], resumes with no gap and no duplicate.
    pub fn positions(&self) -> Vec<(u32, u64)> {
        self.cursors
            .iter()
            .map(|c| (c.partition, c.delivered))
            .collect()
    }

    /// Whether the bus behind it is gone (nothing more will arrive).
    pub fn is_closed(&self) -> bool {
        self.pending.iter().all(|entry| entry.item.is_none()) && self.bell.is_closed()
    }

    /// The next queued item, moving delivery positions past it (and past
    /// what the filters passed over before it).
    fn pop(&mut self) -> Option<Result<SubscriptionItem, BusError>> {
        while let Some(entry) = self.pending.pop_front() {
            if let Some(position) = entry.position {
                self.cursors[entry.cursor].delivered = position;
            }
            if entry.item.is_some() {
                return entry.item;
            }
        }
        None
    }

    /// Queues `item` for cursor `index`, after which delivery stands at
    /// `position`.
    fn queue(
        &mut self,
        index: usize,
        position: Option<u64>,
        item: Result<SubscriptionItem, BusError>,
    ) {
        self.pending.push_back(Pending {
            cursor: index,
            position,
            item: Some(item),
        });
    }

    /// Notes that delivery of cursor `index` passes `position` with nothing
    /// to hand out (one entry for a run of filtered records).
    fn pass_over(&mut self, index: usize, position: u64) {
        if let Some(last) = self.pending.back_mut()
            && last.item.is_none()
            && last.cursor == index
        {
            last.position = Some(position);
            return;
        }
        if self.pending.is_empty() {
            self.cursors[index].delivered = position;
            return;
        }
        self.pending.push_back(Pending {
            cursor: index,
            position: Some(position),
            item: None,
        });
    }

    fn has_item(&self) -> bool {
        self.pending.iter().any(|entry| entry.item.is_some())
    }

    /// The doorbell this subscription sleeps on (closing it ends the
    /// subscription's waits: what [`super::SubscriptionStream`] does on drop).
    pub fn doorbell(&self) -> Arc<Doorbell> {
        Arc::clone(&self.bell)
    }

    /// The next item, waiting up to `timeout`; `Ok(None)` when none came
    /// (or the bus is closed). Error items (an integrity failure naming its
    /// offset, an outage) come out as `Err`; the subscription goes on after
    /// them.
    pub fn recv_timeout(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<SubscriptionItem>, BusError> {
        let deadline = Instant::now().checked_add(timeout);
        self.next_until(deadline).transpose()
    }

    /// The next item if one can be had without waiting.
    pub fn try_recv(&mut self) -> Result<Option<SubscriptionItem>, BusError> {
        self.recv_timeout(Duration::ZERO)
    }

    /// The next item, waiting as long as it takes; `None` once the bus is
    /// closed.
    pub fn recv(&mut self) -> Option<Result<SubscriptionItem, BusError>> {
        self.next_until(None)
    }

    fn next_until(
        &mut self,
        deadline: Option<Instant>,
    ) -> Option<Result<SubscriptionItem, BusError>> {
        #[cfg(feature = "otel")]
        if self.deliveries.is_some() {
            return self.next_traced(deadline);
        }
        self.next_item(deadline)
    }

    pub(super) fn next_item(
        &mut self,
        deadline: Option<Instant>,
    ) -> Option<Result<SubscriptionItem, BusError>> {
        loop {
            if let Some(item) = self.pop() {
                return Some(item);
            }
            if self.bell.is_closed() {
                return None;
            }
            let seen = self.bell.generation();
            if self.fill() {
                // Records were read (maybe all filtered out by the key):
                // there may be more before the head, so read again.
                continue;
            }
            let now = Instant::now();
            if deadline.is_some_and(|deadline| now >= deadline) {
                return None;
            }
            let retry = self.cursors.iter().filter_map(|c| c.retry_at).min();
            let wake = match (deadline, retry) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) => a,
                (None, Some(b)) => b,
                // No deadline: wake at least hourly to re-check (cheap, and
                // never a polling loop).
                (None, None) => now + Duration::from_secs(3600),
            };
            self.bell.wait_past(seen, wake);
        }
    }

    /// One pass over the partitions, starting after the last one served, so
    /// a busy partition cannot starve the others. Returns whether anything
    /// moved (an item queued or a position advanced).
    fn fill(&mut self) -> bool {
        let count = self.cursors.len();
        for step in 0..count {
            let index = (self.turn + step) % count;
            let before = self.cursors[index].next;
            self.fill_one(index);
            if self.has_item() || self.cursors[index].next != before {
                self.turn = (index + 1) % count;
                return true;
            }
        }
        false
    }

    fn fill_one(&mut self, index: usize) {
        let now = Instant::now();
        if self.cursors[index].retry_at.is_some_and(|at| now < at) {
            return;
        }
        match self.read_cursor(index) {
            Ok(()) => {
                let cursor = &mut self.cursors[index];
                cursor.retry_at = None;
                cursor.retry_pause = RETRY_FIRST;
            }
            Err(error) => {
                let cursor = &mut self.cursors[index];
                cursor.retry_at = Some(now + cursor.retry_pause);
                cursor.retry_pause = (cursor.retry_pause * 2).min(RETRY_MAX);
                self.queue(index, None, Err(error));
            }
        }
    }

    fn read_cursor(&mut self, index: usize) -> Result<(), BusError> {
        let partition = self.cursors[index].partition;
        let mut page = PAGE;
        if let Some(max_lag) = self.max_lag {
            let head = self.feed.head(partition)?;
            let next = self.cursors[index].next;
            crate::metrics::lag(&self.topic, partition, head.saturating_sub(next));
            if head.saturating_sub(next) > max_lag {
                if self.key.is_some() {
                    // More records than the bound wait, maybe not of its key.
                    if self.catch_up_key(index, head, max_lag) {
                        return Ok(());
                    }
                } else {
                    let resume = head - max_lag;
                    self.report_lagged(index, resume - next, resume);
                    self.cursors[index].next = resume;
                }
            }
            page = page.min(usize::try_from(max_lag).unwrap_or(usize::MAX).max(1));
        }
        let from = self.cursors[index].next;
        let events = match self.feed.read_records(partition, from, page) {
            Ok(events) => events,
            // A forged record (C19), or a record missing from the log (a
            // row deleted behind the bus): what comes before it, the error
            // naming it, then on after it, never a subscription stuck at it.
            Err(error) => {
                let Some(offset) = bad_offset(&error, partition).filter(|&offset| offset >= from)
                else {
                    return Err(error);
                };
                let before = usize::try_from(offset - from).unwrap_or(usize::MAX);
                if before > 0 {
                    let events = match self.feed.read_records(partition, from, before) {
                        Ok(events) => events,
                        // Nothing readable before the bad record.
                        Err(again) if bad_offset(&again, partition) == Some(offset) => Vec::new(),
                        Err(error) => return Err(error),
                    };
                    self.push_events(index, events);
                    let next = self.cursors[index].next;
                    if next > from && next < offset {
                        // Part of the prefix came: read on from there.
                        return Ok(());
                    }
                    if next < offset {
                        // The prefix reads as nothing: retention took it
                        // since the first read. Report the gap and go on to
                        // the forged record (re-reading would never move).
                        self.report_lagged(index, offset - next, offset);
                        self.cursors[index].next = offset;
                    }
                }
                self.queue(index, Some(offset + 1), Err(error));
                self.cursors[index].next = offset + 1;
                return Ok(());
            }
        };
        self.push_events(index, events);
        Ok(())
    }

    /// A key subscription more than `max_lag` partition records behind:
    /// reads the partition up to `head` in order (as any read does, so a
    /// feed that streams works too), keeps the key's newest `max_lag`
    /// records and reports the key's records it skipped, counted in that
    /// key alone (C18). False when nothing could be read: the plain read
    /// then reports why.
    fn catch_up_key(&mut self, index: usize, head: u64, max_lag: u64) -> bool {
        let partition = self.cursors[index].partition;
        let start = self.cursors[index].next;
        let bound = usize::try_from(max_lag).unwrap_or(usize::MAX);
        let mut kept: VecDeque<StoredRecord> = VecDeque::new();
        let (mut seen, mut expired) = (0u64, 0u64);
        let mut from = start;
        while from < head {
            let Ok(records) = self.feed.read_records_below_head(partition, from, PAGE) else {
                break;
            };
            let Some(last) = records.last().map(|record| record.event.offset) else {
                break;
            };
            for record in records {
                let offset = record.event.offset;
                if offset < from {
                    continue;
                }
                // Retention took these before they were read.
                expired += offset - from;
                from = offset + 1;
                if self.wanted(index, &record.event) {
                    seen += 1;
                    kept.push_back(record);
                    if kept.len() > bound {
                        kept.pop_front();
                    }
                }
            }
            from = from.max(last + 1);
        }
        if from == start {
            return false;
        }
        self.cursors[index].next = from;
        let skipped = seen - kept.len() as u64;
        if expired > 0 || skipped > 0 {
            let resume = kept.front().map_or(from, |record| record.event.offset);
            self.report_lagged(index, expired + skipped, resume);
        }
        for StoredRecord { event, headers } in kept {
            let position = event.offset + 1;
            let topic = self.topic.clone();
            self.queue(
                index,
                Some(position),
                Ok(SubscriptionItem::Record {
                    topic,
                    event,
                    headers,
                }),
            );
        }
        self.pass_over(index, from);
        true
    }

    /// Queues `Lagged` for records of cursor `index`'s partition the
    /// subscriber will never see, and counts them for operators.
    fn report_lagged(&mut self, index: usize, skipped: u64, next_offset: u64) {
        crate::metrics::lagged(&self.topic, skipped);
        let partition = self.cursors[index].partition;
        self.queue(
            index,
            Some(next_offset),
            Ok(SubscriptionItem::Lagged {
                partition,
                skipped,
                next_offset,
            }),
        );
    }

    /// Whether the subscriber gets `event`, the next record read on cursor
    /// `index`: not before the start time, and of the subscription's key if
    /// it has one. The one place both reads ([`Self::push_events`] and the
    /// key catch-up) apply the two filters.
    fn wanted(&mut self, index: usize, event: &StoredEvent) -> bool {
        let cursor = &mut self.cursors[index];
        if let Some(time) = cursor.not_before {
            if event.stored_at < time {
                return false;
            }
            // From the first record at or after the time on, the log's
            // order decides (a clock step back does not hide records).
            cursor.not_before = None;
        }
        self.key.as_deref().is_none_or(|key| key == event.key)
    }

    fn push_events(&mut self, index: usize, records: Vec<StoredRecord>) {
        for StoredRecord { event, headers } in records {
            let next = self.cursors[index].next;
            if event.offset < next {
                continue;
            }
            if event.offset > next {
                // Retention took these before they were read.
                self.report_lagged(index, event.offset - next, event.offset);
            }
            let position = event.offset + 1;
            self.cursors[index].next = position;
            if self.wanted(index, &event) {
                let topic = self.topic.clone();
                self.queue(
                    index,
                    Some(position),
                    Ok(SubscriptionItem::Record {
                        topic,
                        event,
                        headers,
                    }),
                );
            } else {
                self.pass_over(index, position);
            }
        }
    }
}

/// The offset a read of `partition` failed at, when the failure is one
/// record's: a forged record of that partition, or a missing one.
fn bad_offset(error: &BusError, partition: u32) -> Option<u64> {
    match error {
        BusError::Integrity {
            partition: bad,
            offset,
            ..
        } if *bad == partition => Some(*offset),
        BusError::Corrupt { offset, .. } => Some(*offset),
        _ => None,
    }
}

impl Iterator for Subscription {
    type Item = Result<SubscriptionItem, BusError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.recv()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // Backend machinery watching the bell stops with it.
        self.bell.close();
    }
}

#[cfg(test)]
mod tests;
