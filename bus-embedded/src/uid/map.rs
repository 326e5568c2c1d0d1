//! The UID → offset map behind dedup and `find_event_by_uid`.
//!
//! A lookup in a map of a million UIDs is bound by memory latency, not by
//! hashing: on this project's VM one dependent load from a 64 MiB region
//! takes ~150–200 ns (see `examples/memory_latency.rs`), against ~90 ns for
//! the whole `find_event_by_uid` call at a thousand UIDs. A
//! `HashMap<String, u64>` pays three such loads (the control bytes, the
//! bucket, the string on the heap). This map keeps UIDs
//! of up to [`INLINE`] bytes inside 32-byte slots of one open-addressing
//! table with linear probing, so a lookup reads one slot (and, rarely, its
//! neighbours on the same or the next cache line) and compares the UID
//! exactly: never a hash-only match. Longer UIDs go to an ordinary map.

use std::collections::HashMap;
use std::hash::BuildHasher;

/// UID bytes a slot holds inline.
pub(crate) const INLINE: usize = 23;

/// One slot: 32 bytes, aligned so a slot never straddles a cache line.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Slot {
    offset: u64,
    /// UID length; 0 marks an empty slot (UIDs stored inline are never empty).
    len: u8,
    bytes: [u8; INLINE],
}

const EMPTY: Slot = Slot {
    offset: 0,
    len: 0,
    bytes: [0; INLINE],
};

impl Slot {
    fn holds(&self, uid: &[u8]) -> bool {
        usize::from(self.len) == uid.len() && &self.bytes[..uid.len()] == uid
    }
}

/// UID → offset, first insertion wins.
#[derive(Default)]
pub(crate) struct UidMap {
    /// Power-of-two length (or empty).
    slots: Vec<Slot>,
    /// Occupied slots.
    len: usize,
    /// UIDs that do not fit a slot (longer than [`INLINE`], or empty).
    spill: HashMap<Box<[u8]>, u64>,
    /// Random keys of this map's hash: UIDs are chosen by callers, and
    /// with a known hash a caller could pick UIDs that all collide and make
    /// every publish probe the whole table (HashDoS).
    keys: std::hash::RandomState,
}

impl std::fmt::Debug for UidMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UidMap")
            .field("len", &self.len())
            .field("slots", &self.slots.len())
            .finish_non_exhaustive()
    }
}

fn inline(uid: &[u8]) -> bool {
    !uid.is_empty() && uid.len() <= INLINE
}

/// The keyed hash (SipHash with `keys`), then a multiply-xorshift finish
/// so that the top bits, which pick the slot, depend on every byte.
fn hash(keys: &std::hash::RandomState, uid: &[u8]) -> u64 {
    let mut h = keys.hash_one(uid);
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h
}

impl UidMap {
    /// Number of UIDs held.
    pub fn len(&self) -> usize {
        self.len + self.spill.len()
    }

    /// The home slot of `uid` in a table of `slots` (a power of two).
    fn home(keys: &std::hash::RandomState, uid: &[u8], slots: usize) -> usize {
        let bits = slots.trailing_zeros();
        if bits == 0 {
            return 0;
        }
        usize::try_from(hash(keys, uid) >> (64 - bits)).unwrap_or(0)
    }

    /// The slot holding `uid`, or the empty slot where it would go.
    fn find(&self, uid: &[u8]) -> usize {
        let mask = self.slots.len() - 1;
        let mut at = Self::home(&self.keys, uid, self.slots.len());
        loop {
            let slot = &self.slots[at];
            if slot.len == 0 || slot.holds(uid) {
                return at;
            }
            at = (at + 1) & mask;
        }
    }

    /// The offset stored for `uid`.
    pub fn get(&self, uid: &[u8]) -> Option<u64> {
        if !inline(uid) {
            return self.spill.get(uid).copied();
        }
        if self.slots.is_empty() {
            return None;
        }
        let slot = &self.slots[self.find(uid)];
        (slot.len != 0).then_some(slot.offset)
    }

    /// Stores `uid` at `offset` unless it is stored already; returns the
    /// offset it had then.
    pub fn insert_first(&mut self, uid: &[u8], offset: u64) -> Option<u64> {
        if !inline(uid) {
            return match self.spill.get(uid) {
                Some(&old) => Some(old),
                None => {
                    self.spill.insert(uid.into(), offset);
                    None
                }
            };
        }
        self.reserve(1);
        let at = self.find(uid);
        let slot = &mut self.slots[at];
        if slot.len != 0 {
            return Some(slot.offset);
        }
        slot.offset = offset;
        slot.len = u8::try_from(uid.len()).unwrap_or(0);
        slot.bytes[..uid.len()].copy_from_slice(uid);
        self.len += 1;
        None
    }

