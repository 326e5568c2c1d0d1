//! One writer round's work: dedup against stored UIDs, offsets, frames,
//! the write and the fsync (or zeros written ahead of small frames), and
//! cutting those zeros off again.

use bus_core::backend::sync::lock;
use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use bus_core::{BusError, backend::metrics, now_ms};

use crate::log::checkpoint::{self, RecoveryPoint};
use crate::log::frame::{self, NewRecord};
use crate::options::Durability;
use crate::partition::full;
use crate::partition::poison::Poison;
use crate::partition::queue::Request;
use crate::partition::{Partition, WriterState};

/// Under [`Durability::Sync`], a frame smaller than this is written into
/// zeros written (and fsynced) ahead of it, so its `fdatasync` flushes data
/// only: an append that grows the file also commits its new size to the
/// journal. Measured on this project's VM (ext4 on virtio): 200-byte
/// appends 167-198 µs per write+fdatasync, the same into zeros 96-136 µs;
/// 3.2 KB 230-277 µs against 121-165 µs; fallocate'd or sparse space does
/// not help as much (124-226 µs). Larger frames (batches) append: their
/// fsync is dominated by their own bytes, and zeros would double them.
const ZERO_AHEAD_FRAMES_UNDER: u64 = 64 << 10;
/// Zeros written ahead at least and at most: about the bytes the segment
/// already holds, so an idle partition costs little disk and a busy one
/// extends its file once per 4 MiB.
const ZERO_AHEAD_MIN: u64 = 16 << 10;
const ZERO_AHEAD_MAX: u64 = 4 << 20;

impl Partition {
    /// One writer round: dedup, assign offsets, write, fsync, publish. A
    /// request that cannot be framed or whose dedup lookup fails fails alone.
    pub(super) fn commit(&self, round: &[Request]) -> Vec<Result<Vec<u64>, BusError>> {
        let mut writer = lock(&self.writer);
        if let Some(cause) = writer.poisoned.clone() {
            return round
                .iter()
                .map(|_| Err(self.poisoned_error(&cause)))
                .collect();
        }
        let mut next = writer.next;
        let mut fresh: HashMap<&str, u64> = HashMap::default();
        let mut new_uids = Vec::new();
        let mut to_write: Vec<&NewRecord> = Vec::new();
        let mut results = Vec::with_capacity(round.len());
        let mut dedup_hits = 0;
        for request in round {
            let known = frame::checked_body_len(&request.records)
                .map_err(|reason| BusError::invalid("records", reason))
                .and_then(|_| self.stored_uids(request));
            let known = match known {
                Ok(known) => known,
                Err(error) => {
                    results.push(Err(error));
                    continue;
                }
            };
            let mut mine = Vec::with_capacity(request.records.len());
            for (record, known) in request.records.iter().zip(known) {
                if let Some(uid) = record.uid.as_deref() {
                    if !request.dedup {
                        new_uids.push((uid.to_owned(), next));
                    } else if let Some(offset) = fresh.get(uid).copied().or(known) {
                        dedup_hits += 1;
                        mine.push(offset);
                        continue;
                    } else {
                        fresh.insert(uid, next);
                        new_uids.push((uid.to_owned(), next));
                    }
                }
                to_write.push(record);
                mine.push(next);
                next += 1;
            }
            results.push(Ok(mine));
        }
        metrics::dedup_hits("embedded", &self.topic, dedup_hits);
        let outcome = if to_write.is_empty() {
            Ok(())
        } else {
            self.write_frame(&mut writer, &to_write, new_uids)
        };
        let failure = |error: &WriteError| match error {
            WriteError::Refused(reason) => BusError::invalid("records", reason.clone()),
            WriteError::Full(error) => full::refusal(&self.topic, self.id, error),
            WriteError::Failed(cause) => self.poisoned_error(cause),
        };
        let error = match outcome {
            Ok(()) if to_write.is_empty() => return results,
            Ok(()) => {
                tracing::debug!(
                    topic = %self.topic,
                    partition = self.id,
                    requests = round.len(),
                    records = to_write.len(),
                    "group-commit round written and synced"
                );
                metrics::commit_round("embedded", to_write.len());
                // Acked and visible to fetch from here on.
                self.announce(writer.base, writer.pos);
                return results;
            }
            Err(error) => error,
        };
        if let WriteError::Failed(cause) = &error {
            tracing::error!(
                topic = %self.topic,
                partition = self.id,
                %cause,
                "write or fsync failed: partition poisoned until the bus is reopened"
            );
            writer.poisoned = Some(cause.clone());
        }
        if let WriteError::Full(cause) = &error {
            tracing::warn!(
                topic = %self.topic,
                partition = self.id,
                %cause,
                "disk full: round refused, nothing of it stored; the partition stays open"
            );
        }
        results
            .into_iter()
            .map(|result| result.and_then(|_| Err(failure(&error))))
            .collect()
    }

