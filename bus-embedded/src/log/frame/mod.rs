//! The on-disk frame. A written batch is one frame, or several (of at most
//! [`FRAME_RECORDS`] records or about [`FRAME_BYTES`] bytes each, so one
//! record is read and verified without its whole batch) written by the
//! same write and fsync: every frame of a batch but its last is marked
//! `continued`, and a run of continued frames without its closing frame is
//! a torn batch, never partly visible.
//!
//! ```text
//! len: u32        bytes after the checksum field
//! crc: u32        CRC-32C of those bytes (header included)
//! magic: u8, version: u8
//! flags: u8       version 2 only: bit 0 = continued (more of the batch follows),
//!                 bit 1 = compressed
//! base: u64       offset of the first record
//! count: u32      records in the frame
//! stored_at: u64  epoch ms the batch was written
//! lead: u32       version 2 only: records of the batch before this frame
//! records:        count × { flags: u8, key_len: u32, key, [uid_len: u32, uid], [tag_len: u16, tag],
//!                 [headers_len: u32, headers], value_len: u32, value }
//!                 record flags: bit 0 = has UID, bit 1 = has tag, bit 2 = has headers (C25);
//!                 headers: count: u16, count × { name_len: u16, name, value_len: u16, value }
//!                 or, compressed: codec: u8 (1 lz4 block, 2 zstd), raw_len: u32, the records compressed,
//!                 end: u8 = 0xB5 (so the frame's last byte is never zero, as a plain frame's is not:
//!                 recovery takes a zero last byte for zeros written ahead)
//! ```
//! All integers are little-endian. Values are stored as the JSON bytes
//! checked at publish and parsed only on fetch.
//!
//! A topic's compression (its `TopicSpec::compression`) applies per frame:
//! the header stays plain (so the resync scan and the index read it as
//! ever) and the checksum covers the stored, compressed bytes, so a torn or
//! flipped frame is caught before anything is decompressed. A frame whose
//! records do not shrink is written uncompressed, and every frame says how
//! it is stored, so a topic's setting can change with old frames readable.

use bus_core::Compression;

use crate::log::codec::Encoder;

/// Bytes before the checksummed body: `len` and `crc`.
pub(crate) const PREFIX: usize = 8;
/// Fixed part of a version-1 body.
const BODY_HEADER_V1: usize = 2 + 8 + 4 + 8;
/// Fixed part of a version-2 body (the frame flags and lead added).
const BODY_HEADER: usize = BODY_HEADER_V1 + 1 + 4;
const MAGIC: u8 = 0xB5;
/// Written by versions before batches were split: no frame flags.
pub(crate) const VERSION_1: u8 = 1;
/// The version written.
pub(crate) const VERSION: u8 = 2;
/// Frame flag: the batch goes on in the next frame.
const CONTINUED: u8 = 1;
/// Frame flag: the records are compressed (version 2 only).
const COMPRESSED: u8 = 2;
/// `codec` and `raw_len` before compressed records.
const COMPRESSED_HEADER: usize = 1 + 4;
/// The byte after compressed records: a zstd frame may end in a zero byte
/// (a block of literals only ends with a sequence count of 0), and a frame
/// must not.
const COMPRESSED_END: u8 = MAGIC;
/// A batch's frame holds at most this many records (~3.3 KB of ~200-byte
/// events: `fetch(random, 1)` reads and checks at most two such frames,
/// 4.6-4.7 µs against 6.5-7.0 µs with frames of 64 records in alternating
/// 1,000,000-record bench runs, replay and batch publish unchanged)...
pub(crate) const FRAME_RECORDS: usize = 16;
/// ...and at most this many record bytes, unless one record alone is larger.
pub(crate) const FRAME_BYTES: usize = 32 << 10;
const HAS_UID: u8 = 1;
const HAS_TAG: u8 = 2;
/// Record flag: headers follow the tag (C25). A record flag rather than a
/// frame version: frames of records without headers are byte for byte what
/// they were, so segments written before headers read unchanged, and a
/// version from before headers refuses a record that has them as a
/// malformed frame (it checks for unknown record flags) instead of reading
/// the headers as the value.
const HAS_HEADERS: u8 = 4;
/// Frames longer than this are treated as damage, not allocated.
pub(crate) const MAX_BODY: u64 = 1 << 31;

/// A record to be written.
#[derive(Debug, Clone)]
pub(crate) struct NewRecord {
    pub key: String,
    pub uid: Option<String>,
    pub tag: Option<Vec<u8>>,
    /// [`encode_headers`] of the record's headers; empty when it has none.
    pub headers: Vec<u8>,
    pub value: Vec<u8>,
}

