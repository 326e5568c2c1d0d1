//! Entry points for the fuzz targets in `fuzz/` (cargo feature `fuzzing`):
//! thin wrappers over the private frame, segment, index and UID-map code,
//! with owned types so a target can compare what it encoded with what
//! decodes. Not a stable API.
#![doc(hidden)]

use std::fs::File;

use crate::log::frame::{self, NewRecord, PREFIX};
use crate::log::index::{self, SegmentIndex};
use crate::log::segment;
use crate::uid::index::UidIndex;
use crate::uid::map::UidMap;
use bus_core::BusError;

/// A record to encode into a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Partition key.
    pub key: String,
    /// Event UID.
    pub uid: Option<String>,
    /// Authentication tag.
    pub tag: Option<Vec<u8>>,
    /// The record's headers as the frame encodes them (empty: none).
    pub headers: Vec<u8>,
    /// Value bytes.
    pub value: Vec<u8>,
}

/// A record as decoded from a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedRecord {
    /// Partition key bytes.
    pub key: Vec<u8>,
    /// Event UID bytes.
    pub uid: Option<Vec<u8>>,
    /// Authentication tag.
    pub tag: Option<Vec<u8>>,
    /// The record's headers as the frame encodes them (empty: none).
    pub headers: Vec<u8>,
    /// Value bytes.
    pub value: Vec<u8>,
}

/// A frame whose checksum verified and whose records parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedFrame {
    /// Format version (1: before batches were split; 2: with frame flags).
    pub version: u8,
    /// More frames of the same batch follow.
    pub continued: bool,
    /// Records of the batch in the frames before this one.
    pub lead: u32,
    /// Offset of the first record.
    pub base: u64,
    /// Records announced by the header.
    pub count: u32,
    /// Epoch ms of the write.
    pub stored_at: u64,
    /// The codec byte of a compressed frame (1 lz4, 2 zstd).
    pub codec: Option<u8>,
    /// The records, by the same iterator fetch uses.
    pub records: Vec<DecodedRecord>,
    /// Bytes the frame takes (prefix included).
    pub len: usize,
}

/// Bytes before a frame's checksummed body.
pub const FRAME_PREFIX: usize = PREFIX;

/// Encodes one (closing) frame the way the partition writer does.
pub fn encode_frame(base: u64, stored_at: u64, records: &[Record]) -> Result<Vec<u8>, BusError> {
    encode_frame_as(frame::VERSION_1, false, 0, base, stored_at, records)
}

/// Encodes one frame of format `version`, marked `continued` or not, the
/// batch holding `lead` records before it.
pub fn encode_frame_as(
    version: u8,
    continued: bool,
    lead: u32,
    base: u64,
    stored_at: u64,
    records: &[Record],
) -> Result<Vec<u8>, BusError> {
    let records = new_records(records);
    let mut out = Vec::new();
    frame::encode_into(
        &mut out,
        version,
        continued,
        lead,
        base,
        stored_at,
        &records.iter().collect::<Vec<_>>(),
    )
    .map_err(unencodable)?;
    Ok(out)
}

/// Encodes one frame the way the writer of a topic with `compression`
/// does: compressed (version 2) unless that does not make it smaller.
pub fn encode_frame_compressed(
    compression: bus_core::Compression,
    continued: bool,
    lead: u32,
    base: u64,
    stored_at: u64,
    records: &[Record],
) -> Result<Vec<u8>, BusError> {
    let records = new_records(records);
    let refs: Vec<&NewRecord> = records.iter().collect();
    let mut out = Vec::new();
    let mut encoder = crate::log::codec::Encoder::new(compression);
    if !frame::encode_compressed_into(
        &mut out,
        continued,
        lead,
        base,
        stored_at,
        &refs,
        &mut encoder,
    )
    .map_err(unencodable)?
    {
        frame::encode_into(
            &mut out,
            frame::VERSION,
            continued,
            lead,
            base,
            stored_at,
            &refs,
        )
        .map_err(unencodable)?;
    }
    Ok(out)
}

/// Records the frame format cannot hold (a tag over `u16::MAX` bytes, a
/// frame over its limit).
fn unencodable(why: String) -> BusError {
    BusError::invalid("records", why)
}

