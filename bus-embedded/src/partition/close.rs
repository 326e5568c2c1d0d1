//! A partition's clean close (no zeros past the last frame, the active
//! segment's hints, the whole log recorded as complete) and the recovery
//! point it and maintenance store.

use bus_core::BusError;
use bus_core::backend::sync::lock;

use crate::log::checkpoint;
use crate::log::index::SegmentIndex;
use crate::partition::queue::Committer;
use crate::partition::write::trim_zeros;
use crate::partition::{Partition, WriterState};
use crate::uid::index::UidIndex;

impl Drop for Partition {
    /// A clean close leaves no zeros past the last frame (so a closed
    /// segment ends with its last frame, as after a roll) and records the
    /// whole log as known complete: a closed segment found shorter on the
    /// next open is damage, not a torn tail.
    fn drop(&mut self) {
        let committer = self
            .committer
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(Committer { bell, thread }) = committer {
            drop(bell);
            // The thread may hold the last handle (dropping it there).
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
        let read = self
            .read
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let active_index = read.segments.last().map(|s| s.index.clone());
        let active_uids = &read.uids;
        let writer = self
            .writer
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if writer.poisoned.is_some() {
            return;
        }
        let files = &self.options.files;
        if let Err(error) = trim_zeros(&self.dir, files.as_ref(), writer) {
            tracing::warn!(
                topic = %self.topic,
                partition = self.id,
                %error,
                "zeros written ahead not trimmed at close (the next open recovers the segment)"
            );
            return;
        }
        if writer.dirty && files.sync_data(&writer.file).is_err() {
            return;
        }
        writer.dirty = false;
        if let Some(point) = writer.durable_point()
            && writer.recovery_point != Some(point)
        {
            // Without it the next open treats this segment's tail as
            // unverified, as after a crash: nothing is lost by failing here.
            match checkpoint::write(&self.dir, &point) {
                Ok(()) => writer.recovery_point = Some(point),
                Err(error) => tracing::warn!(
                    topic = %self.topic,
                    partition = self.id,
                    %error,
                    "recovery point not saved at close"
                ),
            }
        }
        // The active segment's index and UID table as of this close, so
        // the next open reads them instead of every frame (they name the
        // bytes they cover, and are used only while those are all of the
        // segment and the recovery point says so).
        if writer.recovery_point == writer.durable_point()
            && writer.hinted_len != Some(writer.pos)
            && let Err(error) = store_active_hints(&self.dir, active_index, active_uids, writer)
        {
            tracing::warn!(
                topic = %self.topic,
                partition = self.id,
                %error,
                "active segment's index not saved at close (the next open reads the segment)"
            );
        }
        // The UID locator's file (rewritten as it changed), synced so the
        // next open's first lookup reads it back instead of every table
        // (one covering no segment is built for free: not worth an fsync
        // per partition).
        if let Some(locator) = self.locator.unpersisted()
            && locator.covered().next().is_some()
            && let Err(error) = locator.sync()
        {
            tracing::warn!(
                topic = %self.topic,
                partition = self.id,
                %error,
                "UID locator not saved at close (the next open rebuilds it)"
            );
        }
    }
}

/// Writes the active segment's index and UID table as of a clean close.
fn store_active_hints(
    dir: &std::path::Path,
    index: Option<SegmentIndex>,
    active_uids: &UidIndex,
    writer: &WriterState,
) -> Result<(), BusError> {
    let Some(index) = index.filter(|i| i.len == writer.pos && i.end == writer.next) else {
        return Ok(());
    };
    let uids = writer.active_list(active_uids)?;
    let Some(table) = crate::uid::table::encode(
        crate::uid::keyed::Key::random(),
        writer.base,
        index.end,
        index.len,
        &uids,
    ) else {
        return Ok(());
    };
    let path = |ext| crate::log::segment::path(dir, writer.base, ext);
    crate::fsutil::write_atomic(
        &path(crate::log::segment::CLOSED_IDX),
        &crate::log::index::encode_index(writer.base, &index),
    )?;
    crate::fsutil::write_atomic(&path(crate::log::segment::CLOSED_UIDS), &table)?;
    Ok(())
}

impl Partition {
    /// Records how far the log is durable, when that moved (fsyncing bytes
    /// written under `Durability::Interval` first). A poisoned partition
    /// keeps its last recovery point.
    pub(crate) fn save_recovery_point(&self) -> Result<(), BusError> {
        let mut writer = lock(&self.writer);
        if writer.poisoned.is_some() {
            return Ok(());
        }
        if writer.dirty {
            drop(writer);
            self.flush()?;
            writer = lock(&self.writer);
        }
        self.store_point(&mut writer)?;
        Ok(())
    }

    /// Writes the writer's durable point if it differs from the stored one.
    pub(crate) fn store_point(&self, writer: &mut WriterState) -> std::io::Result<()> {
        let Some(point) = writer.durable_point() else {
            return Ok(());
        };
        if writer.recovery_point == Some(point) {
            return Ok(());
        }
        checkpoint::write(&self.dir, &point)?;
        writer.recovery_point = Some(point);
        Ok(())
    }
}
