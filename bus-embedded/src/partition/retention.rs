//! Segment lifecycle: rolling the active segment (seal: fsync, persist its
//! indexes, create the next one) and deleting whole expired segments.

use std::sync::Arc;

use bus_core::BusError;

use crate::fsutil;
use crate::log::index::{self, SegmentIndex};
use crate::log::segment::{self, CLOSED_IDX, CLOSED_UIDS, IDX, LOG, UIDS};
use crate::partition::poison::Poison;
use crate::partition::recovery::create_segment;
use crate::partition::{Partition, SegmentMeta, WriterState};
use crate::uid::table::SealedUids;
use bus_core::backend::sync::lock;

impl Partition {
    /// Rolls before a frame of `frame_len` bytes written at `now` when the
    /// active segment would outgrow its size or has reached its age.
    pub(crate) fn roll_if_due(
        &self,
        writer: &mut WriterState,
        frame_len: u64,
        now: u64,
    ) -> Result<(), Poison> {
        if writer.pos == 0 {
            return Ok(());
        }
        let too_big = writer.pos + frame_len > self.options.segment_bytes;
        let too_old = self.options.segment_max_age_ms.is_some_and(|age| {
            let first = self
                .reader()
                .segments
                .last()
                .and_then(|s| s.index.min_ts)
                .unwrap_or(now);
            now.saturating_sub(first) >= age
        });
        if too_big || too_old {
            self.roll(writer)?;
        }
        Ok(())
    }

    /// Seals the active segment and starts an empty one at the next offset.
    /// Errors are I/O failures the caller poisons the partition with.
    pub(crate) fn roll(&self, writer: &mut WriterState) -> Result<(), Poison> {
        // A sealed segment ends with its last frame: the zeros written
        // ahead go before its indexes are written.
        crate::partition::write::trim_zeros(&self.dir, self.options.files.as_ref(), writer)
            .map_err(|e| Poison::io("truncate", e))?;
        if writer.dirty {
            self.sync_unsynced(writer, "fsync before sealing a segment")?;
        }
        let sealed: SegmentIndex = self
            .reader()
            .segments
            .last()
            .map(|s| s.index.clone())
            .unwrap_or_default();
        let base = writer.base;
        let seal = |ext: &str, bytes: Vec<u8>| {
            fsutil::write_atomic(&segment::path(&self.dir, base, ext), &bytes)
                .map_err(|e| Poison::io(&format!("sealing segment {base}"), e))
        };
        seal(IDX, index::encode_index(base, &sealed))?;
        let list = writer
            .active_list(&self.reader().uids)
            .map_err(|e| Poison::bus(&format!("sealing segment {base}"), e))?;
        let id = crate::uid::locator::SegmentId {
            base,
            end: sealed.end,
            log_len: sealed.len,
        };
        let uids = SealedUids::new(&self.dir, base, sealed.end, sealed.len, &self.options)
            .store(&list)
            .map_err(|e| Poison::bus(&format!("sealing segment {base}"), e))?;
        // What a clean close left for the active segment is superseded.
        for ext in [CLOSED_IDX, CLOSED_UIDS] {
            let _ = std::fs::remove_file(segment::path(&self.dir, base, ext));
        }
        let next = writer.next;
        let file = create_segment(&self.dir, next).map_err(|e| Poison::bus("roll", e))?;
        let file = Arc::new(file);
        {
            let mut read = self.read_mut();
            if let Some(active) = read.segments.last_mut() {
                active.file = None;
                active.uids = Some(Arc::new(uids));
                // Sealed: the index grows no more (no spare capacity kept
                // per segment for the log's life).
                active.index.entries.shrink_to_fit();
            }
            // The sealed segment's UIDs are in its table now. The map keeps
            // its memory for the next segment, which will hold about as
            // many: freeing and regrowing it per segment left the heap
            // holding the freed copies (RssAnon).
            read.uids.clear();
            read.segments.push(SegmentMeta {
                base: next,
                path: segment::path(&self.dir, next, LOG),
                index: SegmentIndex {
                    end: next,
                    ..SegmentIndex::default()
                },
                file: Some(Arc::clone(&file)),
                uids: None,
            });
        }
        // Listed as sealed: the locator may name it now.
        self.cover_sealed(id, &list);
        drop(list);
        writer.file = file;
        writer.base = next;
        writer.pos = 0;
        writer.synced = 0;
        writer.allocated = 0;
        writer.last_indexed = None;
        writer.active_prefix = None;
        // The sealed segments are complete; so is the new one, empty.
        self.store_point(writer)
            .map_err(|e| Poison::io("recovery point", e))?;
        Ok(())
    }