    /// Every `(uid, offset)` held, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], u64)> + '_ {
        self.slots
            .iter()
            .filter(|slot| slot.len != 0)
            .map(|slot| (&slot.bytes[..usize::from(slot.len)], slot.offset))
            .chain(self.spill.iter().map(|(uid, &offset)| (&uid[..], offset)))
    }

    /// Empties the map, keeping its table's memory.
    pub fn clear(&mut self) {
        self.slots.fill(EMPTY);
        self.len = 0;
        self.spill = HashMap::new();
    }

    /// Makes room for `additional` more UIDs without regrowing (load at
    /// most 3/4, where linear probing still reads a slot or two).
    pub fn reserve(&mut self, additional: usize) {
        let needed = (self.len + additional).saturating_mul(4) / 3 + 1;
        if needed <= self.slots.len() {
            return;
        }
        let size = needed.next_power_of_two().max(16);
        let old = std::mem::replace(&mut self.slots, vec![EMPTY; size]);
        let mask = size - 1;
        for slot in old.into_iter().filter(|slot| slot.len != 0) {
            let uid = &slot.bytes[..usize::from(slot.len)];
            let mut at = Self::home(&self.keys, uid, size);
            while self.slots[at].len != 0 {
                at = (at + 1) & mask;
            }
            self.slots[at] = slot;
        }
    }

    /// Keeps only the UIDs for which `keep(uid, &mut offset)` is true (it
    /// may change the offset). Rebuilds the table.
    pub fn retain(&mut self, mut keep: impl FnMut(&[u8], &mut u64) -> bool) {
        self.spill.retain(|uid, offset| keep(uid, offset));
        let old = std::mem::take(&mut self.slots);
        let count = self.len;
        self.len = 0;
        let mut kept = Vec::with_capacity(count);
        for mut slot in old.into_iter().filter(|slot| slot.len != 0) {
            let len = usize::from(slot.len);
            if keep(&slot.bytes[..len], &mut slot.offset) {
                kept.push(slot);
            }
        }
        self.reserve(kept.len());
        for slot in kept {
            let uid = &slot.bytes[..usize::from(slot.len)];
            let at = self.find(uid);
            self.slots[at] = slot;
            self.len += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]
    use super::*;

    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            self.0 >> 33
        }
    }

    /// UIDs of every length from 0 to well past the inline limit.
    fn uid(rng: &mut Lcg) -> Vec<u8> {
        let len = (rng.next() % 40) as usize;
        (0..len).map(|_| b'a' + (rng.next() % 4) as u8).collect()
    }

    #[test]
    fn behaves_like_a_hash_map() {
        let mut rng = Lcg(7);
        let mut ours = UidMap::default();
        let mut model: HashMap<Vec<u8>, u64> = HashMap::new();
        for offset in 0..20_000u64 {
            let uid = uid(&mut rng);
            let expected = model.get(&uid).copied();
            assert_eq!(ours.insert_first(&uid, offset), expected, "{uid:?}");
            model.entry(uid).or_insert(offset);
            let probe = self::uid(&mut rng);
            assert_eq!(ours.get(&probe), model.get(&probe).copied(), "{probe:?}");
        }
        assert_eq!(ours.len(), model.len());
        for (uid, offset) in &model {
            assert_eq!(ours.get(uid), Some(*offset));
        }
        // Retain with offset changes, then the same again.
        let keep = |uid: &[u8], offset: &mut u64| {
            if offset.is_multiple_of(3) {
                return false;
            }
            if uid.len().is_multiple_of(2) {
                *offset += 1_000_000;
            }
            true
        };
        ours.retain(keep);
        model.retain(|uid, offset| keep(uid, offset));
        assert_eq!(ours.len(), model.len());
        for (uid, offset) in &model {
            assert_eq!(ours.get(uid), Some(*offset));
        }
        for _ in 0..5_000 {
            let probe = uid(&mut rng);
            assert_eq!(ours.get(&probe), model.get(&probe).copied(), "{probe:?}");
        }
    }

    #[test]
    fn uids_differing_only_in_length_or_last_byte_stay_apart() {
        let mut map = UidMap::default();
        let long = [b'x'; INLINE];
        assert_eq!(map.insert_first(&long[..INLINE - 1], 1), None);
        assert_eq!(map.insert_first(&long, 2), None);
        assert_eq!(map.insert_first(&[b'x'; INLINE + 1], 3), None);
        assert_eq!(map.insert_first(b"", 4), None);
        let mut other = long;
        other[INLINE - 1] = b'y';
        assert_eq!(map.get(&other), None);
        assert_eq!(map.get(&long[..INLINE - 1]), Some(1));
        assert_eq!(map.get(&long), Some(2));
        assert_eq!(map.get(&[b'x'; INLINE + 1]), Some(3));
        assert_eq!(map.get(b""), Some(4));
        assert_eq!(map.insert_first(&long, 9), Some(2), "first insertion wins");
        assert_eq!(map.get(&long), Some(2));
        assert_eq!(map.len(), 4);
    }

    #[test]
    fn growth_keeps_every_entry() {
        let mut map = UidMap::default();
        for i in 0..100_000u64 {
            assert_eq!(map.insert_first(format!("e{i}").as_bytes(), i), None);
        }
        assert!(map.slots.len() * 3 >= map.len * 4, "load above 3/4");
        for i in 0..100_000u64 {
            assert_eq!(map.get(format!("e{i}").as_bytes()), Some(i));
        }
        assert_eq!(map.get(b"e100000"), None);
    }

    #[test]
    fn a_slot_is_half_a_cache_line() {
        assert_eq!(std::mem::size_of::<Slot>(), 32);
        assert_eq!(std::mem::align_of::<Slot>(), 32);
    }
}
