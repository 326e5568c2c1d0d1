//! The acked end of a partition, for read-only opens in other processes.
//!
//! A writer writes frames before it fsyncs them, so a reader that trusted
//! every whole frame in a segment could deliver a record that an OS crash
//! or power loss takes back before its publisher was acked. Under
//! `Durability::Sync` the writer therefore stores, after every round's
//! fsync, the point up to which records are acked: `pNNNN/acked`, 24 bytes,
//! the active segment's base offset and its acked length (u64 LE each) and
//! a CRC-32C of the two. It is rewritten in place and never fsynced:
//! readers on the same machine share the page cache, and every writer open
//! stores it again after recovery. One `pwrite` per round, about 2 µs
//! (`examples/bench_subscribe.rs`), beside a round's fsync.
//!
//! After a power loss the marker cannot be trusted: never fsynced, it comes
//! back empty, zero-filled, stale, torn or garbage while the frames it
//! covered were fsynced and acked (#29: a read-only open after a cut showed
//! none of the last run's acked records; a garbage one hid them all too). A
//! reader that finds no writer holding the directory (`readonly`) therefore
//! does not read it at all and shows every whole frame up to the first bad
//! one, which is what the next writer's recovery keeps. While a writer
//! holds it, an empty or zero marker also means every whole frame (a writer
//! is opening, after its recovery, before its first store).
//!
//! Under `Durability::Interval` a record is acked once written, so whole
//! frames are exactly what is acked (a killed writer's whole frames survive
//! its recovery; a power loss takes acked records in that mode anyway): the
//! writer stores "every whole frame" once when it opens, and nothing per
//! round, which would cost a third of a publish there.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// File name of the marker, in the partition directory.
pub(crate) const FILE: &str = "acked";
const LEN: usize = 24;

/// The marker file of one partition.
#[derive(Debug)]
pub(crate) struct AckedEnd {
    file: File,
}

/// What a reader may show of a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limit {
    /// No marker: the directory was last written before markers existed
    /// (or is being provisioned); every whole frame is shown.
    Whole,
    /// Segments below `base` wholly, segment `base` up to `len` bytes,
    /// nothing of later ones. [`EVERY_WHOLE_FRAME`] shows all whole frames.
    Acked { base: u64, len: u64 },
}

/// The marker of a writer under `Durability::Interval`: every whole frame
/// is acked.
pub(crate) const EVERY_WHOLE_FRAME: (u64, u64) = (u64::MAX, u64::MAX);

impl Limit {
    /// The bytes of the segment starting at `base` that may be shown.
    pub(crate) fn of(self, base: u64) -> u64 {
        match self {
            Self::Whole => u64::MAX,
            Self::Acked { base: acked, .. } if base < acked => u64::MAX,
            Self::Acked { base: acked, len } if base == acked => len,
            Self::Acked { .. } => 0,
        }
    }
}

impl AckedEnd {
    /// The writer's handle (created when missing).
    pub(crate) fn create(dir: &Path) -> std::io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(dir.join(FILE))?;
        Ok(Self { file })
    }

    /// A reader's handle; `None` while there is no marker.
    pub(crate) fn open(dir: &Path) -> std::io::Result<Option<Self>> {
        match File::open(dir.join(FILE)) {
            Ok(file) => Ok(Some(Self { file })),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Records that segment `base` is acked up to `len` bytes.
    pub(crate) fn store(&self, base: u64, len: u64) -> std::io::Result<()> {
        self.file.write_all_at(&encode(base, len), 0)
    }

    /// The stored point, or why there is none.
    pub(crate) fn load(&self) -> std::io::Result<Stored> {
        let mut buf = [0u8; LEN];
        for _ in 0..4 {
            match self.file.read_exact_at(&mut buf, 0) {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return Ok(Stored::Unwritten);
                }
                Err(error) => return Err(error),
            }
            if let Some((base, len)) = decode(&buf) {
                return Ok(Stored::Point { base, len });
            }
            if buf.iter().all(|&b| b == 0) {
                return Ok(Stored::Unwritten);
            }
        }
        Ok(Stored::Torn)
    }
}

/// What a marker holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stored {
    /// The acked end a writer stored.
    Point { base: u64, len: u64 },
    /// Empty or zero-filled: created and not written yet by a writer that
    /// is opening, or never fsynced and lost with the power. Either way no
    /// writer is appending: every whole frame is what recovery keeps.
    Unwritten,
    /// A read overlapped a rewrite several times in a row.
    Torn,
}

fn encode(base: u64, len: u64) -> [u8; LEN] {
    let mut buf = [0u8; LEN];
    buf[..8].copy_from_slice(&base.to_le_bytes());
    buf[8..16].copy_from_slice(&len.to_le_bytes());
    let crc = u64::from(crc32c::crc32c(&buf[..16]));
    buf[16..].copy_from_slice(&crc.to_le_bytes());
    buf
}

fn decode(buf: &[u8; LEN]) -> Option<(u64, u64)> {
    let word = |at: usize| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&buf[at..at + 8]);
        u64::from_le_bytes(bytes)
    };
    (word(16) == u64::from(crc32c::crc32c(&buf[..16]))).then(|| (word(0), word(8)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_marker_round_trips_and_a_torn_one_is_refused() {
        let buf = encode(7, 4096);
        assert_eq!(decode(&buf), Some((7, 4096)));
        let mut torn = buf;
        torn[9] ^= 1;
        assert_eq!(decode(&torn), None);
    }

    #[test]
    fn limits_show_older_segments_wholly_and_later_ones_not_at_all() {
        let limit = Limit::Acked { base: 10, len: 300 };
        assert_eq!(limit.of(0), u64::MAX);
        assert_eq!(limit.of(10), 300);
        assert_eq!(limit.of(20), 0);
        assert_eq!(Limit::Whole.of(20), u64::MAX);
        let (base, len) = EVERY_WHOLE_FRAME;
        assert_eq!(Limit::Acked { base, len }.of(20), u64::MAX);
    }
}
