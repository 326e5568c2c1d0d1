//! Per-segment indexes: the sparse offset index (offset → file position,
//! one entry per ~`index_interval_bytes` of frames) with the segment's
//! bookkeeping, and the UID index file persisted when a segment is sealed
//! (the in-memory UID index is `uid::index`).
//!
//! Both files are hints: they carry a CRC and the segment's length, and a
//! file that is missing, short or wrong is rebuilt from the segment.

use std::path::Path;

/// The sparse index of one segment, plus what retention and fetch need.
#[derive(Debug, Clone, Default)]
pub(crate) struct SegmentIndex {
    /// `(frame base offset, byte position)`, ascending.
    pub entries: Vec<(u64, u64)>,
    /// Offset after the last record.
    pub end: u64,
    /// Bytes of valid frames.
    pub len: u64,
    /// Newest `stored_at` in the segment (0 when empty).
    pub max_ts: u64,
    /// Oldest `stored_at` in the segment.
    pub min_ts: Option<u64>,
}

impl SegmentIndex {
    /// The last entry at or before `offset`: where to start reading.
    pub fn floor(&self, offset: u64) -> (u64, u64) {
        let at = self.entries.partition_point(|&(base, _)| base <= offset);
        at.checked_sub(1)
            .and_then(|i| self.entries.get(i).copied())
            .unwrap_or((0, 0))
    }
}

const IDX_MAGIC: &[u8; 4] = b"BIX1";
const UID_MAGIC: &[u8; 4] = b"BUI1";

/// Encodes the index file of a sealed segment.
pub(crate) fn encode_index(base: u64, index: &SegmentIndex) -> Vec<u8> {
    let mut out = Vec::with_capacity(48 + index.entries.len() * 16);
    out.extend_from_slice(IDX_MAGIC);
    for word in [
        base,
        index.end,
        index.len,
        index.max_ts,
        index.min_ts.unwrap_or(u64::MAX),
        index.entries.len() as u64,
    ] {
        out.extend_from_slice(&word.to_le_bytes());
    }
    for &(offset, pos) in &index.entries {
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&pos.to_le_bytes());
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Decodes an index file, checking it against the segment's `base` and
/// byte length; `None` when it does not fit (then rebuild).
pub(crate) fn decode_index(bytes: &[u8], base: u64, log_len: u64) -> Option<SegmentIndex> {
    let body = check_crc(bytes, IDX_MAGIC)?;
    let mut cursor = Cursor { bytes: body };
    let words: Vec<u64> = (0..6).map(|_| cursor.u64()).collect::<Option<_>>()?;
    let [file_base, end, len, max_ts, min_ts, count] = words[..] else {
        return None;
    };
    if file_base != base || len != log_len || end < base {
        return None;
    }
    let count = usize::try_from(count).ok()?;
    if cursor.bytes.len() != count.checked_mul(16)? {
        return None;
    }
    let mut entries = Vec::with_capacity(count);
    for _ in 0..count {
        let entry = (cursor.u64()?, cursor.u64()?);
        let ordered = entries
            .last()
            .is_none_or(|&(o, p)| entry.0 > o && entry.1 > p);
        if !ordered || entry.0 < base || entry.0 >= end || entry.1 >= len {
            return None;
        }
        entries.push(entry);
    }
    if end > base && entries.first() != Some(&(base, 0)) {
        return None;
    }
    Some(SegmentIndex {
        entries,
        end,
        len,
        max_ts,
        min_ts: (min_ts != u64::MAX).then_some(min_ts),
    })
}

/// Encodes a UID list in the format written before UID tables (see
/// `uid::table`), which are read from it once.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn encode_uids(base: u64, end: u64, uids: &[(String, u64)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(UID_MAGIC);
    out.extend_from_slice(&base.to_le_bytes());
    out.extend_from_slice(&end.to_le_bytes());
    out.extend_from_slice(&(uids.len() as u64).to_le_bytes());
    for (uid, offset) in uids {
        out.extend_from_slice(&(uid.len() as u64).to_le_bytes());
        out.extend_from_slice(uid.as_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Decodes a UID file of the segment `base..end`; `None` when it does not fit.
pub(crate) fn decode_uids(bytes: &[u8], base: u64, end: u64) -> Option<Vec<(String, u64)>> {
    let body = check_crc(bytes, UID_MAGIC)?;
    let mut cursor = Cursor { bytes: body };
    if cursor.u64()? != base || cursor.u64()? != end {
        return None;
    }
    let count = usize::try_from(cursor.u64()?).ok()?;
    let mut uids = Vec::with_capacity(count.min(body.len() / 9));
    for _ in 0..count {
        let len = usize::try_from(cursor.u64()?).ok()?;
        let uid = String::from_utf8(cursor.take(len)?.to_vec()).ok()?;
        let offset = cursor.u64()?;
        if offset < base || offset >= end {
            return None;
        }
        uids.push((uid, offset));
    }
    cursor.bytes.is_empty().then_some(uids)
}

fn check_crc<'a>(bytes: &'a [u8], magic: &[u8; 4]) -> Option<&'a [u8]> {
    let split = bytes.len().checked_sub(4)?;
    let (body, crc) = bytes.split_at(split);
    let crc = u32::from_le_bytes(crc.try_into().ok()?);
    (body.starts_with(magic) && crc32c::crc32c(body) == crc).then(|| &body[4..])
}

struct Cursor<'a> {
    bytes: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < n {
            return None;
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Some(head)
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

/// Reads a hint file; a missing or unreadable one is just `None`.
pub(crate) fn read_hint(path: &Path) -> Option<Vec<u8>> {
    std::fs::read(path).ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn index_round_trip_and_rejects_damage() {
        let index = SegmentIndex {
            entries: vec![(10, 0), (15, 4100)],
            end: 20,
            len: 9000,
            max_ts: 5,
            min_ts: Some(1),
        };
        let bytes = encode_index(10, &index);
        let back = decode_index(&bytes, 10, 9000).unwrap();
        assert_eq!(back.entries, index.entries);
        assert_eq!(back.floor(14), (10, 0));
        assert_eq!(back.floor(15), (15, 4100));
        assert!(decode_index(&bytes, 10, 9001).is_none());
        assert!(decode_index(&bytes[..bytes.len() - 1], 10, 9000).is_none());
        assert!(decode_index(&vec![0; bytes.len()], 10, 9000).is_none());
    }

    #[test]
    fn uids_round_trip() {
        let uids = vec![("a".to_owned(), 3), ("b".to_owned(), 4)];
        let bytes = encode_uids(3, 5, &uids);
        assert_eq!(decode_uids(&bytes, 3, 5).unwrap(), uids);
        assert!(decode_uids(&bytes, 3, 4).is_none());
    }
}
