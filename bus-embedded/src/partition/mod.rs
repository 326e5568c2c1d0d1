//! One partition of a topic: its state and the group-commit writer (the
//! read side is in `fetch`).
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

pub(crate) mod acked;
pub(crate) mod fetch;
pub(crate) mod lookup;
pub(crate) mod poison;
pub(crate) mod readonly;
pub(crate) mod recovery;
pub(crate) mod retention;

use bus_core::sync::lock;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{
    Arc, Condvar, Mutex, MutexGuard, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard,
};
use std::time::{Duration, Instant};

use bus_core::auth::RecordAuth;
use bus_core::{BusError, PartitionOffsets, metrics, now_ms};

use crate::log::checkpoint::{self, RecoveryPoint};
use crate::log::frame::{self, NewRecord};
use crate::log::index::SegmentIndex;
use crate::options::{Durability, Options};
use crate::partition::acked::{AckedEnd, EVERY_WHOLE_FRAME};
use crate::partition::poison::Poison;
use crate::uid::index::UidIndex;

/// Record bytes one writer round takes at most (it always takes one
/// request), so an oversized request never shares a frame with others.
const ROUND_BYTES: usize = 8 << 20;

/// Under [`Durability::Sync`], a frame smaller than this is written into
/// zeros written (and fsynced) ahead of it, so its `fdatasync` flushes data
/// only: an append that grows the file also commits its new size to the
/// journal. Measured on this project's VM (ext4 on virtio): 200-byte
/// appends 167-198 µs per write+fdatasync, the same into zeros 96-136 µs;
/// 3.2 KB 230-277 µs against 121-165 µs; fallocate'd or sparse space does
/// not help as much (124-226 µs). Larger frames (batches) append: their
/// fsync is dominated by their own bytes, and zeros would double them.
const ZERO_AHEAD_FRAMES_UNDER: u64 = 64 << 10;
/// Zeros written ahead at least and at most: about the bytes the segment
/// already holds, so an idle partition costs little disk and a busy one
/// extends its file once per 4 MiB.
const ZERO_AHEAD_MIN: u64 = 16 << 10;
const ZERO_AHEAD_MAX: u64 = 4 << 20;

/// A segment as readers see it.
#[derive(Debug)]
pub(crate) struct SegmentMeta {
    pub base: u64,
    pub path: PathBuf,
    pub index: SegmentIndex,
    /// The open file of the active segment; sealed ones are opened on
    /// their first read and kept in the partition's [`FileCache`].
    pub file: Option<Arc<File>>,
    /// A sealed segment's UIDs (on disk); `None` for the active segment
    /// and in read-only opens, whose UIDs are in [`ReadState::uids`].
    pub uids: Option<Arc<crate::uid::table::SealedUids>>,
}

/// Sealed segments' files kept open after a read: opening the file cost
/// more than the read itself in `fetch(random, 1)` (a path walk and a
/// descriptor per call, ~2 µs here). Each partition keeps up to
/// [`FileCache::CAP`]; more while the bus holds fewer than
/// [`FileCache::BUS_BUDGET`] such extra descriptors in all (the least
/// recently read is closed first). At 3,000,000 records (24 segments),
/// keeping 64 instead of 8 took `fetch(random, 1)` from 7.5-7.7 µs to
/// 5.1-5.6 µs in alternating runs.
#[derive(Debug, Default)]
pub(crate) struct FileCache {
    /// `(segment base, file, last use)`.
    files: Vec<(u64, Arc<File>, u64)>,
    clock: u64,
    /// The bus's count of descriptors held beyond each partition's `CAP`.
    budget: Arc<AtomicUsize>,
}

impl FileCache {
    /// Descriptors a partition keeps for its sealed segments in any case.
    pub const CAP: usize = 8;
    /// Descriptors the bus keeps beyond that, over all partitions.
    pub const BUS_BUDGET: usize = 512;

    pub fn new(budget: Arc<AtomicUsize>) -> Self {
        Self {
            files: Vec::new(),
            clock: 0,
            budget,
        }
    }