/// A record decoded from a frame, borrowing its bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecordRef<'a> {
    pub key: &'a [u8],
    pub uid: Option<&'a [u8]>,
    pub tag: Option<&'a [u8]>,
    /// The encoded headers, checked to parse when the frame was decoded.
    pub headers: Option<&'a [u8]>,
    pub value: &'a [u8],
}

/// A frame whose checksum verified.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Frame<'a> {
    /// Read by the fuzzing entry points (re-encoding must be canonical).
    #[cfg_attr(not(any(test, feature = "fuzzing")), allow(dead_code))]
    pub version: u8,
    /// More frames of the same batch follow.
    pub continued: bool,
    /// Records of the same batch in the frames before this one.
    pub lead: u32,
    pub base: u64,
    pub count: u32,
    pub stored_at: u64,
    /// The codec byte of a compressed frame.
    pub codec: Option<u8>,
    records: &'a [u8],
}

/// Bytes one record takes in a frame body.
pub(crate) fn record_size(r: &NewRecord) -> usize {
    1 + 4
        + r.key.len()
        + r.uid.as_ref().map_or(0, |u| 4 + u.len())
        + r.tag.as_ref().map_or(0, |t| 2 + t.len())
        + if r.headers.is_empty() {
            0
        } else {
            4 + r.headers.len()
        }
        + 4
        + r.value.len()
}

/// The body length of a frame of `records`, or why they cannot share one.
pub(crate) fn checked_body_len<'r>(
    records: impl IntoIterator<Item = &'r NewRecord>,
) -> Result<u32, String> {
    let body_len = BODY_HEADER + records.into_iter().map(record_size).sum::<usize>();
    u32::try_from(body_len)
        .ok()
        .filter(|&len| u64::from(len) <= MAX_BODY)
        .ok_or_else(|| format!("batch of {body_len} bytes is too large for one frame"))
}

/// Encodes one (closing) frame of `records` starting at offset `base`.
#[cfg(test)]
pub(crate) fn encode(base: u64, stored_at: u64, records: &[&NewRecord]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    encode_into(&mut out, VERSION_1, false, 0, base, stored_at, records)?;
    Ok(out)
}

/// `(base offset, byte position, compressed)` of each frame of an encoded batch.
pub(crate) type FramePositions = Vec<(u64, u64, bool)>;

/// Whether the frame at byte `pos` holding offsets from `base` gets a
/// sparse-index entry, `last` being the last entry `(base, pos)`: every
/// `interval` bytes, and a compressed frame also every [`FRAME_RECORDS`]
/// records, since a read decompresses each frame from its entry on and
/// compressed frames are small (by bytes alone, entries would lie several
/// times as many records apart).
pub(crate) fn index_due(
    last: Option<(u64, u64)>,
    base: u64,
    pos: u64,
    compressed: bool,
    interval: u64,
) -> bool {
    last.is_none_or(|(last_base, last_pos)| {
        pos - last_pos >= interval
            || (compressed && base.saturating_sub(last_base) >= FRAME_RECORDS as u64)
    })
}

/// Encodes a batch starting at offset `base` as frames of bounded size,
/// all but the last marked continued; returns the bytes and each frame's
/// `(base offset, position in the bytes, compressed)`. A batch that fits one frame is
/// written as version 1, which has no flags or lead to say (5 bytes less).
///
/// With a compressing `encoder` each frame is compressed (so version 2)
/// unless that does not make it smaller.
pub(crate) fn encode_batch(
    base: u64,
    stored_at: u64,
    records: &[&NewRecord],
    encoder: &mut Encoder,
) -> Result<(Vec<u8>, FramePositions), String> {
    let mut out = Vec::new();
    let mut frames = Vec::new();
    let mut rest = records;
    let mut next = base;
    while !rest.is_empty() {
        let mut take = 0;
        let mut bytes = 0;
        for record in rest.iter().take(FRAME_RECORDS) {
            let size = record_size(record);
            if take > 0 && bytes + size > FRAME_BYTES {
                break;
            }
            bytes += size;
            take += 1;
        }
        let (chunk, tail) = rest.split_at(take);
        let at = out.len() as u64;
        let lead = u32::try_from(next - base).map_err(|_| "too many records in one batch")?;
        let continued = !tail.is_empty();
        let compressed = encoder.compression() != Compression::None
            && encode_compressed_into(&mut out, continued, lead, next, stored_at, chunk, encoder)?;
        if !compressed {
            let version = if lead == 0 && !continued {
                VERSION_1
            } else {
                VERSION
            };
            encode_into(&mut out, version, continued, lead, next, stored_at, chunk)?;
        }
        frames.push((next, at, compressed));
        next += take as u64;
        rest = tail;
    }
    Ok((out, frames))
}

