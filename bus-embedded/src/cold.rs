//! The embedded log's cold tier (contract C24, issue #30; cargo feature
//! `cold`): sealed segments archived into a [`bus_cold::ColdTier`], and
//! reads below the hot log start served from it through the same `fetch`
//! and `subscribe`, with the same offsets, values, `stored_at` and tags.
//!
//! Where a topic's cold tier is lives in the topic's directory
//! (`topics/<topic>/cold.json`, `{"location": "file:///…" | "s3://…"}`),
//! written by [`attach`](crate::cold::attach); a location never holds credentials (S3 keys come
//! from the environment, see [`bus_cold::ColdLocation::parse`]).
//!
//! Kept in this file (and three one-line hooks) so the log's own code is
//! untouched: the archiver reads frames as `Partition::fetch` does, but
//! keeps each record's stored bytes and tag instead of decoding them.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use bus_cold::{ColdLocation, ColdRecord, ColdTier, DEFAULT_OBJECT_RECORDS, format::TAG_LEN};
use bus_core::auth::RecordAuth;
use bus_core::{BusError, Headers, StoredRecord};

use crate::EmbeddedBus;
use crate::inner::Inner;
use crate::log::segment::FrameReader;
use crate::partition::Partition;

const CONFIG: &str = "cold.json";

#[derive(serde::Serialize, serde::Deserialize)]
struct Config {
    location: String,
}

/// Open tiers by topic directory: one connector thread per location, not
/// per read. (A process-wide map keeps `Inner` unchanged; a tier is
/// stateless but for its cache of immutable objects.)
fn tiers() -> &'static Mutex<HashMap<PathBuf, Option<Arc<ColdTier>>>> {
    static TIERS: OnceLock<Mutex<HashMap<PathBuf, Option<Arc<ColdTier>>>>> = OnceLock::new();
    TIERS.get_or_init(Mutex::default)
}

fn topic_dir(partition: &Partition) -> Option<&Path> {
    partition.dir.parent()
}

/// The cold tier of the partition's topic, if it has one.
/// Whether `partition`'s topic has a cold tier attached.
pub(crate) fn attached(partition: &Partition) -> Result<bool, BusError> {
    Ok(tier_of(partition)?.is_some())
}

fn tier_of(partition: &Partition) -> Result<Option<Arc<ColdTier>>, BusError> {
    let Some(dir) = topic_dir(partition) else {
        return Ok(None);
    };
    let mut tiers = tiers()
        .lock()
        .map_err(|_| BusError::backend("embedded", "cold tier map poisoned"))?;
    if let Some(tier) = tiers.get(dir) {
        return Ok(tier.clone());
    }
    let tier = match std::fs::read(dir.join(CONFIG)) {
        Ok(bytes) => {
            let config: Config = serde_json::from_slice(&bytes).map_err(|e| {
                BusError::invalid("cold.json", format!("{}: {e}", dir.join(CONFIG).display()))
            })?;
            Some(Arc::new(ColdTier::open(&ColdLocation::parse(
                &config.location,
            )?)?))
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
        Err(error) => return Err(error.into()),
    };
    tiers.insert(dir.to_owned(), tier.clone());
    Ok(tier)
}

/// Gives `topic` a cold tier at `location` (see [`ColdLocation::parse`]):
/// checked to answer first, then recorded in the topic's directory.
pub fn attach(bus: &EmbeddedBus, topic: &str, location: &str) -> Result<(), BusError> {
    bus.inner.writable("cold attach")?;
    let parsed = ColdLocation::parse(location)?;
    let tier = ColdTier::open(&parsed)?;
    tier.check()?;
    let part = bus.inner.readable(topic, 0)?;
    let dir =
        topic_dir(&part).ok_or_else(|| BusError::backend("embedded", "topic has no directory"))?;
    let json = serde_json::to_vec_pretty(&Config {
        location: parsed.to_string(),
    })?;
    let tmp = dir.join(format!("{CONFIG}.tmp"));
    std::fs::write(&tmp, json)?;
    File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, dir.join(CONFIG))?;
    File::open(dir)?.sync_all()?;
    if let Ok(mut tiers) = tiers().lock() {
        tiers.insert(dir.to_owned(), Some(Arc::new(tier)));
    }
    Ok(())
}

/// Archives the sealed history of every partition of `topic` (records in
/// segments that no longer take writes) into its cold tier; idempotent and
/// crash-safe (see `bus_cold`). Returns the records newly archived.
pub fn archive(bus: &EmbeddedBus, topic: &str) -> Result<u64, BusError> {
    archive_until(bus, topic, Until::Sealed)
}

/// [`archive`] through the head: every acked record, the active segment's
/// too (acked records never change). What to run before a retention pass
/// that may roll and drop the active segment (it does when all of it is
/// old), so that retention drops nothing the cold tier lacks.
pub fn archive_all(bus: &EmbeddedBus, topic: &str) -> Result<u64, BusError> {
    archive_until(bus, topic, Until::Head)
}

#[derive(Clone, Copy)]
enum Until {
    Sealed,
    Head,
}