    /// The cached file of the segment at `base`.
    pub fn get(&mut self, base: u64) -> Option<Arc<File>> {
        self.clock += 1;
        let clock = self.clock;
        self.files
            .iter_mut()
            .find(|(b, _, _)| *b == base)
            .map(|(_, file, used)| {
                *used = clock;
                Arc::clone(file)
            })
    }

    /// Keeps `file` for the segment at `base`, closing the least recently
    /// used one when the partition and the bus have no room.
    pub fn put(&mut self, base: u64, file: Arc<File>) {
        self.clock += 1;
        if let Some(entry) = self.files.iter_mut().find(|(b, _, _)| *b == base) {
            *entry = (base, file, self.clock);
            return;
        }
        let room = self.files.len() < Self::CAP
            || self
                .budget
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                    (held < Self::BUS_BUDGET).then_some(held + 1)
                })
                .is_ok();
        if !room && let Some(oldest) = (0..self.files.len()).min_by_key(|&i| self.files[i].2) {
            self.files.swap_remove(oldest);
        }
        self.files.push((base, file, self.clock));
    }

    /// Closes the files of segments below `start` (deleted by retention).
    pub fn retain_from(&mut self, start: u64) {
        let before = self.files.len();
        self.files.retain(|(base, _, _)| *base >= start);
        self.release(before);
    }

    /// Gives back the budget of the files beyond `CAP` of the `before` held.
    fn release(&self, before: usize) {
        let extra = |n: usize| n.saturating_sub(Self::CAP);
        let freed = extra(before) - extra(self.files.len());
        if freed > 0 {
            self.budget.fetch_sub(freed, Ordering::AcqRel);
        }
    }
}

impl Drop for FileCache {
    fn drop(&mut self) {
        let before = self.files.len();
        self.files.clear();
        self.release(before);
    }
}

/// What fetch and lookups read, changed only by durable writes and retention.
#[derive(Debug, Default)]
pub(crate) struct ReadState {
    /// Ascending; the last one is the active segment.
    pub segments: Vec<SegmentMeta>,
    /// UID → offsets of the records with a UID that are not in a sealed
    /// segment's table: the active segment's (and, read-only, all).
    pub uids: UidIndex,
}

/// What only the writer of the moment touches.
#[derive(Debug)]
pub(crate) struct WriterState {
    pub file: Arc<File>,
    pub base: u64,
    /// Bytes written to the active segment.
    pub pos: u64,
    /// Offset the next record gets.
    pub next: u64,
    pub last_indexed: Option<(u64, u64)>,
    /// The UIDs of the active segment's first bytes, when open took them
    /// from the table written at a clean close (not in [`ReadState::uids`],
    /// which holds the rest of the active segment's; both are persisted
    /// when it is sealed).
    pub active_prefix: Option<Arc<crate::uid::table::SealedUids>>,
    /// Bytes of the active segment its hint files on disk cover (written
    /// at a clean close), if any.
    pub hinted_len: Option<u64>,
    /// Set by a failed write or fsync; the partition refuses writes until reopen.
    pub poisoned: Option<Poison>,
    /// Bytes written but not yet fsynced ([`Durability::Interval`]).
    pub dirty: bool,
    /// Length of the active segment's file: the frames, then zeros
    /// written ahead of `pos` (see [`ZERO_AHEAD_FRAMES_UNDER`]).
    pub allocated: u64,
    /// The recovery point last stored (see `checkpoint`).
    pub recovery_point: Option<RecoveryPoint>,
    /// Compresses frames as the topic's spec says (set after open, and
    /// again when a manifest changes it).
    pub encoder: crate::log::codec::Encoder,
}

#[derive(Debug, Default)]
struct Queue {
    pending: Vec<Request>,
    /// A publisher is writing a round, or has been handed the lead.
    leading: bool,
    /// The leader waits in [`Partition::gather`] for `expected` requests.
    gathering: bool,
    expected: usize,
    last_commit: Duration,
}

