//! Read-only opens (contract C16): the partitions of a data directory that
//! another process may be writing, read without its lock and without
//! writing anything: no recovery truncation, no index rebuilt on disk, no
//! new file. Before each read a partition's view is refreshed from the
//! files: frames up to the writer's acked end (see `acked`), segments
//! rolled since, segments retention deleted. An incomplete tail is taken
//! as not yet written.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bus_core::BusError;

use crate::log::index::{self, SegmentIndex};
use crate::log::segment::{self, FrameReader, IDX, LOG, UIDS};
use crate::options::Options;
use crate::partition::acked::{AckedEnd, Limit, Stored};
use crate::partition::poison::Poison;
use crate::partition::{Partition, ReadState, SegmentMeta, WriterState};
use crate::uid::table::Table;
use bus_core::backend::sync::lock;

/// Why a read-only partition's writer state refuses every append.
const READ_ONLY: &str = "write: the bus was opened read-only";

/// Opens the partition stored in `dir` for reading only.
pub(crate) fn open_partition(
    topic: &str,
    id: u32,
    dir: PathBuf,
    options: &Options,
    no_writer: bool,
) -> Result<Partition, BusError> {
    // Never written through: poisoned, so an append fails before any I/O,
    // and dropping the partition trims nothing.
    let placeholder = File::open(&dir)?;
    let writer = WriterState {
        file: Arc::new(placeholder),
        base: 0,
        pos: 0,
        next: 0,
        last_indexed: None,
        active_prefix: None,
        hinted_len: None,
        poisoned: Some(Poison::note(READ_ONLY)),
        dirty: false,
        synced: 0,
        allocated: 0,
        recovery_point: None,
        encoder: crate::log::codec::Encoder::new(bus_core::Compression::None),
    };
    let partition = Partition::new(
        topic.to_owned(),
        id,
        dir,
        options.clone(),
        writer,
        ReadState::default(),
    );
    partition.refresh_with(no_writer)?;
    Ok(partition)
}

/// Whole frames of one segment read past a known point.
#[derive(Debug, Default)]
struct Tail {
    entries: Vec<(u64, u64)>,
    end: u64,
    len: u64,
    max_ts: u64,
    min_ts: Option<u64>,
    uids: Vec<(String, u64)>,
}

impl Tail {
    fn apply(self, index: &mut SegmentIndex, uids: &mut crate::uid::index::UidIndex) {
        index.entries.extend(self.entries);
        index.end = self.end;
        index.len = self.len;
        index.max_ts = index.max_ts.max(self.max_ts);
        if let Some(min) = self.min_ts {
            index.min_ts = Some(index.min_ts.map_or(min, |old| old.min(min)));
        }
        for (uid, offset) in self.uids {
            uids.push(uid, offset);
        }
    }
}

/// What is known of a segment: records up to offset `end` in its first
/// `len` bytes, the last sparse-index entry at byte `last_indexed`.
#[derive(Debug, Clone, Copy)]
struct Known {
    end: u64,
    len: u64,
    last_indexed: Option<(u64, u64)>,
}

impl Known {
    fn of(index: &SegmentIndex) -> Self {
        Self {
            end: index.end,
            len: index.len,
            last_indexed: index.entries.last().copied(),
        }
    }

    fn empty(base: u64) -> Self {
        Self {
            end: base,
            len: 0,
            last_indexed: None,
        }
    }
}

/// How far a segment's bytes are known to hold whole acked frames.
#[derive(Debug, Clone, Copy)]
enum Complete {
    /// Nothing is known: a frame that is incomplete or does not follow may
    /// be one the writer has not finished.
    Unknown,
    /// The first `n` bytes: the writer's acked end, or the whole of a
    /// segment that precedes the acked one. A frame starting below it that
    /// does not verify is damage to acked records.
    Upto(u64),
}

impl Complete {
    fn of(limit: Limit, base: u64) -> Self {
        match limit {
            // An Interval writer marks no acked end (every whole frame is
            // shown, a torn one may be its unfinished write).
            Limit::Whole | Limit::Acked { base: u64::MAX, .. } => Self::Unknown,
            Limit::Acked { base: acked, .. } if base < acked => Self::Upto(u64::MAX),
            Limit::Acked { base: acked, len } if base == acked => Self::Upto(len),
            Limit::Acked { .. } => Self::Unknown,
        }
    }
}

