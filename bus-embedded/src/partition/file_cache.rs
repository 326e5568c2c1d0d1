//! The open files of a partition's recently read sealed segments.

use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Sealed segments' files kept open after a read: opening the file cost
/// more than the read itself in `fetch(random, 1)` (a path walk and a
/// descriptor per call, ~2 µs here). Each partition keeps up to
/// [`FileCache::CAP`]; more while the bus holds fewer than
/// [`FileCache::BUS_BUDGET`] such extra descriptors in all (the least
/// recently read is closed first). At 3,000,000 records (24 segments),
/// keeping 64 instead of 8 took `fetch(random, 1)` from 7.5-7.7 µs to
/// 5.1-5.6 µs in alternating runs.
#[derive(Debug, Default)]
pub(crate) struct FileCache {
    /// `(segment base, file, last use)`.
    files: Vec<(u64, Arc<File>, u64)>,
    clock: u64,
    /// The bus's count of descriptors held beyond each partition's `CAP`.
    budget: Arc<AtomicUsize>,
}

impl FileCache {
    /// Descriptors a partition keeps for its sealed segments in any case.
    pub const CAP: usize = 8;
    /// Descriptors the bus keeps beyond that, over all partitions.
    pub const BUS_BUDGET: usize = 512;

    pub fn new(budget: Arc<AtomicUsize>) -> Self {
        Self {
            files: Vec::new(),
            clock: 0,
            budget,
        }
    }

    /// The cached file of the segment at `base`.
    pub fn get(&mut self, base: u64) -> Option<Arc<File>> {
        self.clock += 1;
        let clock = self.clock;
        self.files
            .iter_mut()
            .find(|(b, _, _)| *b == base)
            .map(|(_, file, used)| {
                *used = clock;
                Arc::clone(file)
            })
    }

    /// Keeps `file` for the segment at `base`, closing the least recently
    /// used one when the partition and the bus have no room.
    pub fn put(&mut self, base: u64, file: Arc<File>) {
        self.clock += 1;
        if let Some(entry) = self.files.iter_mut().find(|(b, _, _)| *b == base) {
            *entry = (base, file, self.clock);
            return;
        }
        let room = self.files.len() < Self::CAP
            || self
                .budget
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                    (held < Self::BUS_BUDGET).then_some(held + 1)
                })
                .is_ok();
        if !room && let Some(oldest) = (0..self.files.len()).min_by_key(|&i| self.files[i].2) {
            self.files.swap_remove(oldest);
        }
        self.files.push((base, file, self.clock));
    }

    /// Closes the files of segments below `start` (deleted by retention).
    pub fn retain_from(&mut self, start: u64) {
        let before = self.files.len();
        self.files.retain(|(base, _, _)| *base >= start);
        self.release(before);
    }

    /// Gives back the budget of the files beyond `CAP` of the `before` held.
    fn release(&self, before: usize) {
        let extra = |n: usize| n.saturating_sub(Self::CAP);
        let freed = extra(before) - extra(self.files.len());
        if freed > 0 {
            self.budget.fetch_sub(freed, Ordering::AcqRel);
        }
    }
}

impl Drop for FileCache {
    fn drop(&mut self) {
        let before = self.files.len();
        self.files.clear();
        self.release(before);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn cached_files_beyond_a_partitions_share_come_from_the_bus_budget() {
        let budget = Arc::new(AtomicUsize::new(0));
        let file = || Arc::new(File::open("/dev/null").unwrap());
        let held = |cache: &FileCache| cache.files.len();
        let mut a = FileCache::new(Arc::clone(&budget));
        for base in 0..(FileCache::CAP + 5) as u64 {
            a.put(base, file());
        }
        assert_eq!(
            (held(&a), budget.load(Ordering::Relaxed)),
            (FileCache::CAP + 5, 5)
        );
        // Another partition takes the rest of the budget, then recycles.
        let mut b = FileCache::new(Arc::clone(&budget));
        for base in 0..(FileCache::CAP + FileCache::BUS_BUDGET + 10) as u64 {
            b.put(base, file());
        }
        assert_eq!(budget.load(Ordering::Relaxed), FileCache::BUS_BUDGET);
        assert_eq!(held(&b), FileCache::CAP + FileCache::BUS_BUDGET - 5);
        assert!(
            b.get(FileCache::BUS_BUDGET as u64 + 17).is_some(),
            "newest kept"
        );
        assert!(b.get(0).is_none(), "oldest closed");
        // Retention and drop give it back.
        b.retain_from(u64::MAX);
        assert_eq!((held(&b), budget.load(Ordering::Relaxed)), (0, 5));
        drop(a);
        assert_eq!(budget.load(Ordering::Relaxed), 0);
    }
}
