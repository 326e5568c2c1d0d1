//! Opening a partition: load the sealed segments' persisted indexes (or
//! rebuild them), verify the active segment frame by frame, truncate an
//! unacknowledged torn tail, and refuse damage inside acknowledged data:
//! anything below the recovery point (see `checkpoint`) and any bad frame
//! that a verified frame follows, unless the last writer acked before
//! fsync (see `unordered`): past the recovery point its frames reached the
//! disk in any order, and the log is cut at the first bad one.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bus_core::BusError;

use crate::fsutil;
use crate::log::checkpoint::{self, RecoveryPoint};
use crate::log::index::{self, SegmentIndex};
use crate::log::segment::{self, CLOSED_IDX, CLOSED_UIDS, IDX, LOG, Scan, UIDS};
use crate::options::Options;
use crate::partition::{Partition, ReadState, SegmentMeta, WriterState};
use crate::uid::table::SealedUids;

fn corrupt(path: &Path, offset: u64, reason: impl Into<String>) -> BusError {
    BusError::Corrupt {
        location: path.display().to_string(),
        offset,
        reason: reason.into(),
    }
}

/// Opens (creating if needed) the partition stored in `dir`.
pub(crate) fn open_partition(
    topic: &str,
    id: u32,
    dir: PathBuf,
    options: &Options,
) -> Result<Partition, BusError> {
    fsutil::create_dir(&dir)?;
    remove_temp_files(&dir)?;
    let point = checkpoint::read(&dir)?;
    // The last writer acked before fsync (`unordered`): past the recovery
    // point its frames may have reached the disk in any order.
    let unordered = crate::partition::unordered::present(&dir);
    let mut bases = segment::list(&dir)?;
    if bases.is_empty() {
        if let Some(point) = point.filter(|p| p.base > 0 || p.len > 0) {
            return Err(missing(&dir, point));
        }
        create_segment(&dir, 0)?;
        bases.push(0);
    }
    let mut read = ReadState::default();
    let mut expected: Option<u64> = None;
    let last = bases.len() - 1;
    for (i, &base) in bases.iter().enumerate() {
        let path = segment::path(&dir, base, LOG);
        if let Some(expected) = expected
            && expected != base
            && let Some(previous) = read.segments.last()
        {
            return Err(corrupt(
                &previous.path,
                expected,
                format!("segment ends at offset {expected} but the next one starts at {base}"),
            ));
        }
        let (index, uids) = if i == last {
            (SegmentIndex::default(), None)
        } else {
            let (index, uids) = load_sealed(&dir, base, &path, options)?;
            (index, Some(Arc::new(uids)))
        };
        if let Some(point) = point
            && point.base == base
            && i != last
            && (index.len < point.len || index.end < point.next)
        {
            return Err(corrupt(
                &path,
                index.end,
                format!(
                    "sealed segment holds {} bytes, offsets to {}; {} bytes, offsets to {} were known complete",
                    index.len, index.end, point.len, point.next
                ),
            ));
        }
        expected = Some(if i == last { base } else { index.end });
        read.segments.push(SegmentMeta {
            base,
            path,
            index,
            file: None,
            uids,
        });
    }
    if let Some(point) = point
        && bases.binary_search(&point.base).is_err()
    {
        return Err(missing(&dir, point));
    }
    let base = bases[last];
    // Only with a recovery point in this segment is part of it known complete.
    let known = point.filter(|p| p.base == base);
    let path = segment::path(&dir, base, LOG);
    let file = fsutil::open_rw(&path, false)?;
    // Stale hints of the active segment (a roll that did not finish) are
    // rewritten when it is sealed.
    remove_hints(&dir, base, &[IDX, UIDS])?;
    if let Some(known) = known
        && known.extent == known.len
        && let Some((index, uids)) = closed_cleanly(&dir, base, &file, known, options)?
    {
        // As below: the bytes become visible only once surely durable (a
        // clean close synced them; this costs little then).
        options.files.sync_recovered(&file)?;
        let uids = Arc::new(uids);
        let file = Arc::new(file);
        let writer = WriterState {
            file: Arc::clone(&file),
            base,
            pos: known.len,
            next: known.next,
            last_indexed: index.entries.last().copied(),
            active_prefix: Some(Arc::clone(&uids)),
            hinted_len: Some(known.len),
            poisoned: None,
            dirty: false,
            synced: known.len,
            allocated: known.len,
            recovery_point: point,
            encoder: crate::log::codec::Encoder::new(bus_core::Compression::None),
        };
        if let Some(active) = read.segments.last_mut() {
            active.index = index;
            active.file = Some(file);
            active.uids = Some(uids);
        }
        return Ok(Partition::new(
            topic.to_owned(),
            id,
            dir,
            options.clone(),
            writer,
            read,
        ));
    }
    let mut scan = segment::scan_to_mark(
        &file,
        base,
        options.index_interval_bytes,
        known.map(|p| p.len),
    )?;
    let file_len = file.metadata()?.len();
    if let Some(known) = known
        && scan.end_at_mark != Some(known.next)
    {
        let reason = match (&scan.fault, scan.end_at_mark) {
            (_, Some(end)) => format!(
                "frames end at offset {end} at byte {}, where offset {} was known complete",
                known.len, known.next
            ),
            (Some((pos, reason)), None) => format!(
                "{reason} at byte {pos}, below the {} bytes known complete",
                known.len
            ),
            (None, None) => format!(
                "segment is cut at byte {file_len}, below the {} bytes known complete",
                known.len
            ),
        };
        return Err(corrupt(&path, scan.end, reason));
    }
    if let Some(known) = known
        && file_len < known.extent
    {
        // Fsynced bytes do not go missing in a crash: whatever the frames
        // at the end look like now, some may have been acked.
        return Err(corrupt(
            &path,
            scan.end,
            format!(
                "segment is cut at byte {file_len}, below the {} bytes its writer had fsynced \
                 (frames and zeros written ahead): cut after it was written",
                known.extent
            ),
        ));
    }
    // Past the recovery point nothing was known complete: a bad frame there
    // is a torn tail unless a frame verifies after it (or the writer acked
    // before fsync: then later frames prove nothing). Without a recovery
    // point (a partition from before they existed), the bad frame must
    // also look torn.
    let torn = if unordered {
        true
    } else if known.is_some() || point.is_some() {
        !scan.resumes
    } else {
        scan.torn
    };
    if let Some((pos, reason)) = &scan.fault
        && !torn
    {
        return Err(corrupt(&path, scan.end, format!("{reason} at byte {pos}")));
    }
    // Inside the zeros fsynced ahead, a frame a crash tore shows zeros
    // where its unwritten pages were; one written whole that fails its
    // checksum was damaged afterwards, and may have been acked.
    if let (Some(known), Some((pos, reason))) = (known, &scan.fault)
        && *pos < known.extent
        && segment::written_whole(&file, *pos, known.extent.min(file_len))?
    {
        return Err(corrupt(
            &path,
            scan.end,
            format!(
                "{reason} at byte {pos}, in a frame written whole inside the {} bytes fsynced \
                 ahead: damaged after it was written",
                known.extent
            ),
        ));
    }
    // What a killed writer left in the page cache but never fsynced must be
    // durable before it becomes visible (and dedup answers for it).
    options.files.sync_recovered(&file)?;
    // What recovery verified and synced is now known complete; the stored
    // extent comes down to it before the file is cut (see `checkpoint`).
    let recovered = RecoveryPoint {
        base,
        len: scan.valid_len,
        next: scan.end,
        extent: scan.valid_len,
    };
    if point != Some(recovered) {
        checkpoint::write(&dir, &recovered)?;
    }
    if scan.valid_len < file_len {
        // Only the unacknowledged tail goes: bytes past the last whole frame.
        let zeros = segment::all_zero(&file, scan.valid_len, file_len)?;
        file.set_len(scan.valid_len)?;
        options.files.sync_recovered(&file)?;
        let dropped = file_len - scan.valid_len;
        let why = scan
            .fault
            .as_ref()
            .map_or("", |(_, reason)| reason.as_str());
        if zeros {
            tracing::info!(
                topic = %topic,
                partition = id,
                dropped,
                offset = scan.end,
                path = %path.display(),
                "dropped zero bytes written ahead"
            );
        } else {
            tracing::warn!(
                topic = %topic,
                partition = id,
                dropped,
                offset = scan.end,
                path = %path.display(),
                why,
                "truncated a torn tail"
            );
        }
    }
    // The hints of a clean close no longer describe the segment.
    remove_hints(&dir, base, &[CLOSED_IDX, CLOSED_UIDS])?;
    let file = Arc::new(file);
    read.uids = crate::uid::index::UidIndex::with_capacity(scan.uids.len());
    for (uid, offset) in std::mem::take(&mut scan.uids) {
        read.uids.push(uid, offset);
    }
    let writer = WriterState {
        file: Arc::clone(&file),
        base,
        pos: scan.valid_len,
        next: scan.end,
        last_indexed: scan.index.last().copied(),
        active_prefix: None,
        hinted_len: None,
        poisoned: None,
        dirty: false,
        synced: scan.valid_len,
        allocated: scan.valid_len,
        recovery_point: Some(recovered),
        encoder: crate::log::codec::Encoder::new(bus_core::Compression::None),
    };
    if let Some(active) = read.segments.last_mut() {
        active.index = index_of(&scan);
        active.file = Some(file);
        active.uids = None;
    }
    Ok(Partition::new(
        topic.to_owned(),
        id,
        dir,
        options.clone(),
        writer,
        read,
    ))
}