    /// The stored offset of each record's UID (`None` without one, or when
    /// no stored copy authenticates under the request's key).
    fn stored_uids(&self, request: &Request) -> Result<Vec<Option<u64>>, BusError> {
        request
            .records
            .iter()
            .map(|record| match record.uid.as_deref() {
                Some(uid) if request.dedup => self.find_uid(uid, request.auth.as_ref()),
                _ => Ok(None),
            })
            .collect()
    }

    fn write_frame(
        &self,
        writer: &mut WriterState,
        records: &[&NewRecord],
        new_uids: Vec<(String, u64)>,
    ) -> Result<(), WriteError> {
        let stored_at = now_ms();
        // A large batch goes out as several bounded frames in this one
        // write and fsync, so reading one record never verifies the rest.
        let (bytes, frames) =
            frame::encode_batch(writer.next, stored_at, records, &mut writer.encoder)
                .map_err(WriteError::Refused)?;
        let len = bytes.len() as u64;
        self.roll_if_due(writer, len, stored_at)
            .map_err(WriteError::Failed)?;
        let files = &self.options.files;
        files
            .write_all_at(&writer.file, &bytes, writer.pos)
            .map_err(|e| self.write_failed(writer, len, e))?;
        let allocated = writer.allocated;
        self.zero_ahead(writer, writer.pos + len, len)
            .map_err(|e| self.write_failed(writer, len, e))?;
        // The file grew: its new extent is stored once this fsync made it
        // durable, before the ack (once per up to 4 MiB of small frames).
        let extended = writer.allocated > allocated;
        match self.options.durability {
            Durability::Sync => {
                let started = Instant::now();
                if let Err(error) = files.sync_data(&writer.file) {
                    // Not acked, and never fsynced again by this writer
                    // (poisoned: after a failed fsync Linux marks the pages
                    // clean, so a retry would "succeed" without writing
                    // them). They are still in the page cache, where a
                    // reopen in this boot would find the frame and keep it:
                    // zeros over it, so recovery ends at the acked frames
                    // (#29). Best effort: the poison is the answer either way.
                    let zeros = vec![0u8; bytes.len()];
                    let _ = files.write_all_at(&writer.file, &zeros, writer.pos);
                    return Err(WriteError::Failed(Poison::io("fsync", error)));
                }
                metrics::fsync("embedded", started.elapsed());
            }
            Durability::Interval(_) => writer.dirty = true,
        }
        metrics::stored("embedded", &self.topic, records.len() as u64, len);
        let pos = writer.pos;
        writer.pos += len;
        writer.next += records.len() as u64;
        if !writer.dirty {
            writer.synced = writer.pos;
        }
        let mut entries = Vec::new();
        for (frame_base, at, compressed) in frames {
            let frame_pos = pos + at;
            if frame::index_due(
                writer.last_indexed,
                frame_base,
                frame_pos,
                compressed,
                self.options.index_interval_bytes,
            ) {
                entries.push((frame_base, frame_pos));
                writer.last_indexed = Some((frame_base, frame_pos));
            }
        }
        if extended && let Err(error) = self.store_point(writer) {
            // The frame is durable; only the recovery point stays behind.
            tracing::warn!(
                topic = %self.topic,
                partition = self.id,
                %error,
                "recovery point not advanced (the frame is durable)"
            );
        }
        let mut read = self.read_mut();
        let read = &mut *read;
        if let Some(active) = read.segments.last_mut() {
            active.index.entries.extend(entries);
            active.index.len = writer.pos;
            active.index.end = writer.next;
            active.index.max_ts = active.index.max_ts.max(stored_at);
            active.index.min_ts.get_or_insert(stored_at);
        }
        for (uid, offset) in new_uids {
            read.uids.push(uid, offset);
        }
        Ok(())
    }