/// Appends one frame to `out` (a version-1 frame cannot be continued nor
/// have a lead).
pub(crate) fn encode_into(
    out: &mut Vec<u8>,
    version: u8,
    continued: bool,
    lead: u32,
    base: u64,
    stored_at: u64,
    records: &[&NewRecord],
) -> Result<(), String> {
    let header = match version {
        VERSION_1 if !continued && lead == 0 => BODY_HEADER_V1,
        VERSION => BODY_HEADER,
        _ => return Err(format!("cannot encode frame version {version}")),
    };
    let len = checked_body_len(records.iter().copied())?;
    // A version-1 header lacks the flags and the lead.
    let len = if header == BODY_HEADER { len } else { len - 5 };
    let count = u32::try_from(records.len()).map_err(|_| "too many records in one batch")?;
    let start = out.len();
    out.reserve(PREFIX + usize::try_from(len).unwrap_or_default());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&[MAGIC, version]);
    if version == VERSION {
        out.push(if continued { CONTINUED } else { 0 });
    }
    out.extend_from_slice(&base.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&stored_at.to_le_bytes());
    if version == VERSION {
        out.extend_from_slice(&lead.to_le_bytes());
    }
    put_records(out, records)?;
    let crc = crc32c::crc32c(&out[start + PREFIX..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// Appends one version-2 frame of `records` compressed by `encoder`;
/// false, with `out` unchanged, when compressing does not make the frame
/// smaller, when several records take more than [`FRAME_BYTES`] (what
/// `decode` expands at most for them), or the topic does not compress.
pub(crate) fn encode_compressed_into(
    out: &mut Vec<u8>,
    continued: bool,
    lead: u32,
    base: u64,
    stored_at: u64,
    records: &[&NewRecord],
    encoder: &mut Encoder,
) -> Result<bool, String> {
    let count = u32::try_from(records.len()).map_err(|_| "too many records in one batch")?;
    checked_body_len(records.iter().copied())?;
    encoder.raw.clear();
    put_records(&mut encoder.raw, records)?;
    let raw_len = u32::try_from(encoder.raw.len()).map_err(|_| "batch too large for one frame")?;
    if records.len() > 1 && encoder.raw.len() > FRAME_BYTES {
        // More than `encode_batch` puts in a frame of several records,
        // which `decode` refuses to expand: stored plain.
        return Ok(false);
    }
    let start = out.len();
    out.extend_from_slice(&[0; PREFIX]);
    out.extend_from_slice(&[MAGIC, VERSION]);
    out.push(if continued { CONTINUED } else { 0 } | COMPRESSED);
    out.extend_from_slice(&base.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&stored_at.to_le_bytes());
    out.extend_from_slice(&lead.to_le_bytes());
    let codec_at = out.len();
    out.push(0);
    out.extend_from_slice(&raw_len.to_le_bytes());
    let packed_at = out.len();
    let Some(codec) = encoder.compress_raw(out) else {
        out.truncate(start);
        return Ok(false);
    };
    if out.len() - packed_at + COMPRESSED_HEADER + 1 >= encoder.raw.len() {
        out.truncate(start);
        return Ok(false);
    }
    out.push(COMPRESSED_END);
    out[codec_at] = codec;
    let len = u32::try_from(out.len() - start - PREFIX)
        .ok()
        .filter(|&len| u64::from(len) <= MAX_BODY)
        .ok_or("compressed frame too large")?;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    let crc = crc32c::crc32c(&out[start + PREFIX..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    Ok(true)
}

/// Appends the records section of a frame.
fn put_records(out: &mut Vec<u8>, records: &[&NewRecord]) -> Result<(), String> {
    for record in records {
        let flags = if record.uid.is_some() { HAS_UID } else { 0 }
            | if record.tag.is_some() { HAS_TAG } else { 0 }
            | if record.headers.is_empty() {
                0
            } else {
                HAS_HEADERS
            };
        out.push(flags);
        put_bytes32(out, record.key.as_bytes())?;
        if let Some(uid) = &record.uid {
            put_bytes32(out, uid.as_bytes())?;
        }
        if let Some(tag) = &record.tag {
            let tag_len = u16::try_from(tag.len()).map_err(|_| "tag too long")?;
            out.extend_from_slice(&tag_len.to_le_bytes());
            out.extend_from_slice(tag);
        }
        if !record.headers.is_empty() {
            put_bytes32(out, &record.headers)?;
        }
        put_bytes32(out, &record.value)?;
    }
    Ok(())
}

/// The frame encoding of `headers` (C25): empty for none, else a count and
/// each name and value with a 16-bit length (the bus's limits keep both
/// far below it; longer ones are refused, never cut).
pub(crate) fn encode_headers(headers: &bus_core::Headers) -> Result<Vec<u8>, String> {
    if headers.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::with_capacity(2 + headers.bytes() + 4 * headers.len());
    let count = u16::try_from(headers.len()).map_err(|_| "too many headers")?;
    out.extend_from_slice(&count.to_le_bytes());
    for (name, value) in headers.iter() {
        for text in [name, value] {
            let len = u16::try_from(text.len()).map_err(|_| "header too long")?;
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(text.as_bytes());
        }
    }
    Ok(out)
}

/// Reverses [`encode_headers`]; `None` when the block does not parse
/// exactly (lengths past its end, trailing bytes, text that is not UTF-8)
/// or is not what [`encode_headers`] writes (no headers, names out of
/// order or repeated): a record has one encoding, so a block that decodes
/// is the one its headers encode to.
pub(crate) fn decode_headers(block: &[u8]) -> Option<bus_core::Headers> {
    fn text<'b>(rest: &mut &'b [u8]) -> Option<&'b str> {
        let (len, tail) = rest.split_first_chunk::<2>()?;
        let len = usize::from(u16::from_le_bytes(*len));
        let (text, tail) = (tail.get(..len)?, tail.get(len..)?);
        *rest = tail;
        std::str::from_utf8(text).ok()
    }
    let (count, mut rest) = block.split_first_chunk::<2>()?;
    let count = u16::from_le_bytes(*count);
    let mut pairs = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let name = text(&mut rest)?;
        let value = text(&mut rest)?;
        pairs.push((name, value));
    }
    let canonical = count > 0 && pairs.windows(2).all(|pair| pair[0].0 < pair[1].0);
    (rest.is_empty() && canonical).then(|| bus_core::Headers::from_stored(pairs))
}

fn put_bytes32(out: &mut Vec<u8>, bytes: &[u8]) -> Result<(), String> {
    let len = u32::try_from(bytes.len()).map_err(|_| "field too long")?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(bytes);
    Ok(())
}

/// The body length announced by a frame prefix.
pub(crate) fn body_len(prefix: &[u8; PREFIX]) -> u64 {
    u64::from(u32::from_le_bytes([
        prefix[0], prefix[1], prefix[2], prefix[3],
    ]))
}

/// Bytes from a frame's start through its base offset (version 2; a
/// version-1 frame has one less, and is never shorter than this).
pub(crate) const HEAD: usize = PREFIX + 11;

/// Where the base offset starts in a body of `version`.
fn base_at(version: u8) -> Option<usize> {
    match version {
        VERSION_1 => Some(2),
        VERSION => Some(3),
        _ => None,
    }
}

/// `(body length, base offset)` when `head` (at least [`HEAD`] bytes)
/// starts like a frame: right magic and version, a length under
/// [`MAX_BODY`]. Only [`decode`] proves it is one.
pub(crate) fn peek(head: &[u8]) -> Option<(u64, u64)> {
    let head = head.get(..HEAD)?;
    if head[PREFIX] != MAGIC {
        return None;
    }
    let at = base_at(head[PREFIX + 1])?;
    let len = u64::from(u32_at(head, 0));
    (len <= MAX_BODY).then(|| (len, u64_at(head, PREFIX + at)))
}

/// Why bytes are not a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The frame runs past the end of the readable bytes.
    Short,
    /// The checksum does not match.
    Checksum,
    /// The checksum matches but the body does not parse.
    Malformed(String),
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Short => f.write_str("frame cut short"),
            Self::Checksum => f.write_str("frame checksum mismatch"),
            Self::Malformed(why) => write!(f, "malformed frame: {why}"),
        }
    }
}