/// After a clean close: the active segment's index and UIDs from the hint
/// files the close wrote, when they cover exactly the bytes the recovery
/// point knows complete and the segment has no others. Only the frames
/// from the last index entry on are read (the end of the segment, where a
/// cut or a torn write would show); the rest is verified as it is read.
fn closed_cleanly(
    dir: &Path,
    base: u64,
    file: &File,
    known: RecoveryPoint,
    options: &Options,
) -> Result<Option<(SegmentIndex, SealedUids)>, BusError> {
    if file.metadata()?.len() != known.len {
        return Ok(None);
    }
    let Some(index) = index::read_hint(&segment::path(dir, base, CLOSED_IDX))
        .and_then(|b| index::decode_index(&b, base, known.len))
        .filter(|index| index.end == known.next)
    else {
        return Ok(None);
    };
    let uids = SealedUids::at(dir, base, known.next, known.len, options, CLOSED_UIDS);
    if !uids.header_fits() {
        return Ok(None);
    }
    let (mut expected, pos) = index.entries.last().copied().unwrap_or((base, 0));
    let mut reader = segment::FrameReader::new(file, pos, known.len);
    loop {
        match reader.next_frame()? {
            Some(Ok(frame)) if frame.base == expected && frame.count > 0 => {
                expected = frame.end();
            }
            Some(_) => return Ok(None),
            None => break,
        }
    }
    Ok((expected == known.next).then_some((index, uids)))
}

