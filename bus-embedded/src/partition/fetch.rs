//! The read side of a partition: fetch across segments (stepping over a
//! damaged frame that lies wholly before the requested offset), and UID
//! lookups that, with a control key, count only records that authenticate.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

use bus_core::auth::{RecordAuth, RecordParts, TagFault};
use bus_core::{BusError, Headers, StoredEvent, StoredRecord};

use crate::log::frame::RecordRef;
use crate::log::segment::{self, FrameReader, ReadBuffers};
use crate::partition::Partition;
use bus_core::backend::sync::lock;

thread_local! {
    /// The read buffers of this thread's last fetch (up to
    /// `segment::CHUNK`, and a frame's decompressed records), reused by its
    /// next: no 64 KiB allocation per fetch.
    static READ_BUFFER: std::cell::Cell<ReadBuffers> = const { std::cell::Cell::new(ReadBuffers::new()) };
}

/// Where one read of a segment starts.
struct Snapshot {
    /// Offset actually read from (at or past the log start).
    from: u64,
    base: u64,
    path: PathBuf,
    file: Option<Arc<File>>,
    entry: (u64, u64),
    len: u64,
    end: u64,
}

impl Partition {
    /// The stored offset of `uid`; with `auth`, of its oldest retained
    /// record that authenticates (a forged copy must not answer for it).
    pub(crate) fn find_uid(
        &self,
        uid: &str,
        auth: Option<&RecordAuth>,
    ) -> Result<Option<u64>, BusError> {
        let locator = self.locator()?;
        let Some(auth) = auth else {
            let read = self.reader();
            for (i, filtered) in
                crate::partition::lookup::probes(&read.segments, locator.as_deref(), uid)
            {
                if let Some(uids) = &read.segments[i].uids
                    && let Some(&first) = uids.get(uid, filtered)?.first()
                {
                    return Ok(Some(first));
                }
            }
            return Ok(read.uids.first(uid));
        };
        let candidates = {
            let read = self.reader();
            let mut all = Vec::new();
            for (i, filtered) in
                crate::partition::lookup::probes(&read.segments, locator.as_deref(), uid)
            {
                if let Some(uids) = &read.segments[i].uids {
                    all.extend(uids.get(uid, filtered)?);
                }
            }
            all.extend(read.uids.all(uid));
            all
        };
        for offset in candidates {
            if self.authentic(offset, uid, auth)? {
                return Ok(Some(offset));
            }
        }
        Ok(None)
    }

