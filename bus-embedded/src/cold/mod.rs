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

mod declared;
mod restore;

pub(crate) use declared::{archive_for_retention, attach_declared, cold_retention, open_declared};
pub use restore::restore;

const CONFIG: &str = "cold.json";

#[derive(serde::Serialize, serde::Deserialize)]
struct Config {
    location: String,
    /// Retention drops only segments the tier holds (absent in a
    /// `cold.json` written before the option: off).
    #[serde(default)]
    expire_only_archived: bool,
}

/// A topic's attached tier.
#[derive(Clone)]
struct Attached {
    tier: Arc<ColdTier>,
    expire_only_archived: bool,
}

/// Open tiers by topic directory: one connector thread per location, not
/// per read. (A process-wide map keeps `Inner` unchanged; a tier is
/// stateless but for its cache of immutable objects.)
fn tiers() -> &'static Mutex<HashMap<PathBuf, Option<Attached>>> {
    static TIERS: OnceLock<Mutex<HashMap<PathBuf, Option<Attached>>>> = OnceLock::new();
    TIERS.get_or_init(Mutex::default)
}

fn topic_dir(partition: &Partition) -> Option<&Path> {
    partition.dir.parent()
}

/// Whether `partition`'s topic has a cold tier attached.
pub(crate) fn has_tier(partition: &Partition) -> Result<bool, BusError> {
    Ok(tier_of(partition)?.is_some())
}

/// The cold tier of the partition's topic, if it has one.
fn tier_of(partition: &Partition) -> Result<Option<Arc<ColdTier>>, BusError> {
    Ok(attached(partition)?.map(|attached| attached.tier))
}

/// The tier of `topic` (whose partition `part` is), or an error saying to
/// attach one: archiving and cold retention need it.
fn attached_tier(part: &Partition, topic: &str) -> Result<Arc<ColdTier>, BusError> {
    tier_of(part)?.ok_or_else(|| {
        BusError::invalid(
            "topic",
            format!("{topic:?} has no cold tier; attach one first (bus_embedded::cold::attach)"),
        )
    })
}

/// The partition's topic's tier and options, if it has one.
fn attached(partition: &Partition) -> Result<Option<Attached>, BusError> {
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
            Some(Attached {
                tier: Arc::new(ColdTier::open(&ColdLocation::parse(&config.location)?)?),
                expire_only_archived: config.expire_only_archived,
            })
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
        Err(error) => return Err(error.into()),
    };
    tiers.insert(dir.to_owned(), tier.clone());
    Ok(tier)
}

/// The retained range of a partition whose topic may have a tier: the hot
/// log's, its start lowered to the tier's first offset when the tier holds
/// any (as `bus_cold::ColdBus` reports it).
pub(crate) fn offsets(
    part: &Partition,
    topic: &str,
    partition: u32,
) -> Result<bus_core::PartitionOffsets, BusError> {
    let hot = part.offsets();
    let Some(tier) = tier_of(part)? else {
        return Ok(hot);
    };
    let start = tier.manifest(topic, partition)?.start();
    Ok(bus_core::PartitionOffsets {
        first: start.map_or(hot.first, |start| start.min(hot.first)),
        next: hot.next,
    })
}

/// Where the hot log of `topic`/`partition` begins and ends, below any
/// cold tier (`EventBus::offsets` reports the tier's start as `first`).
pub fn hot_offsets(
    bus: &EmbeddedBus,
    topic: &str,
    partition: u32,
) -> Result<bus_core::PartitionOffsets, BusError> {
    Ok(bus.inner.readable(topic, partition)?.offsets())
}

/// Gives `topic` a cold tier at `location` (see [`ColdLocation::parse`]):
/// checked to answer first, then recorded in the topic's directory.
/// Retention then drops only what the tier holds ([`attach_with`] with
/// `expire_only_archived = true`).
pub fn attach(bus: &EmbeddedBus, topic: &str, location: &str) -> Result<(), BusError> {
    attach_with(bus, topic, location, true)
}

