//! The in-memory UID index of a partition's active segment (and of
//! segments whose table is held in memory): UID → offsets, for dedup and
//! `find_event_by_uid` (contracts C6, C7).

use std::collections::HashMap;

use crate::uid::map::UidMap;

/// UID → offsets of the retained records carrying it, in log order. Dedup
/// stores a UID once, so almost every UID has one record, in `first` (a
/// table built for lookups in memory-latency terms, see [`UidMap`]); the
/// others (written around the bus, or stored again because the first copy
/// does not authenticate) keep their later offsets in `more`, so a reopen
/// can still find the authentic copy whichever came first.
#[derive(Debug, Default)]
pub(crate) struct UidIndex {
    first: UidMap,
    /// std's keyed hash: UIDs are chosen by callers (no HashDoS).
    more: HashMap<String, Vec<u64>>,
}

impl UidIndex {
    /// Records that `uid` is (also) stored at `offset`, which follows
    /// every offset already recorded for it.
    pub fn push(&mut self, uid: String, offset: u64) {
        match self.first.insert_first(uid.as_bytes(), offset) {
            Some(first) if first != offset => {
                let rest = self.more.entry(uid).or_default();
                if !rest.contains(&offset) {
                    rest.push(offset);
                }
            }
            Some(_) | None => {}
        }
    }

    /// The oldest retained offset of `uid`.
    pub fn first(&self, uid: &str) -> Option<u64> {
        self.first.get(uid.as_bytes())
    }

    /// Every retained offset of `uid`, oldest first.
    pub fn all(&self, uid: &str) -> Vec<u64> {
        let mut all: Vec<u64> = self.first(uid).into_iter().collect();
        all.extend(self.more.get(uid).into_iter().flatten());
        all
    }

    /// An empty index with room for `uids` UIDs without regrowing.
    pub fn with_capacity(uids: usize) -> Self {
        let mut out = Self::default();
        out.first.reserve(uids);
        out
    }

    /// Empties it, keeping the table's memory.
    pub fn clear(&mut self) {
        self.first.clear();
        self.more = HashMap::new();
    }

    /// Every `(uid, offset)` held, by offset: the active segment's UIDs
    /// when it is sealed or closed (so the writer keeps no second list).
    pub fn entries(&self) -> Vec<(String, u64)> {
        let more: usize = self.more.values().map(Vec::len).sum();
        let mut out = Vec::with_capacity(self.first.len() + more);
        for (uid, offset) in self.first.iter() {
            // Stored UIDs come from strings, so they are UTF-8.
            if let Ok(uid) = std::str::from_utf8(uid) {
                out.push((uid.to_owned(), offset));
            }
        }
        for (uid, rest) in &self.more {
            out.extend(rest.iter().map(|&offset| (uid.clone(), offset)));
        }
        out.sort_unstable_by_key(|&(_, offset)| offset);
        out
    }

    /// Forgets the offsets below `start` (deleted by retention).
    pub fn retain_from(&mut self, start: u64) {
        let Self { first, more } = self;
        more.retain(|_, rest| {
            rest.retain(|&offset| offset >= start);
            !rest.is_empty()
        });
        first.retain(|uid, offset| {
            if *offset >= start {
                return true;
            }
            // Stored UIDs come from strings, so they are UTF-8.
            let Some(uid) = std::str::from_utf8(uid).ok() else {
                return false;
            };
            let Some(rest) = more.get_mut(uid) else {
                return false;
            };
            *offset = rest.remove(0);
            if rest.is_empty() {
                more.remove(uid);
            }
            true
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn uid_index_keeps_later_copies() {
        let mut uids = UidIndex::default();
        uids.push("a".to_owned(), 1);
        uids.push("a".to_owned(), 4);
        uids.push("a".to_owned(), 4);
        uids.push("b".to_owned(), 2);
        assert_eq!(uids.all("a"), vec![1, 4]);
        assert_eq!(uids.first("b"), Some(2));
        uids.retain_from(3);
        assert_eq!(uids.all("a"), vec![4]);
        assert_eq!(uids.first("b"), None);
        uids.retain_from(5);
        assert!(uids.all("a").is_empty());
    }
}