/// The whole frames of `file` past what is `known`, up to `limit` bytes:
/// where a frame is incomplete or does not follow, the writer has not
/// finished it, unless it starts where the bytes are known `complete`:
/// then it is damage, `Corrupt` naming the segment and offset (as the
/// writer's open would report it).
fn read_tail(
    path: &Path,
    file: &File,
    known: Known,
    limit: u64,
    complete: Complete,
    interval: u64,
) -> Result<Tail, BusError> {
    let mut tail = Tail {
        end: known.end,
        len: known.len,
        ..Tail::default()
    };
    let file_len = file.metadata()?.len();
    let end = limit.min(file_len);
    let complete = match complete {
        Complete::Unknown => 0,
        Complete::Upto(n) => n.min(file_len),
    };
    if end <= known.len {
        return Ok(tail);
    }
    let mut last_indexed = known.last_indexed;
    let mut reader = FrameReader::new(file, known.len, end);
    // The frames of a batch count only once its closing frame is read.
    let mut staged = Tail {
        end: known.end,
        ..Tail::default()
    };
    loop {
        let pos = reader.pos();
        let (base, count, stored_at, uids, continued, compressed) = match reader.next_frame()? {
            Some(Ok(frame)) if frame.base == staged.end && frame.count > 0 => {
                let uids: Vec<(String, u64)> = (frame.base..)
                    .zip(frame.records())
                    .filter_map(|(offset, record)| {
                        let uid = record.uid?;
                        Some((String::from_utf8_lossy(uid).into_owned(), offset))
                    })
                    .collect();
                (
                    frame.base,
                    frame.count,
                    frame.stored_at,
                    uids,
                    frame.continued,
                    frame.codec.is_some(),
                )
            }
            Some(Ok(_)) | Some(Err(_)) | None if pos < complete.min(end) => {
                return Err(BusError::Corrupt {
                    location: path.display().to_string(),
                    offset: tail.end,
                    reason: format!(
                        "no whole frame at byte {pos}, below the {complete} bytes the writer acked"
                    ),
                });
            }
            _ => return Ok(tail),
        };
        if crate::log::frame::index_due(last_indexed, base, pos, compressed, interval) {
            staged.entries.push((base, pos));
            last_indexed = Some((base, pos));
        }
        staged.uids.extend(uids);
        staged.max_ts = staged.max_ts.max(stored_at);
        staged.min_ts = Some(staged.min_ts.map_or(stored_at, |t| t.min(stored_at)));
        staged.end = base + u64::from(count);
        if !continued {
            tail.entries.append(&mut staged.entries);
            tail.uids.append(&mut staged.uids);
            tail.max_ts = tail.max_ts.max(staged.max_ts);
            tail.min_ts = match (tail.min_ts, staged.min_ts) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            tail.end = staged.end;
            tail.len = reader.pos();
        }
    }
}

/// A sealed segment's index and UIDs: its hint files when they fit, else
/// read from the segment in memory (never written back).
fn load_sealed(
    dir: &Path,
    base: u64,
    file: &File,
    complete: Complete,
    interval: u64,
) -> Result<(SegmentIndex, Vec<(String, u64)>), BusError> {
    let log_len = file.metadata()?.len();
    let index = index::read_hint(&segment::path(dir, base, IDX))
        .and_then(|bytes| index::decode_index(&bytes, base, log_len));
    if let Some(index) = index {
        let path = segment::path(dir, base, UIDS);
        let table = File::open(&path)
            .ok()
            .and_then(|file| Table::load(file, base, index.end, index.len).ok())
            .and_then(|table| table.entries().ok());
        if let Some(uids) = table.or_else(|| {
            index::read_hint(&path).and_then(|bytes| index::decode_uids(&bytes, base, index.end))
        }) {
            return Ok((index, uids));
        }
    }
    let path = segment::path(dir, base, LOG);
    let tail = read_tail(
        &path,
        file,
        Known::empty(base),
        u64::MAX,
        complete,
        interval,
    )?;
    let index = SegmentIndex {
        entries: tail.entries,
        end: tail.end,
        len: tail.len,
        max_ts: tail.max_ts,
        min_ts: tail.min_ts,
    };
    Ok((index, tail.uids))
}

impl Partition {
    /// Brings this read-only partition's view up to what the writer has
    /// acked. Cheap when nothing changed: one read of the marker and one
    /// `stat` of the oldest segment (which retention may have deleted).
    pub(crate) fn refresh(&self) -> Result<(), BusError> {
        self.refresh_with(false)
    }

