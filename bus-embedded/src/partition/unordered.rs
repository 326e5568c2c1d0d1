//! The `unordered-tail` marker: "this partition's writer acks before it
//! fsyncs" (`Durability::Interval`).
//!
//! Under `Durability::Sync` every acked frame was fsynced before the next
//! one was written, so a frame that verifies after a bad one proves the bad
//! one was acked, and recovery refuses the log as `Corrupt`. Under
//! `Durability::Interval` frames written since the flusher's last fsync
//! reach the disk in whatever order the kernel (or a power cut tearing the
//! page cache) writes their pages: a hole of zeros followed by whole frames
//! is the documented loss of the last interval, not damage (#29).
//!
//! The flusher stores the recovery point after each of its fsyncs (see
//! `checkpoint`), so below it a bad frame is still damage to fsynced data;
//! past it, in a partition carrying this marker, recovery cuts the log at
//! the first bad frame. The marker is created (and its directory fsynced)
//! when an `Interval` writer opens the partition, before it writes, and
//! removed when a `Sync` writer opens it, after the recovery that still
//! needed it: a `Sync` log keeps the strict rule.

use std::path::Path;

use crate::fsutil;

/// File name of the marker, in the partition directory.
pub(crate) const FILE: &str = "unordered-tail";

/// Whether the last writer of the partition in `dir` acked before fsync.
pub(crate) fn present(dir: &Path) -> bool {
    dir.join(FILE).exists()
}

/// Makes the marker say what a writer of `interval` durability does,
/// durably (created or removed, then the directory fsynced), if it does
/// not already.
pub(crate) fn set(dir: &Path, interval: bool) -> std::io::Result<()> {
    let path = dir.join(FILE);
    match (interval, path.exists()) {
        (true, false) => {
            drop(fsutil::open_rw(&path, false)?);
            fsutil::sync_dir(dir)
        }
        (false, true) => {
            std::fs::remove_file(&path)?;
            fsutil::sync_dir(dir)
        }
        _ => Ok(()),
    }
}