/// The thread that leads rounds for async publishers, started at the
/// partition's first async publish. It holds the partition weakly, so the
/// partition still closes cleanly when the bus drops it.
#[derive(Debug)]
struct Committer {
    /// One message per call to lead; dropping it ends the thread.
    bell: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

#[derive(Debug)]
struct Request {
    records: Vec<NewRecord>,
    /// The publisher's key: stored UIDs count for dedup only when their
    /// record authenticates under it.
    auth: Option<RecordAuth>,
    /// False for records written as given, the way a foreign writer would
    /// (test hook): their UIDs are not deduplicated.
    dedup: bool,
    /// Where the publisher waits: only the publishers of a finished round
    /// are woken, and the next leader alone.
    slot: Arc<Slot>,
}

#[derive(Debug)]
enum Turn {
    Waiting,
    /// Lead the next round (the request is still queued).
    Lead,
    Done(Result<Vec<u64>, BusError>),
}

/// One waiting publisher's turn. Publishers wait on their partition's
/// [`Partition::answered`] word, so a finished round wakes all its
/// publishers with one `futex` call.
#[derive(Debug)]
struct Slot {
    turn: Mutex<Turn>,
    /// An async publisher's task, woken when its turn is set.
    waker: Mutex<Option<std::task::Waker>>,
    /// An async publisher: never handed the lead.
    asynchronous: bool,
}

impl Slot {
    fn new() -> Self {
        Self {
            turn: Mutex::new(Turn::Waiting),
            waker: Mutex::new(None),
            asynchronous: false,
        }
    }

    /// Sets the turn; a sync publisher sees it after the next
    /// [`Partition::wake`], an async one is woken now.
    fn set(&self, turn: Turn) {
        *lock(&self.turn) = turn;
        if self.asynchronous
            && let Some(waker) = lock(&self.waker).take()
        {
            waker.wake();
        }
    }

    /// Blocks until the request is answered or its publisher must lead.
    fn wait(&self, answered: &AtomicU32) -> Option<Result<Vec<u64>, BusError>> {
        loop {
            // Read before looking, so a wake between the look and the wait
            // makes the wait return at once.
            let seen = answered.load(Ordering::Acquire);
            let turn = std::mem::replace(&mut *lock(&self.turn), Turn::Waiting);
            match turn {
                Turn::Waiting => atomic_wait::wait(answered, seen),
                Turn::Lead => return None,
                Turn::Done(result) => return Some(result),
            }
        }
    }
}

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

/// One partition's log.
#[derive(Debug)]
pub(crate) struct Partition {
    pub topic: String,
    pub id: u32,
    pub dir: PathBuf,
    pub options: Options,
    queue: Mutex<Queue>,
    /// Wakes a gathering leader once enough requests are queued.
    gathered: Condvar,
    /// Bumped after turns are set; waiting publishers sleep on it.
    answered: AtomicU32,
    pub(crate) writer: Mutex<WriterState>,
    pub(crate) read: RwLock<ReadState>,
    /// Where readers in other processes learn what is acked (`acked`).
    pub(crate) acked: OnceLock<AckedEnd>,
    /// Open files of recently read sealed segments.
    pub(crate) sealed_files: Mutex<FileCache>,
    /// Leads rounds for async publishers (see the module documentation).
    committer: Mutex<Option<Committer>>,
    /// Which sealed segments may hold a UID (see `locator`).
    pub(crate) locator: crate::uid::locator::LocatorCell,
}

/// Whom [`Partition::pass_lead`] handed the lead to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lead {
    /// Nobody: the queue is empty.
    Ended,
    /// A sync publisher, to be woken.
    Publisher,
    /// The commit thread, to be called (only async publishers wait).
    Committer,
}

