//! Opening a partition: load the sealed segments' persisted indexes (or
//! rebuild them), verify the active segment frame by frame, truncate an
//! unacknowledged torn tail, and refuse damage inside acknowledged data.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bus_core::BusError;

use crate::fsutil;
use crate::index::{self, SegmentIndex};
use crate::options::Options;
use crate::partition::{Partition, ReadState, SegmentMeta, WriterState};
use crate::segment::{self, IDX, LOG, Scan, UIDS};

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
    let mut bases = segment::list(&dir)?;
    if bases.is_empty() {
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
        {
            return Err(corrupt(
                &path,
                expected,
                format!("segment starts at offset {base} but the previous one ends at {expected}"),
            ));
        }
        let (index, uids) = if i == last {
            (SegmentIndex::default(), Vec::new())
        } else {
            load_sealed(&dir, base, &path, options)?
        };
        expected = Some(if i == last { base } else { index.end });
        read.uids.reserve(uids.len());
        for (uid, offset) in uids {
            read.uids.push(uid, offset);
        }
        read.segments.push(SegmentMeta {
            base,
            path,
            index,
            file: None,
        });
    }
    let base = bases[last];
    let path = segment::path(&dir, base, LOG);
    let file = fsutil::open_rw(&path, false)?;
    let scan = segment::scan(&file, base, options.index_interval_bytes)?;
    let file_len = file.metadata()?.len();
    if let Some((pos, reason)) = &scan.fault
        && !scan.torn
    {
        return Err(corrupt(&path, scan.end, format!("{reason} at byte {pos}")));
    }
    if scan.valid_len < file_len {
        // Only the unacknowledged tail goes: bytes past the last whole frame.
        file.set_len(scan.valid_len)?;
    }
    // What a killed writer left in the page cache but never fsynced must be
    // durable before it becomes visible (and dedup answers for it).
    options.files.sync_recovered(&file)?;
    // Stale hints of the active segment (a roll that did not finish) are
    // rewritten when it is sealed.
    for ext in [IDX, UIDS] {
        let hint = segment::path(&dir, base, ext);
        if hint.exists() {
            std::fs::remove_file(hint)?;
        }
    }
    let file = Arc::new(file);
    for (uid, offset) in &scan.uids {
        read.uids.push(uid.clone(), *offset);
    }
    let writer = WriterState {
        file: Arc::clone(&file),
        base,
        pos: scan.valid_len,
        next: scan.end,
        last_indexed: scan.index.last().map(|&(_, pos)| pos),
        active_uids: scan.uids.clone(),
        poisoned: None,
        dirty: false,
        allocated: scan.valid_len,
    };
    if let Some(active) = read.segments.last_mut() {
        active.index = index_of(&scan);
        active.file = Some(file);
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
/// else rebuilt from the segment (which must then verify completely).
fn load_sealed(
    dir: &Path,
    base: u64,
    path: &Path,
    options: &Options,
) -> Result<(SegmentIndex, Vec<(String, u64)>), BusError> {
    let log_len = std::fs::metadata(path)?.len();
    let idx_path = segment::path(dir, base, IDX);
    let uids_path = segment::path(dir, base, UIDS);
    let index = index::read_hint(&idx_path).and_then(|b| index::decode_index(&b, base, log_len));
    let uids = index.as_ref().and_then(|index| {
        index::read_hint(&uids_path).and_then(|b| index::decode_uids(&b, base, index.end))
    });
    if let (Some(index), Some(uids)) = (index.clone(), uids) {
        return Ok((index, uids));
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
    fsutil::write_atomic(&uids_path, &index::encode_uids(base, index.end, &scan.uids))?;
    Ok((index, scan.uids))
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