fn archive_until(bus: &EmbeddedBus, topic: &str, until: Until) -> Result<u64, BusError> {
    let partitions = bus.inner.topic(topic)?.spec.partitions;
    let mut archived = 0;
    for id in 0..partitions {
        let part = bus.inner.readable(topic, id)?;
        let Some(tier) = tier_of(&part)? else {
            return Err(BusError::invalid(
                "topic",
                format!(
                    "{topic:?} has no cold tier; attach one first (bus_embedded::cold::attach)"
                ),
            ));
        };
        let end = match until {
            Until::Sealed => part
                .reader()
                .segments
                .last()
                .map_or(0, |active| active.base),
            Until::Head => part.offsets().next,
        };
        archived += tier.archive_with(topic, id, end, DEFAULT_OBJECT_RECORDS, |from, max| {
            raw_records(&part, from, max)
        })?;
    }
    Ok(archived)
}

/// Up to `max` records from `from` (from the log start when below it) as
/// stored: value bytes and tags untouched.
fn raw_records(part: &Partition, from: u64, max: usize) -> Result<Vec<ColdRecord>, BusError> {
    let segments: Vec<_> = {
        let read = part.reader();
        read.segments
            .iter()
            .filter(|s| s.index.end > from)
            .map(|s| {
                (
                    s.path.clone(),
                    s.index.floor(from.max(s.base)),
                    s.index.len,
                    s.index.end,
                )
            })
            .collect()
    };
    let mut out = Vec::new();
    for (path, (_, pos), len, _) in segments {
        if out.len() >= max {
            break;
        }
        let file = File::open(&path)?;
        let mut reader = FrameReader::new(&file, pos, len);
        while out.len() < max {
            let frame = match reader.next_frame()? {
                None => break,
                Some(Ok(frame)) => frame,
                Some(Err(fault)) => {
                    return Err(BusError::Corrupt {
                        location: path.display().to_string(),
                        offset: from,
                        reason: format!("archiving: {fault:?}"),
                    });
                }
            };
            for (offset, record) in (frame.base..).zip(frame.records()) {
                if offset < from || out.len() >= max {
                    continue;
                }
                if record.headers.is_some() {
                    // The object format has no place for headers yet: an
                    // archive that dropped them would fail the record's tag
                    // (it covers them) on every cold read. Refused before
                    // the object is written, so nothing is archived half.
                    return Err(BusError::Unsupported {
                        operation: format!(
                            "archiving {} offset {offset}, a record with headers (C25), into a cold tier",
                            path.display()
                        ),
                        backend: "embedded".into(),
                    });
                }
                let text = |bytes: &[u8], what: &str| {
                    String::from_utf8(bytes.to_vec()).map_err(|_| BusError::Corrupt {
                        location: path.display().to_string(),
                        offset,
                        reason: format!("{what} is not UTF-8"),
                    })
                };
                let tag = match record.tag {
                    None => None,
                    Some(tag) => {
                        Some(
                            <[u8; TAG_LEN]>::try_from(tag).map_err(|_| BusError::Corrupt {
                                location: path.display().to_string(),
                                offset,
                                reason: "tag of the wrong length".into(),
                            })?,
                        )
                    }
                };
                out.push(ColdRecord {
                    offset,
                    stored_at: frame.stored_at,
                    key: text(record.key, "key")?,
                    uid: record.uid.map(|uid| text(uid, "UID")).transpose()?,
                    value: record.value.to_vec(),
                    tag,
                });
            }
        }
    }
    Ok(out)
}

/// `fetch` of the embedded bus with its cold tier: below the hot log start
/// the records come from the cold tier (C24: same offsets, values,
/// `stored_at`, tags verified), then the hot log continues the page.
pub(crate) fn fetch(
    inner: &Inner,
    topic: &str,
    partition: u32,
    offset: u64,
    max: usize,
    auth: Option<&RecordAuth>,
) -> Result<Vec<StoredRecord>, BusError> {
    let part = inner.readable(topic, partition)?;
    let hot_start = part.offsets().first;
    if offset >= hot_start {
        return part.fetch(offset, max, auth);
    }
    let Some(tier) = tier_of(&part)? else {
        return part.fetch(offset, max, auth);
    };
    let want = usize::try_from(hot_start - offset)
        .unwrap_or(usize::MAX)
        .min(max);
    // The tier keeps no headers yet: the archiver refuses a record that
    // has any (`raw_records`), so every cold record has none (C25).
    let mut out: Vec<StoredRecord> = tier
        .fetch(topic, partition, offset, want, auth)?
        .into_iter()
        .map(|event| StoredRecord {
            event,
            headers: Headers::default(),
        })
        .collect();
    let next = out.last().map_or(offset, |e| e.event.offset + 1);
    if out.len() < want && next < hot_start {
        if !out.is_empty() {
            // The page ends where the cold tier does; the next read from
            // `next` reports the hole.
            return Ok(out);
        }
        let manifest = tier.manifest(topic, partition)?;
        if manifest.ranges.is_empty() {
            // Nothing archived yet: the hot log alone, as without a tier.
            return part.fetch(offset, max, auth);
        }
        // Offsets that should be cold (below the hot log start, above what
        // the tier holds): an error naming them, never a silent gap (C24).
        let from = manifest.end().max(offset);
        return Err(BusError::Corrupt {
            location: format!("cold range {topic}/{partition} [{from}, {hot_start})"),
            offset: from,
            reason:
                "below the hot log start and not in the cold tier (expired before it was archived?)"
                    .into(),
        });
    }
    if out.len() < max {
        let next = out.last().map_or(offset, |e| e.event.offset + 1);
        let hot = part.fetch(next, max - out.len(), auth)?;
        // Retention may have moved the hot start past `next` since it was
        // read: return the cold page alone rather than one with a hole.
        if hot.first().is_some_and(|e| e.event.offset == next) {
            out.extend(hot);
        }
    }
    Ok(out)
}