fn new_records(records: &[Record]) -> Vec<NewRecord> {
    records
        .iter()
        .map(|r| NewRecord {
            key: r.key.clone(),
            uid: r.uid.clone(),
            tag: r.tag.clone(),
            headers: r.headers.clone(),
            value: r.value.clone(),
        })
        .collect()
}

/// Decodes the frame at the start of `bytes`, reading as much body as its
/// prefix announces (as the segment reader does); `Err` (an argument error
/// on `bytes`) says why not.
pub fn decode_frame(bytes: &[u8]) -> Result<DecodedFrame, BusError> {
    let not_a_frame = |why: String| BusError::invalid("frame", why);
    let prefix: [u8; PREFIX] = bytes
        .get(..PREFIX)
        .and_then(|p| p.try_into().ok())
        .ok_or_else(|| not_a_frame("shorter than a prefix".to_owned()))?;
    let len = usize::try_from(frame::body_len(&prefix)).map_err(|e| not_a_frame(e.to_string()))?;
    let body = bytes
        .get(PREFIX..)
        .and_then(|rest| rest.get(..len))
        .ok_or_else(|| not_a_frame("body cut short".to_owned()))?;
    let mut raw = Vec::new();
    let decoded =
        frame::decode(&prefix, body, &mut raw).map_err(|fault| not_a_frame(fault.to_string()))?;
    Ok(DecodedFrame {
        version: decoded.version,
        continued: decoded.continued,
        lead: decoded.lead,
        base: decoded.base,
        count: decoded.count,
        stored_at: decoded.stored_at,
        codec: decoded.codec,
        records: decoded
            .records()
            .map(|r| DecodedRecord {
                key: r.key.to_vec(),
                uid: r.uid.map(<[u8]>::to_vec),
                tag: r.tag.map(<[u8]>::to_vec),
                headers: r.headers.map(<[u8]>::to_vec).unwrap_or_default(),
                value: r.value.to_vec(),
            })
            .collect(),
        len: PREFIX + len,
    })
}

/// `(body length, base offset)` when `head` starts like a frame.
pub fn peek_frame(head: &[u8]) -> Option<(u64, u64)> {
    frame::peek(head)
}

/// What [`scan_segment`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanSummary {
    /// Offset after the last valid record.
    pub end: u64,
    /// Bytes of valid frames.
    pub valid_len: u64,
    /// Sparse index entries.
    pub index: Vec<(u64, u64)>,
    /// `(uid, offset)` of the records with a UID.
    pub uids: Vec<(String, u64)>,
    /// Where and why verification stopped.
    pub fault: Option<(u64, String)>,
    /// Whether the stop looks like a torn tail.
    pub torn: bool,
}

/// The full verifying scan recovery runs over a segment file.
pub fn scan_segment(file: &File, base: u64, index_interval: u64) -> std::io::Result<ScanSummary> {
    let scan = segment::scan(file, base, index_interval)?;
    Ok(ScanSummary {
        end: scan.end,
        valid_len: scan.valid_len,
        index: scan.index,
        uids: scan.uids,
        fault: scan.fault,
        torn: scan.torn,
    })
}

/// Where reading can resume past damage: the first verifying frame at or
/// after `start` with a base of at least `min_base`.
pub fn next_verified_frame(
    file: &File,
    start: u64,
    end: u64,
    min_base: u64,
) -> std::io::Result<Option<(u64, u64)>> {
    segment::next_verified_frame(file, start, end, min_base)
}

/// A sealed segment's sparse index, as its `.idx` file holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexFile {
    /// `(frame base offset, byte position)`.
    pub entries: Vec<(u64, u64)>,
    /// Offset after the last record.
    pub end: u64,
    /// Bytes of valid frames.
    pub len: u64,
    /// Newest `stored_at`.
    pub max_ts: u64,
    /// Oldest `stored_at`.
    pub min_ts: Option<u64>,
}

/// Encodes a `.idx` file.
pub fn encode_index(base: u64, index: &IndexFile) -> Vec<u8> {
    index::encode_index(
        base,
        &SegmentIndex {
            entries: index.entries.clone(),
            end: index.end,
            len: index.len,
            max_ts: index.max_ts,
            min_ts: index.min_ts,
        },
    )
}

