//! Segment files: naming, a buffered positional frame reader, and the full
//! verifying scan used by recovery and index rebuilds.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::log::frame::{self, Fault, Frame, PREFIX};

/// Extension of segment files; the stem is the base offset, 20 digits, so
/// the file name persists the offset sequence even when the segment is empty.
pub(crate) const LOG: &str = "log";
/// Extension of a sealed segment's sparse index.
pub(crate) const IDX: &str = "idx";
/// Extensions of the active segment's index and UID table as of a clean
/// close (used by the next open only while they cover the whole segment).
pub(crate) const CLOSED_IDX: &str = "cidx";
pub(crate) const CLOSED_UIDS: &str = "cuids";
/// Extension of a sealed segment's UID table (see `uid::table`; files of
/// the list format written before tables are read once and replaced).
pub(crate) const UIDS: &str = "uids";

/// `dir/<base>.<ext>`.
pub(crate) fn path(dir: &Path, base: u64, ext: &str) -> PathBuf {
    dir.join(format!("{base:020}.{ext}"))
}

/// Base offsets of the segment files in `dir`, ascending.
pub(crate) fn list(dir: &Path) -> std::io::Result<Vec<u64>> {
    let mut bases = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(stem) = name.strip_suffix(".log")
            && stem.len() == 20
            && let Ok(base) = stem.parse::<u64>()
        {
            bases.push(base);
        }
    }
    bases.sort_unstable();
    Ok(bases)
}

/// Reads frames sequentially from `pos` up to `end` with large positional
/// reads, so a fetch costs a few syscalls however long the log is.
pub(crate) struct FrameReader<'f> {
    file: &'f File,
    pos: u64,
    end: u64,
    buf: Vec<u8>,
    buf_start: u64,
    read_ahead: usize,
    /// The records of the last compressed frame, decompressed.
    raw: Vec<u8>,
}

/// A reader's memory, kept for the next reader: the bytes read ahead and
/// the decompressed records of a compressed frame.
#[derive(Debug, Default)]
pub(crate) struct ReadBuffers {
    read: Vec<u8>,
    raw: Vec<u8>,
}

impl ReadBuffers {
    pub(crate) const fn new() -> Self {
        Self {
            read: Vec::new(),
            raw: Vec::new(),
        }
    }
}

/// Read-ahead size.
pub(crate) const CHUNK: usize = 64 * 1024;
/// Read-ahead of a read of a few records: the frame of a sparse-index entry
/// (one per ~4 KiB) and the next, at `frame::FRAME_RECORDS` records of
/// ~200 bytes, so one record costs one short read (larger records get a
/// longer read when their frame needs it).
pub(crate) const SMALL_CHUNK: usize = 8 * 1024;

impl<'f> FrameReader<'f> {
    pub fn new(file: &'f File, pos: u64, end: u64) -> Self {
        Self::with_read_ahead(file, pos, end, CHUNK)
    }

    /// A reader whose reads are at least `read_ahead` bytes.
    pub fn with_read_ahead(file: &'f File, pos: u64, end: u64, read_ahead: usize) -> Self {
        Self {
            file,
            pos,
            end,
            buf: Vec::new(),
            buf_start: pos,
            read_ahead,
            raw: Vec::new(),
        }
    }

    /// A reader that reads into `buffers` (their bytes discarded, their
    /// memory kept): a caller reading often passes the buffers of its last
    /// read, so a read allocates nothing.
    pub fn with_buffers(
        file: &'f File,
        pos: u64,
        end: u64,
        read_ahead: usize,
        buffers: ReadBuffers,
    ) -> Self {
        let ReadBuffers { read: mut buf, raw } = buffers;
        buf.clear();
        Self {
            file,
            pos,
            end,
            buf,
            buf_start: pos,
            read_ahead,
            raw,
        }
    }

    /// The buffers, for the next reader.
    pub fn into_buffers(self) -> ReadBuffers {
        ReadBuffers {
            read: self.buf,
            raw: self.raw,
        }
    }

    /// Position of the next frame.
    pub fn pos(&self) -> u64 {
        self.pos
    }

    /// Makes `buf` cover `[self.pos, self.pos + need)`; false when that runs past `end`.
    fn fill(&mut self, need: u64) -> std::io::Result<bool> {
        let want_end = self.pos.saturating_add(need);
        if want_end > self.end {
            return Ok(false);
        }
        let have_end = self.buf_start + self.buf.len() as u64;
        if self.pos >= self.buf_start && want_end <= have_end {
            return Ok(true);
        }
        let read_len = need.max(self.read_ahead as u64).min(self.end - self.pos);
        let read_len = usize::try_from(read_len).map_err(std::io::Error::other)?;
        self.buf.resize(read_len, 0);
        self.file.read_exact_at(&mut self.buf, self.pos)?;
        self.buf_start = self.pos;
        Ok(true)
    }

