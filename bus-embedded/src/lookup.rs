//! How a partition finds the segments that may hold a UID: through its
//! UID locator (`locator.rs`), loaded or built on first use and kept up to
//! date as segments seal.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bus_core::BusError;
use bus_core::sync::{lock, write};

use crate::locator::{CATCH_UP, FILE, Locator, Rebuild, SLOTS, SegmentId};
use crate::partition::{Partition, SegmentMeta};
use crate::uidtable::SealedUids;

pub(crate) fn id_of(segment: &SegmentMeta) -> SegmentId {
    SegmentId {
        base: segment.base,
        end: segment.index.end,
        log_len: segment.index.len,
    }
}

/// Which segments of `segments` (the last one active) a lookup of `uid`
/// reads, ascending, and whether through their filter: with a locator,
/// the candidates it names among the segments it covers, and every
/// sealed segment it does not cover; without, every one.
pub(crate) fn probes(
    segments: &[SegmentMeta],
    locator: Option<&Locator>,
    uid: &str,
) -> Vec<(usize, bool)> {
    let Some(active) = segments.len().checked_sub(1) else {
        return Vec::new();
    };
    let sealed = &segments[..active];
    let mut out = Vec::new();
    match locator {
        None => out.extend((0..active).map(|i| (i, true))),
        Some(locator) => {
            let candidates = locator.candidates(locator.hash(uid.as_bytes()));
            let first = sealed.first().map_or(u64::MAX, |s| s.base);
            let mut all_covered =
                locator.covered_between(first, segments[active].base) == sealed.len();
            if all_covered {
                for slot in candidates.slots() {
                    let Some(id) = locator.slot(slot) else {
                        continue;
                    };
                    match sealed.binary_search_by_key(&id.base, |s| s.base) {
                        Ok(i) if id_of(&sealed[i]) == id => out.push((i, false)),
                        Ok(_) => all_covered = false,
                        // Deleted since.
                        Err(_) => {}
                    }
                }
            }
            if all_covered {
                out.sort_unstable();
            } else {
                out.clear();
                let named: Vec<u64> = candidates
                    .slots()
                    .filter_map(|slot| locator.slot(slot))
                    .map(|id| id.base)
                    .collect();
                for (i, segment) in sealed.iter().enumerate() {
                    if !locator.covers(id_of(segment)) {
                        out.push((i, true));
                    } else if named.contains(&segment.base) {
                        out.push((i, false));
                    }
                }
            }
        }
    }
    if segments[active].uids.is_some() {
        out.push((active, true));
    }
    out
}

impl Partition {
    /// The partition's locator, loaded or built on first use; `None` in
    /// read-only opens (they hold every UID in memory).
    pub(crate) fn locator(&self) -> Result<Option<Arc<Locator>>, BusError> {
        if self.options.read_only {
            return Ok(None);
        }
        if let Some(locator) = self.locator.get() {
            return Ok(Some(locator));
        }
        let _loading = lock(&self.locator.loading);
        if let Some(locator) = self.locator.get() {
            return Ok(Some(locator));
        }
        let (locator, persisted) = self.load_locator()?;
        Ok(Some(self.locator.set(locator, persisted)))
    }

    /// The sealed segments and their UID tables, ascending.
    fn sealed(&self) -> Vec<(SegmentId, Arc<SealedUids>)> {
        let read = self.reader();
        let sealed = read.segments.len().saturating_sub(1);
        read.segments[..sealed]
            .iter()
            .filter_map(|s| Some((id_of(s), Arc::clone(s.uids.as_ref()?))))
            .collect()
    }