    /// [`Partition::refresh`]; `no_writer`: no writer held the directory
    /// when this reader opened, so every whole frame on disk is what the
    /// next writer's recovery keeps, whatever the marker says (a power loss
    /// can leave it empty or older than the fsynced frames). A later
    /// writer's recovery stores a marker at least that far.
    fn refresh_with(&self, no_writer: bool) -> Result<(), BusError> {
        // A read-only partition has no writer: its lock orders refreshes.
        let _refreshing = lock(&self.writer);
        if self.acked.get().is_none()
            && let Some(marker) = AckedEnd::open(&self.dir)?
        {
            let _ = self.acked.set(marker);
        }
        // No writer: the marker is not read at all. A power cut can leave
        // it empty, stale, torn or garbage (never fsynced), and even a torn
        // one must not hide fsynced, acked frames (#29).
        let limit = match self.acked.get() {
            _ if no_writer => Limit::Whole,
            None => Limit::Whole,
            Some(marker) => match marker.load()? {
                Stored::Point { base, len } => Limit::Acked { base, len },
                // No writer is appending (see `acked`): a power loss took
                // the unsynced marker, or a writer is opening (after its
                // recovery, before its first store).
                Stored::Unwritten => Limit::Whole,
                // Being rewritten: nothing new yet.
                Stored::Torn => return Ok(()),
            },
        };
        let (active, oldest) = {
            let read = self.reader();
            let active = read.segments.last().map(|s| (s.base, s.index.len));
            // Even the only one: retention rolls an old active segment
            // before deleting it, without a new round to move the marker.
            let oldest = read.segments.first().map(|s| s.path.clone());
            (active, oldest)
        };
        let rolled = match (limit, active) {
            (Limit::Acked { base, .. }, Some((active, _))) => base != active,
            _ => true,
        };
        let expired = oldest.is_some_and(|path| !path.exists());
        if !rolled && !expired {
            if let (Limit::Acked { len, .. }, Some((_, known))) = (limit, active)
                && len == known
            {
                return Ok(());
            }
            return self.grow_active(limit);
        }
        self.relist(limit)
    }

    /// Reads the active segment's new frames.
    fn grow_active(&self, limit: Limit) -> Result<(), BusError> {
        let (file, path, base, known) = {
            let read = self.reader();
            let Some(active) = read.segments.last() else {
                return Ok(());
            };
            let Some(file) = active.file.clone() else {
                return Ok(());
            };
            (
                file,
                active.path.clone(),
                active.base,
                Known::of(&active.index),
            )
        };
        let tail = read_tail(
            &path,
            &file,
            known,
            limit.of(base),
            Complete::of(limit, base),
            self.options.index_interval_bytes,
        )?;
        let mut read = self.read_mut();
        let read = &mut *read;
        if let Some(active) = read.segments.last_mut()
            && active.base == base
            && active.index.len == known.len
        {
            tail.apply(&mut active.index, &mut read.uids);
        }
        Ok(())
    }

    /// Matches the known segments against the directory: drops what
    /// retention deleted, finishes the old active segment when a newer one
    /// exists, and adds the new ones.
    fn relist(&self, limit: Limit) -> Result<(), BusError> {
        let bases = segment::list(&self.dir)?;
        let Some(&oldest) = bases.first() else {
            return Ok(());
        };
        let newest = bases[bases.len() - 1];
        let interval = self.options.index_interval_bytes;
        let mut read = self.read_mut();
        let read = &mut *read;
        let before = read.segments.len();
        read.segments.retain(|s| s.base >= oldest);
        if read.segments.len() != before {
            read.uids.retain_from(oldest);
            lock(&self.sealed_files).retain_from(oldest);
        }
        let known = read.segments.last().map(|s| s.base);
        if let Some(active) = read.segments.last_mut() {
            let sealed = newest > active.base;
            let file = match active.file.clone() {
                Some(file) => file,
                None => Arc::new(File::open(&active.path)?),
            };
            let known = Known::of(&active.index);
            let bytes = if sealed {
                u64::MAX
            } else {
                limit.of(active.base)
            };
            let complete = Complete::of(limit, active.base);
            read_tail(&active.path, &file, known, bytes, complete, interval)?
                .apply(&mut active.index, &mut read.uids);
            active.file = if sealed { None } else { Some(file) };
        }
        for &base in bases.iter().filter(|&&b| known.is_none_or(|k| b > k)) {
            let path = segment::path(&self.dir, base, LOG);
            let file = match File::open(&path) {
                Ok(file) => file,
                // Deleted since the listing: the next refresh sees that.
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => break,
                Err(error) => return Err(error.into()),
            };
            let mut index = SegmentIndex {
                end: base,
                ..SegmentIndex::default()
            };
            if base < newest {
                let complete = Complete::of(limit, base);
                let (loaded, uids) = load_sealed(&self.dir, base, &file, complete, interval)?;
                index = loaded;
                for (uid, offset) in uids {
                    read.uids.push(uid, offset);
                }
            } else {
                let complete = Complete::of(limit, base);
                read_tail(
                    &path,
                    &file,
                    Known::empty(base),
                    limit.of(base),
                    complete,
                    interval,
                )?
                .apply(&mut index, &mut read.uids);
            }
            read.segments.push(SegmentMeta {
                base,
                path,
                index,
                file: (base == newest).then(|| Arc::new(file)),
                uids: None,
            });
        }
        Ok(())
    }
}
