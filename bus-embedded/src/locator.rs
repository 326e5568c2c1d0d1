//! The partition's UID locator: which sealed segments may hold a UID, in
//! one lookup, however many segments the partition has (issue 15).
//!
//! Each sealed segment's UIDs are in its own on-disk table (`uidtable`).
//! Asking every segment's filter in turn cost one cache miss per segment
//! per lookup (78 per partition at 10,000,000 records), on every dedup
//! check of a batch too. The locator is one structure for the partition:
//! per UID of a covered segment, a 16-bit fingerprint of its keyed hash and
//! the segment's slot (8 bits), sorted by hash, behind a directory of
//! buckets (the top `q` bits of the hash). A lookup reads one directory
//! entry and a bucket of about 8–16 entries and names the candidate
//! segments, usually none or one; the caller then reads one page of each
//! candidate's table. It never misses a UID of a covered segment; a false
//! candidate costs one page read that finds nothing (about 1 in
//! `2^(q + fingerprint bits) / UIDs`, under 1%).
//!
//! At most [`SLOTS`] segments are covered (the newest, as segments are
//! sealed); older ones, and any sealed while the locator was being loaded,
//! are asked through their own filters as before.
//!
//! The hash is SipHash with a random key drawn when the locator is built
//! and kept in its file's header: UIDs are chosen by callers, and with a
//! known hash they could be picked to fill one bucket (HashDoS).
//!
//! Persisted as `uid-locator` in the partition's directory, a hint like
//! the other index files: written at a clean close, checked against its
//! CRCs and against the sealed segments on load (the first lookup after an
//! open), and rebuilt from the segments' tables when missing, damaged or
//! stale. Segments sealed after it was written (a crash) are added from
//! their tables.
//!
//! ```text
//! header  48 bytes: "BUL1", q u32, fingerprint bits u32, slots u32,
//!         key (2 × u64), entries u64, zero u32, header CRC u32
//! slots   slots × 32 bytes: base, end, byte length, entries (u64 each;
//!         all ones: a free slot)
//! dir     (2^q + 1) × u32: where each bucket's entries start
//! fps     entries × u16: fingerprint, left-aligned (its top bits count)
//! classes entries × u8: the slot
//! crc     u32 of everything after the header
//! ```

use std::hash::Hasher as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use bus_core::sync::{read, write};

/// Segments a locator covers at most (a slot is one byte per entry).
pub(crate) const SLOTS: usize = 256;
/// The file's name in the partition's directory.
pub(crate) const FILE: &str = "uid-locator";
const MAGIC: &[u8; 4] = b"BUL1";
const HEADER: usize = 48;
const SLOT_BYTES: usize = 32;
/// Fingerprint bits after a build; each doubling of the directory takes
/// one (its bit becomes a bucket bit), down to [`MIN_FP_BITS`].
const FP_BITS: u32 = 16;
const MIN_FP_BITS: u32 = 10;
/// Entries per bucket on average: the directory doubles past `MAX_FILL`,
/// a build sizes it for `BUILD_FILL`.
const MAX_FILL: u64 = 16;
const BUILD_FILL: u64 = 8;
const MAX_Q: u32 = 32;
const MIN_Q: u32 = 6;

/// A sealed segment as the locator knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SegmentId {
    pub base: u64,
    pub end: u64,
    pub log_len: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    id: SegmentId,
    entries: u64,
}

/// Candidate slots of a lookup, one bit each.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Candidates([u64; SLOTS / 64]);

impl Candidates {
    fn set(&mut self, slot: u8) {
        self.0[usize::from(slot) / 64] |= 1 << (slot % 64);
    }

    /// The slots set, ascending.
    pub fn slots(self) -> impl Iterator<Item = usize> {
        self.0.into_iter().enumerate().flat_map(|(i, mut word)| {
            std::iter::from_fn(move || {
                let bit = word.trailing_zeros();
                (bit < 64).then(|| {
                    word &= word - 1;
                    i * 64 + bit as usize
                })
            })
        })
    }
}

/// See the module documentation.
#[derive(Clone)]
pub(crate) struct Locator {
    key: (u64, u64),
    /// Bucket bits.
    q: u32,
    /// Fingerprint bits that count (the top ones of each `fps` entry).
    r: u32,
    /// `2^q + 1` starts: bucket `b` is `dir[b]..dir[b + 1]`.
    dir: Vec<u32>,
    /// Sorted by (bucket, fingerprint).
    fps: Vec<u16>,
    classes: Vec<u8>,
    slots: Vec<Option<Slot>>,
    /// Covered segments' bases, ascending, with their slot.
    by_base: Vec<(u64, u8)>,
}