    /// Whether the record at `offset` carries `uid` and a tag that verifies.
    /// A record that is gone or unreadable proves nothing: false.
    fn authentic(&self, offset: u64, uid: &str, auth: &RecordAuth) -> Result<bool, BusError> {
        let Some(snapshot) = self.locate(offset).filter(|s| s.from == offset) else {
            return Ok(false);
        };
        let file = match self.segment_file(&snapshot) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(error) => return Err(error.into()),
        };
        let mut reader = FrameReader::new(&file, snapshot.entry.1, snapshot.len);
        while let Some(Ok(frame)) = reader.next_frame()? {
            if frame.end() <= offset {
                continue;
            }
            let record = usize::try_from(offset.saturating_sub(frame.base))
                .ok()
                .filter(|_| frame.base <= offset)
                .and_then(|i| frame.records().nth(i));
            return Ok(record.is_some_and(|record| {
                record.uid == Some(uid.as_bytes()) && self.check_tag(record, auth).is_ok()
            }));
        }
        Ok(false)
    }

    /// Up to `max` records from `offset` on (from the log start when below it).
    /// A bad record ends the read: the records before it are returned, or
    /// the error when it is the first.
    pub(crate) fn fetch(
        &self,
        offset: u64,
        max: usize,
        auth: Option<&RecordAuth>,
    ) -> Result<Vec<StoredRecord>, BusError> {
        self.fetch_as(offset, max, auth, Self::event)
    }

    /// [`Partition::fetch`] making each checked record with `make` (the
    /// record with its headers, the event alone, or the raw bytes).
    pub(crate) fn fetch_as<T>(
        &self,
        offset: u64,
        max: usize,
        auth: Option<&RecordAuth>,
        make: Make<T>,
    ) -> Result<Vec<T>, BusError> {
        let mut out = Vec::new();
        let mut cursor = offset;
        let mut retries = 0;
        while out.len() < max {
            let Some(snapshot) = self.locate(cursor) else {
                break;
            };
            // Retention deleted what follows the records collected: stop
            // rather than jump ahead, so a result never has a hole.
            if !out.is_empty() && snapshot.from != cursor {
                break;
            }
            // Room for the records this segment has for the page, in one
            // allocation made before theirs (not a series of regrowths).
            let here = usize::try_from(snapshot.end - snapshot.from).unwrap_or(usize::MAX);
            out.reserve(here.min(max - out.len()).min(MAX_RESERVED));
            match self.read_segment(&snapshot, max, auth, make, &mut out) {
                Ok(next) => cursor = next,
                Err(ReadError::Retry) if !out.is_empty() => break,
                Err(ReadError::Retry) if retries < 3 => retries += 1,
                Err(ReadError::Retry) => {
                    return Err(BusError::backend(
                        "embedded",
                        format!(
                            "topic {:?} partition {}: segment {} keeps changing under the read",
                            self.topic,
                            self.id,
                            snapshot.path.display()
                        ),
                    ));
                }
                Err(ReadError::Bus(_)) if !out.is_empty() => break,
                Err(ReadError::Bus(error)) => return Err(error),
            }
        }
        Ok(out)
    }

    /// The open file of the snapshot's segment: the active one's, or a
    /// sealed one's from the cache (opened and cached on a miss).
    fn segment_file(&self, snapshot: &Snapshot) -> std::io::Result<Arc<File>> {
        if let Some(file) = &snapshot.file {
            return Ok(Arc::clone(file));
        }
        if let Some(file) = lock(&self.sealed_files).get(snapshot.base) {
            return Ok(file);
        }
        let file = Arc::new(File::open(&snapshot.path)?);
        // Retention may have dropped the segment since the snapshot (its
        // file can outlive the listing briefly): cache only a listed one,
        // checked under the read lock that retention takes to drop it.
        let read = self.reader();
        if read
            .segments
            .first()
            .is_some_and(|first| first.base <= snapshot.base)
        {
            lock(&self.sealed_files).put(snapshot.base, Arc::clone(&file));
        }
        drop(read);
        Ok(file)
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
            base: segment.base,
            path: segment.path.clone(),
            file: segment.file.clone(),
            entry: segment.index.floor(from),
            len: segment.index.len,
            end: segment.index.end,
        })
    }

    /// Reads from one segment into `out`; returns the offset to continue at.
    fn read_segment<T>(
        &self,
        snapshot: &Snapshot,
        max: usize,
        auth: Option<&RecordAuth>,
        make: Make<T>,
        out: &mut Vec<T>,
    ) -> Result<u64, ReadError> {
        let file = match self.segment_file(snapshot) {
            Ok(file) => file,
            // Retention may have deleted it since the snapshot: look again.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Err(ReadError::Retry);
            }
            Err(error) => return Err(BusError::Io(error).into()),
        };
        let (expected, pos) = snapshot.entry;
        let read_ahead = if max - out.len() <= 64 {
            segment::SMALL_CHUNK
        } else {
            segment::CHUNK
        };
        let mut reader =
            FrameReader::with_buffers(&file, pos, snapshot.len, read_ahead, READ_BUFFER.take());
        let result = self.read_frames(
            snapshot,
            &file,
            &mut reader,
            expected,
            (max, auth, make),
            out,
        );
        READ_BUFFER.set(reader.into_buffers());
        result
    }

    /// [`Partition::read_segment`]'s loop over the frames of `reader`.
    fn read_frames<'f, T>(
        &self,
        snapshot: &Snapshot,
        file: &'f File,
        reader: &mut FrameReader<'f>,
        mut expected: u64,
        (max, auth, make): (usize, Option<&RecordAuth>, Make<T>),
        out: &mut Vec<T>,
    ) -> Result<u64, ReadError> {
        let from = snapshot.from;
        let mut last = None;
        let mut first = true;
        while out.len() < max && expected < snapshot.end {
            let pos = reader.pos();
            // Named so that a caller skipping to `offset + 1` always moves on.
            let corrupt = |reason: String| BusError::Corrupt {
                location: snapshot.path.display().to_string(),
                offset: expected.max(from),
                reason,
            };
            let reason = match reader.next_frame().map_err(BusError::Io)? {
                Some(Ok(frame)) if frame.base == expected => {
                    first = false;
                    for (offset, record) in (frame.base..).zip(frame.records()) {
                        if offset < from {
                            continue;
                        }
                        if out.len() >= max {
                            break;
                        }
                        out.push(make(self, offset, frame.stored_at, record, auth)?);
                        last = Some(offset);
                    }
                    expected = frame.end();
                    continue;
                }
                Some(Ok(_)) if first => {
                    // The index is a hint: a wrong entry is rebuilt, then retried.
                    self.rebuild_index(&snapshot.path, from)?;
                    return Err(ReadError::Retry);
                }
                Some(Ok(frame)) => format!("frame holds offset {}", frame.base),
                Some(Err(fault)) => fault.to_string(),
                None => return Err(corrupt("segment ends early".to_owned()).into()),
            };
            // Step over a bad frame that lies wholly before `from`: the next
            // frame that verifies says where its records end.
            match segment::next_verified_frame(file, pos + 1, snapshot.len, expected)
                .map_err(BusError::Io)?
            {
                Some((next_pos, next_base)) if next_base <= from => {
                    *reader = FrameReader::new(file, next_pos, snapshot.len);
                    expected = next_base;
                    first = false;
                }
                _ => return Err(corrupt(format!("{reason} at byte {pos}")).into()),
            }
        }
        Ok(last
            .map_or(expected, |offset| offset + 1)
            .max(snapshot.from))
    }

    /// A checked record with its headers.
    fn event(
        &self,
        offset: u64,
        stored_at: u64,
        record: RecordRef<'_>,
        auth: Option<&RecordAuth>,
    ) -> Result<StoredRecord, BusError> {
        // Parsed when the frame was decoded; `None` here would be a bug.
        let headers =
            record_headers(record).ok_or_else(|| self.integrity(offset, "headers do not parse"))?;
        Ok(StoredRecord {
            event: self.event_only(offset, stored_at, record, auth)?,
            headers,
        })
    }

    /// A checked record without its headers (what `fetch` returns): no
    /// header map is built for it.
    pub(crate) fn event_only(
        &self,
        offset: u64,
        stored_at: u64,
        record: RecordRef<'_>,
        auth: Option<&RecordAuth>,
    ) -> Result<StoredEvent, BusError> {
        let key = self.checked_key(offset, record, auth)?;
        // Checked as UTF-8 at once (a fast pass over the whole value), so
        // the parser does not check each string again as `from_slice` does.
        let value = std::str::from_utf8(record.value)
            .ok()
            .and_then(|text| serde_json::from_str(text).ok())
            .ok_or_else(|| self.integrity(offset, "value is not valid JSON"))?;
        Ok(StoredEvent {
            partition: self.id,
            offset,
            key: key.to_owned(),
            value,
            stored_at,
        })
    }

    /// A checked record's bytes as stored, the value not parsed.
    pub(crate) fn raw_record(
        &self,
        offset: u64,
        stored_at: u64,
        record: RecordRef<'_>,
        auth: Option<&RecordAuth>,
    ) -> Result<crate::raw::StoredBytes, BusError> {
        let key = self.checked_key(offset, record, auth)?;
        let headers =
            record_headers(record).ok_or_else(|| self.integrity(offset, "headers do not parse"))?;
        Ok(crate::raw::StoredBytes {
            partition: self.id,
            offset,
            key: key.to_owned(),
            value: record.value.to_vec(),
            stored_at,
            headers,
        })
    }

    /// The record's key, once its tag (under `auth`) verifies.
    fn checked_key<'r>(
        &self,
        offset: u64,
        record: RecordRef<'r>,
        auth: Option<&RecordAuth>,
    ) -> Result<&'r str, BusError> {
        let key = std::str::from_utf8(record.key)
            .map_err(|_| self.integrity(offset, "key is not UTF-8"))?;
        if let Some(auth) = auth {
            self.check_tag(record, auth)
                .map_err(|reason| self.integrity(offset, reason))?;
        }
        Ok(key)
    }

    fn integrity(&self, offset: u64, reason: &str) -> BusError {
        BusError::Integrity {
            topic: self.topic.clone(),
            partition: self.id,
            offset,
            reason: reason.to_owned(),
        }
    }

    /// Why `record` does not authenticate under `auth`, if it does not.
    fn check_tag(&self, record: RecordRef<'_>, auth: &RecordAuth) -> Result<(), &'static str> {
        let key = std::str::from_utf8(record.key).map_err(|_| "key is not UTF-8")?;
        let uid = match record.uid.map(std::str::from_utf8) {
            Some(Ok(uid)) => Some(uid),
            Some(Err(_)) => return Err("UID is not UTF-8"),
            None => None,
        };
        let parts = RecordParts {
            topic: &self.topic,
            partition: self.id,
            key,
            uid,
            value: record.value,
        };
        match record.headers {
            None => auth.check(parts, record.tag),
            Some(_) => {
                let headers = record_headers(record).ok_or("headers do not parse")?;
                auth.check_with(parts, &headers, record.tag)
            }
        }
        .map_err(TagFault::reason)
    }

    /// Rebuilds the sparse index of the segment at `path` from its frames.
    /// An error names an offset at or past `from`, the offset being read.
    fn rebuild_index(&self, path: &std::path::Path, from: u64) -> Result<(), ReadError> {
        let (base, len) = {
            let read = self.reader();
            let Some(segment) = read.segments.iter().find(|s| s.path == path) else {
                return Ok(());
            };
            (segment.base, segment.index.len)
        };
        let file = match File::open(path) {
            Ok(file) => file,
            // Retention deleted it since the snapshot: look again.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Err(ReadError::Retry);
            }
            Err(error) => return Err(BusError::Io(error).into()),
        };
        let scan =
            segment::scan(&file, base, self.options.index_interval_bytes).map_err(BusError::Io)?;
        if scan.valid_len < len {
            return Err(BusError::Corrupt {
                location: path.display().to_string(),
                offset: scan.end.max(from),
                reason: scan.fault.map_or_else(String::new, |(_, why)| why),
            }
            .into());
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

/// How a read makes its output from one checked record: the partition,
/// the record's offset and store time, the record, the control key.
pub(crate) type Make<T> =
    fn(&Partition, u64, u64, RecordRef<'_>, Option<&RecordAuth>) -> Result<T, BusError>;

/// Records a fetch reserves room for at once (more grow the page).
const MAX_RESERVED: usize = 4096;

/// A record's headers (C25): none when its frame carries none.
fn record_headers(record: RecordRef<'_>) -> Option<Headers> {
    match record.headers {
        None => Some(Headers::new()),
        Some(block) => crate::log::frame::decode_headers(block),
    }
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
