//! A partition's recovery point: how far its log is known to be complete
//! (Kafka's recovery-point checkpoint). Recovery refuses damage below it as
//! [`BusError::Corrupt`] and treats only the bytes past it as a tail a crash
//! may have torn.
//!
//! It is written atomically (temp file, fsync, rename, directory fsync) and
//! only when what it claims is already durable: when a partition is opened
//! (after recovery), when a segment is sealed, when the bus closes cleanly,
//! by [`Partition::save_recovery_point`] (`maintenance`), and when the
//! writer extends the zeros it writes ahead (once per up to 4 MiB). Never
//! per publish: the frames themselves are checksummed, and the publish
//! path keeps its single fsync.
//!
//! It also records the segment's `extent`: how long the file is known to
//! be, frames and the zeros written (and fsynced) ahead of them. A crash
//! cannot shorten fsynced bytes, so a segment found shorter than its
//! extent was cut after the fact, and every frame acked under
//! `Durability::Sync` lies inside the extent (a frame that grows the file
//! is acked only after the extent covering it is stored). A smaller extent
//! is always safe to store; a larger one only once it is durable: whoever
//! shortens the file (a clean close, a seal, recovery) stores the lower
//! extent first.

use std::path::{Path, PathBuf};

use bus_core::BusError;

use crate::fsutil;

/// File name inside the partition directory.
pub(crate) const FILE: &str = "recovery-point";
/// Written before extents were recorded: base, len, next.
const MAGIC_V1: &[u8; 4] = b"BRP1";
const LEN_V1: usize = 4 + 3 * 8 + 4;
/// The format written: base, len, next, extent.
const MAGIC: &[u8; 4] = b"BRP2";
const LEN: usize = 4 + 4 * 8 + 4;

/// The first `len` bytes of segment `base` are complete, fsynced frames
/// whose records end at offset `next`; every segment before it is sealed;
/// the segment file is at least `extent` bytes long (`len` and the zeros
/// fsynced past it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecoveryPoint {
    pub base: u64,
    pub len: u64,
    pub next: u64,
    pub extent: u64,
}

impl RecoveryPoint {
    /// The same point with the file known only as far as its frames.
    pub(crate) const fn without_zeros(self) -> Self {
        Self {
            extent: self.len,
            ..self
        }
    }
}

pub(crate) fn path(dir: &Path) -> PathBuf {
    dir.join(FILE)
}

pub(crate) fn encode(point: &RecoveryPoint) -> Vec<u8> {
    let mut out = Vec::with_capacity(LEN);
    out.extend_from_slice(MAGIC);
    for word in [point.base, point.len, point.next, point.extent] {
        out.extend_from_slice(&word.to_le_bytes());
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// `None` unless `bytes` are exactly one intact recovery point (of either
/// format: a version-1 point knows no zeros past its frames).
pub(crate) fn decode(bytes: &[u8]) -> Option<RecoveryPoint> {
    let v1 = bytes.len() == LEN_V1 && bytes.starts_with(MAGIC_V1);
    if !v1 && (bytes.len() != LEN || !bytes.starts_with(MAGIC)) {
        return None;
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().ok()?) {
        return None;
    }
    let word = |i: usize| {
        let at = 4 + i * 8;
        body[at..at + 8].try_into().ok().map(u64::from_le_bytes)
    };
    let len = word(1)?;
    let point = RecoveryPoint {
        base: word(0)?,
        len,
        next: word(2)?,
        extent: if v1 { len } else { word(3)? },
    };
    (point.next >= point.base && point.extent >= point.len).then_some(point)
}

/// The partition's recovery point; `None` when it has none yet (a
/// partition written before recovery points existed). A damaged one is
/// `Corrupt`: an atomic replace cannot be torn by a crash.
pub(crate) fn read(dir: &Path) -> Result<Option<RecoveryPoint>, BusError> {
    let path = path(dir);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error.into()),
    };
    decode(&bytes).map(Some).ok_or_else(|| BusError::Corrupt {
        location: path.display().to_string(),
        offset: 0,
        reason: "recovery point damaged".to_owned(),
    })
}

/// Replaces the partition's recovery point; `point` must be durable already.
pub(crate) fn write(dir: &Path, point: &RecoveryPoint) -> std::io::Result<()> {
    fsutil::write_atomic(&path(dir), &encode(point))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn round_trip_and_rejects_damage() {
        let point = RecoveryPoint {
            base: 40,
            len: 1234,
            next: 57,
            extent: 16_384,
        };
        let bytes = encode(&point);
        assert_eq!(decode(&bytes), Some(point));
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x04;
            assert_eq!(decode(&bad), None, "flip at {at}");
        }
        assert_eq!(decode(&bytes[..bytes.len() - 1]), None);
        assert_eq!(decode(&[bytes.as_slice(), &[0]].concat()), None);
        // An extent below the frames is no point at all.
        let short = encode(&RecoveryPoint {
            extent: 1000,
            ..point
        });
        assert_eq!(decode(&short), None);
    }

    #[test]
    fn reads_the_version_1_format() {
        let mut v1 = Vec::new();
        v1.extend_from_slice(MAGIC_V1);
        for word in [40u64, 1234, 57] {
            v1.extend_from_slice(&word.to_le_bytes());
        }
        let crc = crc32c::crc32c(&v1);
        v1.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(
            decode(&v1),
            Some(RecoveryPoint {
                base: 40,
                len: 1234,
                next: 57,
                extent: 1234,
            })
        );
    }
}
