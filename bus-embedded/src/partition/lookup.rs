//! How a partition finds the segments that may hold a UID: through its
//! UID locator (`uid::locator`), loaded or built on first use and kept up to
//! date as segments seal.

use std::sync::Arc;

use bus_core::BusError;
use bus_core::backend::sync::lock;

use crate::partition::{Partition, SegmentMeta};
use crate::uid::locator::{CATCH_UP, FILE, Locator, Merged, SLOTS, SegmentId, Unfit};
use crate::uid::table::SealedUids;

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
            let Ok(candidates) = locator.candidates(locator.hash(uid.as_bytes())) else {
                // Its file unreadable: every sealed segment's filter answers.
                out.extend((0..active).map(|i| (i, true)));
                if segments[active].uids.is_some() {
                    out.push((active, true));
                }
                return out;
            };
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
        let why = match Locator::load(&self.dir.join(FILE)) {
            Err(why) => why,
            Ok(mut locator) => {
                let first = sealed.first().map_or(u64::MAX, |(id, _)| id.base);
                let forgot = match locator.forget_below(first) {
                    Ok(Some(fewer)) => {
                        locator = fewer;
                        true
                    }
                    Ok(None) => false,
                    Err(Unfit::Rebuild) => {
                        return Ok((self.build_locator(&sealed)?, false));
                    }
                    Err(Unfit::Io(error)) => return Err(error.into()),
                };
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
            match locator.with_segment(*id, &uids.entries()?, first) {
                Ok(next) => locator = next,
                Err(Unfit::Rebuild) => return Ok(None),
                Err(Unfit::Io(error)) => return Err(error.into()),
            }
        }
        Ok(Some((locator, added)))
    }

    fn build_locator(&self, sealed: &[(SegmentId, Arc<SealedUids>)]) -> Result<Locator, BusError> {
        let ids: Vec<SegmentId> = sealed.iter().map(|(id, _)| *id).collect();
        Locator::build(&self.dir.join(FILE), &ids, |i| sealed[i].1.entries())
    }

    /// Covers the segment `id` holding `uids`, just sealed and listed as
    /// such, when the locator is loaded (otherwise its load will). A new
    /// file is written from the current one's and the segment's entries
    /// while lookups go on with the current one (asking the new segment
    /// through its filter meanwhile). Rebuilt from the tables when due,
    /// with any sealed segment it lacks (sealed while it was loading) added.
    pub(crate) fn cover_sealed(&self, id: SegmentId, uids: &[(String, u64)]) {
        let _writing = lock(&self.locator.loading);
        let Some(current) = self.locator.get() else {
            return;
        };
        let (first, sealed_count) = {
            let read = self.reader();
            let first = read.segments.first().map_or(u64::MAX, |s| s.base);
            (first, read.segments.len().saturating_sub(1))
        };
        let merged = current.merge_segment(id, uids, first);
        drop(current);
        let next = match merged {
            Ok(Merged::New(next)) => Ok(self.locator.set(next, false)),
            Ok(Merged::Update(update)) => self.locator.apply(update).ok_or(Unfit::Rebuild),
            Err(unfit) => Err(unfit),
        };
        let result = match next {
            Ok(next) if next.covered().count() >= sealed_count.min(SLOTS) => return,
            Ok(next) => {
                let sealed = self.sealed();
                match next.try_clone() {
                    Ok(copy) => match self.catch_up(copy, &sealed) {
                        Ok(Some((next, _))) => Ok(next),
                        Ok(None) => self.build_locator(&sealed),
                        Err(error) => Err(error),
                    },
                    Err(error) => Err(error.into()),
                }
            }
            Err(Unfit::Rebuild) => self.build_locator(&self.sealed()),
            Err(Unfit::Io(error)) => Err(error.into()),
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