impl Partition {
    pub(crate) fn new(
        topic: String,
        id: u32,
        dir: PathBuf,
        options: Options,
        writer: WriterState,
        read: ReadState,
    ) -> Self {
        let open_files = Arc::clone(&options.open_files);
        Self {
            topic,
            id,
            dir,
            options,
            queue: Mutex::default(),
            gathered: Condvar::new(),
            answered: AtomicU32::new(0),
            writer: Mutex::new(writer),
            read: RwLock::new(read),
            acked: OnceLock::new(),
            sealed_files: Mutex::new(FileCache::new(open_files)),
            committer: Mutex::new(None),
            locator: crate::uid::locator::LocatorCell::default(),
        }
    }

    pub(crate) fn reader(&self) -> RwLockReadGuard<'_, ReadState> {
        self.read
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn read_mut(&self) -> RwLockWriteGuard<'_, ReadState> {
        self.read
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn poisoned_error(&self, cause: &Poison) -> BusError {
        cause.error(&self.topic, self.id)
    }

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

    /// One writer round: dedup, assign offsets, write, fsync, publish. A
    /// request that cannot be framed or whose dedup lookup fails fails alone.
    fn commit(&self, round: &[Request]) -> Vec<Result<Vec<u64>, BusError>> {
        let mut writer = lock(&self.writer);
        if let Some(cause) = writer.poisoned.clone() {
            return round
                .iter()
                .map(|_| Err(self.poisoned_error(&cause)))
                .collect();
        }
        let mut next = writer.next;
        let mut fresh: HashMap<&str, u64> = HashMap::default();
        let mut new_uids = Vec::new();
        let mut to_write: Vec<&NewRecord> = Vec::new();
        let mut results = Vec::with_capacity(round.len());
        let mut dedup_hits = 0;
        for request in round {
            let known = frame::checked_body_len(&request.records)
                .map_err(|reason| BusError::invalid("records", reason))
                .and_then(|_| self.stored_uids(request));
            let known = match known {
                Ok(known) => known,
                Err(error) => {
                    results.push(Err(error));
                    continue;
                }
            };
            let mut mine = Vec::with_capacity(request.records.len());
            for (record, known) in request.records.iter().zip(known) {
                if let Some(uid) = record.uid.as_deref() {
                    if !request.dedup {
                        new_uids.push((uid.to_owned(), next));
                    } else if let Some(offset) = fresh.get(uid).copied().or(known) {
                        dedup_hits += 1;
                        mine.push(offset);
                        continue;
                    } else {
                        fresh.insert(uid, next);
                        new_uids.push((uid.to_owned(), next));
                    }
                }
                to_write.push(record);
                mine.push(next);
                next += 1;
            }
            results.push(Ok(mine));
        }
        metrics::dedup_hits("embedded", &self.topic, dedup_hits);
        let outcome = if to_write.is_empty() {
            Ok(())
        } else {
            self.write_frame(&mut writer, &to_write, new_uids)
        };
        let failure = |error: &WriteError| match error {
            WriteError::Refused(reason) => BusError::invalid("records", reason.clone()),
            WriteError::Failed(cause) => self.poisoned_error(cause),
        };
        let error = match outcome {
            Ok(()) if to_write.is_empty() => return results,
            Ok(()) => {
                tracing::debug!(
                    topic = %self.topic,
                    partition = self.id,
                    requests = round.len(),
                    records = to_write.len(),
                    "group-commit round written and synced"
                );
                metrics::commit_round("embedded", to_write.len());
                // Acked and visible to fetch from here on.
                self.announce(writer.base, writer.pos);
                return results;
            }
            Err(error) => error,
        };
        if let WriteError::Failed(cause) = &error {
            tracing::error!(
                topic = %self.topic,
                partition = self.id,
                %cause,
                "write or fsync failed: partition poisoned until the bus is reopened"
            );
            writer.poisoned = Some(cause.clone());
        }
        results
            .into_iter()
            .map(|result| result.and_then(|_| Err(failure(&error))))
            .collect()
    }