impl std::fmt::Debug for Locator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locator")
            .field("q", &self.q)
            .field("r", &self.r)
            .field("entries", &self.fps.len())
            .field("segments", &self.by_base.len())
            .finish_non_exhaustive()
    }
}

/// A fresh random key (std's hasher keys are drawn from the OS).
fn random_key() -> (u64, u64) {
    use std::hash::BuildHasher as _;
    let a = std::hash::RandomState::new().hash_one(0x5bd1_e995_u64);
    let b = std::hash::RandomState::new().hash_one(0x9e37_79b9_u64);
    (a, b)
}

/// Bucket bits for `total` entries in a fresh build (at least
/// [`MIN_Q`], so a small locator can grow 64-fold before a rebuild).
fn build_bits(total: u64) -> u32 {
    let mut q = MIN_Q;
    while total > BUILD_FILL << q && q < MAX_Q {
        q += 1;
    }
    q
}

fn fp_mask(r: u32) -> u16 {
    if r == 0 { 0 } else { u16::MAX << (16 - r) }
}

fn word(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

fn word32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// Why a segment could not be added: build the locator anew.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Rebuild;

impl Locator {
    /// An empty locator with a fresh key.
    #[cfg(test)]
    pub fn new() -> Self {
        Self::empty(random_key(), 0)
    }

    fn empty(key: (u64, u64), q: u32) -> Self {
        Self {
            key,
            q,
            r: FP_BITS,
            dir: vec![0; (1usize << q) + 1],
            fps: Vec::new(),
            classes: Vec::new(),
            slots: vec![None; SLOTS],
            by_base: Vec::new(),
        }
    }

    /// The keyed hash of `uid`.
    pub fn hash(&self, uid: &[u8]) -> u64 {
        #[allow(deprecated)] // SipHash-2-4 with explicit keys; std keeps it.
        let mut hasher = std::hash::SipHasher::new_with_keys(self.key.0, self.key.1);
        hasher.write(uid);
        hasher.finish()
    }

    /// Bucket and fingerprint of hash `h` at `q` bucket bits and `r`
    /// fingerprint bits.
    fn place(h: u64, q: u32, r: u32) -> (usize, u16) {
        let bucket = if q == 0 { 0 } else { h >> (64 - q) };
        let fp = u16::try_from((h << q) >> 48).unwrap_or(0) & fp_mask(r);
        (usize::try_from(bucket).unwrap_or(0), fp)
    }

    /// The slots whose segment may hold the UID of [`Locator::hash`] `h`.
    pub fn candidates(&self, h: u64) -> Candidates {
        let (bucket, fp) = Self::place(h, self.q, self.r);
        let mut out = Candidates::default();
        let (Some(&from), Some(&to)) = (self.dir.get(bucket), self.dir.get(bucket + 1)) else {
            return out;
        };
        let (from, to) = (from as usize, to as usize);
        for (i, &entry) in self.fps[from..to].iter().enumerate() {
            if entry == fp {
                out.set(self.classes[from + i]);
            } else if entry > fp {
                break;
            }
        }
        out
    }

    /// The segment in `slot`.
    pub fn slot(&self, slot: usize) -> Option<SegmentId> {
        self.slots.get(slot).copied().flatten().map(|s| s.id)
    }

    /// Covered segments' bases, ascending.
    pub fn covered(&self) -> impl Iterator<Item = u64> + '_ {
        self.by_base.iter().map(|&(base, _)| base)
    }

    /// Covered segments with a base in `from..to`.
    pub fn covered_between(&self, from: u64, to: u64) -> usize {
        self.by_base
            .partition_point(|&(base, _)| base < to)
            .saturating_sub(self.by_base.partition_point(|&(base, _)| base < from))
    }

    /// Whether the segment `id` is covered.
    pub fn covers(&self, id: SegmentId) -> bool {
        self.by_base
            .binary_search_by_key(&id.base, |&(base, _)| base)
            .ok()
            .and_then(|i| self.slot(usize::from(self.by_base[i].1)))
            == Some(id)
    }

    /// UIDs held.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.fps.len()
    }

    /// The slot a new segment takes: a free one, one of a segment below
    /// `first_live` (deleted), else the oldest covered one's.
    fn free_slot(&self, first_live: u64) -> usize {
        if let Some(free) = self.slots.iter().position(Option::is_none) {
            return free;
        }
        self.slots
            .iter()
            .position(|s| s.is_some_and(|s| s.id.base < first_live))
            .or_else(|| self.by_base.first().map(|&(_, slot)| usize::from(slot)))
            .unwrap_or(0)
    }

    /// A copy that also covers the segment `id` holding `uids` (see
    /// [`Locator::add_segment`]).
    #[cfg(test)]
    pub fn with_segment(
        &self,
        id: SegmentId,
        uids: &[(String, u64)],
        first_live: u64,
    ) -> Result<Self, Rebuild> {
        let mut out = self.clone();
        out.add_segment(id, uids, first_live)?;
        Ok(out)
    }

    /// Also covers the segment `id` holding `uids`, and no longer the
    /// segments below `first_live` (deleted). When every slot is taken, the
    /// oldest segment's is reused (it is asked directly from then on).
    /// `Err(Rebuild)`, leaving it unchanged, when the fingerprints would
    /// grow too short. Works in place (the arrays grow at their end), so
    /// memory never holds two copies of the entries.
    pub fn add_segment(
        &mut self,
        id: SegmentId,
        uids: &[(String, u64)],
        first_live: u64,
    ) -> Result<(), Rebuild> {
        let take = self.free_slot(first_live);
        let mut drop = [false; SLOTS];
        for (i, slot) in self.slots.iter().enumerate() {
            drop[i] = slot.is_none_or(|s| s.id.base < first_live || s.id.base == id.base);
        }
        drop[take] = true;
        let kept: u64 = self
            .slots
            .iter()
            .enumerate()
            .filter(|(i, _)| !drop[*i])
            .map(|(_, s)| s.map_or(0, |s| s.entries))
            .sum();
        let total = kept + uids.len() as u64;
        let (mut q, mut r) = (self.q, self.r);
        if kept == 0 {
            // Nothing to carry over: sized afresh, every fingerprint bit.
            (q, r) = (build_bits(total), FP_BITS);
        }
        while total > MAX_FILL << q && q < MAX_Q {
            q += 1;
            r -= 1;
            if r < MIN_FP_BITS {
                return Err(Rebuild);
            }
        }
        let class = u8::try_from(take).map_err(|_| Rebuild)?;
        let mut fresh: Vec<(usize, u16)> = uids
            .iter()
            .map(|(uid, _)| Self::place(self.hash(uid.as_bytes()), q, r))
            .collect();
        fresh.sort_unstable();
        fresh.dedup();
        let buckets = 1usize << q;
        // 1. The kept entries, compacted to the front and re-placed at
        // (q, r); `counts[b]`: how many are in bucket `b`. The directory is
        // reused for the counts when its size stays.
        let mut w = 0usize;
        let mut counts = if kept == 0 {
            self.fps.clear();
            self.classes.clear();
            vec![0u32; buckets + 1]
        } else if q == self.q {
            let mut from = 0usize;
            for b in 0..buckets {
                let to = self.dir[b + 1] as usize;
                let start = w;
                for i in from..to {
                    if !drop[usize::from(self.classes[i])] {
                        self.fps[w] = self.fps[i];
                        self.classes[w] = self.classes[i];
                        w += 1;
                    }
                }
                self.dir[b] = u32::try_from(w - start).map_err(|_| Rebuild)?;
                from = to;
            }
            std::mem::take(&mut self.dir)
        } else {
            let shift = q - self.q;
            let mut counts = vec![0u32; buckets + 1];
            for old_bucket in 0..(1usize << self.q) {
                for i in self.dir[old_bucket] as usize..self.dir[old_bucket + 1] as usize {
                    if drop[usize::from(self.classes[i])] {
                        continue;
                    }
                    let old = self.fps[i];
                    let bucket = (old_bucket << shift) | usize::from(old >> (16 - shift));
                    self.fps[w] = (old << shift) & fp_mask(r);
                    self.classes[w] = self.classes[i];
                    counts[bucket] += 1;
                    w += 1;
                }
            }
            counts
        };
        self.fps.truncate(w);
        self.classes.truncate(w);
        // 2. The new entries merged in from the back.
        let m = fresh.len();
        self.fps.resize(w + m, 0);
        self.classes.resize(w + m, 0);
        let (mut i, mut j, mut k) = (w, m, w + m);
        let (mut bucket, mut left) = (buckets, 0u32);
        while j > 0 {
            let take_fresh = if i == 0 {
                true
            } else {
                while left == 0 {
                    bucket -= 1;
                    left = counts[bucket];
                }
                fresh[j - 1] >= (bucket, self.fps[i - 1])
            };
            k -= 1;
            if take_fresh {
                self.fps[k] = fresh[j - 1].1;
                self.classes[k] = class;
                j -= 1;
            } else {
                self.fps[k] = self.fps[i - 1];
                self.classes[k] = self.classes[i - 1];
                i -= 1;
                left -= 1;
            }
        }
        for &(b, _) in &fresh {
            counts[b] += 1;
        }
        // 3. Counts to starts.
        counts.truncate(buckets);
        let mut at = 0u32;
        for count in &mut counts {
            let n = *count;
            *count = at;
            at = at.checked_add(n).ok_or(Rebuild)?;
        }
        counts.push(at);
        self.dir = counts;
        self.q = q;
        self.r = r;
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if drop[i] {
                *slot = None;
            }
        }
        self.slots[take] = Some(Slot {
            id,
            entries: m as u64,
        });
        self.index_slots();
        Ok(())
    }

    /// A locator with a fresh key covering the segments `ids` (at most
    /// [`SLOTS`]: the last ones), whose UIDs `uids_of(i)` reads in turn.
    pub fn build<E>(
        ids: &[SegmentId],
        mut uids_of: impl FnMut(usize) -> Result<Vec<(String, u64)>, E>,
    ) -> Result<Self, E> {
        let skip = ids.len().saturating_sub(SLOTS);
        let mut out = Self::empty(random_key(), 0);
        // The hash's top 56 bits and the slot, packed into one word: bucket
        // and fingerprint come from the top `q + 16` bits (q <= 32).
        let mut all: Vec<u64> = Vec::new();
        for (slot, i) in (skip..ids.len()).enumerate() {
            for (uid, _) in uids_of(i)? {
                all.push((out.hash(uid.as_bytes()) & !0xff) | slot as u64);
            }
        }
        all.sort_unstable();
        let q = build_bits(all.len() as u64);
        out.q = q;
        let mut counts = vec![0u32; 1usize << q];
        out.fps = Vec::with_capacity(all.len());
        out.classes = Vec::with_capacity(all.len());
        let mut last = None;
        for packed in all {
            let (bucket, fp) = Self::place(packed & !0xff, q, FP_BITS);
            let class = u8::try_from(packed & 0xff).unwrap_or(0);
            if last == Some((bucket, fp, class)) {
                continue;
            }
            last = Some((bucket, fp, class));
            counts[bucket] += 1;
            out.fps.push(fp);
            out.classes.push(class);
        }
        // Fewer than 2^32 entries per partition (u32 starts).
        let _ = out.finish_dir(&counts);
        for (slot, id) in ids[skip..].iter().enumerate() {
            out.slots[slot] = Some(Slot {
                id: *id,
                entries: 0,
            });
        }
        for &class in &out.classes {
            if let Some(slot) = &mut out.slots[usize::from(class)] {
                slot.entries += 1;
            }
        }
        out.index_slots();
        Ok(out)
    }

    fn finish_dir(&mut self, counts: &[u32]) -> Result<(), ()> {
        let mut at = 0u32;
        self.dir.clear();
        self.dir.reserve_exact(counts.len() + 1);
        for &count in counts {
            self.dir.push(at);
            at = at.checked_add(count).ok_or(())?;
        }
        self.dir.push(at);
        Ok(())
    }

    fn index_slots(&mut self) {
        self.by_base = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some((s.as_ref()?.id.base, u8::try_from(i).ok()?)))
            .collect();
        self.by_base.sort_unstable();
    }

    /// Drops the segments below `first_live` (deleted) and their entries.
    /// Whether any went.
    pub fn forget_below(&mut self, first_live: u64) -> bool {
        let mut gone = [false; SLOTS];
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if slot.is_some_and(|s| s.id.base < first_live) {
                *slot = None;
                gone[i] = true;
            }
        }
        if !gone.contains(&true) {
            return false;
        }
        let mut counts = vec![0u32; self.dir.len() - 1];
        let (mut fps, mut classes) = (Vec::new(), Vec::new());
        for (bucket, count) in counts.iter_mut().enumerate() {
            for i in self.dir[bucket] as usize..self.dir[bucket + 1] as usize {
                if !gone[usize::from(self.classes[i])] {
                    fps.push(self.fps[i]);
                    classes.push(self.classes[i]);
                    *count += 1;
                }
            }
        }
        (self.fps, self.classes) = (fps, classes);
        let _ = self.finish_dir(&counts);
        self.index_slots();
        true
    }

    /// The file's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            HEADER + SLOTS * SLOT_BYTES + self.dir.len() * 4 + self.fps.len() * 3 + 4,
        );
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.q.to_le_bytes());
        out.extend_from_slice(&self.r.to_le_bytes());
        out.extend_from_slice(&u32::try_from(SLOTS).unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&self.key.0.to_le_bytes());
        out.extend_from_slice(&self.key.1.to_le_bytes());
        out.extend_from_slice(&(self.fps.len() as u64).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        for slot in &self.slots {
            let words = slot.map_or([u64::MAX; 4], |s| {
                [s.id.base, s.id.end, s.id.log_len, s.entries]
            });
            for w in words {
                out.extend_from_slice(&w.to_le_bytes());
            }
        }
        for &d in &self.dir {
            out.extend_from_slice(&d.to_le_bytes());
        }
        for &fp in &self.fps {
            out.extend_from_slice(&fp.to_le_bytes());
        }
        out.extend_from_slice(&self.classes);
        let crc = crc32c::crc32c(&out[HEADER..]);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes a file; `None` when it is not a whole, consistent one.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let head = bytes.get(..HEADER)?;
        if !head.starts_with(MAGIC) || crc32c::crc32c(&head[..44]) != word32(head, 44)? {
            return None;
        }
        let (q, r, slots) = (word32(head, 4)?, word32(head, 8)?, word32(head, 12)?);
        let key = (word(head, 16)?, word(head, 24)?);
        let n = usize::try_from(word(head, 32)?).ok()?;
        if q > MAX_Q || !(MIN_FP_BITS..=FP_BITS).contains(&r) || slots as usize != SLOTS {
            return None;
        }
        let buckets = 1usize.checked_shl(q)?;
        let len = HEADER
            .checked_add(SLOTS * SLOT_BYTES)?
            .checked_add(buckets.checked_add(1)?.checked_mul(4)?)?
            .checked_add(n.checked_mul(3)?)?
            .checked_add(4)?;
        if bytes.len() != len || crc32c::crc32c(&bytes[HEADER..len - 4]) != word32(bytes, len - 4)?
        {
            return None;
        }
        let mut out = Self::empty(key, 0);
        out.q = q;
        out.r = r;
        let mut at = HEADER;
        for slot in &mut out.slots {
            let words = [
                word(bytes, at)?,
                word(bytes, at + 8)?,
                word(bytes, at + 16)?,
                word(bytes, at + 24)?,
            ];
            at += SLOT_BYTES;
            if words != [u64::MAX; 4] {
                *slot = Some(Slot {
                    id: SegmentId {
                        base: words[0],
                        end: words[1],
                        log_len: words[2],
                    },
                    entries: words[3],
                });
            }
        }
        out.dir = (0..=buckets)
            .map(|i| word32(bytes, at + i * 4))
            .collect::<Option<_>>()?;
        at += (buckets + 1) * 4;
        out.fps = bytes[at..at + n * 2]
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        at += n * 2;
        out.classes = bytes[at..at + n].to_vec();
        // Consistent: a monotone directory over all entries, each entry of
        // a covered slot, and as many per slot as the slot says.
        let monotone = out.dir.first() == Some(&0)
            && out.dir.last().map(|&d| d as usize) == Some(n)
            && out.dir.windows(2).all(|w| w[0] <= w[1]);
        if !monotone {
            return None;
        }
        let mut counts = [0u64; SLOTS];
        for &class in &out.classes {
            counts[usize::from(class)] += 1;
        }
        for (slot, &count) in out.slots.iter().zip(&counts) {
            if slot.map_or(0, |s| s.entries) != count {
                return None;
            }
        }
        out.index_slots();
        Some(out)
    }
}

