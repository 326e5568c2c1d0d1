//! One partition of a topic: its state (what readers see, what the writer
//! holds) and the [`Partition`] that owns it. The files beside this one
//! each do one job on a partition:
//!
//! - `queue` and `commit`: publishers queue requests and share writer
//!   rounds (group commit); `write`: one round's dedup, frames, write and
//!   fsync; `full`: a full disk's clean refusal; `flush`: the fsync of
//!   `Durability::Interval`; `close`: the clean close and the recovery point;
//! - `fetch` and `lookup`: the read side (offsets, UIDs); `file_cache`:
//!   open files of sealed segments;
//! - `recovery`, `readonly`, `retention`: opening a partition (for writing
//!   or read-only) and rolling, sealing and deleting segments;
//! - `acked` and `poison`: the acked end for read-only opens, and why a
//!   partition refuses writes; `unordered`: the marker of a writer that
//!   acks before fsync, for recovery.

pub(crate) mod acked;
mod close;
mod commit;
pub(crate) mod fetch;
mod file_cache;
mod flush;
mod full;
pub(crate) mod lookup;
pub(crate) mod poison;
mod queue;
pub(crate) mod readonly;
pub(crate) mod recovery;
pub(crate) mod retention;
pub(crate) mod unordered;
pub(crate) mod write;

use bus_core::backend::sync::lock;
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use bus_core::{BusError, PartitionOffsets};

use crate::log::checkpoint::RecoveryPoint;
use crate::log::index::SegmentIndex;
use crate::options::Options;
use crate::partition::acked::AckedEnd;
use crate::partition::file_cache::FileCache;
use crate::partition::poison::Poison;
use crate::partition::queue::{Committer, Queue};
use crate::uid::index::UidIndex;

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
    /// Bytes written but not yet fsynced ([`Durability::Interval`](crate::options::Durability::Interval)).
    pub dirty: bool,
    /// Bytes of the active segment the writer knows fsynced (under
    /// `Interval`, by the flusher's last fsync; see `flush`).
    pub synced: u64,
    /// Length of the active segment's file: the frames, then zeros
    /// written ahead of `pos` (see [`write::ZERO_AHEAD_FRAMES_UNDER`]).
    pub allocated: u64,
    /// The recovery point last stored (see `checkpoint`).
    pub recovery_point: Option<RecoveryPoint>,
    /// Compresses frames as the topic's spec says (set after open, and
    /// again when a manifest changes it).
    pub encoder: crate::log::codec::Encoder,
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
    /// Leads rounds for async publishers (see `commit`).
    committer: Mutex<Option<Committer>>,
    /// Which sealed segments may hold a UID (see `locator`).
    pub(crate) locator: crate::uid::locator::LocatorCell,
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

    /// The retained range: the oldest segment's base to the next offset.
    pub(crate) fn offsets(&self) -> PartitionOffsets {
        let read = self.reader();
        let first = read.segments.first().map_or(0, |s| s.base);
        let next = read.segments.last().map_or(first, |s| s.index.end);
        PartitionOffsets { first, next }
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
