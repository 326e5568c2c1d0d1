//! One partition of a topic: the group-commit writer, fetch and UID lookup.
//!
//! Publishers queue requests; the first one that finds no writer running
//! becomes the writer for one round: it takes everything queued, assigns
//! offsets, writes one frame, fsyncs once and acks the whole round. Records
//! become visible to fetch (and their UIDs to dedup) only after that.

use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use bus_core::auth::{RecordAuth, RecordParts, TAG_LEN};
use bus_core::{BusError, PartitionOffsets, StoredEvent, now_ms};

use crate::frame::{self, NewRecord, RecordRef};
use crate::index::SegmentIndex;
use crate::options::{Durability, Options};
use crate::segment::FrameReader;

/// Value bytes one writer round takes at most (it always takes one request).
const ROUND_BYTES: usize = 8 << 20;

/// UID → offset.
pub(crate) type UidMap = HashMap<String, u64, fnv::FnvBuildHasher>;

/// A segment as readers see it.
#[derive(Debug)]
pub(crate) struct SegmentMeta {
    pub base: u64,
    pub path: PathBuf,
    pub index: SegmentIndex,
    /// The open file of the active segment; sealed ones are opened per read
    /// so the number of descriptors stays one per partition.
    pub file: Option<Arc<File>>,
}

/// What fetch and lookups read, changed only by durable writes and retention.
#[derive(Debug, Default)]
pub(crate) struct ReadState {
    /// Ascending; the last one is the active segment.
    pub segments: Vec<SegmentMeta>,
    /// UID → offset of every retained record with a UID (first one wins).
    /// FNV rather than SipHash: lookups are on the publish path, and UIDs
    /// come from the bus's own (trusted) callers.
    pub uids: UidMap,
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
    pub last_indexed: Option<u64>,
    /// `(uid, offset)` of the active segment, persisted when it is sealed.
    pub active_uids: Vec<(String, u64)>,
    /// Set by a failed write or fsync; the partition refuses writes until reopen.
    pub poisoned: Option<String>,
    /// Bytes written but not yet fsynced ([`Durability::Interval`]).
    pub dirty: bool,
}

#[derive(Debug, Default)]
struct Queue {
    pending: Vec<Request>,
    next_id: u64,
    leading: bool,
    done: HashMap<u64, Result<Vec<u64>, BusError>>,
}

#[derive(Debug)]
struct Request {
    id: u64,
    records: Vec<NewRecord>,
}