    /// The stored locator, checked against the sealed segments and brought
    /// up to date, or one built from their tables. Whether the file holds it.
    fn load_locator(&self) -> Result<(Locator, bool), BusError> {
        let sealed = self.sealed();
        let stored = crate::index::read_hint(&self.dir.join(FILE));
        let why = match stored.as_deref().map(Locator::decode) {
            None => "missing",
            Some(None) => "damaged",
            Some(Some(mut locator)) => {
                let first = sealed.first().map_or(u64::MAX, |(id, _)| id.base);
                let forgot = locator.forget_below(first);
                // Every segment it covers is a sealed one, as it was then.
                let consistent = locator.covered().all(|base| {
                    sealed
                        .binary_search_by_key(&base, |(id, _)| id.base)
                        .is_ok_and(|i| locator.covers(sealed[i].0))
                });
                if consistent {
                    if let Some((locator, added)) = self.catch_up(locator, &sealed)? {
                        return Ok((locator, !forgot && !added));
                    }
                    "behind"
                } else {
                    "stale"
                }
            }
        };
        if !sealed.is_empty() {
            tracing::info!(
                topic = %self.topic,
                partition = self.id,
                why,
                segments = sealed.len(),
                "building the UID locator from the segments' tables"
            );
        }
        Ok((self.build_locator(&sealed)?, false))
    }

    /// `locator` with the newest sealed segments it lacks added from their
    /// tables (and whether any were); `None` when more than [`CATCH_UP`] are
    /// missing or a rebuild is due.
    fn catch_up(
        &self,
        mut locator: Locator,
        sealed: &[(SegmentId, Arc<SealedUids>)],
    ) -> Result<Option<(Locator, bool)>, BusError> {
        let first = sealed.first().map_or(u64::MAX, |(id, _)| id.base);
        let newest = &sealed[sealed.len().saturating_sub(SLOTS)..];
        let missing: Vec<&(SegmentId, Arc<SealedUids>)> = newest
            .iter()
            .filter(|(id, _)| !locator.covers(*id))
            .collect();
        if missing.len() > CATCH_UP {
            return Ok(None);
        }
        let added = !missing.is_empty();
        for (id, uids) in missing {
            if locator.add_segment(*id, &uids.entries()?, first).is_err() {
                return Ok(None);
            }
        }
        Ok(Some((locator, added)))
    }

    fn build_locator(&self, sealed: &[(SegmentId, Arc<SealedUids>)]) -> Result<Locator, BusError> {
        let ids: Vec<SegmentId> = sealed.iter().map(|(id, _)| *id).collect();
        Locator::build(&ids, |i| sealed[i].1.entries())
    }

    /// Covers the segment `id` holding `uids`, just sealed and listed as
    /// such, when the locator is loaded (otherwise its load will). In
    /// place, under the lock: lookups wait for the merge (a few ms per
    /// million UIDs) rather than memory holding two copies. Rebuilt from
    /// the tables when due, with any sealed segment it lacks (sealed while
    /// it was loading) added.
    pub(crate) fn cover_sealed(&self, id: SegmentId, uids: &[(String, u64)]) {
        let (first, sealed_count) = {
            let read = self.reader();
            let first = read.segments.first().map_or(u64::MAX, |s| s.base);
            (first, read.segments.len().saturating_sub(1))
        };
        let mut current = write(&self.locator.current);
        let Some(locator) = current.as_mut() else {
            return;
        };
        self.locator.persisted.store(false, Ordering::Release);
        let locator = Arc::make_mut(locator);
        let added = locator.add_segment(id, uids, first);
        let complete = added.is_ok() && locator.covered().count() >= sealed_count.min(SLOTS);
        let next = (!complete).then(|| locator.clone());
        drop(current);
        let Some(next) = next else {
            return;
        };
        let sealed = self.sealed();
        let result = match added {
            Ok(()) => match self.catch_up(next, &sealed) {
                Ok(Some((next, _))) => Ok(next),
                Ok(None) => self.build_locator(&sealed),
                Err(error) => Err(error),
            },
            Err(Rebuild) => self.build_locator(&sealed),
        };
        match result {
            Ok(next) => {
                self.locator.set(next, false);
            }
            // The segments it does not cover are asked directly.
            Err(error) => tracing::warn!(
                topic = %self.topic,
                partition = self.id,
                %error,
                "UID locator not brought up to date: segments' filters answer for the rest"
            ),
        }
    }
}
