//! Which offsets of a partition are acknowledged: everything below a
//! frontier, plus ranges above it acknowledged out of order.

use std::collections::BTreeMap;

/// The acknowledged offsets of one partition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Acked {
    /// Every offset below it is acknowledged.
    next: u64,
    /// Disjoint, non-adjacent ranges `start -> end` (end exclusive), all
    /// above `next`.
    above: BTreeMap<u64, u64>,
}

impl Acked {
    pub(crate) fn new(next: u64, ranges: &[(u64, u64)]) -> Self {
        let mut acked = Self {
            next,
            above: BTreeMap::new(),
        };
        for &(start, end) in ranges {
            acked.insert(start, end);
        }
        acked
    }

    /// The first offset not acknowledged.
    pub(crate) fn next(&self) -> u64 {
        self.next
    }

    /// The ranges above the frontier, for the stored cursor.
    pub(crate) fn ranges(&self) -> Vec<(u64, u64)> {
        self.above.iter().map(|(&s, &e)| (s, e)).collect()
    }

    /// How many offsets above the frontier are acknowledged.
    pub(crate) fn count_above(&self) -> u64 {
        self.above.iter().map(|(s, e)| e - s).sum()
    }

    pub(crate) fn contains(&self, offset: u64) -> bool {
        offset < self.next
            || self
                .above
                .range(..=offset)
                .next_back()
                .is_some_and(|(_, &end)| offset < end)
    }

    /// Marks `[start, end)` acknowledged, merging ranges and moving the
    /// frontier over any that now touch it.
    pub(crate) fn insert(&mut self, start: u64, end: u64) {
        let mut start = start.max(self.next);
        let mut end = end;
        if start >= end {
            return;
        }
        // Absorb every range that overlaps or touches [start, end).
        let touching: Vec<u64> = self
            .above
            .range(..=end)
            .filter(|&(_, &e)| e >= start)
            .map(|(&s, _)| s)
            .collect();
        for s in touching {
            if let Some(e) = self.above.remove(&s) {
                start = start.min(s);
                end = end.max(e);
            }
        }
        if start <= self.next {
            self.next = self.next.max(end);
        } else {
            self.above.insert(start, end);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_order_acks_close_the_gap_and_move_the_frontier() {
        let mut acked = Acked::new(5, &[]);
        acked.insert(7, 8);
        acked.insert(9, 10);
        assert_eq!(acked.next(), 5);
        assert_eq!(acked.ranges(), vec![(7, 8), (9, 10)]);
        assert!(acked.contains(7) && !acked.contains(8) && acked.contains(4));
        acked.insert(8, 9);
        assert_eq!(acked.ranges(), vec![(7, 10)]);
        assert_eq!(acked.count_above(), 3);
        acked.insert(5, 7);
        assert_eq!(acked.next(), 10);
        assert!(acked.ranges().is_empty());
        // Below the frontier: nothing changes (a second ack is harmless).
        acked.insert(2, 3);
        assert_eq!((acked.next(), acked.count_above()), (10, 0));
    }
}