/// Segments missing from a stored locator that are added one by one on
/// load; with more, it is built anew.
pub(crate) const CATCH_UP: usize = 8;

/// A partition's locator, loaded on its first lookup.
#[derive(Debug, Default)]
pub(crate) struct LocatorCell {
    pub(crate) current: RwLock<Option<Arc<Locator>>>,
    /// Whether the file holds `current`.
    pub(crate) persisted: AtomicBool,
    pub(crate) loading: Mutex<()>,
}

impl LocatorCell {
    pub fn get(&self) -> Option<Arc<Locator>> {
        read(&self.current).clone()
    }

    pub(crate) fn set(&self, locator: Locator, persisted: bool) -> Arc<Locator> {
        let locator = Arc::new(locator);
        *write(&self.current) = Some(Arc::clone(&locator));
        self.persisted.store(persisted, Ordering::Release);
        locator
    }

    /// The locator to write at close, if the file does not hold it.
    pub fn unpersisted(&self) -> Option<Arc<Locator>> {
        (!self.persisted.load(Ordering::Acquire))
            .then(|| self.get())
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]
    use super::*;

    fn uids(from: u64, to: u64) -> Vec<(String, u64)> {
        (from..to).map(|i| (format!("e{i}"), i)).collect()
    }

    fn id(base: u64, end: u64) -> SegmentId {
        SegmentId {
            base,
            end,
            log_len: end * 10,
        }
    }

