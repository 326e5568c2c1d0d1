//! The group commit of a partition's writes.
//!
//! Publishers queue requests; the first one that finds no writer running
//! becomes the writer for one round: it takes everything queued, assigns
//! offsets, writes one batch of frames, fsyncs once and acks the whole round. Records
//! become visible to fetch (and their UIDs to dedup) only after that.
//!
//! An async publisher (feature `async`) queues its request the same way but
//! never leads a round (that would write and fsync on a runtime worker):
//! when no writer is running it calls the partition's commit thread, which
//! leads rounds until the queue is empty, and the publisher awaits its
//! answer. Async and sync publishers share rounds, and the lead passes
//! only to sync publishers or to that thread.
//!
//! The round's own work (dedup, offsets, frames, write, fsync) is in
//! `write`.

use bus_core::backend::sync::lock;
#[cfg(feature = "async")]
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::Instant;

use bus_core::auth::RecordAuth;
use bus_core::{BusError, backend::metrics};

use crate::log::frame::NewRecord;
use crate::options::Durability;
use crate::partition::Partition;
use crate::partition::acked::{AckedEnd, EVERY_WHOLE_FRAME};
use crate::partition::poison::Poison;
#[cfg(feature = "async")]
use crate::partition::queue::Answer;
use crate::partition::queue::{Committer, Lead, Queue, Request, Slot, Turn, take_round};

/// Ends a writer round even when `commit` panics: the round's waiters get
/// an error, the partition is poisoned (memory and disk may disagree) and
/// the lead passes on.
struct Round<'p> {
    partition: &'p Partition,
    requests: Vec<Request>,
    /// The leader's own slot; its panic reaches it directly.
    own: &'p Arc<Slot>,
    finished: bool,
}

impl Drop for Round<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let cause = lock(&self.partition.writer)
            .poisoned
            .get_or_insert_with(|| Poison::note("the writer panicked"))
            .clone();
        for request in &self.requests {
            if !Arc::ptr_eq(&request.slot, self.own) {
                request
                    .slot
                    .set(Turn::Done(Err(self.partition.poisoned_error(&cause))));
            }
        }
        // Every other publisher of the round was answered: wake them all.
        let called = self.partition.pass_lead(&mut lock(&self.partition.queue));
        if called == Lead::Committer {
            self.partition.call_committer();
        }
        self.partition.wake();
    }
}

impl Partition {
    /// Appends `records` as one frame (sharing a writer round with other
    /// publishers) and returns each record's offset; a record whose UID is
    /// already stored gets the original offset and is not written again.
    /// With `auth`, a stored UID counts only when its record authenticates.
    pub(crate) fn append(
        &self,
        records: Vec<NewRecord>,
        auth: Option<RecordAuth>,
    ) -> Result<Vec<u64>, BusError> {
        self.submit(records, auth, true)
    }

    /// Appends `records` as given, UIDs already stored or not, as a foreign
    /// writer of the files would (test hook for contract C14).
    pub(crate) fn append_foreign(&self, records: Vec<NewRecord>) -> Result<Vec<u64>, BusError> {
        self.submit(records, None, false)
    }

