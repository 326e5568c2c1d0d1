//! Covering a newly sealed segment, and forgetting deleted ones: the old
//! file's entries merged with the segment's into a new file (in runs when
//! none is dropped), then the directory and summaries changed in place.

use std::fs::File;
use std::os::unix::fs::FileExt as _;

use super::writer::Writer;
use super::{
    CHUNK, ENTRIES_AT, ENTRY, FP_BITS, Locator, MAX_FILL, MAX_Q, MIN_FP_BITS, Merged, SLOTS,
    SegmentId, Slot, Unfit, Update, build_bits, entry_check, fp_mask, pack, read_region,
    summary_bits, unpack,
};

impl Locator {
    /// The slot a new segment takes among `slots`: a free one, one of a
    /// segment below `first_live` (deleted), else the oldest covered one's.
    fn free_slot(slots: &[Option<Slot>], first_live: u64) -> usize {
        if let Some(free) = slots.iter().position(Option::is_none) {
            return free;
        }
        slots
            .iter()
            .position(|s| s.is_some_and(|s| s.id.base < first_live))
            .or_else(|| {
                slots
                    .iter()
                    .enumerate()
                    .filter_map(|(i, s)| Some((s.as_ref()?.id.base, i)))
                    .min()
                    .map(|(_, i)| i)
            })
            .unwrap_or(0)
    }

    /// A new locator (and file) that also covers the segment `id` holding
    /// `uids`, and no longer the segments below `first_live` (deleted).
    /// When every slot is taken, the oldest segment's is reused (it is
    /// asked directly from then on). `Err(Unfit::Rebuild)` when the
    /// fingerprints would grow too short.
    pub fn with_segment(
        &self,
        id: SegmentId,
        uids: &[(String, u64)],
        first_live: u64,
    ) -> Result<Self, Unfit> {
        let merged = self.merged(Some((id, uids)), first_live)?;
        self.completed(merged)
    }

    /// [`Locator::with_segment`], leaving an update of this locator as such
    /// (for [`LocatorCell::apply`]).
    pub fn merge_segment(
        &self,
        id: SegmentId,
        uids: &[(String, u64)],
        first_live: u64,
    ) -> Result<Merged, Unfit> {
        self.merged(Some((id, uids)), first_live)
    }

    /// The locator a merge made: an update applied to a copy of this one.
    fn completed(&self, merged: Merged) -> Result<Self, Unfit> {
        match merged {
            Merged::New(next) => Ok(next),
            Merged::Update(update) => {
                let mut next = self.copy_without_file();
                next.apply(update);
                Ok(next)
            }
        }
    }

    /// A copy of its memory, reading no file until one is given.
    pub(super) fn copy_without_file(&self) -> Self {
        Self {
            key: self.key,
            q: self.q,
            r: self.r,
            dir: self.dir.clone(),
            summary: self.summary.clone(),
            check: self.check.clone(),
            n: self.n,
            slots: self.slots.clone(),
            by_base: self.by_base.clone(),
            file: None,
            path: self.path.clone(),
        }
    }

    /// A copy that reads the same file.
    pub fn try_clone(&self) -> std::io::Result<Self> {
        let mut out = self.copy_without_file();
        out.file = self.file.as_ref().map(File::try_clone).transpose()?;
        Ok(out)
    }

    /// Takes the new file of `update` and changes the directory and
    /// summaries in place: each bucket starts later by the new entries
    /// before it, and gains the bits of its own.
    pub fn apply(&mut self, update: Update) {
        let buckets = self.dir.len() - 1;
        let mut next = update.fresh.iter().map(|&f| unpack(f)).peekable();
        let mut added = 0u32;
        for bucket in 0..buckets {
            self.dir[bucket] += added;
            while let Some((_, fp, slot)) = next.next_if(|&(b, _, _)| b == bucket) {
                self.summary[bucket] |= summary_bits(fp);
                self.check[bucket] = self.check[bucket].wrapping_add(entry_check(fp, slot));
                added += 1;
            }
        }
        self.dir[buckets] += added;
        self.n = update.n;
        self.slots = update.slots;
        self.file = Some(update.file);
        self.index_slots();
    }

    /// Without the segments below `first_live` (deleted) and their
    /// entries: `None` when it covers none of them.
    pub fn forget_below(&self, first_live: u64) -> Result<Option<Self>, Unfit> {
        if !self
            .slots
            .iter()
            .any(|s| s.is_some_and(|s| s.id.base < first_live))
        {
            return Ok(None);
        }
        let merged = self.merged(None, first_live)?;
        self.completed(merged).map(Some)
    }