    /// The stored offset of each record's UID (`None` without one, or when
    /// no stored copy authenticates under the request's key).
    fn stored_uids(&self, request: &Request) -> Result<Vec<Option<u64>>, BusError> {
        request
            .records
            .iter()
            .map(|record| match record.uid.as_deref() {
                Some(uid) if request.dedup => self.find_uid(uid, request.auth.as_ref()),
                _ => Ok(None),
            })
            .collect()
    }

    fn write_frame(
        &self,
        writer: &mut WriterState,
        records: &[&NewRecord],
        new_uids: Vec<(String, u64)>,
    ) -> Result<(), WriteError> {
        let stored_at = now_ms();
        // A large batch goes out as several bounded frames in this one
        // write and fsync, so reading one record never verifies the rest.
        let (bytes, frames) =
            frame::encode_batch(writer.next, stored_at, records, &mut writer.encoder)
                .map_err(WriteError::Refused)?;
        let len = bytes.len() as u64;
        self.roll_if_due(writer, len, stored_at)
            .map_err(WriteError::Failed)?;
        let files = &self.options.files;
        files
            .write_all_at(&writer.file, &bytes, writer.pos)
            .map_err(|e| WriteError::Failed(Poison::io("write", e)))?;
        let allocated = writer.allocated;
        self.zero_ahead(writer, writer.pos + len, len)
            .map_err(|e| WriteError::Failed(Poison::io("write", e)))?;
        // The file grew: its new extent is stored once this fsync made it
        // durable, before the ack (once per up to 4 MiB of small frames).
        let extended = writer.allocated > allocated;
        match self.options.durability {
            Durability::Sync => {
                let started = Instant::now();
                files
                    .sync_data(&writer.file)
                    .map_err(|e| WriteError::Failed(Poison::io("fsync", e)))?;
                metrics::fsync("embedded", started.elapsed());
            }
            Durability::Interval(_) => writer.dirty = true,
        }
        metrics::stored("embedded", &self.topic, records.len() as u64, len);
        let pos = writer.pos;
        writer.pos += len;
        writer.next += records.len() as u64;
        let mut entries = Vec::new();
        for (frame_base, at, compressed) in frames {
            let frame_pos = pos + at;
            if frame::index_due(
                writer.last_indexed,
                frame_base,
                frame_pos,
                compressed,
                self.options.index_interval_bytes,
            ) {
                entries.push((frame_base, frame_pos));
                writer.last_indexed = Some((frame_base, frame_pos));
            }
        }
        if extended && let Err(error) = self.store_point(writer) {
            // The frame is durable; only the recovery point stays behind.
            tracing::warn!(
                topic = %self.topic,
                partition = self.id,
                %error,
                "recovery point not advanced (the frame is durable)"
            );
        }
        let mut read = self.read_mut();
        let read = &mut *read;
        if let Some(active) = read.segments.last_mut() {
            active.index.entries.extend(entries);
            active.index.len = writer.pos;
            active.index.end = writer.next;
            active.index.max_ts = active.index.max_ts.max(stored_at);
            active.index.min_ts.get_or_insert(stored_at);
        }
        for (uid, offset) in new_uids {
            read.uids.push(uid, offset);
        }
        Ok(())
    }