    /// The next frame, `None` at `end`, or where and why the bytes are not a frame.
    pub fn next_frame(&mut self) -> std::io::Result<Option<Result<Frame<'_>, Fault>>> {
        if self.pos >= self.end {
            return Ok(None);
        }
        if !self.fill(PREFIX as u64)? {
            return Ok(Some(Err(Fault::Short)));
        }
        let at = usize::try_from(self.pos - self.buf_start).map_err(std::io::Error::other)?;
        let mut prefix = [0u8; PREFIX];
        prefix.copy_from_slice(&self.buf[at..at + PREFIX]);
        let body_len = frame::body_len(&prefix);
        if body_len > frame::MAX_BODY {
            return Ok(Some(Err(Fault::Checksum)));
        }
        let total = PREFIX as u64 + body_len;
        if !self.fill(total)? {
            return Ok(Some(Err(Fault::Short)));
        }
        let at = usize::try_from(self.pos - self.buf_start).map_err(std::io::Error::other)?;
        let body_end = at + usize::try_from(total).map_err(std::io::Error::other)?;
        let result = frame::decode(&prefix, &self.buf[at + PREFIX..body_end], &mut self.raw);
        if result.is_ok() {
            self.pos += total;
        }
        Ok(Some(result))
    }
}

/// What a full scan of a segment found.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// Offset after the last valid record.
    pub end: u64,
    /// Bytes of valid frames.
    pub valid_len: u64,
    /// Newest `stored_at` (0 when empty).
    pub max_ts: u64,
    /// Oldest `stored_at` (None when empty).
    pub min_ts: Option<u64>,
    /// Sparse index entries `(frame base offset, position)`.
    pub index: Vec<(u64, u64)>,
    /// `(uid, offset)` of every record with a UID, in log order.
    pub uids: Vec<(String, u64)>,
    /// Where verification stopped early, and why.
    pub fault: Option<(u64, String)>,
    /// Whether the stop looks like an unacknowledged torn tail: no frame
    /// verifies after the bad one, and the bad frame runs to or past the
    /// end of the file, or only zeros follow it, or the file ends in zeros
    /// (the writer had zero-filled ahead and was stopped before it closed:
    /// its last, unsynced frame may have reached the disk in any order of
    /// its pages, so its header is no guide to where it ends).
    pub torn: bool,
    /// Whether a frame verifies after the stop: the bad bytes were written
    /// (and acked) before it, so they are damage, never a torn tail.
    pub resumes: bool,
    /// With a mark: the offset after the frames that end exactly at that
    /// byte, when the verified frames reach it at a frame boundary.
    pub end_at_mark: Option<u64>,
}

/// Verifies every frame of the segment `file` (base offset `base`).
pub(crate) fn scan(file: &File, base: u64, index_interval: u64) -> std::io::Result<Scan> {
    scan_to_mark(file, base, index_interval, None)
}