/// Decodes a `.idx` file checked against the segment's base and length.
pub fn decode_index(bytes: &[u8], base: u64, log_len: u64) -> Option<IndexFile> {
    index::decode_index(bytes, base, log_len).map(|index| IndexFile {
        entries: index.entries,
        end: index.end,
        len: index.len,
        max_ts: index.max_ts,
        min_ts: index.min_ts,
    })
}

/// The index's answer to "where do I start reading for `offset`".
pub fn index_floor(index: &IndexFile, offset: u64) -> (u64, u64) {
    SegmentIndex {
        entries: index.entries.clone(),
        ..SegmentIndex::default()
    }
    .floor(offset)
}

/// Encodes a `.uids` file.
pub fn encode_uids(base: u64, end: u64, uids: &[(String, u64)]) -> Vec<u8> {
    index::encode_uids(base, end, uids)
}

/// Decodes a `.uids` file of the segment `base..end`.
pub fn decode_uids(bytes: &[u8], base: u64, end: u64) -> Option<Vec<(String, u64)>> {
    index::decode_uids(bytes, base, end)
}

/// The UID → first offset table behind dedup.
#[derive(Debug, Default)]
pub struct FuzzUidMap(UidMap);

impl FuzzUidMap {
    /// See `UidMap::insert_first`.
    pub fn insert_first(&mut self, uid: &[u8], offset: u64) -> Option<u64> {
        self.0.insert_first(uid, offset)
    }

    /// See `UidMap::get`.
    pub fn get(&self, uid: &[u8]) -> Option<u64> {
        self.0.get(uid)
    }

    /// See `UidMap::reserve`.
    pub fn reserve(&mut self, additional: usize) {
        self.0.reserve(additional);
    }

    /// See `UidMap::retain`.
    pub fn retain(&mut self, keep: impl FnMut(&[u8], &mut u64) -> bool) {
        self.0.retain(keep);
    }

    /// Number of UIDs held.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no UID is held.
    pub fn is_empty(&self) -> bool {
        self.0.len() == 0
    }
}

/// The UID → every retained offset index of a partition.
#[derive(Debug, Default)]
pub struct FuzzUidIndex(UidIndex);

impl FuzzUidIndex {
    /// See `UidIndex::push`.
    pub fn push(&mut self, uid: String, offset: u64) {
        self.0.push(uid, offset);
    }

    /// See `UidIndex::first`.
    pub fn first(&self, uid: &str) -> Option<u64> {
        self.0.first(uid)
    }

    /// See `UidIndex::all`.
    pub fn all(&self, uid: &str) -> Vec<u64> {
        self.0.all(uid)
    }

    /// See `UidIndex::retain_from`.
    pub fn retain_from(&mut self, start: u64) {
        self.0.retain_from(start);
    }
}

/// Encodes the UID table of the segment `base..end` of `log_len` bytes,
/// its pages placed by SipHash under `key` (`None`: a UID too long for a
/// page).
pub fn encode_uid_table(
    key: (u64, u64),
    base: u64,
    end: u64,
    log_len: u64,
    uids: &[(String, u64)],
) -> Option<Vec<u8>> {
    crate::uid::table::encode(
        crate::uid::keyed::Key(key.0, key.1),
        base,
        end,
        log_len,
        uids,
    )
}

/// A loaded UID table (see `uidtable::Table`).
#[derive(Debug)]
pub struct FuzzUidTable(crate::uid::table::Table);

impl FuzzUidTable {
    /// Loads the table in `file` for the segment `base..end` of `log_len`
    /// bytes; `None` when its header is refused (the filter is checked when
    /// first used).
    pub fn load(file: File, base: u64, end: u64, log_len: u64) -> Option<Self> {
        crate::uid::table::Table::load(file, base, end, log_len)
            .ok()
            .map(Self)
    }

    /// Offsets of `uid`, ascending; `None` when a page read is refused.
    pub fn get(&self, uid: &[u8]) -> Option<Vec<u64>> {
        self.0.get(uid).ok()
    }

    /// Every entry in offset order; `None` when a page is refused.
    pub fn entries(&self) -> Option<Vec<(String, u64)>> {
        self.0.entries().ok()
    }
}
