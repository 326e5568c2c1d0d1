//! The one partitioner every backend uses (contract C3).

/// 64-bit FNV-1a of `bytes`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    use std::hash::Hasher;
    let mut hasher = fnv::FnvHasher::default();
    hasher.write(bytes);
    hasher.finish()
}

/// Stable partition assignment: FNV-1a of the key modulo partition count.
/// Deterministic across processes and platforms so replay tooling and the
/// broker always agree (a hash mismatch would silently split an agent's
/// ordered stream). A count of 0 is treated as 1.
pub fn partition_for(key: &str, partitions: u32) -> u32 {
    let h = fnv1a64(key.as_bytes());
    // The remainder is below `partitions`, which fits in u32.
    #[allow(clippy::cast_possible_truncation)]
    let partition = (h % u64::from(partitions.max(1))) as u32;
    partition
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_matches_published_vectors() {
        // Vectors from the FNV reference (isthe.com/chongo/tech/comp/fnv).
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn partition_is_hash_mod_count() {
        assert_eq!(
            partition_for("a", 8),
            (0xaf63_dc4c_8601_ec8c_u64 % 8) as u32
        );
        assert_eq!(
            partition_for("foobar", 7),
            (0x8594_4171_f739_67e8_u64 % 7) as u32
        );
        assert_eq!(
            partition_for("", 1024),
            (0xcbf2_9ce4_8422_2325_u64 % 1024) as u32
        );
    }

    #[test]
    fn zero_partitions_clamped() {
        assert_eq!(partition_for("x", 0), 0);
        assert_eq!(partition_for("x", 1), 0);
    }

    #[test]
    fn keys_spread_over_partitions() {
        let spread: std::collections::HashSet<u32> = (0..100)
            .map(|i| partition_for(&format!("inst-{i}"), 8))
            .collect();
        assert!(spread.len() >= 6, "poor partition spread: {spread:?}");
    }
}