/// [`scan`], also noting where the frames stand at byte `mark`.
pub(crate) fn scan_to_mark(
    file: &File,
    base: u64,
    index_interval: u64,
    mark: Option<u64>,
) -> std::io::Result<Scan> {
    let file_len = file.metadata()?.len();
    let mut out = Scan {
        end: base,
        ..Scan::default()
    };
    let mut reader = FrameReader::new(file, 0, file_len);
    let mut last_indexed: Option<(u64, u64)> = None;
    // The frames of a batch whose closing frame is not read yet: they
    // count only once it verifies.
    let mut staged = Scan {
        end: base,
        ..Scan::default()
    };
    let mut batch_at: Option<u64> = None;
    loop {
        let pos = reader.pos();
        if mark == Some(pos) && batch_at.is_none() {
            out.end_at_mark = Some(out.end);
        }
        let Some(next) = reader.next_frame()? else {
            break;
        };
        let fault = match next {
            Ok(frame) if frame.base != staged.end || frame.count == 0 => {
                Some(Fault::Malformed(format!(
                    "frame starts at offset {} where {} was expected",
                    frame.base, staged.end
                )))
            }
            Ok(frame) => {
                let compressed = frame.codec.is_some();
                if frame::index_due(last_indexed, frame.base, pos, compressed, index_interval) {
                    staged.index.push((frame.base, pos));
                    last_indexed = Some((frame.base, pos));
                }
                for (i, record) in frame.records().enumerate() {
                    if let Some(uid) = record.uid {
                        let uid = String::from_utf8_lossy(uid).into_owned();
                        staged.uids.push((uid, frame.base + i as u64));
                    }
                }
                staged.max_ts = staged.max_ts.max(frame.stored_at);
                staged.min_ts = Some(
                    staged
                        .min_ts
                        .map_or(frame.stored_at, |t| t.min(frame.stored_at)),
                );
                staged.end = frame.end();
                if frame.continued {
                    batch_at.get_or_insert(pos);
                } else {
                    batch_at = None;
                    out.index.append(&mut staged.index);
                    out.uids.append(&mut staged.uids);
                    out.max_ts = out.max_ts.max(staged.max_ts);
                    out.min_ts = match (out.min_ts, staged.min_ts) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    out.end = staged.end;
                    out.valid_len = reader.pos();
                }
                None
            }
            Err(fault) => Some(fault),
        };
        let Some(fault) = fault else {
            continue;
        };
        // A frame that verifies further on proves the bad one was written
        // (and acked) before it: damage, not a torn tail. Except the rest
        // of the bad frame's own batch, when nothing follows that batch:
        // the pages of its one write reach the disk in any order.
        let after = next_verified_frame(file, pos + 1, file_len, staged.end)?;
        let torn_batch = match after {
            Some((at, _)) => batch_ends_log(file, at, file_len, out.end)?,
            None => false,
        };
        out.resumes = after.is_some() && !torn_batch;
        out.torn = !out.resumes
            && (torn_batch
                || fault == Fault::Short
                || frame_reaches_end(file, pos, file_len)?
                || ends_with_zero(file, file_len)?);
        out.fault = Some((pos, fault.to_string()));
        return Ok(out);
    }
    // The file ends inside a batch: its closing frame was never written,
    // so none of it was acked.
    if let Some(pos) = batch_at {
        out.torn = true;
        out.fault = Some((
            pos,
            "batch cut short: its closing frame is missing".to_owned(),
        ));
    }
    Ok(out)
}

/// Whether the verified frames from `at` on (past damage) are only the
/// later frames of the batch starting at offset `batch_base`, and nothing
/// verifies after them: then the damage is that batch torn by a crash in
/// its write, not a frame acked before others.
fn batch_ends_log(file: &File, mut at: u64, end: u64, batch_base: u64) -> std::io::Result<bool> {
    loop {
        let mut reader = FrameReader::new(file, at, end);
        let bad = loop {
            let pos = reader.pos();
            let Some(next) = reader.next_frame()? else {
                // The batch's closing frame never verified.
                return Ok(true);
            };
            match next {
                Ok(frame) if frame.lead > 0 && frame.batch_base() == batch_base => {
                    if !frame.continued {
                        let after = frame.end();
                        let pos = reader.pos();
                        return Ok(next_verified_frame(file, pos, end, after)?.is_none());
                    }
                }
                // A frame of another batch: the torn one was complete before it.
                Ok(_) => return Ok(false),
                Err(_) => break pos,
            }
        };
        match next_verified_frame(file, bad + 1, end, batch_base)? {
            Some((next, _)) => at = next,
            None => return Ok(true),
        }
    }
}

/// Whether the file's last byte is zero. A frame never ends in one (its
/// last bytes are a JSON value; a compressed frame's, its end byte
/// `0xB5`), so only zeros written ahead do.
fn ends_with_zero(file: &File, file_len: u64) -> std::io::Result<bool> {
    if file_len == 0 {
        return Ok(false);
    }
    let mut last = [0u8; 1];
    file.read_exact_at(&mut last, file_len - 1)?;
    Ok(last[0] == 0)
}

/// Whether the frame at `pos` ends exactly at or past `file_len`, or
/// everything from `pos` on is zero (a preallocated, never-written tail).
fn frame_reaches_end(file: &File, pos: u64, file_len: u64) -> std::io::Result<bool> {
    let mut prefix = [0u8; PREFIX];
    if pos + PREFIX as u64 > file_len {
        return Ok(true);
    }
    file.read_exact_at(&mut prefix, pos)?;
    if pos + PREFIX as u64 + frame::body_len(&prefix) >= file_len {
        return Ok(true);
    }
    all_zero(file, pos, file_len)
}

/// Sectors a torn write leaves whole or untouched: a crash (a killed
/// writer's partial `pwrite`, pages written back in any order before a
/// power cut) loses whole pages, and a device writes whole sectors.
const SECTOR: u64 = 512;