/// Verifies and decodes a frame: `prefix` + `body` as read from disk. The
/// records of a compressed frame are decompressed into `raw` (the reader's
/// buffer, reused frame after frame) and borrowed from there.
pub(crate) fn decode<'a>(
    prefix: &[u8; PREFIX],
    body: &'a [u8],
    raw: &'a mut Vec<u8>,
) -> Result<Frame<'a>, Fault> {
    let stored_crc = u32::from_le_bytes([prefix[4], prefix[5], prefix[6], prefix[7]]);
    if crc32c::crc32c(body) != stored_crc {
        return Err(Fault::Checksum);
    }
    let (version, at) = match body {
        [MAGIC, version, ..] => (*version, base_at(*version)),
        _ => (0, None),
    };
    let header = if version == VERSION {
        BODY_HEADER
    } else {
        BODY_HEADER_V1
    };
    let Some(at) = at.filter(|_| body.len() >= header) else {
        return Err(Fault::Malformed("bad header".to_owned()));
    };
    let flags = if version == VERSION { body[2] } else { 0 };
    if flags & !(CONTINUED | COMPRESSED) != 0 {
        return Err(Fault::Malformed(format!(
            "unknown frame flags {flags:#04x}"
        )));
    }
    let (codec, records) = if flags & COMPRESSED == 0 {
        (None, &body[header..])
    } else {
        let Some((&COMPRESSED_END, packed)) = body
            .get(header + COMPRESSED_HEADER..)
            .and_then(<[u8]>::split_last)
        else {
            return Err(Fault::Malformed("bad compressed header or end".to_owned()));
        };
        let codec = body[header];
        let raw_len = u32_at(body, header + 1);
        // A frame of several records holds at most FRAME_BYTES of them
        // (`encode_batch`): a small frame announcing more is not followed.
        if u32_at(body, at + 8) > 1 && raw_len as usize > FRAME_BYTES {
            return Err(Fault::Malformed(format!(
                "compressed records of several records announce {raw_len} bytes"
            )));
        }
        crate::log::codec::decompress(codec, packed, raw_len, MAX_BODY, raw)
            .map_err(Fault::Malformed)?;
        let raw: &'a Vec<u8> = raw;
        (Some(codec), raw.as_slice())
    };
    let frame = Frame {
        version,
        continued: flags & CONTINUED != 0,
        lead: if version == VERSION {
            u32_at(body, at + 20)
        } else {
            0
        },
        base: u64_at(body, at),
        count: u32_at(body, at + 8),
        stored_at: u64_at(body, at + 12),
        codec,
        records,
    };
    // Walk the records once so later iteration cannot fail on structure.
    let mut records = frame.records();
    for _ in 0..frame.count {
        records.next_record()?;
    }
    if !records.rest.is_empty() {
        return Err(Fault::Malformed("trailing bytes".to_owned()));
    }
    Ok(frame)
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