/// [`attach`], choosing whether hot retention (`maintenance`) may drop
/// segments the tier does not hold yet: with `expire_only_archived`, an
/// expired segment stays until an archive covers it (C24).
pub fn attach_with(
    bus: &EmbeddedBus,
    topic: &str,
    location: &str,
    expire_only_archived: bool,
) -> Result<(), BusError> {
    bus.inner.writable("cold attach")?;
    let parsed = ColdLocation::parse(location)?;
    let tier = ColdTier::open(&parsed)?;
    tier.check()?;
    let part = bus.inner.readable(topic, 0)?;
    let dir =
        topic_dir(&part).ok_or_else(|| BusError::backend("embedded", "topic has no directory"))?;
    remember(dir, tier, &parsed, expire_only_archived)?;
    Ok(())
}

/// Records `tier` (at `location`) as the tier of the topic in `dir`, in
/// its `cold.json` (written atomically) and in the map of open tiers.
fn remember(
    dir: &Path,
    tier: ColdTier,
    location: &ColdLocation,
    expire_only_archived: bool,
) -> Result<(), BusError> {
    let json = serde_json::to_vec_pretty(&Config {
        location: location.to_string(),
        expire_only_archived,
    })?;
    crate::fsutil::write_atomic(&dir.join(CONFIG), &json)?;
    if let Ok(mut tiers) = tiers().lock() {
        tiers.insert(
            dir.to_owned(),
            Some(Attached {
                tier: Arc::new(tier),
                expire_only_archived,
            }),
        );
    }
    Ok(())
}

/// Retention of one partition (`maintenance`): with a tier attached with
/// `expire_only_archived`, only segments wholly below what the tier holds
/// are dropped; otherwise every segment past `cutoff`.
pub(crate) fn expire(
    partition: &Partition,
    topic: &str,
    id: u32,
    cutoff: u64,
) -> Result<u64, BusError> {
    match attached(partition)? {
        Some(attached) if attached.expire_only_archived => {
            let archived_end = attached.tier.manifest(topic, id)?.end();
            partition.expire_archived(cutoff, archived_end)
        }
        _ => partition.expire(cutoff),
    }
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

/// Cold retention of `topic`: every partition's archived objects whose
/// newest record was stored before `cutoff_ms` are deleted (whole objects;
/// see [`ColdTier::expire`]). Reads below the tier's new start begin at
/// it, as after hot retention. Returns the records expired.
pub fn expire_cold(bus: &EmbeddedBus, topic: &str, cutoff_ms: u64) -> Result<u64, BusError> {
    bus.inner.writable("cold expire")?;
    let partitions = bus.inner.topic(topic)?.spec.partitions;
    let mut expired = 0;
    for id in 0..partitions {
        let part = bus.inner.readable(topic, id)?;
        let tier = attached_tier(&part, topic)?;
        expired += tier.expire(topic, id, cutoff_ms)?;
    }
    Ok(expired)
}

#[derive(Clone, Copy)]
enum Until {
    Sealed,
    Head,
}

fn archive_until(bus: &EmbeddedBus, topic: &str, until: Until) -> Result<u64, BusError> {
    let spec = bus.inner.topic(topic)?.spec.clone();
    let (partitions, compression) = (spec.partitions, spec.compression);
    let mut archived = 0;
    for id in 0..partitions {
        let part = bus.inner.readable(topic, id)?;
        let tier = attached_tier(&part, topic)?;
        let end = match until {
            Until::Sealed => part
                .reader()
                .segments
                .last()
                .map_or(0, |active| active.base),
            Until::Head => part.offsets().next,
        };
        // The tier's objects are compressed as the topic's frames are.
        archived += tier.archive_with_compression(
            topic,
            id,
            end,
            DEFAULT_OBJECT_RECORDS,
            compression,
            |from, max| raw_records(&part, from, max),
        )?;
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
                // Headers (C25) travel with the record: its tag covers them.
                let headers = match record.headers {
                    None => Headers::default(),
                    Some(block) => crate::log::frame::decode_headers(block).ok_or_else(|| {
                        BusError::Corrupt {
                            location: path.display().to_string(),
                            offset,
                            reason: "archiving: headers do not parse".into(),
                        }
                    })?,
                };
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
                    headers,
                });
            }
        }
    }
    Ok(out)
}