    /// Deletes the whole segments whose newest record was stored at or
    /// before `cutoff`, i.e. has reached the retention age (rolling the active one first when it is all old); returns
    /// how many records went. Offsets are kept: the active segment's file
    /// name carries the next offset even when it is empty.
    pub(crate) fn expire(&self, cutoff: u64) -> Result<u64, BusError> {
        self.drop_front(|s| s.index.max_ts <= cutoff)
    }

    /// Deletes the whole segments every record of which is below `offset`
    /// (rolling the active one first when all of it is); returns how many
    /// records went. A segment holding `offset - 1` and later records is
    /// kept whole: the hot log start moves to a segment base at or below
    /// `offset`. What a cold tier calls once those records are archived.
    pub(crate) fn delete_below(&self, offset: u64) -> Result<u64, BusError> {
        self.drop_front(|s| s.index.end <= offset)
    }

    /// [`Self::expire`] of the segments wholly below `archived_end` only:
    /// retention never drops a record the cold tier does not hold (C24,
    /// "expire only what is archived").
    #[cfg(feature = "cold")]
    pub(crate) fn expire_archived(&self, cutoff: u64, archived_end: u64) -> Result<u64, BusError> {
        self.drop_front(|s| s.index.max_ts <= cutoff && s.index.end <= archived_end)
    }

    /// Deletes the oldest segments while `gone` says so (see [`Self::expire`]).
    fn drop_front(&self, gone: impl Fn(&SegmentMeta) -> bool) -> Result<u64, BusError> {
        let mut writer = lock(&self.writer);
        let active_old = {
            let read = self.reader();
            read.segments
                .last()
                .is_some_and(|s| s.index.end > s.base && gone(s))
        };
        if active_old
            && writer.poisoned.is_none()
            && let Err(cause) = self.roll(&mut writer)
        {
            writer.poisoned = Some(cause.clone());
            return Err(self.poisoned_error(&cause));
        }
        let gone: Vec<(u64, u64)> = {
            let mut read = self.read_mut();
            let sealed = read.segments.len().saturating_sub(1);
            let count = read.segments[..sealed]
                .iter()
                .take_while(|s| gone(s))
                .count();
            let gone: Vec<(u64, u64)> = read
                .segments
                .drain(..count)
                .map(|s| (s.base, s.index.end))
                .collect();
            if let Some(start) = read.segments.first().map(|s| s.base)
                && !gone.is_empty()
            {
                read.uids.retain_from(start);
                lock(&self.sealed_files).retain_from(start);
            }
            gone
        };
        drop(writer);
        if gone.is_empty() {
            return Ok(0);
        }
        // The deletions that did happen must persist even when one fails.
        let mut failed = None;
        for &(base, _) in &gone {
            for ext in [LOG, IDX, UIDS, CLOSED_IDX, CLOSED_UIDS] {
                match std::fs::remove_file(segment::path(&self.dir, base, ext)) {
                    Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                        failed.get_or_insert(error);
                    }
                    _ => {}
                }
            }
        }
        fsutil::sync_dir(&self.dir)?;
        if let Some(error) = failed {
            return Err(error.into());
        }
        Ok(gone.iter().map(|(base, end)| end - base).sum())
    }
}
