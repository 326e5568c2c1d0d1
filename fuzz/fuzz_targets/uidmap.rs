//! The dedup tables against a `HashMap` model: `UidMap` (UID → first
//! offset, open addressing with inline UIDs) and `UidIndex` (UID → every
//! retained offset) under arbitrary inserts, lookups, growth and retention.
#![no_main]

use std::collections::HashMap;

use arbitrary::Arbitrary;
use bus_embedded::fuzzing::{FuzzUidIndex, FuzzUidMap};
use libfuzzer_sys::fuzz_target;

/// UIDs from a small alphabet, so collisions and repeats are common; the
/// length crosses the inline limit (23 bytes).
#[derive(Debug, Arbitrary)]
struct Uid {
    len: u8,
    seed: u16,
}

impl Uid {
    fn bytes(&self) -> Vec<u8> {
        let len = usize::from(self.len % 40);
        (0..len)
            .map(|i| b"ab"[usize::from(self.seed >> (i % 16)) & 1])
            .collect()
    }
}

#[derive(Debug, Arbitrary)]
enum MapOp {
    Insert(Uid, u64),
    Get(Uid),
    Reserve(u16),
    /// Drops offsets divisible by `modulus`, bumps the others by `bump`.
    Retain {
        modulus: u8,
        bump: u8,
    },
}

#[derive(Debug, Arbitrary)]
enum IndexOp {
    /// Records the UID at the next offset (`step` past the last one).
    Push(Uid, u8),
    Lookup(Uid),
    RetainFrom(u16),
}

#[derive(Debug, Arbitrary)]
struct Input {
    map: Vec<MapOp>,
    index: Vec<IndexOp>,
}

fn utf8(uid: &Uid) -> String {
    String::from_utf8(uid.bytes()).expect("ascii")
}

fuzz_target!(|input: Input| {
    let mut map = FuzzUidMap::default();
    let mut model: HashMap<Vec<u8>, u64> = HashMap::new();
    for op in &input.map {
        match op {
            MapOp::Insert(uid, offset) => {
                let uid = uid.bytes();
                assert_eq!(map.insert_first(&uid, *offset), model.get(&uid).copied());
                model.entry(uid).or_insert(*offset);
            }
            MapOp::Get(uid) => {
                let uid = uid.bytes();
                assert_eq!(map.get(&uid), model.get(&uid).copied());
            }
            MapOp::Reserve(n) => map.reserve(usize::from(*n)),
            MapOp::Retain { modulus, bump } => {
                let modulus = u64::from(*modulus).max(1);
                let keep = |_: &[u8], offset: &mut u64| {
                    if offset.is_multiple_of(modulus) {
                        return false;
                    }
                    *offset = offset.wrapping_add(u64::from(*bump));
                    true
                };
                map.retain(keep);
                model.retain(|uid, offset| keep(uid, offset));
            }
        }
        assert_eq!(map.len(), model.len());
    }
    for (uid, offset) in &model {
        assert_eq!(map.get(uid), Some(*offset));
    }

    let mut index = FuzzUidIndex::default();
    let mut all: HashMap<String, Vec<u64>> = HashMap::new();
    let mut next = 0u64;
    let mut start = 0u64;
    for op in &input.index {
        match op {
            IndexOp::Push(uid, step) => {
                // Offsets grow, and retention never passes a later record.
                next = (next + u64::from(*step)).max(start);
                let uid = utf8(uid);
                index.push(uid.clone(), next);
                let offsets = all.entry(uid).or_default();
                if !offsets.contains(&next) {
                    offsets.push(next);
                }
            }
            IndexOp::Lookup(uid) => {
                let uid = utf8(uid);
                let expected = all.get(&uid).cloned().unwrap_or_default();
                assert_eq!(index.all(&uid), expected);
                assert_eq!(index.first(&uid), expected.first().copied());
            }
            IndexOp::RetainFrom(delta) => {
                // Retention only moves forward, and never past the end.
                start = (start + u64::from(*delta)).min(next + 1);
                index.retain_from(start);
                for offsets in all.values_mut() {
                    offsets.retain(|&o| o >= start);
                }
                all.retain(|_, offsets| !offsets.is_empty());
            }
        }
    }
    for (uid, offsets) in &all {
        assert_eq!(&index.all(uid), offsets);
    }
});