    fn submit(
        &self,
        records: Vec<NewRecord>,
        auth: Option<RecordAuth>,
        dedup: bool,
    ) -> Result<Vec<u64>, BusError> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        if dedup && records.iter().all(|r| r.uid.is_some()) {
            let mut known = Vec::with_capacity(records.len());
            for uid in records.iter().filter_map(|r| r.uid.as_deref()) {
                match self.find_uid(uid, auth.as_ref())? {
                    Some(offset) => known.push(offset),
                    None => break,
                }
            }
            if known.len() == records.len() {
                metrics::dedup_hits("embedded", &self.topic, known.len() as u64);
                return Ok(known);
            }
        }
        let own = Arc::new(Slot::new());
        let mut queue = lock(&self.queue);
        queue.pending.push(Request {
            records,
            auth,
            dedup,
            slot: Arc::clone(&own),
        });
        if queue.leading {
            if queue.gathering && queue.pending.len() >= queue.expected {
                self.gathered.notify_one();
            }
            drop(queue);
            if let Some(result) = own.wait(&self.answered) {
                return result;
            }
            queue = lock(&self.queue);
        }
        queue.leading = true;
        loop {
            queue = self.gather(queue);
            let requests = take_round(&mut queue.pending);
            drop(queue);
            let started = Instant::now();
            let mut round = Round {
                partition: self,
                requests,
                own: &own,
                finished: false,
            };
            let results = self.commit(&round.requests);
            round.finished = true;
            let requests = std::mem::take(&mut round.requests);
            let size = requests.len();
            let mut mine = None;
            let mut answers = Vec::with_capacity(size);
            for (request, result) in requests.into_iter().zip(results) {
                if Arc::ptr_eq(&request.slot, &own) {
                    mine = Some(result);
                } else {
                    answers.push((request.slot, result));
                }
            }
            queue = lock(&self.queue);
            // Everyone in this round and everyone who queued meanwhile is
            // publishing: the next round waits briefly for that many.
            queue.expected = size + queue.pending.len();
            queue.last_commit = started.elapsed();
            let handed = if mine.is_some() {
                self.pass_lead(&mut queue)
            } else {
                Lead::Ended
            };
            drop(queue);
            if handed == Lead::Committer {
                self.call_committer();
            }
            // One wake-up for the whole round and the next leader (a lone
            // publisher, who leads every round, makes no system call).
            let woken = handed == Lead::Publisher || !answers.is_empty();
            for (slot, result) in answers {
                slot.set(Turn::Done(result));
            }
            if woken {
                self.wake();
            }
            if let Some(result) = mine {
                return result;
            }
            queue = lock(&self.queue);
        }
    }

    /// Lets a round's leader wait, under `Durability::Sync` only, until as
    /// many publishers have queued as took part in the last round (they are
    /// about to come back), for at most half that round's commit time: one
    /// fsync then covers them all instead of every other round covering
    /// half of them.
    fn gather<'q>(&'q self, mut queue: MutexGuard<'q, Queue>) -> MutexGuard<'q, Queue> {
        if !matches!(self.options.durability, Durability::Sync)
            || queue.pending.len() >= queue.expected
        {
            return queue;
        }
        let deadline = Instant::now() + queue.last_commit / 2;
        queue.gathering = true;
        while queue.pending.len() < queue.expected {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            queue = self
                .gathered
                .wait_timeout(queue, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        queue.gathering = false;
        queue
    }

    /// Wakes every waiting publisher to look at its turn: one system call
    /// for a whole round (a thread woken for nothing waits again).
    fn wake(&self) {
        self.answered.fetch_add(1, Ordering::Release);
        atomic_wait::wake_all(&self.answered);
    }

    /// Hands the lead to the first queued sync publisher (the caller must
    /// wake it), else to the commit thread when async publishers wait (the
    /// caller must call it, after releasing the queue), or ends it.
    fn pass_lead(&self, queue: &mut Queue) -> Lead {
        if let Some(next) = queue.pending.iter().find(|r| !r.slot.asynchronous) {
            next.slot.set(Turn::Lead);
            Lead::Publisher
        } else if queue.pending.is_empty() {
            queue.leading = false;
            Lead::Ended
        } else {
            Lead::Committer
        }
    }

    /// Asks the commit thread to lead (it holds the lead already).
    fn call_committer(&self) {
        let called = lock(&self.committer)
            .as_ref()
            .is_some_and(|committer| committer.bell.send(()).is_ok());
        if !called {
            // Only async publishers start the thread, so it exists; should
            // it be gone, the waiting publishers are answered here.
            self.lead_rounds();
        }
    }

    /// Starts the commit thread if it is not running.
    #[cfg_attr(not(feature = "async"), allow(dead_code))]
    fn start_committer(self: &Arc<Self>) -> Result<(), BusError> {
        let mut slot = lock(&self.committer);
        if slot.is_some() {
            return Ok(());
        }
        let (bell, calls) = std::sync::mpsc::channel::<()>();
        let partition = Arc::downgrade(self);
        let thread = std::thread::Builder::new()
            .name(format!("bus-embedded-commit-{}", self.id))
            .spawn(move || {
                while calls.recv().is_ok() {
                    let Some(partition) = partition.upgrade() else {
                        return;
                    };
                    // A panicking round answers its publishers with an error
                    // and poisons the partition (`Round`); the thread goes on.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        partition.lead_rounds();
                    }));
                }
            })
            .map_err(BusError::Io)?;
        *slot = Some(Committer { bell, thread });
        Ok(())
    }

    /// The commit thread's work: with the lead held, commits rounds until
    /// the queue is empty, then gives the lead up.
    fn lead_rounds(&self) {
        let own = Arc::new(Slot::new());
        let mut queue = lock(&self.queue);
        loop {
            if queue.pending.is_empty() {
                queue.leading = false;
                return;
            }
            queue = self.gather(queue);
            let requests = take_round(&mut queue.pending);
            drop(queue);
            let started = Instant::now();
            let mut round = Round {
                partition: self,
                requests,
                own: &own,
                finished: false,
            };
            let results = self.commit(&round.requests);
            round.finished = true;
            let requests = std::mem::take(&mut round.requests);
            let size = requests.len();
            queue = lock(&self.queue);
            queue.expected = size + queue.pending.len();
            queue.last_commit = started.elapsed();
            drop(queue);
            let any_sync = requests.iter().any(|r| !r.slot.asynchronous);
            for (request, result) in requests.into_iter().zip(results) {
                request.slot.set(Turn::Done(result));
            }
            if any_sync {
                self.wake();
            }
            queue = lock(&self.queue);
        }
    }

    /// [`Partition::append`] for an async publisher: queues the request
    /// and returns at once; the future resolves when its round is durable.
    /// It never writes, fsyncs nor reads a file on the caller's thread: a
    /// UID already stored is found by the round's dedup, not up front.
    #[cfg(feature = "async")]
    pub(crate) fn append_async(
        self: &Arc<Self>,
        records: Vec<NewRecord>,
        auth: Option<RecordAuth>,
    ) -> Result<Answer, BusError> {
        if records.is_empty() {
            return Ok(Answer(None));
        }
        self.start_committer()?;
        let slot = Arc::new(Slot {
            turn: Mutex::new(Turn::Waiting),
            waker: Mutex::new(None),
            asynchronous: true,
        });
        let mut queue = lock(&self.queue);
        queue.pending.push(Request {
            records,
            auth,
            dedup: true,
            slot: Arc::clone(&slot),
        });
        if queue.leading {
            if queue.gathering && queue.pending.len() >= queue.expected {
                self.gathered.notify_one();
            }
        } else {
            queue.leading = true;
            drop(queue);
            self.call_committer();
        }
        Ok(Answer(Some(slot)))
    }

    /// Ends this partition's commit thread, if one runs, and waits for it:
    /// afterwards no thread but the bus's holds the partition, so it is
    /// closed (files trimmed, recovery point and hints written) before the
    /// bus releases its directory lock.
    pub(crate) fn stop_committer(&self) {
        let committer = lock(&self.committer).take();
        if let Some(Committer { bell, thread }) = committer {
            drop(bell);
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }

    /// A writer's round is acked and visible to fetch: tell readers in
    /// other processes (the marker) and subscriptions of this bus.
    pub(crate) fn announce(&self, base: u64, len: u64) {
        if let (Durability::Sync, Some(marker)) = (self.options.durability, self.acked.get()) {
            // A failed store only delays readers in other processes until
            // the next round; failing an already durable round would be worse.
            let _ = marker.store(base, len);
        }
        self.options.notifier.ring(&self.topic);
    }

    /// Starts the marker of a partition a writer has just opened (after
    /// recovery made its whole frames durable).
    pub(crate) fn start_acked_end(&self) -> std::io::Result<()> {
        let marker = AckedEnd::create(&self.dir)?;
        let (base, len) = match self.options.durability {
            Durability::Sync => {
                let writer = lock(&self.writer);
                (writer.base, writer.pos)
            }
            Durability::Interval(_) => EVERY_WHOLE_FRAME,
        };
        marker.store(base, len)?;
        let _ = self.acked.set(marker);
        Ok(())
    }
}