    fn holders(loc: &Locator, uid: &str) -> Vec<u64> {
        let mut out: Vec<u64> = loc
            .candidates(loc.hash(uid.as_bytes()))
            .slots()
            .map(|s| loc.slot(s).unwrap().base)
            .collect();
        out.sort_unstable();
        out
    }

    #[test]
    fn every_uid_names_its_segment_and_few_name_others() {
        let mut loc = Locator::new();
        for seg in 0..20u64 {
            let (from, to) = (seg * 5000, seg * 5000 + 5000);
            loc = loc.with_segment(id(from, to), &uids(from, to), 0).unwrap();
            assert!(loc.covers(id(from, to)));
        }
        // UIDs of one segment that share bucket and fingerprint share an entry.
        assert!(loc.len() > 99_900 && loc.len() <= 100_000, "{}", loc.len());
        for i in 0..100_000u64 {
            assert!(
                holders(&loc, &format!("e{i}")).contains(&(i / 5000 * 5000)),
                "e{i}"
            );
        }
        let false_hits = (100_000..200_000u64)
            .filter(|i| !holders(&loc, &format!("e{i}")).is_empty())
            .count();
        assert!(false_hits < 1000, "{false_hits} false candidates");
        // Round trip through the file.
        let back = Locator::decode(&loc.encode()).unwrap();
        for i in (0..100_000u64).step_by(7) {
            assert_eq!(
                holders(&back, &format!("e{i}")),
                holders(&loc, &format!("e{i}"))
            );
        }
    }