impl<'a> Frame<'a> {
    /// The offset of its batch's first record.
    pub fn batch_base(&self) -> u64 {
        self.base.saturating_sub(u64::from(self.lead))
    }

    /// The offset after the frame's last record.
    pub fn end(&self) -> u64 {
        self.base.saturating_add(u64::from(self.count))
    }

    /// The frame's records in order.
    pub fn records(&self) -> Records<'a> {
        Records { rest: self.records }
    }
}

/// Iterator over a verified frame's records.
pub(crate) struct Records<'a> {
    rest: &'a [u8],
}

impl<'a> Records<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Fault> {
        if self.rest.len() < n {
            return Err(Fault::Malformed("record runs past the frame".to_owned()));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn bytes32(&mut self) -> Result<&'a [u8], Fault> {
        let len = u32_at(self.take(4)?, 0);
        let len = usize::try_from(len).map_err(|_| Fault::Malformed("length".to_owned()))?;
        self.take(len)
    }

    fn next_record(&mut self) -> Result<RecordRef<'a>, Fault> {
        let flags = self.take(1)?[0];
        // Bits this version does not know would change how the rest parses.
        if flags & !(HAS_UID | HAS_TAG | HAS_HEADERS) != 0 {
            return Err(Fault::Malformed(format!(
                "unknown record flags {flags:#04x}"
            )));
        }
        let key = self.bytes32()?;
        let uid = if flags & HAS_UID != 0 {
            Some(self.bytes32()?)
        } else {
            None
        };
        let tag = if flags & HAS_TAG != 0 {
            let len = self.take(2)?;
            let len = usize::from(u16::from_le_bytes([len[0], len[1]]));
            Some(self.take(len)?)
        } else {
            None
        };
        let headers = if flags & HAS_HEADERS != 0 {
            let block = self.bytes32()?;
            if decode_headers(block).is_none() {
                return Err(Fault::Malformed("record headers do not parse".to_owned()));
            }
            Some(block)
        } else {
            None
        };
        let value = self.bytes32()?;
        Ok(RecordRef {
            key,
            uid,
            tag,
            headers,
            value,
        })
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = RecordRef<'a>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        self.next_record().ok()
    }
}

#[cfg(test)]
mod tests;