    /// The merge behind [`Locator::with_segment`] and
    /// [`Locator::forget_below`]: the old file's entries, read in order
    /// and re-placed when the directory grows, merged with the new
    /// segment's into a new file.
    fn merged(
        &self,
        add: Option<(SegmentId, &[(String, u64)])>,
        first_live: u64,
    ) -> Result<Merged, Unfit> {
        let mut slots = self.slots.clone();
        let mut drop = [false; SLOTS];
        for (i, slot) in slots.iter_mut().enumerate() {
            if slot.is_some_and(|s| {
                s.id.base < first_live || add.is_some_and(|(id, _)| s.id.base == id.base)
            }) {
                *slot = None;
                drop[i] = true;
            }
        }
        let mut class = None;
        if let Some((id, _)) = add {
            let take = Self::free_slot(&slots, first_live);
            drop[take] |= slots[take].is_some();
            slots[take] = Some(Slot { id, entries: 0 });
            class = Some(u8::try_from(take).map_err(|_| Unfit::Rebuild)?);
        }
        let kept: u64 = self
            .slots
            .iter()
            .enumerate()
            .filter(|(i, _)| !drop[*i])
            .map(|(_, s)| s.map_or(0, |s| s.entries))
            .sum();
        let uids = add.map_or(&[][..], |(_, uids)| uids);
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
                return Err(Unfit::Rebuild);
            }
        }
        let mut fresh: Vec<u64> = match class {
            Some(class) => uids
                .iter()
                .map(|(uid, _)| {
                    let (bucket, fp) = Self::place(self.hash(uid.as_bytes()), q, r);
                    pack(bucket, fp, class)
                })
                .collect(),
            None => Vec::new(),
        };
        fresh.sort_unstable();
        fresh.dedup();
        let in_runs = kept > 0 && kept == self.n && q == self.q;
        let out = Writer::new(&self.path, self.key, q, r, slots, !in_runs)?;
        if in_runs && let Some(file) = &self.file {
            return self.merged_in_runs(file, out, fresh).map(Merged::Update);
        }
        let mut out = out;
        let mut next = fresh.iter().copied().peekable();
        if kept > 0 {
            let Some(file) = &self.file else {
                return Err(Unfit::Rebuild);
            };
            let shift = q - self.q;
            let (mut index, mut bucket, mut seen) = (0u32, 0usize, 0u64);
            read_region(file, ENTRIES_AT, self.n * ENTRY as u64, |chunk| {
                for entry in chunk.chunks_exact(ENTRY) {
                    while self.dir.get(bucket + 1).is_some_and(|&end| end <= index) {
                        bucket += 1;
                    }
                    index += 1;
                    let class = entry[2];
                    if drop[usize::from(class)] {
                        continue;
                    }
                    seen += 1;
                    let old = u16::from_le_bytes([entry[0], entry[1]]);
                    let (new_bucket, fp) = if shift == 0 {
                        (bucket, old)
                    } else {
                        (
                            (bucket << shift) | usize::from(old >> (16 - shift)),
                            (old << shift) & fp_mask(r),
                        )
                    };
                    let packed = pack(new_bucket, fp, class);
                    while let Some(f) = next.next_if(|&f| f >> 8 < packed >> 8) {
                        out.push(f)?;
                    }
                    out.push(packed)?;
                }
                Ok(())
            })?;
            if seen != kept {
                // The file is not what this locator wrote.
                return Err(Unfit::Rebuild);
            }
        }
        for f in next {
            out.push(f)?;
        }
        out.finish().map(Merged::New)
    }

    /// The common merge (every old entry kept, the directory's size
    /// unchanged): the old entries are read a group of whole buckets at a
    /// time and copied in runs between the new ones instead of one by one,
    /// and the directory, summaries and per-slot counts are the old ones
    /// plus the new entries'. At 10,000,000 UIDs a seal copies ~30 MB.
    fn merged_in_runs(
        &self,
        file: &File,
        mut out: Writer,
        fresh: Vec<u64>,
    ) -> Result<Update, Unfit> {
        let buckets = self.dir.len() - 1;
        for (count, slot) in out.per_slot.iter_mut().zip(&self.slots) {
            *count = slot.map_or(0, |s| s.entries);
        }
        for &f in &fresh {
            let (bucket, _, class) = unpack(f);
            if bucket >= buckets {
                return Err(Unfit::Rebuild);
            }
            out.per_slot[usize::from(class)] += 1;
        }
        out.n = self.n + fresh.len() as u64;
        let group_entries = u32::try_from(CHUNK / ENTRY).unwrap_or(u32::MAX);
        let mut buf = vec![0u8; CHUNK];
        let (mut b0, mut next) = (0usize, 0usize);
        while b0 < buckets {
            let start = self.dir[b0];
            // Whole buckets b0..b1 of about CHUNK bytes (one, if larger).
            let b1 = self
                .dir
                .partition_point(|&d| d <= start.saturating_add(group_entries))
                .saturating_sub(1)
                .max(b0 + 1)
                .min(buckets);
            let len = (self.dir[b1] - start) as usize * ENTRY;
            if buf.len() < len {
                buf.resize(len, 0);
            }
            let group = &mut buf[..len];
            file.read_exact_at(group, ENTRIES_AT + u64::from(start) * ENTRY as u64)?;
            let mut copied = 0usize;
            while let Some(&f) = fresh.get(next) {
                let (bucket, fp, class) = unpack(f);
                if bucket >= b1 {
                    break;
                }
                // After the bucket's entries with a fingerprint at most its own.
                let end = (self.dir[bucket + 1] - start) as usize * ENTRY;
                let mut at = ((self.dir[bucket] - start) as usize * ENTRY).max(copied);
                while at < end && u16::from_le_bytes([group[at], group[at + 1]]) <= fp {
                    at += ENTRY;
                }
                out.put(&group[copied..at])?;
                let [a, b] = fp.to_le_bytes();
                out.put(&[a, b, class])?;
                copied = at;
                next += 1;
            }
            out.put(&group[copied..])?;
            b0 = b1;
        }
        if next != fresh.len() {
            return Err(Unfit::Rebuild);
        }
        out.finish_update(&self.dir, fresh)
    }
}