fn remove_hints(dir: &Path, base: u64, exts: &[&str]) -> Result<(), BusError> {
    for ext in exts {
        let hint = segment::path(dir, base, ext);
        if hint.exists() {
            std::fs::remove_file(hint)?;
        }
    }
    Ok(())
}

/// The segment a recovery point names is gone.
fn missing(dir: &Path, point: RecoveryPoint) -> BusError {
    corrupt(
        &segment::path(dir, point.base, LOG),
        point.base,
        format!(
            "segment missing; {} bytes, offsets to {} were known complete",
            point.len, point.next
        ),
    )
}

fn index_of(scan: &Scan) -> SegmentIndex {
    SegmentIndex {
        entries: scan.index.clone(),
        end: scan.end,
        len: scan.valid_len,
        max_ts: scan.max_ts,
        min_ts: scan.min_ts,
    }
}

/// A sealed segment's index and UIDs, from its hint files when they fit,
/// else rebuilt from the segment (which must then verify completely). Of
/// the UID table only the header is read here (its filter and pages are
/// checked when first read), so open reads a fixed amount per segment.
fn load_sealed(
    dir: &Path,
    base: u64,
    path: &Path,
    options: &Options,
) -> Result<(SegmentIndex, SealedUids), BusError> {
    let log_len = std::fs::metadata(path)?.len();
    let idx_path = segment::path(dir, base, IDX);
    let uids_path = segment::path(dir, base, UIDS);
    let index = index::read_hint(&idx_path).and_then(|b| index::decode_index(&b, base, log_len));
    if let Some(index) = &index {
        let uids = SealedUids::new(dir, base, index.end, index.len, options);
        if uids.header_fits() {
            return Ok((index.clone(), uids));
        }
        // A UID list written before tables: turned into one, no scan.
        if let Some(list) =
            index::read_hint(&uids_path).and_then(|b| index::decode_uids(&b, base, index.end))
        {
            return Ok((index.clone(), uids.store(&list)?));
        }
    }
    let file = File::open(path)?;
    let scan = segment::scan(&file, base, options.index_interval_bytes)?;
    if let Some((pos, reason)) = scan.fault {
        return Err(corrupt(
            path,
            scan.end,
            format!("{reason} at byte {pos} of a sealed segment"),
        ));
    }
    let rebuilt = index_of(&scan);
    let index = match index {
        Some(index) if index.end == rebuilt.end => index,
        _ => {
            fsutil::write_atomic(&idx_path, &index::encode_index(base, &rebuilt))?;
            rebuilt
        }
    };
    let uids = SealedUids::new(dir, base, index.end, index.len, options).store(&scan.uids)?;
    Ok((index, uids))
}

/// Creates an empty segment file and makes its name durable.
pub(crate) fn create_segment(dir: &Path, base: u64) -> Result<File, BusError> {
    let file = fsutil::open_rw(&segment::path(dir, base, LOG), true)?;
    fsutil::sync_dir(dir)?;
    Ok(file)
}

/// Leftovers of interrupted atomic writes.
fn remove_temp_files(dir: &Path) -> Result<(), BusError> {
    let mut removed = false;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().ends_with(".tmp") {
            std::fs::remove_file(entry.path())?;
            removed = true;
        }
    }
    if removed {
        fsutil::sync_dir(dir)?;
    }
    Ok(())
}