/// One partition's log.
#[derive(Debug)]
pub(crate) struct Partition {
    pub topic: String,
    pub id: u32,
    pub dir: PathBuf,
    pub options: Options,
    queue: Mutex<Queue>,
    turn: Condvar,
    pub(crate) writer: Mutex<WriterState>,
    pub(crate) read: RwLock<ReadState>,
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Where one read of a segment starts.
struct Snapshot {
    /// Offset actually read from (at or past the log start).
    from: u64,
    path: PathBuf,
    file: Option<Arc<File>>,
    entry: (u64, u64),
    len: u64,
    end: u64,
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
        Self {
            topic,
            id,
            dir,
            options,
            queue: Mutex::default(),
            turn: Condvar::new(),
            writer: Mutex::new(writer),
            read: RwLock::new(read),
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

    pub(crate) fn poisoned_error(&self, cause: &str) -> BusError {
        BusError::Poisoned {
            topic: self.topic.clone(),
            partition: self.id,
            cause: cause.to_owned(),
        }
    }

    /// Appends `records` as one frame (sharing a writer round with other
    /// publishers) and returns each record's offset; a record whose UID is
    /// already stored gets the original offset and is not written again.
    pub(crate) fn append(&self, records: Vec<NewRecord>) -> Result<Vec<u64>, BusError> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        if records.iter().all(|r| r.uid.is_some()) {
            let read = self.reader();
            let known: Option<Vec<u64>> = records
                .iter()
                .map(|r| r.uid.as_ref().and_then(|uid| read.uids.get(uid).copied()))
                .collect();
            if let Some(offsets) = known {
                return Ok(offsets);
            }
        }
        let mut queue = lock(&self.queue);
        let id = queue.next_id;
        queue.next_id += 1;
        queue.pending.push(Request { id, records });
        loop {
            if let Some(result) = queue.done.remove(&id) {
                return result;
            }
            if !queue.leading && !queue.pending.is_empty() {
                queue.leading = true;
                let round = take_round(&mut queue.pending);
                drop(queue);
                let results = self.commit(round);
                queue = lock(&self.queue);
                queue.done.extend(results);
                queue.leading = false;
                self.turn.notify_all();
                continue;
            }
            queue = self
                .turn
                .wait(queue)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// One writer round: dedup, assign offsets, write, fsync, publish.
    fn commit(&self, round: Vec<Request>) -> Vec<(u64, Result<Vec<u64>, BusError>)> {
        let mut writer = lock(&self.writer);
        if let Some(cause) = writer.poisoned.clone() {
            return round
                .iter()
                .map(|r| (r.id, Err(self.poisoned_error(&cause))))
                .collect();
        }
        let mut next = writer.next;
        let mut fresh: HashMap<&str, u64, fnv::FnvBuildHasher> = HashMap::default();
        let mut new_uids = Vec::new();
        let mut to_write: Vec<&NewRecord> = Vec::new();
        let mut offsets = Vec::with_capacity(round.len());
        {
            let read = self.reader();
            for request in &round {
                let mut mine = Vec::with_capacity(request.records.len());
                for record in &request.records {
                    if let Some(uid) = record.uid.as_deref() {
                        if let Some(&offset) = fresh.get(uid).or_else(|| read.uids.get(uid)) {
                            mine.push(offset);
                            continue;
                        }
                        fresh.insert(uid, next);
                        new_uids.push((uid.to_owned(), next));
                    }
                    to_write.push(record);
                    mine.push(next);
                    next += 1;
                }
                offsets.push(mine);
            }
        }
        let outcome = if to_write.is_empty() {
            Ok(())
        } else {
            self.write_frame(&mut writer, &to_write, new_uids)
        };
        match outcome {
            Ok(()) => round
                .iter()
                .zip(offsets)
                .map(|(r, o)| (r.id, Ok(o)))
                .collect(),
            Err(WriteError::Refused(reason)) => round
                .iter()
                .map(|r| (r.id, Err(BusError::invalid("records", reason.clone()))))
                .collect(),
            Err(WriteError::Failed(cause)) => {
                writer.poisoned = Some(cause.clone());
                round
                    .iter()
                    .map(|r| (r.id, Err(self.poisoned_error(&cause))))
                    .collect()
            }
        }
    }

    fn write_frame(
        &self,
        writer: &mut WriterState,
        records: &[&NewRecord],
        new_uids: Vec<(String, u64)>,
    ) -> Result<(), WriteError> {
        let stored_at = now_ms();
        let bytes = frame::encode(writer.next, stored_at, records).map_err(WriteError::Refused)?;
        let len = bytes.len() as u64;
        self.roll_if_due(writer, len, stored_at)
            .map_err(WriteError::Failed)?;
        let files = &self.options.files;
        files
            .write_all_at(&writer.file, &bytes, writer.pos)
            .map_err(|e| WriteError::Failed(format!("write: {e}")))?;
        match self.options.durability {
            Durability::Sync => files
                .sync_data(&writer.file)
                .map_err(|e| WriteError::Failed(format!("fsync: {e}")))?,
            Durability::Interval(_) => writer.dirty = true,
        }
        let pos = writer.pos;
        let base = writer.next;
        writer.pos += len;
        writer.next += records.len() as u64;
        let entry = writer
            .last_indexed
            .is_none_or(|last| pos - last >= self.options.index_interval_bytes)
            .then_some((base, pos));
        if entry.is_some() {
            writer.last_indexed = Some(pos);
        }
        writer.active_uids.extend(new_uids.iter().cloned());
        let mut read = self.read_mut();
        let read = &mut *read;
        if let Some(active) = read.segments.last_mut() {
            active.index.entries.extend(entry);
            active.index.len = writer.pos;
            active.index.end = writer.next;
            active.index.max_ts = active.index.max_ts.max(stored_at);
            active.index.min_ts.get_or_insert(stored_at);
        }
        for (uid, offset) in new_uids {
            read.uids.entry(uid).or_insert(offset);
        }
        Ok(())
    }

    /// The retained range: the oldest segment's base to the next offset.
    pub(crate) fn offsets(&self) -> PartitionOffsets {
        let read = self.reader();
        let first = read.segments.first().map_or(0, |s| s.base);
        let next = read.segments.last().map_or(first, |s| s.index.end);
        PartitionOffsets { first, next }
    }

    /// The stored offset of `uid`.
    pub(crate) fn find_uid(&self, uid: &str) -> Option<u64> {
        self.reader().uids.get(uid).copied()
    }

    /// Up to `max` records from `offset` on (from the log start when below it).
    /// A bad record ends the read: the records before it are returned, or
    /// the error when it is the first.
    pub(crate) fn fetch(
        &self,
        offset: u64,
        max: usize,
        auth: Option<&RecordAuth>,
    ) -> Result<Vec<StoredEvent>, BusError> {
        let mut out = Vec::new();
        let mut cursor = offset;
        let mut retries = 0;
        while out.len() < max {
            let Some(snapshot) = self.locate(cursor) else {
                break;
            };
            match self.read_segment(&snapshot, max, auth, &mut out) {
                Ok(next) => cursor = next,
                Err(ReadError::Retry) if retries < 3 => retries += 1,
                Err(ReadError::Retry) => {
                    return Err(BusError::Backend(format!(
                        "topic {:?} partition {}: segment {} keeps changing under the read",
                        self.topic,
                        self.id,
                        snapshot.path.display()
                    )));
                }
                Err(ReadError::Bus(_)) if !out.is_empty() => break,
                Err(ReadError::Bus(error)) => return Err(error),
            }
        }
        Ok(out)
    }

    fn locate(&self, offset: u64) -> Option<Snapshot> {
        let read = self.reader();
        let first = read.segments.first()?;
        let from = offset.max(first.base);
        let at = read.segments.partition_point(|s| s.base <= from);
        let segment = read.segments[at.checked_sub(1)?..]
            .iter()
            .find(|s| s.index.end > from)?;
        Some(Snapshot {
            from,
            path: segment.path.clone(),
            file: segment.file.clone(),
            entry: segment.index.floor(from),
            len: segment.index.len,
            end: segment.index.end,
        })
    }

    /// Reads from one segment into `out`; returns the offset to continue at.
    fn read_segment(
        &self,
        snapshot: &Snapshot,
        max: usize,
        auth: Option<&RecordAuth>,
        out: &mut Vec<StoredEvent>,
    ) -> Result<u64, ReadError> {
        let file = match &snapshot.file {
            Some(file) => Arc::clone(file),
            None => match File::open(&snapshot.path) {
                Ok(file) => Arc::new(file),
                // Retention may have deleted it since the snapshot: look again.
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                    return Err(ReadError::Retry);
                }
                Err(error) => return Err(BusError::Io(error).into()),
            },
        };
        let (mut expected, pos) = snapshot.entry;
        let mut reader = FrameReader::new(&file, pos, snapshot.len);
        let mut first = true;
        while out.len() < max && expected < snapshot.end {
            let corrupt = |reason: String| BusError::Corrupt {
                location: snapshot.path.display().to_string(),
                offset: expected,
                reason,
            };
            let frame = match reader.next_frame().map_err(BusError::Io)? {
                Some(Ok(frame)) => frame,
                Some(Err(fault)) => return Err(corrupt(fault.to_string()).into()),
                None => return Err(corrupt("segment ends early".to_owned()).into()),
            };
            if frame.base != expected {
                if first {
                    // The index is a hint: a wrong entry is rebuilt, then retried.
                    self.rebuild_index(&snapshot.path)?;
                    return Err(ReadError::Retry);
                }
                return Err(corrupt(format!("frame holds offset {}", frame.base)).into());
            }
            first = false;
            for (offset, record) in (frame.base..).zip(frame.records()) {
                if offset < snapshot.from {
                    continue;
                }
                if out.len() >= max {
                    break;
                }
                out.push(self.event(offset, frame.stored_at, record, auth)?);
            }
            expected = frame.end();
        }
        Ok(out
            .last()
            .map_or(expected, |e| e.offset + 1)
            .max(snapshot.from))
    }

    fn event(
        &self,
        offset: u64,
        stored_at: u64,
        record: RecordRef<'_>,
        auth: Option<&RecordAuth>,
    ) -> Result<StoredEvent, BusError> {
        let integrity = |reason: &str| BusError::Integrity {
            topic: self.topic.clone(),
            partition: self.id,
            offset,
            reason: reason.to_owned(),
        };
        let key = std::str::from_utf8(record.key).map_err(|_| integrity("key is not UTF-8"))?;
        if let Some(auth) = auth {
            let uid = match record.uid.map(std::str::from_utf8) {
                Some(Ok(uid)) => Some(uid),
                Some(Err(_)) => return Err(integrity("UID is not UTF-8")),
                None => None,
            };
            let parts = RecordParts {
                topic: &self.topic,
                partition: self.id,
                key,
                uid,
                value: record.value,
            };
            match record.tag {
                None => return Err(integrity("record carries no authentication tag")),
                Some(tag) if tag.len() != TAG_LEN || !auth.verify(parts, tag) => {
                    return Err(integrity("authentication tag does not match"));
                }
                Some(_) => {}
            }
        }
        let value = serde_json::from_slice(record.value)
            .map_err(|_| integrity("value is not valid JSON"))?;
        Ok(StoredEvent {
            partition: self.id,
            offset,
            key: key.to_owned(),
            value,
            stored_at,
        })
    }

    /// Rebuilds the sparse index of the segment at `path` from its frames.
    fn rebuild_index(&self, path: &std::path::Path) -> Result<(), BusError> {
        let (base, len) = {
            let read = self.reader();
            let Some(segment) = read.segments.iter().find(|s| s.path == path) else {
                return Ok(());
            };
            (segment.base, segment.index.len)
        };
        let file = File::open(path)?;
        let scan = crate::segment::scan(&file, base, self.options.index_interval_bytes)?;
        if scan.valid_len < len {
            return Err(BusError::Corrupt {
                location: path.display().to_string(),
                offset: scan.end,
                reason: scan.fault.map_or_else(String::new, |(_, why)| why),
            });
        }
        let mut read = self.read_mut();
        if let Some(segment) = read.segments.iter_mut().find(|s| s.path == path) {
            segment.index.entries = scan
                .index
                .into_iter()
                .filter(|&(_, pos)| pos < segment.index.len)
                .collect();
        }
        Ok(())
    }
}

enum WriteError {
    /// Nothing was written (the batch cannot be framed).
    Refused(String),
    /// A write or fsync failed: poison.
    Failed(String),
}

enum ReadError {
    Retry,
    Bus(BusError),
}

impl From<BusError> for ReadError {
    fn from(error: BusError) -> Self {
        Self::Bus(error)
    }
}

fn take_round(pending: &mut Vec<Request>) -> Vec<Request> {
    let mut bytes = 0;
    let mut take = 0;
    for request in pending.iter() {
        if take > 0 && bytes >= ROUND_BYTES {
            break;
        }
        bytes += request.records.iter().map(|r| r.value.len()).sum::<usize>();
        take += 1;
    }
    pending.drain(..take).collect()
}
