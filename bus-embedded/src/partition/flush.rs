//! The fsync of `Durability::Interval`: the flusher's, a roll's and a
//! close's, and what follows it.
//!
//! After a successful fsync the recovery point is stored (see `checkpoint`
//! and `unordered`): below it a bad frame is damage to fsynced data, past
//! it a torn tail. That costs an atomic replace (two fsyncs) per interval
//! and partition that wrote, not per publish.
//!
//! A failed fsync (`EIO`) poisons the partition with an error that says
//! so, and is never retried: after a writeback error Linux marks the pages
//! clean, so a second fsync would "succeed" without writing them. Those
//! pages are still in the page cache, where a reopen in the same boot would
//! find whole frames, fsync nothing, store a recovery point past them, and
//! a later power loss would cut the log below that point (refused as
//! `Corrupt`). So the segment is cut back to what the last successful
//! fsync covered: the records acked since (at most an interval's, the
//! documented loss of `Interval`) are gone at once instead of at the next
//! power loss, and a reopen recovers a consistent log. Until that reopen
//! the poisoned bus no longer serves those records (their bytes are gone
//! from the file; its index still names them).

use bus_core::BusError;
use bus_core::backend::sync::lock;

use crate::partition::poison::Poison;
use crate::partition::{Partition, WriterState};

impl Partition {
    /// Fsyncs bytes written under [`crate::Durability::Interval`] and
    /// stores the recovery point they reach.
    pub(crate) fn flush(&self) -> Result<(), BusError> {
        let mut writer = lock(&self.writer);
        if !writer.dirty || writer.poisoned.is_some() {
            return Ok(());
        }
        if let Err(cause) = self.sync_unsynced(&mut writer, "background fsync") {
            writer.poisoned = Some(cause.clone());
            return Err(self.poisoned_error(&cause));
        }
        if let Err(error) = self.store_point(&mut writer) {
            // The frames are durable; recovery only knows less of them.
            tracing::warn!(
                topic = %self.topic,
                partition = self.id,
                %error,
                "recovery point not advanced after a flush (the frames are durable)"
            );
        }
        Ok(())
    }

    /// Fsyncs the active segment's unsynced bytes (`what` names the fsync
    /// in the error). On failure the caller poisons the partition with the
    /// returned cause; the bytes past the last good fsync are cut first
    /// (see the module's doc), best effort.
    pub(crate) fn sync_unsynced(&self, writer: &mut WriterState, what: &str) -> Result<(), Poison> {
        let files = &self.options.files;
        match files.sync_data(&writer.file) {
            Ok(()) => {
                writer.dirty = false;
                writer.synced = writer.pos;
                Ok(())
            }
            Err(error) => {
                // Only unsynced bytes of `Interval` go (under `Sync` the
                // file holds fsynced zeros past the frames: they stay).
                let cut = if writer.dirty {
                    files.set_len(&writer.file, writer.synced)
                } else {
                    Ok(())
                };
                tracing::error!(
                    topic = %self.topic,
                    partition = self.id,
                    %error,
                    lost_bytes = writer.pos - writer.synced,
                    cut_back = cut.is_ok(),
                    "{what} failed: the records acked since the last fsync are lost, \
                     the partition is poisoned until the bus is reopened"
                );
                Err(Poison::io(
                    &format!(
                        "{what} (Durability::Interval: the records acked since the last \
                         good fsync, from byte {} of segment {}, are lost)",
                        writer.synced, writer.base
                    ),
                    error,
                ))
            }
        }
    }
}