    /// The error a failed write of a round of `len` bytes ends in: a full
    /// disk is a clean refusal once the bytes are put back (`full`), any
    /// other failure poisons.
    fn write_failed(
        &self,
        writer: &mut WriterState,
        len: u64,
        error: std::io::Error,
    ) -> WriteError {
        if !full::is_full(&error) {
            return WriteError::Failed(Poison::io("write", error));
        }
        match self.undo_full_write(writer, len) {
            Ok(()) => WriteError::Full(error),
            Err(poison) => WriteError::Failed(poison),
        }
    }

    /// Extends the active segment with zeros past `end` (where a frame of
    /// `len` bytes just ended), when it has none left and the frame is small
    /// and durability is `Sync` (under `Interval`, frames written into
    /// zeros could reach the disk out of order, and recovery could no
    /// longer tell an unsynced tail from damage). Written in the same round
    /// as the frame, so one fsync covers both. Each extension (once per up
    /// to 4 MiB) also advances the recovery point, after that fsync.
    fn zero_ahead(&self, writer: &mut WriterState, end: u64, len: u64) -> std::io::Result<()> {
        if end <= writer.allocated {
            return Ok(());
        }
        let ahead = match self.options.durability {
            Durability::Sync if len < ZERO_AHEAD_FRAMES_UNDER => {
                end.clamp(ZERO_AHEAD_MIN, ZERO_AHEAD_MAX)
            }
            // A hole costs no disk: room for the next large write or more,
            // so its extent is stored at most every other such write (every
            // 4 MiB for batches of ~200 KB).
            Durability::Sync => len.max(ZERO_AHEAD_MAX),
            Durability::Interval(_) => 0,
        };
        // Never past the size at which the segment rolls.
        let target = end
            .saturating_add(ahead)
            .min(end.max(self.options.segment_bytes));
        if len < ZERO_AHEAD_FRAMES_UNDER {
            static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
            let mut at = end;
            while at < target {
                let n = usize::try_from(target - at).map_or(ZEROS.len(), |n| n.min(ZEROS.len()));
                self.options
                    .files
                    .write_all_at(&writer.file, &ZEROS[..n], at)?;
                at += n as u64;
            }
        } else if target > end {
            // A large frame's fsync is dominated by its own bytes: the
            // space past it is a hole (reads as zeros, writes nothing), so
            // the file's extent still covers every acked frame.
            self.options.files.set_len(&writer.file, target)?;
        }
        writer.allocated = target;
        Ok(())
    }
}

enum WriteError {
    /// Nothing was written (the batch cannot be framed).
    Refused(String),
    /// The disk is full: what the round wrote was put back, durably, and
    /// the partition stays open (see `full`).
    Full(std::io::Error),
    /// A write or fsync failed: poison.
    Failed(Poison),
}

/// Cuts the zeros written ahead off the active segment of the partition in
/// `dir` (a seal, a clean close). The recovery point's extent goes down
/// first: a crash between the two must not leave a file shorter than its
/// stored extent, which reads as a segment cut after the fact.
pub(crate) fn trim_zeros(
    dir: &Path,
    files: &dyn crate::options::FileLayer,
    writer: &mut WriterState,
) -> std::io::Result<()> {
    if writer.allocated <= writer.pos {
        return Ok(());
    }
    if writer.dirty {
        files.sync_data(&writer.file)?;
        writer.dirty = false;
    }
    if let Some(point) = writer.durable_point().map(RecoveryPoint::without_zeros)
        && writer.recovery_point != Some(point)
    {
        checkpoint::write(dir, &point)?;
        writer.recovery_point = Some(point);
    }
    files.set_len(&writer.file, writer.pos)?;
    files.sync_data(&writer.file)?;
    writer.allocated = writer.pos;
    Ok(())
}