    /// Extends the active segment with zeros past `end` (where a frame of
    /// `len` bytes just ended), when it has none left and the frame is small
    /// and durability is `Sync` (under `Interval`, frames written into
    /// zeros could reach the disk out of order, and recovery could no
    /// longer tell an unsynced tail from damage). Written in the same round
    /// as the frame, so one fsync covers both. Each extension (once per up
    /// to 4 MiB) also advances the recovery point, after that fsync.
    fn zero_ahead(&self, writer: &mut WriterState, end: u64, len: u64) -> std::io::Result<()> {
        if end <= writer.allocated {
            return Ok(());
        }
        let ahead = match self.options.durability {
            Durability::Sync if len < ZERO_AHEAD_FRAMES_UNDER => {
                end.clamp(ZERO_AHEAD_MIN, ZERO_AHEAD_MAX)
            }
            // A hole costs no disk: room for the next large write or more,
            // so its extent is stored at most every other such write (every
            // 4 MiB for batches of ~200 KB).
            Durability::Sync => len.max(ZERO_AHEAD_MAX),
            Durability::Interval(_) => 0,
        };
        // Never past the size at which the segment rolls.
        let target = end
            .saturating_add(ahead)
            .min(end.max(self.options.segment_bytes));
        if len < ZERO_AHEAD_FRAMES_UNDER {
            static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
            let mut at = end;
            while at < target {
                let n = usize::try_from(target - at).map_or(ZEROS.len(), |n| n.min(ZEROS.len()));
                self.options
                    .files
                    .write_all_at(&writer.file, &ZEROS[..n], at)?;
                at += n as u64;
            }
        } else if target > end {
            // A large frame's fsync is dominated by its own bytes: the
            // space past it is a hole (reads as zeros, writes nothing), so
            // the file's extent still covers every acked frame.
            self.options.files.set_len(&writer.file, target)?;
        }
        writer.allocated = target;
        Ok(())
    }

    /// The retained range: the oldest segment's base to the next offset.
    pub(crate) fn offsets(&self) -> PartitionOffsets {
        let read = self.reader();
        let first = read.segments.first().map_or(0, |s| s.base);
        let next = read.segments.last().map_or(first, |s| s.index.end);
        PartitionOffsets { first, next }
    }
}

impl Partition {
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
}

/// Cuts the zeros written ahead off the active segment of the partition in
/// `dir` (a seal, a clean close). The recovery point's extent goes down
/// first: a crash between the two must not leave a file shorter than its
/// stored extent, which reads as a segment cut after the fact.
pub(crate) fn trim_zeros(
    dir: &Path,
    files: &dyn crate::options::FileLayer,
    writer: &mut WriterState,
) -> std::io::Result<()> {
    if writer.allocated <= writer.pos {
        return Ok(());
    }
    if writer.dirty {
        files.sync_data(&writer.file)?;
        writer.dirty = false;
    }
    if let Some(point) = writer.durable_point().map(RecoveryPoint::without_zeros)
        && writer.recovery_point != Some(point)
    {
        checkpoint::write(dir, &point)?;
        writer.recovery_point = Some(point);
    }
    files.set_len(&writer.file, writer.pos)?;
    files.sync_data(&writer.file)?;
    writer.allocated = writer.pos;
    Ok(())
}