    #[test]
    fn a_build_equals_adding_one_by_one() {
        let segments: Vec<(SegmentId, Vec<(String, u64)>)> = (0..5u64)
            .map(|s| (id(s * 100, s * 100 + 100), uids(s * 100, s * 100 + 100)))
            .collect();
        let ids: Vec<SegmentId> = segments.iter().map(|(id, _)| *id).collect();
        let built = Locator::build(&ids, |i| Ok::<_, ()>(segments[i].1.clone())).unwrap();
        for i in 0..500u64 {
            assert_eq!(holders(&built, &format!("e{i}")), vec![i / 100 * 100]);
        }
        // A UID stored in two segments names both.
        let mut two = segments.clone();
        two[3].1.push(("e5".to_owned(), 399));
        let built = Locator::build(&ids, |i| Ok::<_, ()>(two[i].1.clone())).unwrap();
        assert_eq!(holders(&built, "e5"), vec![0, 300]);
        let mut added = Locator::new();
        for (seg, list) in &two {
            added = added.with_segment(*seg, list, 0).unwrap();
        }
        assert_eq!(holders(&added, "e5"), vec![0, 300]);
    }

    #[test]
    fn deleted_segments_and_full_slots() {
        let mut loc = Locator::new();
        for seg in 0..(SLOTS as u64 + 10) {
            loc = loc
                .with_segment(
                    id(seg * 10, seg * 10 + 10),
                    &uids(seg * 10, seg * 10 + 10),
                    0,
                )
                .unwrap();
        }
        // The oldest ten gave their slots to the newest.
        assert_eq!(loc.covered().count(), SLOTS);
        assert_eq!(loc.covered().next(), Some(100));
        assert!(holders(&loc, "e5").is_empty());
        assert_eq!(holders(&loc, "e2655"), vec![2650]);
        // Segments below 1000 deleted: gone at the next change.
        let mut kept = loc.clone();
        assert!(kept.forget_below(1000));
        assert_eq!(kept.covered_between(0, u64::MAX), SLOTS - 90);
        let next = loc
            .with_segment(id(2660, 2670), &uids(2660, 2670), 1000)
            .unwrap();
        assert_eq!(next.covered().next(), Some(1000));
        assert!(next.len() <= (SLOTS - 90 + 1) * 10 && next.len() > (SLOTS - 91) * 10);
        assert!(holders(&next, "e999").is_empty());
        assert_eq!(holders(&next, "e1000"), vec![1000]);
    }

