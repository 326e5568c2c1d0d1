//! The cold object format, versions 2 and 3: one object holds the records
//! of one (topic, partition, offset range) `[from, end)`, with no gap.
//!
//! ```text
//! header   "BUSCOLD1" | version u16 (2 or 3) | [codec u8, version 3 only: 1 LZ4, 2 zstd]
//!          | topic_len u16 | topic | partition u32 | from u64 | end u64 | crc32c u32 (of the header before it)
//! frames   len u32 | crc32c u32 (of the len bytes that follow) | payload
//!          version 3: the len bytes are raw_len u32 | the payload compressed with the codec
//!          payload = base u64 | count u32 | count × record
//!          record  = stored_at u64 | key_len u32 | key | uid_flag u8 [uid_len u32 | uid]
//!                    | value_len u32 | value (the JSON bytes as the backend stored them)
//!                    | tag_flag u8 [tag 32 bytes] (the record's C14 HMAC tag, kept as is)
//!                    | header_count u16 | header_count × (name_len u32 | name | value_len u32 | value)
//!                      (C25 headers, name order; the tag covers them)
//! index    count × (base u64 | frame_pos u64), then crc32c u32 of the entries
//! footer   index_pos u64 | frames u32 | from u64 | end u64 | "BUSCIDX1"   (36 bytes)
//! ```
//!
//! Version 1 (written before headers were kept) is the same without
//! `header_count` and its headers; it is still read, its records with no
//! headers. Uncompressed objects are written as version 2, byte for byte
//! as before version 3 existed (an archive adopts a leftover object only
//! when it is byte-identical); version 3 is written only with a codec. A
//! frame's checksum covers its stored (compressed) bytes, so damage is
//! named before anything is decompressed, and decompression is bounded by
//! the frame's stated `raw_len`. All integers are big-endian. A frame's records have consecutive offsets
//! from its `base`; the frames cover `[from, end)` in order. The header and
//! footer name the topic, partition and range, so an object copied under
//! another range's name, or from another topic, is refused as `Corrupt`.
//! Values and `stored_at` are kept byte for byte, and the tag travels with
//! the record: a record edited with its CRCs recomputed still fails its tag
//! (C14 → `Integrity`) when the reader has the control key.

use bus_core::{BusError, Compression, Headers};

const MAGIC: &[u8; 8] = b"BUSCOLD1";
const FOOTER_MAGIC: &[u8; 8] = b"BUSCIDX1";
const VERSION: u16 = 2;
/// Version 2 with a codec byte and compressed frames.
const VERSION_3: u16 = 3;
/// The headerless version 1, still read.
const VERSION_1: u16 = 1;
/// The most a compressed frame may claim to decompress to (a frame holds
/// at most [`FRAME_RECORDS`] records; a forged length must not make the
/// reader allocate without bound).
const MAX_RAW_FRAME: usize = 1 << 30;
const FOOTER_LEN: usize = 8 + 4 + 8 + 8 + 8;
/// Records per frame: small enough that a read from the middle of an
/// object decodes little it does not return, large enough that the 8 bytes
/// of frame overhead and an index entry are noise per record.
const FRAME_RECORDS: usize = 128;
/// A frame also closes once its records reach this many bytes, so a frame
/// of large records stays far below what a reader accepts
/// ([`MAX_RAW_FRAME`]); one record larger than that is refused.
const FRAME_BYTES: usize = 8 << 20;
/// Length of a tag (HMAC-SHA256).
pub const TAG_LEN: usize = bus_core::auth::TAG_LEN;

/// One record as the cold tier keeps it: what the backend stored, exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColdRecord {
    /// The record's offset in its partition.
    pub offset: u64,
    /// When the backend stored it (epoch ms), unchanged.
    pub stored_at: u64,
    /// The partition key.
    pub key: String,
    /// The event UID, if the record has one.
    pub uid: Option<String>,
    /// The value's JSON bytes as the backend stored them (tags cover these
    /// bytes, so they are never re-encoded).
    pub value: Vec<u8>,
    /// The record's HMAC tag (C14), when the backend stored one.
    pub tag: Option<[u8; TAG_LEN]>,
    /// The record's headers (C25), empty for most records; the tag covers them.
    pub headers: Headers,
}