impl Drop for Partition {
    /// A clean close leaves no zeros past the last frame (so a closed
    /// segment ends with its last frame, as after a roll) and records the
    /// whole log as known complete: a closed segment found shorter on the
    /// next open is damage, not a torn tail.
    fn drop(&mut self) {
        let committer = self
            .committer
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(Committer { bell, thread }) = committer {
            drop(bell);
            // The thread may hold the last handle (dropping it there).
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
        let read = self
            .read
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let active_index = read.segments.last().map(|s| s.index.clone());
        let active_uids = &read.uids;
        let writer = self
            .writer
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if writer.poisoned.is_some() {
            return;
        }
        let files = &self.options.files;
        if let Err(error) = trim_zeros(&self.dir, files.as_ref(), writer) {
            tracing::warn!(
                topic = %self.topic,
                partition = self.id,
                %error,
                "zeros written ahead not trimmed at close (the next open recovers the segment)"
            );
            return;
        }
        if writer.dirty && files.sync_data(&writer.file).is_err() {
            return;
        }
        writer.dirty = false;
        if let Some(point) = writer.durable_point()
            && writer.recovery_point != Some(point)
        {
            // Without it the next open treats this segment's tail as
            // unverified, as after a crash: nothing is lost by failing here.
            match checkpoint::write(&self.dir, &point) {
                Ok(()) => writer.recovery_point = Some(point),
                Err(error) => tracing::warn!(
                    topic = %self.topic,
                    partition = self.id,
                    %error,
                    "recovery point not saved at close"
                ),
            }
        }
        // The active segment's index and UID table as of this close, so
        // the next open reads them instead of every frame (they name the
        // bytes they cover, and are used only while those are all of the
        // segment and the recovery point says so).
        if writer.recovery_point == writer.durable_point()
            && writer.hinted_len != Some(writer.pos)
            && let Err(error) = store_active_hints(&self.dir, active_index, active_uids, writer)
        {
            tracing::warn!(
                topic = %self.topic,
                partition = self.id,
                %error,
                "active segment's index not saved at close (the next open reads the segment)"
            );
        }
        // The UID locator's file (rewritten as it changed), synced so the
        // next open's first lookup reads it back instead of every table
        // (one covering no segment is built for free: not worth an fsync
        // per partition).
        if let Some(locator) = self.locator.unpersisted()
            && locator.covered().next().is_some()
            && let Err(error) = locator.sync()
        {
            tracing::warn!(
                topic = %self.topic,
                partition = self.id,
                %error,
                "UID locator not saved at close (the next open rebuilds it)"
            );
        }
    }
}

/// Writes the active segment's index and UID table as of a clean close.
fn store_active_hints(
    dir: &std::path::Path,
    index: Option<SegmentIndex>,
    active_uids: &UidIndex,
    writer: &WriterState,
) -> Result<(), BusError> {
    let Some(index) = index.filter(|i| i.len == writer.pos && i.end == writer.next) else {
        return Ok(());
    };
    let uids = writer.active_list(active_uids)?;
    let Some(table) = crate::uid::table::encode(
        crate::uid::keyed::Key::random(),
        writer.base,
        index.end,
        index.len,
        &uids,
    ) else {
        return Ok(());
    };
    let path = |ext| crate::log::segment::path(dir, writer.base, ext);
    crate::fsutil::write_atomic(
        &path(crate::log::segment::CLOSED_IDX),
        &crate::log::index::encode_index(writer.base, &index),
    )?;
    crate::fsutil::write_atomic(&path(crate::log::segment::CLOSED_UIDS), &table)?;
    Ok(())
}

/// The answer to an async publish (see [`Partition::append_async`]).
#[cfg(feature = "async")]
#[derive(Debug)]
pub(crate) struct Answer(Option<Arc<Slot>>);

#[cfg(feature = "async")]
impl std::future::Future for Answer {
    type Output = Result<Vec<u64>, BusError>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let Some(slot) = &self.0 else {
            return std::task::Poll::Ready(Ok(Vec::new()));
        };
        let mut turn = lock(&slot.turn);
        match std::mem::replace(&mut *turn, Turn::Waiting) {
            Turn::Done(result) => std::task::Poll::Ready(result),
            // An async publisher is never handed the lead.
            Turn::Lead => std::task::Poll::Ready(Err(BusError::backend(
                "embedded",
                "an async publisher was handed the writer's lead",
            ))),
            Turn::Waiting => {
                // Registered while the turn is locked: `set` takes the
                // waker only after it changed the turn.
                *lock(&slot.waker) = Some(cx.waker().clone());
                std::task::Poll::Pending
            }
        }
    }
}

enum WriteError {
    /// Nothing was written (the batch cannot be framed).
    Refused(String),
    /// A write or fsync failed: poison.
    Failed(Poison),
}

fn take_round(pending: &mut Vec<Request>) -> Vec<Request> {
    let mut bytes = 0;
    let mut take = 0;
    for request in pending.iter() {
        let size = request
            .records
            .iter()
            .map(frame::record_size)
            .sum::<usize>();
        if take > 0 && bytes + size > ROUND_BYTES {
            break;
        }
        bytes += size;
        take += 1;
    }
    pending.drain(..take).collect()
}

impl Partition {
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

impl Partition {
    /// Frames written from now on are stored as `compression` says.
    pub(crate) fn set_compression(&self, compression: bus_core::Compression) {
        lock(&self.writer).encoder.set(compression);
    }
}

impl WriterState {
    /// Every `(uid, offset)` of the active segment, by offset, to seal it
    /// or to store it at a clean close: the prefix table's, if any, then
    /// `rest` (the partition's [`ReadState::uids`]).
    pub(crate) fn active_list(&self, rest: &UidIndex) -> Result<Vec<(String, u64)>, BusError> {
        let mut uids = match &self.active_prefix {
            Some(prefix) => prefix.entries()?,
            None => Vec::new(),
        };
        uids.append(&mut rest.entries());
        Ok(uids)
    }

