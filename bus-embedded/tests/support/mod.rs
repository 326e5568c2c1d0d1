//! Helpers shared by the crash and recovery tests.
#![allow(dead_code, clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::path::{Path, PathBuf};

use bus_core::{BusError, EventBus, Manifest, StoredEvent, TopicSpec};
use bus_embedded::EmbeddedBus;
use serde_json::{Value, json};

pub const TOPIC: &str = "crash";

/// Provisions [`TOPIC`] with `partitions`.
pub fn provision(bus: &dyn EventBus, partitions: u32) {
    bus.provision(&Manifest::new([TopicSpec::new(TOPIC, partitions)]))
        .unwrap();
}

/// The value published for `uid`, so a reader can check it byte for byte.
pub fn value_for(uid: &str, i: usize) -> Value {
    json!({ "uid": uid, "i": i, "pad": "x".repeat(i % 40), "n": -1.5e300 })
}

/// Every record of a partition, or the first error.
pub fn read_all(bus: &dyn EventBus, partition: u32) -> Result<Vec<StoredEvent>, BusError> {
    let mut out: Vec<StoredEvent> = Vec::new();
    loop {
        let from = out.last().map_or(0, |e| e.offset + 1);
        let page = bus.fetch(TOPIC, partition, from, 64)?;
        if page.is_empty() {
            return Ok(out);
        }
        out.extend(page);
    }
}

/// Asserts offsets run 0, 1, 2, ... without holes.
pub fn assert_gap_free(events: &[StoredEvent]) {
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event.offset, i as u64, "offset hole or repeat");
    }
}

/// The segment files (`.log`) of a partition, ascending.
pub fn segments(dir: &Path, partition: u32) -> Vec<PathBuf> {
    let pdir = bus_embedded::testing::partition_dir(dir, TOPIC, partition);
    let mut logs: Vec<PathBuf> = std::fs::read_dir(pdir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    logs
}

/// Byte positions of the frames of a segment file.
pub fn frame_starts(bytes: &[u8]) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut at = 0;
    while at + 8 <= bytes.len() {
        starts.push(at);
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        at += 8 + len;
    }
    starts
}

/// The recovery point of partition `partition` of [`TOPIC`]: how far the
/// log was known complete. Putting back an older copy after a session
/// stands for that session having been killed before it closed.
pub fn recovery_point(dir: &Path, partition: u32) -> PathBuf {
    bus_embedded::testing::recovery_point_path(dir, TOPIC, partition)
}

/// Copies the tree `from` into `to`. A copy of an open bus's directory is
/// the state `kill -9` would leave: what it wrote is in the page cache.
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Opens `dir` with default options.
pub fn open(dir: &Path) -> EmbeddedBus {
    EmbeddedBus::open(dir).unwrap_or_else(|e| panic!("open {}: {e}", dir.display()))
}

/// A small deterministic PRNG (xorshift64*), seeded by the clock unless
/// `BUS_TEST_SEED` is set; the seed is printed so a failure can be replayed.
pub struct Rng(u64);

impl Rng {
    pub fn new() -> Self {
        let seed = std::env::var("BUS_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos();
                (nanos as u64) | 1
            });
        eprintln!("BUS_TEST_SEED={seed}");
        Self(seed)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}