/// Where an object belongs: checked against what its header and footer say.
#[derive(Debug, Clone, Copy)]
pub struct Place<'a> {
    /// Topic name.
    pub topic: &'a str,
    /// Partition index.
    pub partition: u32,
    /// First offset (inclusive).
    pub from: u64,
    /// Offset after the last record.
    pub end: u64,
}

impl Place<'_> {
    /// `topic/partition [from, end)`, the range an error names.
    pub fn describe(&self) -> String {
        format!(
            "cold range {}/{} [{}, {})",
            self.topic, self.partition, self.from, self.end
        )
    }
}

/// Encodes `records` (consecutive offsets `place.from..place.end`) as one object.
pub fn encode(place: Place<'_>, records: &[ColdRecord]) -> Result<Vec<u8>, BusError> {
    encode_version(place, records, VERSION, Compression::None)
}

/// [`encode`] with each frame compressed by `compression` (version 3; with
/// [`Compression::None`] the same bytes as [`encode`]).
pub fn encode_compressed(
    place: Place<'_>,
    records: &[ColdRecord],
    compression: Compression,
) -> Result<Vec<u8>, BusError> {
    let version = if compression.is_none() {
        VERSION
    } else {
        VERSION_3
    };
    encode_version(place, records, version, compression)
}

fn codec_byte(compression: Compression) -> u8 {
    match compression {
        Compression::None => 0,
        Compression::Lz4 => 1,
        Compression::Zstd => 2,
    }
}

fn compress(compression: Compression, payload: &[u8]) -> Result<Vec<u8>, BusError> {
    let mut out = len32(payload.len())?.to_be_bytes().to_vec();
    match compression {
        Compression::None => out.extend_from_slice(payload),
        Compression::Lz4 => out.extend_from_slice(&lz4_flex::block::compress(payload)),
        Compression::Zstd => out.extend_from_slice(
            &zstd::bulk::compress(payload, 0)
                .map_err(|e| BusError::backend("cold", format!("zstd: {e}")))?,
        ),
    }
    Ok(out)
}

/// The payload of a version 3 frame's stored bytes.
fn decompress(codec: u8, stored: &[u8]) -> Result<Vec<u8>, String> {
    let mut cursor = Cursor {
        bytes: stored,
        pos: 0,
    };
    let raw_len = cursor.u32()? as usize;
    if raw_len > MAX_RAW_FRAME {
        return Err(format!("a frame claims {raw_len} bytes decompressed"));
    }
    let packed = &stored[cursor.pos..];
    let raw = match codec {
        1 => lz4_flex::block::decompress(packed, raw_len).map_err(|e| format!("lz4: {e}"))?,
        2 => zstd::bulk::decompress(packed, raw_len).map_err(|e| format!("zstd: {e}"))?,
        other => return Err(format!("unknown codec {other}")),
    };
    if raw.len() != raw_len {
        return Err(format!(
            "a frame decompressed to {} bytes, {raw_len} stated",
            raw.len()
        ));
    }
    Ok(raw)
}