    /// What the writer has made durable: everything it wrote, unless
    /// bytes written under `Durability::Interval` are still unsynced.
    pub(crate) fn durable_point(&self) -> Option<RecoveryPoint> {
        (!self.dirty && self.poisoned.is_none()).then_some(RecoveryPoint {
            base: self.base,
            len: self.pos,
            next: self.next,
            extent: self.allocated,
        })
    }
}

impl Partition {
    /// Records how far the log is durable, when that moved (fsyncing bytes
    /// written under `Durability::Interval` first). A poisoned partition
    /// keeps its last recovery point.
    pub(crate) fn save_recovery_point(&self) -> Result<(), BusError> {
        let mut writer = lock(&self.writer);
        if writer.poisoned.is_some() {
            return Ok(());
        }
        if writer.dirty {
            drop(writer);
            self.flush()?;
            writer = lock(&self.writer);
        }
        self.store_point(&mut writer)?;
        Ok(())
    }

    /// Writes the writer's durable point if it differs from the stored one.
    pub(crate) fn store_point(&self, writer: &mut WriterState) -> std::io::Result<()> {
        let Some(point) = writer.durable_point() else {
            return Ok(());
        };
        if writer.recovery_point == Some(point) {
            return Ok(());
        }
        checkpoint::write(&self.dir, &point)?;
        writer.recovery_point = Some(point);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn request(id: u64, value_bytes: usize) -> Request {
        Request {
            records: vec![NewRecord {
                key: id.to_string(),
                uid: None,
                tag: None,
                value: vec![b'1'; value_bytes],
            }],
            auth: None,
            dedup: true,
            slot: Arc::new(Slot::new()),
        }
    }

    #[test]
    fn cached_files_beyond_a_partitions_share_come_from_the_bus_budget() {
        let budget = Arc::new(AtomicUsize::new(0));
        let file = || Arc::new(File::open("/dev/null").unwrap());
        let held = |cache: &FileCache| cache.files.len();
        let mut a = FileCache::new(Arc::clone(&budget));
        for base in 0..(FileCache::CAP + 5) as u64 {
            a.put(base, file());
        }
        assert_eq!(
            (held(&a), budget.load(Ordering::Relaxed)),
            (FileCache::CAP + 5, 5)
        );
        // Another partition takes the rest of the budget, then recycles.
        let mut b = FileCache::new(Arc::clone(&budget));
        for base in 0..(FileCache::CAP + FileCache::BUS_BUDGET + 10) as u64 {
            b.put(base, file());
        }
        assert_eq!(budget.load(Ordering::Relaxed), FileCache::BUS_BUDGET);
        assert_eq!(held(&b), FileCache::CAP + FileCache::BUS_BUDGET - 5);
        assert!(
            b.get(FileCache::BUS_BUDGET as u64 + 17).is_some(),
            "newest kept"
        );
        assert!(b.get(0).is_none(), "oldest closed");
        // Retention and drop give it back.
        b.retain_from(u64::MAX);
        assert_eq!((held(&b), budget.load(Ordering::Relaxed)), (0, 5));
        drop(a);
        assert_eq!(budget.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn an_oversized_request_gets_a_round_of_its_own() {
        let mut pending = vec![request(0, 10), request(1, ROUND_BYTES), request(2, 10)];
        let ids = |round: Vec<Request>| {
            round
                .iter()
                .map(|r| r.records[0].key.parse::<u64>().unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(take_round(&mut pending)), vec![0]);
        assert_eq!(ids(take_round(&mut pending)), vec![1]);
        assert_eq!(ids(take_round(&mut pending)), vec![2]);
    }
}