/// Whether the bad frame at `pos`, inside the first `limit` bytes that its
/// writer had fsynced as zeros, was written whole: it verifies once one bit
/// of its length is put back (the length is outside the checksum), or its
/// last byte and every sector-aligned piece of it hold a non-zero byte. A
/// crash leaves a frame written into zeros with zeros where its write
/// stopped (a killed or failed `pwrite` writes a prefix) or where its
/// unwritten pages were, and a frame never ends in a zero byte (see
/// `frame`). Then it was damaged after it was written, not torn.
pub(crate) fn written_whole(file: &File, pos: u64, limit: u64) -> std::io::Result<bool> {
    let header_end = pos + PREFIX as u64;
    if header_end > limit {
        return Ok(false);
    }
    let mut prefix = [0u8; PREFIX];
    file.read_exact_at(&mut prefix, pos)?;
    let claimed = frame::body_len(&prefix);
    let mut body = Vec::new();
    let mut raw = Vec::new();
    for bit in 0..32 {
        let len = claimed ^ (1 << bit);
        if len == 0 || len > frame::MAX_BODY || header_end + len > limit {
            continue;
        }
        body.resize(usize::try_from(len).map_err(std::io::Error::other)?, 0);
        file.read_exact_at(&mut body, header_end)?;
        let mut fixed = prefix;
        fixed[..4].copy_from_slice(&u32::try_from(len).unwrap_or(0).to_le_bytes());
        if frame::decode(&fixed, &body, &mut raw).is_ok() {
            return Ok(true);
        }
    }
    let end = header_end.saturating_add(claimed);
    if end > limit {
        // It claims to run past the zeros: the frame whose write grew the
        // file (acked only once the larger extent was stored), torn.
        return Ok(false);
    }
    let mut piece = vec![0u8; usize::try_from(SECTOR).map_err(std::io::Error::other)?];
    if end > header_end {
        file.read_exact_at(&mut piece[..1], end - 1)?;
        if piece[0] == 0 {
            return Ok(false);
        }
    }
    let mut at = pos;
    while at < end {
        let to = ((at / SECTOR + 1) * SECTOR).min(end);
        let n = usize::try_from(to - at).map_err(std::io::Error::other)?;
        file.read_exact_at(&mut piece[..n], at)?;
        if piece[..n].iter().all(|&b| b == 0) {
            return Ok(false);
        }
        at = to;
    }
    Ok(true)
}

/// Whether bytes `from..to` of `file` are all zero.
pub(crate) fn all_zero(file: &File, from: u64, to: u64) -> std::io::Result<bool> {
    let mut rest = vec![0u8; CHUNK];
    let mut at = from;
    while at < to {
        let n = usize::try_from((to - at).min(CHUNK as u64)).map_err(std::io::Error::other)?;
        file.read_exact_at(&mut rest[..n], at)?;
        if rest[..n].iter().any(|&b| b != 0) {
            return Ok(false);
        }
        at += n as u64;
    }
    Ok(true)
}

/// The first position at or after `start` where a frame with base offset
/// at least `min_base` verifies within `end`, with that base: where reading
/// can resume past damage. Candidates are found by magic and version, so
/// the checksum is computed only where a frame could start.
pub(crate) fn next_verified_frame(
    file: &File,
    start: u64,
    end: u64,
    min_base: u64,
) -> std::io::Result<Option<(u64, u64)>> {
    let mut window = vec![0u8; CHUNK + frame::HEAD];
    let mut body = Vec::new();
    let mut raw = Vec::new();
    let mut at = start;
    while at + frame::HEAD as u64 <= end {
        let n =
            usize::try_from((end - at).min(window.len() as u64)).map_err(std::io::Error::other)?;
        file.read_exact_at(&mut window[..n], at)?;
        let candidates = n - frame::HEAD + 1;
        for i in 0..candidates {
            let Some((len, base)) = frame::peek(&window[i..]) else {
                continue;
            };
            let pos = at + i as u64;
            if base < min_base || pos + PREFIX as u64 + len > end {
                continue;
            }
            let mut prefix = [0u8; PREFIX];
            prefix.copy_from_slice(&window[i..i + PREFIX]);
            body.resize(usize::try_from(len).map_err(std::io::Error::other)?, 0);
            file.read_exact_at(&mut body, pos + PREFIX as u64)?;
            if frame::decode(&prefix, &body, &mut raw).is_ok_and(|f| f.count > 0) {
                return Ok(Some((pos, base)));
            }
        }
        at += candidates as u64;
    }
    Ok(None)
}