fn encode_version(
    place: Place<'_>,
    records: &[ColdRecord],
    version: u16,
    compression: Compression,
) -> Result<Vec<u8>, BusError> {
    let consecutive = records
        .iter()
        .zip(place.from..)
        .all(|(record, offset)| record.offset == offset);
    let count = u64::try_from(records.len()).unwrap_or(u64::MAX);
    if !consecutive || place.end.checked_sub(place.from) != Some(count) || records.is_empty() {
        return Err(BusError::invalid(
            "records",
            format!(
                "an object holds consecutive offsets {}..{} with no gap; got {} records",
                place.from,
                place.end,
                records.len()
            ),
        ));
    }
    let mut out =
        Vec::with_capacity(64 + records.iter().map(|r| r.value.len() + 64).sum::<usize>());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&version.to_be_bytes());
    if version >= VERSION_3 {
        out.push(codec_byte(compression));
    }
    let topic_len = u16::try_from(place.topic.len())
        .map_err(|_| BusError::invalid("topic", "longer than 65535 bytes"))?;
    out.extend_from_slice(&topic_len.to_be_bytes());
    out.extend_from_slice(place.topic.as_bytes());
    out.extend_from_slice(&place.partition.to_be_bytes());
    out.extend_from_slice(&place.from.to_be_bytes());
    out.extend_from_slice(&place.end.to_be_bytes());
    out.extend_from_slice(&crc32c::crc32c(&out).to_be_bytes());
    let mut index = Vec::new();
    for chunk in frames(records)? {
        let frame_pos = out.len() as u64;
        let mut payload = Vec::new();
        payload.extend_from_slice(&chunk[0].offset.to_be_bytes());
        payload.extend_from_slice(&len32(chunk.len())?.to_be_bytes());
        for record in chunk {
            put_record(&mut payload, record, version)?;
        }
        if version >= VERSION_3 {
            payload = compress(compression, &payload)?;
        }
        out.extend_from_slice(&len32(payload.len())?.to_be_bytes());
        out.extend_from_slice(&crc32c::crc32c(&payload).to_be_bytes());
        out.extend_from_slice(&payload);
        index.push((chunk[0].offset, frame_pos));
    }
    let index_pos = out.len() as u64;
    let entries_start = out.len();
    for (base, pos) in &index {
        out.extend_from_slice(&base.to_be_bytes());
        out.extend_from_slice(&pos.to_be_bytes());
    }
    let index_crc = crc32c::crc32c(&out[entries_start..]);
    out.extend_from_slice(&index_crc.to_be_bytes());
    out.extend_from_slice(&index_pos.to_be_bytes());
    out.extend_from_slice(&len32(index.len())?.to_be_bytes());
    out.extend_from_slice(&place.from.to_be_bytes());
    out.extend_from_slice(&place.end.to_be_bytes());
    out.extend_from_slice(FOOTER_MAGIC);
    Ok(out)
}

/// `records` cut into frames of at most [`FRAME_RECORDS`] records, closed
/// early once they hold [`FRAME_BYTES`] of values.
fn frames(records: &[ColdRecord]) -> Result<Vec<&[ColdRecord]>, BusError> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0usize);
    for (i, record) in records.iter().enumerate() {
        let size = record.value.len() + record.key.len() + 64;
        if size > MAX_RAW_FRAME / 2 {
            return Err(BusError::invalid(
                "records",
                format!(
                    "record {} is over {} bytes",
                    record.offset,
                    MAX_RAW_FRAME / 2
                ),
            ));
        }
        if i > start && (i - start == FRAME_RECORDS || bytes + size > FRAME_BYTES) {
            out.push(&records[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < records.len() {
        out.push(&records[start..]);
    }
    Ok(out)
}

fn len32(len: usize) -> Result<u32, BusError> {
    u32::try_from(len).map_err(|_| BusError::invalid("records", "a frame or field over 4 GiB"))
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) -> Result<(), BusError> {
    out.extend_from_slice(&len32(bytes.len())?.to_be_bytes());
    out.extend_from_slice(bytes);
    Ok(())
}

fn put_record(out: &mut Vec<u8>, record: &ColdRecord, version: u16) -> Result<(), BusError> {
    out.extend_from_slice(&record.stored_at.to_be_bytes());
    put_bytes(out, record.key.as_bytes())?;
    match &record.uid {
        Some(uid) => {
            out.push(1);
            put_bytes(out, uid.as_bytes())?;
        }
        None => out.push(0),
    }
    put_bytes(out, &record.value)?;
    match &record.tag {
        Some(tag) => {
            out.push(1);
            out.extend_from_slice(tag);
        }
        None => out.push(0),
    }
    if version < VERSION {
        return Ok(());
    }
    let count = u16::try_from(record.headers.len())
        .map_err(|_| BusError::invalid("headers", "more than 65535 headers on one record"))?;
    out.extend_from_slice(&count.to_be_bytes());
    for (name, value) in record.headers.iter() {
        put_bytes(out, name.as_bytes())?;
        put_bytes(out, value.as_bytes())?;
    }
    Ok(())
}

/// A bounds-checked reader over an object's bytes; every failure names why.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(format!("truncated: {n} bytes wanted at byte {}", self.pos));
        };
        let out = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(out)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.array::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_be_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_be_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_be_bytes(self.array()?))
    }
    fn sized(&mut self) -> Result<&'a [u8], String> {
        let len = self.u32()? as usize;
        self.take(len)
    }
    fn text(&mut self, what: &str) -> Result<String, String> {
        String::from_utf8(self.sized()?.to_vec()).map_err(|_| format!("{what} is not UTF-8"))
    }
}