    #[test]
    fn growth_keeps_every_uid_until_a_rebuild_is_due() {
        let mut loc = Locator::new();
        let mut seg = 0u64;
        let result = loop {
            let (from, to) = (seg * 4000, seg * 4000 + 4000);
            match loc.with_segment(id(from, to), &uids(from, to), 0) {
                Ok(next) => loc = next,
                Err(rebuild) => break rebuild,
            }
            seg += 1;
            if seg == 200 {
                panic!("never asked for a rebuild: q {} r {}", loc.q, loc.r);
            }
        };
        assert_eq!(result, Rebuild);
        assert!(loc.r >= MIN_FP_BITS);
        for i in (0..seg * 4000).step_by(13) {
            assert!(holders(&loc, &format!("e{i}")).contains(&(i / 4000 * 4000)));
        }
    }

    #[test]
    fn growing_while_segments_are_deleted_keeps_every_live_uid() {
        // Segments of growing size, the oldest deleted as new ones come,
        // so merges grow the directory and drop entries at once.
        let mut loc = Locator::new();
        let mut live: Vec<(u64, u64)> = Vec::new();
        let mut next = 0u64;
        for seg in 0..40u64 {
            let len = 50 + seg * seg * 40;
            let (from, to) = (next, next + len);
            next = to;
            live.push((from, to));
            if live.len() > 6 {
                live.remove(0);
            }
            let first = live[0].0;
            match loc.with_segment(id(from, to), &uids(from, to), first) {
                Ok(grown) => loc = grown,
                Err(Rebuild) => {
                    let ids: Vec<SegmentId> = live.iter().map(|&(f, t)| id(f, t)).collect();
                    loc =
                        Locator::build(&ids, |i| Ok::<_, ()>(uids(live[i].0, live[i].1))).unwrap();
                }
            }
            assert_eq!(loc.covered().count(), live.len(), "segment {seg}");
            for &(f, t) in &live {
                for i in (f..t).step_by(11) {
                    assert!(holders(&loc, &format!("e{i}")).contains(&f), "e{i}");
                }
            }
            // A deleted UID names a live segment only by a fingerprint
            // collision (a false candidate), rarely.
            let probed = (0..first).step_by(7).count();
            let named = (0..first)
                .step_by(7)
                .filter(|i| !holders(&loc, &format!("e{i}")).is_empty())
                .count();
            assert!(
                named * 50 <= probed.max(50),
                "{named} of {probed} deleted named"
            );
        }
        assert!(loc.q > MIN_Q, "the directory grew");
    }

    #[test]
    fn damaged_files_are_refused() {
        let mut loc = Locator::new();
        loc = loc.with_segment(id(0, 300), &uids(0, 300), 0).unwrap();
        let bytes = loc.encode();
        assert!(Locator::decode(&bytes).is_some());
        assert!(Locator::decode(&bytes[..bytes.len() - 1]).is_none());
        for at in (0..bytes.len()).step_by(5) {
            let mut bad = bytes.clone();
            bad[at] ^= 0x04;
            assert!(Locator::decode(&bad).is_none(), "flip at {at}");
        }
    }

    #[test]
    fn keys_differ_between_locators() {
        assert_ne!(Locator::new().hash(b"x"), Locator::new().hash(b"x"));
    }
}
