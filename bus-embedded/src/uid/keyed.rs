//! SipHash under a random key: the hash of every on-disk and in-memory
//! table whose keys are UIDs, which callers choose. With a known hash they
//! could pick UIDs that all land in one page or bucket (HashDoS); with a
//! key drawn per table they cannot.

use std::hash::Hasher as _;

/// A 128-bit SipHash key, stored in the header of the table it places.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Key(pub u64, pub u64);

impl Key {
    /// A fresh random key (std's hasher keys are drawn from the OS).
    pub fn random() -> Self {
        use std::hash::BuildHasher as _;
        let a = std::hash::RandomState::new().hash_one(0x5bd1_e995_u64);
        let b = std::hash::RandomState::new().hash_one(0x9e37_79b9_u64);
        Self(a, b)
    }

    /// SipHash-2-4 of `bytes` under this key.
    pub fn hash(self, bytes: &[u8]) -> u64 {
        #[allow(deprecated)] // SipHash-2-4 with explicit keys; std keeps it.
        let mut hasher = std::hash::SipHasher::new_with_keys(self.0, self.1);
        hasher.write(bytes);
        hasher.finish()
    }
}

/// Never printed: whoever reads the key can aim UIDs at one page again.
impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::Key;

    #[test]
    fn keys_differ_and_change_the_hash() {
        let (a, b) = (Key::random(), Key::random());
        assert_ne!(a, b);
        assert_ne!(a.hash(b"uid-1"), b.hash(b"uid-1"));
        assert_eq!(a.hash(b"uid-1"), a.hash(b"uid-1"));
        assert_eq!(format!("{a:?}"), "Key(..)");
    }
}