/// Decodes the records at offsets `from..` (at most `max`) of an object
/// that must hold exactly `place`. Any mismatch, truncation or checksum
/// failure is [`BusError::Corrupt`] naming the range.
pub fn decode(
    place: Place<'_>,
    bytes: &[u8],
    from: u64,
    max: usize,
) -> Result<Vec<ColdRecord>, BusError> {
    decode_inner(place, bytes, from, max).map_err(|reason| BusError::Corrupt {
        location: place.describe(),
        offset: from.max(place.from),
        reason,
    })
}

fn decode_inner(
    place: Place<'_>,
    bytes: &[u8],
    from: u64,
    max: usize,
) -> Result<Vec<ColdRecord>, String> {
    let mut header = Cursor { bytes, pos: 0 };
    if header.take(8)? != MAGIC {
        return Err("not a bus cold object (bad magic)".into());
    }
    let version = header.u16()?;
    if !(VERSION_1..=VERSION_3).contains(&version) {
        return Err(format!(
            "object format version {version}; this reader knows {VERSION_1} to {VERSION_3}"
        ));
    }
    let codec = if version >= VERSION_3 {
        header.u8()?
    } else {
        0
    };
    let topic_len = usize::from(header.u16()?);
    let topic = header.take(topic_len)?;
    let partition = header.u32()?;
    let (head_from, head_end) = (header.u64()?, header.u64()?);
    let header_len = header.pos;
    if header.u32()? != crc32c::crc32c(&bytes[..header_len]) {
        return Err("header checksum mismatch".into());
    }
    if topic != place.topic.as_bytes() || partition != place.partition {
        return Err(format!(
            "object belongs to topic {:?} partition {partition}, not this one (foreign object)",
            String::from_utf8_lossy(topic)
        ));
    }
    if (head_from, head_end) != (place.from, place.end) {
        return Err(format!(
            "object holds [{head_from}, {head_end}), not the range its name and the manifest say"
        ));
    }
    let footer_at = bytes
        .len()
        .checked_sub(FOOTER_LEN)
        .ok_or("truncated: no footer")?;
    let mut footer = Cursor {
        bytes,
        pos: footer_at,
    };
    let index_pos = usize::try_from(footer.u64()?).map_err(|_| "index position too large")?;
    let frames = footer.u32()? as usize;
    let (foot_from, foot_end) = (footer.u64()?, footer.u64()?);
    if footer.take(8)? != FOOTER_MAGIC || (foot_from, foot_end) != (place.from, place.end) {
        return Err("truncated or damaged footer".into());
    }
    let index_len = frames.checked_mul(16).ok_or("index too large")?;
    let index_end = index_pos
        .checked_add(index_len)
        .and_then(|e| e.checked_add(4));
    if index_pos < header.pos || index_end != Some(footer_at) {
        return Err("index position and footer disagree (truncated?)".into());
    }
    let entries = &bytes[index_pos..index_pos + index_len];
    let mut crc = Cursor {
        bytes,
        pos: index_pos + index_len,
    };
    if crc.u32()? != crc32c::crc32c(entries) {
        return Err("index checksum mismatch".into());
    }
    let index: Vec<(u64, usize)> = entries
        .chunks_exact(16)
        .map(|e| {
            let mut c = Cursor { bytes: e, pos: 0 };
            Ok((
                c.u64()?,
                usize::try_from(c.u64()?).map_err(|_| "bad frame position")?,
            ))
        })
        .collect::<Result<_, String>>()?;
    let from = from.max(place.from);
    // The last frame starting at or before `from`: the index spares decoding
    // the frames before it.
    let start = index
        .partition_point(|(base, _)| *base <= from)
        .saturating_sub(1);
    let mut out = Vec::new();
    let mut expected = index.get(start).map_or(place.from, |e| e.0);
    for &(base, pos) in &index[start..] {
        if out.len() >= max {
            break;
        }
        if base != expected {
            return Err(format!(
                "frame at byte {pos} starts at offset {base}, expected {expected}"
            ));
        }
        let mut frame = Cursor {
            bytes: &bytes[..index_pos],
            pos,
        };
        let len = frame.u32()? as usize;
        let sum = frame.u32()?;
        let stored = frame.take(len)?;
        if crc32c::crc32c(stored) != sum {
            return Err(format!("frame at offset {base}: checksum mismatch"));
        }
        let unpacked;
        let payload = if version >= VERSION_3 {
            unpacked =
                decompress(codec, stored).map_err(|e| format!("frame at offset {base}: {e}"))?;
            unpacked.as_slice()
        } else {
            stored
        };
        let mut records = Cursor {
            bytes: payload,
            pos: 0,
        };
        if records.u64()? != base {
            return Err(format!(
                "frame at offset {base}: payload names another base"
            ));
        }
        let count = records.u32()?;
        let frame_end = base
            .checked_add(u64::from(count))
            .ok_or("frame count overflows")?;
        if frame_end > place.end {
            return Err(format!("frame at offset {base} runs past the range end"));
        }
        for offset in base..frame_end {
            let record = read_record(&mut records, offset, version)?;
            if offset >= from && out.len() < max {
                out.push(record);
            }
        }
        expected = frame_end;
    }
    if out.len() < max && expected != place.end {
        return Err(format!(
            "frames end at offset {expected}, expected {}",
            place.end
        ));
    }
    Ok(out)
}

