//! Tuning knobs of the embedded log, and the file layer the writer goes
//! through (so tests can inject write and fsync failures).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use crate::notifier::Notifier;

/// When a publish is acknowledged relative to `fdatasync`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Durability {
    /// Ack only after the record's bytes are fsynced (group commit shares
    /// one fsync among concurrent publishers). The default.
    #[default]
    Sync,
    /// Ack right after the write, *before* fsync; a background thread
    /// fsyncs dirty partitions every this many milliseconds (and stores
    /// how far that fsync reached). A crash (power loss, not just a killed
    /// process) may lose acked records of the last interval, and they are
    /// visible to fetch before they are durable: after a power cut, even a
    /// torn one, the log reopens cut at the first record that did not
    /// reach the disk, and every record the last completed fsync covered is
    /// there. A failed background fsync poisons the partition
    /// ([`BusError::Poisoned`](bus_core::BusError::Poisoned), saying the
    /// records acked since the last good fsync are lost) and is never
    /// retried; the records it covered are cut from the log at once, and
    /// a reopen recovers a consistent log without them.
    Interval(u64),
}

/// The file operations the partition writer performs, behind a trait so a
/// test can make the Nth write or sync fail.
#[doc(hidden)]
pub trait FileLayer: Send + Sync + std::fmt::Debug {
    /// Writes all of `buf` at `pos`.
    fn write_all_at(&self, file: &File, buf: &[u8], pos: u64) -> std::io::Result<()>;
    /// `fdatasync`.
    fn sync_data(&self, file: &File) -> std::io::Result<()>;
    /// `ftruncate`: the zeros written ahead of the last frame go when a
    /// segment is sealed or closed.
    fn set_len(&self, file: &File, len: u64) -> std::io::Result<()> {
        file.set_len(len)
    }
    /// The fsync of the active segment when a partition is opened, so
    /// bytes a killed writer left unsynced are durable before they are
    /// read. Separate from [`FileLayer::sync_data`] so counting the
    /// writer's syncs is unaffected.
    fn sync_recovered(&self, file: &File) -> std::io::Result<()> {
        file.sync_all()
    }
}

/// The real file system.
#[derive(Debug, Default)]
pub(crate) struct OsFiles;

impl FileLayer for OsFiles {
    fn write_all_at(&self, file: &File, buf: &[u8], pos: u64) -> std::io::Result<()> {
        file.write_all_at(buf, pos)
    }

    fn sync_data(&self, file: &File) -> std::io::Result<()> {
        file.sync_data()
    }
}

/// Options of [`crate::EmbeddedBus::open_with`]; `Default` is what
/// [`crate::EmbeddedBus::open`] uses.
///
/// ```
/// use bus_embedded::{Durability, Options};
/// let options = Options::default()
///     .durability(Durability::Sync)
///     .segment_bytes(16 << 20)
///     .index_interval_bytes(4096);
/// assert_eq!(options.segment_bytes, 16 << 20);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Options {
    /// When publishes are acked (default [`Durability::Sync`]).
    pub durability: Durability,
    /// A segment is rolled before it would grow past this (default 32 MiB).
    pub segment_bytes: u64,
    /// A non-empty segment is rolled once its first record is this old.
    pub segment_max_age_ms: Option<u64>,
    /// Bytes of frames between two sparse-index entries (default 4 KiB).
    pub index_interval_bytes: u64,
    /// Open without the writer's lock and never write (see
    /// [`crate::EmbeddedBus::open_read_only`]). Default false.
    pub read_only: bool,
    pub(crate) files: Arc<dyn FileLayer>,
    /// The bus's live subscriptions; each open gets its own.
    pub(crate) notifier: Arc<Notifier>,
    /// Sealed segments' files the bus keeps open beyond each partition's
    /// first few (see `partition::FileCache`); each open gets its own.
    pub(crate) open_files: Arc<std::sync::atomic::AtomicUsize>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            durability: Durability::Sync,
            segment_bytes: 32 << 20,
            segment_max_age_ms: None,
            index_interval_bytes: 4096,
            read_only: false,
            files: Arc::new(OsFiles),
            notifier: Arc::default(),
            open_files: Arc::default(),
        }
    }
}

impl Options {
    /// Sets the durability mode.
    #[must_use]
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Sets the segment size (at least 1 byte; a frame larger than it gets a
    /// segment of its own).
    #[must_use]
    pub fn segment_bytes(mut self, bytes: u64) -> Self {
        self.segment_bytes = bytes.max(1);
        self
    }

    /// Sets the segment age limit.
    #[must_use]
    pub fn segment_max_age_ms(mut self, ms: Option<u64>) -> Self {
        self.segment_max_age_ms = ms;
        self
    }

    /// Sets the sparse-index spacing.
    #[must_use]
    pub fn index_interval_bytes(mut self, bytes: u64) -> Self {
        self.index_interval_bytes = bytes.max(1);
        self
    }

    /// Opens read-only (see [`crate::EmbeddedBus::open_read_only`]).
    #[must_use]
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// Routes the writer's file operations through `files` (fault-injection tests).
    #[doc(hidden)]
    #[must_use]
    pub fn file_layer(mut self, files: Arc<dyn FileLayer>) -> Self {
        self.files = files;
        self
    }
}