/// Attempts of a read whose hot log start keeps moving under it.
const READ_ATTEMPTS: usize = 16;

/// `fetch` of the embedded bus with its cold tier: below the hot log start
/// the records come from the cold tier (C24: same offsets, values,
/// `stored_at`, headers, tags verified), then the hot log continues the
/// page. A hot read that starts past the offset it asked for (retention
/// ran since the hot start was read) reads the tier again: no page is
/// short in the middle or gapped. A page ends where a hole in the tier
/// begins; the read from there is `Corrupt` naming the hole.
pub(crate) fn fetch(
    inner: &Inner,
    topic: &str,
    partition: u32,
    offset: u64,
    max: usize,
    auth: Option<&RecordAuth>,
) -> Result<Vec<StoredRecord>, BusError> {
    let part = inner.readable(topic, partition)?;
    let Some(tier) = tier_of(&part)? else {
        return part.fetch(offset, max, auth);
    };
    let mut out: Vec<StoredRecord> = Vec::new();
    let mut next = offset;
    for _ in 0..READ_ATTEMPTS {
        if out.len() >= max {
            return Ok(out);
        }
        let hot_start = part.offsets().first;
        if next >= hot_start {
            let page = part.fetch(next, max - out.len(), auth)?;
            match page.first() {
                // Retention may have moved the hot start past `next` since
                // it was read (the hot log is empty from there): the tier
                // has those records now.
                None if part.offsets().first > next => continue,
                None => return Ok(out),
                Some(first) if first.event.offset == next => {
                    out.extend(page);
                    return Ok(out);
                }
                // Retention moved the hot start past `next`: the tier has
                // those records now (or says which are missing).
                Some(_) => continue,
            }
        }
        let want = usize::try_from(hot_start - next)
            .unwrap_or(usize::MAX)
            .min(max - out.len());
        let cold: Vec<StoredRecord> = tier
            .read(topic, partition, next, want)?
            .into_iter()
            .map(|record| bus_cold::to_record(topic, partition, record, auth))
            .collect::<Result<_, _>>()?;
        match cold.first() {
            None if !out.is_empty() => return Ok(out),
            None => {
                let manifest = tier.manifest(topic, partition)?;
                if !manifest.ever_archived()
                    || (manifest.ranges.is_empty() && manifest.end() >= hot_start)
                {
                    // Nothing archived yet (the hot log alone, as without a
                    // tier), or all the tier held below the hot start has
                    // expired: the read begins at the hot start.
                    return part.fetch(next.max(hot_start), max, auth);
                }
                return Err(missing(
                    topic,
                    partition,
                    manifest.end().max(next),
                    hot_start,
                ));
            }
            Some(first) if !out.is_empty() && first.event.offset != next => {
                return Ok(out);
            }
            Some(_) => {}
        }
        next = cold.last().map_or(next, |r| r.event.offset + 1);
        out.extend(cold);
    }
    Err(BusError::unavailable(
        "embedded",
        format!("{topic}/{partition}: the hot log start kept moving under the read at {offset}"),
    ))
}

/// Offsets that should be cold (below the hot log start, above what the
/// tier holds): an error naming them, never a silent gap (C24).
fn missing(topic: &str, partition: u32, from: u64, end: u64) -> BusError {
    BusError::Corrupt {
        location: format!("cold range {topic}/{partition} [{from}, {end})"),
        offset: from,
        reason:
            "below the hot log start and not in the cold tier (expired before it was archived?)"
                .into(),
    }
}