fn read_record(c: &mut Cursor<'_>, offset: u64, version: u16) -> Result<ColdRecord, String> {
    let stored_at = c.u64()?;
    let key = c.text("key")?;
    let uid = match c.u8()? {
        0 => None,
        1 => Some(c.text("UID")?),
        flag => return Err(format!("record {offset}: bad UID flag {flag}")),
    };
    let value = c.sized()?.to_vec();
    let tag = match c.u8()? {
        0 => None,
        1 => Some(c.array::<TAG_LEN>()?),
        flag => return Err(format!("record {offset}: bad tag flag {flag}")),
    };
    let mut pairs = Vec::new();
    if version >= VERSION {
        for _ in 0..c.u16()? {
            pairs.push((c.text("header name")?, c.text("header value")?));
        }
    }
    Ok(ColdRecord {
        offset,
        stored_at,
        key,
        uid,
        value,
        tag,
        headers: Headers::from_stored(pairs),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn records(headers: &Headers) -> Vec<ColdRecord> {
        (10..13)
            .map(|offset| ColdRecord {
                offset,
                stored_at: 5 + offset,
                key: "k".into(),
                uid: (offset == 11).then(|| "u".into()),
                value: br#"{"n":1}"#.to_vec(),
                tag: Some([u8::try_from(offset).unwrap_or(0); TAG_LEN]),
                headers: headers.clone(),
            })
            .collect()
    }

    const PLACE: Place<'static> = Place {
        topic: "t",
        partition: 2,
        from: 10,
        end: 13,
    };

    #[test]
    fn headers_round_trip_and_version_1_objects_still_read() {
        let headers = Headers::from_stored([("traceparent", "00-1"), ("x-é", "ü")]);
        let with = records(&headers);
        let object = encode(PLACE, &with).unwrap();
        assert_eq!(decode(PLACE, &object, 0, 10).unwrap(), with);
        assert_eq!(decode(PLACE, &object, 12, 10).unwrap(), with[2..]);
        // An object written before headers were kept: its records, no headers.
        let without = records(&Headers::default());
        let old = encode_version(PLACE, &without, VERSION_1, Compression::None).unwrap();
        assert_ne!(old, encode(PLACE, &without).unwrap());
        assert_eq!(decode(PLACE, &old, 0, 10).unwrap(), without);
        // A version this reader does not know is refused, naming the range.
        let mut future = object.clone();
        future[9] = 4;
        let error = decode(PLACE, &future, 0, 10).unwrap_err().to_string();
        assert!(
            error.contains("version 4") && error.contains("t/2 [10, 13)"),
            "{error}"
        );
    }

    #[test]
    fn compressed_objects_round_trip_and_damage_is_named() {
        let headers = Headers::from_stored([("traceparent", "00-1")]);
        let with = records(&headers);
        // No codec: exactly the version 2 bytes.
        assert_eq!(
            encode_compressed(PLACE, &with, Compression::None).unwrap(),
            encode(PLACE, &with).unwrap()
        );
        for compression in [Compression::Lz4, Compression::Zstd] {
            let object = encode_compressed(PLACE, &with, compression).unwrap();
            assert_eq!(u16::from_be_bytes([object[8], object[9]]), VERSION_3);
            assert_eq!(
                decode(PLACE, &object, 0, 10).unwrap(),
                with,
                "{compression}"
            );
            assert_eq!(decode(PLACE, &object, 11, 1).unwrap(), with[1..2]);
            // A flipped byte in a frame fails its checksum before decompression.
            let header_len = 8 + 2 + 1 + 2 + 1 + 4 + 8 + 8 + 4;
            let mut flipped = object.clone();
            flipped[header_len + 9] ^= 0x40;
            let error = decode(PLACE, &flipped, 0, 10).unwrap_err();
            assert!(
                matches!(&error, BusError::Corrupt { location, .. } if location == "cold range t/2 [10, 13)"),
                "{compression}: {error:?}"
            );
        }
    }

    #[test]
    fn large_records_get_frames_of_their_own() {
        let big = |offset| ColdRecord {
            offset,
            stored_at: 1,
            key: "k".into(),
            uid: None,
            value: vec![b'7'; 3 << 20],
            tag: None,
            headers: Headers::default(),
        };
        let place = Place {
            topic: "t",
            partition: 0,
            from: 0,
            end: 5,
        };
        let records: Vec<_> = (0..5).map(big).collect();
        // 3 MiB each: two per frame under the 8 MiB bound, so three frames.
        assert_eq!(frames(&records).unwrap().len(), 3);
        for compression in [Compression::None, Compression::Zstd] {
            let object = encode_compressed(place, &records, compression).unwrap();
            assert!(
                decode(place, &object, 0, 10).unwrap() == records,
                "{compression}"
            );
        }
    }

    #[test]
    fn a_forged_raw_length_is_refused_without_allocating_it() {
        // A frame whose checksum is right but whose stated size is absurd.
        let stored = [&u32::MAX.to_be_bytes()[..], b"xx"].concat();
        let error = decompress(2, &stored).unwrap_err();
        assert!(error.contains("claims"), "{error}");
        let short = [&8u32.to_be_bytes()[..], &lz4_flex::block::compress(b"abc")].concat();
        assert!(decompress(1, &short).is_err());
    }
}
