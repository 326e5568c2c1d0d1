//! A full disk (`ENOSPC`, or a quota) met while writing a round's frames:
//! a clean, transient refusal (#29).
//!
//! The round is refused with [`BusError::Unavailable`] saying the disk is
//! full, and nothing of it is stored: the bytes it may have written (a
//! write can stop part-way) are put back as they were before the round:
//! zeros inside the space written ahead, nothing past it. Then the segment
//! is fsynced, so no part of the refused frame can reach the disk later
//! (a torn one would otherwise sit between acked frames and a later
//! round's). The partition is not poisoned: the log stays readable, and
//! once space is freed the next publish on the same bus is written where
//! the refused one would have been.
//!
//! Putting the bytes back needs no new space: only blocks the failed write
//! filled are overwritten (they are allocated now; a block that reads as
//! zeros is left alone), and a file that grew is truncated. Should that,
//! or the fsync, fail all the same, the partition is poisoned as for any
//! failed write (the disk is still named full), and a reopen recovers.

use std::os::unix::fs::FileExt;

use bus_core::BusError;

use crate::partition::poison::Poison;
use crate::partition::{Partition, WriterState};

/// The unit of the cut-back: a filesystem block.
const BLOCK_BYTES: usize = 4096;
const BLOCK: u64 = BLOCK_BYTES as u64;

/// What a refused round's publishers get.
pub(crate) fn refusal(topic: &str, partition: u32, error: &std::io::Error) -> BusError {
    let source = match error.raw_os_error() {
        Some(code) => std::io::Error::from_raw_os_error(code),
        None => std::io::Error::new(error.kind(), error.to_string()),
    };
    BusError::Unavailable {
        backend: "embedded".to_owned(),
        reason: format!(
            "the disk is full ({error}): nothing of this publish to topic {topic:?} partition \
             {partition} was stored; free space and publish again (the bus stays open)"
        ),
        source: Some(Box::new(source)),
    }
}

/// Out of space or over a quota.
pub(crate) fn is_full(error: &std::io::Error) -> bool {
    matches!(
        error.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

impl Partition {
    /// Puts the active segment back as it was before a round that may have
    /// written up to `len` bytes at `writer.pos` (and zeros past them) and
    /// makes that durable; `Err` is the poison when it cannot.
    pub(crate) fn undo_full_write(&self, writer: &mut WriterState, len: u64) -> Result<(), Poison> {
        let files = &self.options.files;
        let file = &writer.file;
        let what = "write (the disk is full, and the refused frame could not be cut back)";
        let file_len = file.metadata().map_err(|e| Poison::io(what, e))?.len();
        if file_len > writer.allocated {
            files
                .set_len(file, writer.allocated)
                .map_err(|e| Poison::io(what, e))?;
        }
        let end = (writer.pos + len).min(writer.allocated);
        let mut at = writer.pos;
        let mut buf = [0u8; BLOCK_BYTES];
        let zeros = [0u8; BLOCK_BYTES];
        while at < end {
            // Aligned blocks, so each one touches one filesystem block.
            let n = (BLOCK - at % BLOCK).min(end - at);
            let n_usize = usize::try_from(n).unwrap_or(BLOCK_BYTES);
            let chunk = &mut buf[..n_usize];
            file.read_exact_at(chunk, at)
                .map_err(|e| Poison::io(what, e))?;
            if chunk.iter().any(|&b| b != 0) {
                files
                    .write_all_at(file, &zeros[..n_usize], at)
                    .map_err(|e| Poison::io(what, e))?;
            }
            at += n;
        }
        // Durable now (under `Interval` this also covers the rounds since
        // the last flush). A failed fsync is never retried: poison.
        self.sync_unsynced(writer, "fsync after a write refused for a full disk")
    }
}
