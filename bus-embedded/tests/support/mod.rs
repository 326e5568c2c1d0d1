//! Helpers shared by the crash and recovery tests, and the conformance
//! suite's harness (`harness`).
#![allow(dead_code, clippy::unwrap_used, clippy::cast_possible_truncation)]

pub mod harness;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

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

/// Header bytes of a table (format "BUT2").
pub const TABLE_HEADER: u64 = 88;

pub fn word(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

/// What a table says, checked against its CRCs, apart from its key and the
/// page layout the key picks: magic, page size, base, end, log length and
/// count, and its `(UID, offset)` entries sorted.
pub fn table_contents(bytes: &[u8]) -> (Vec<u8>, Vec<(Vec<u8>, u64)>) {
    assert_eq!(
        crc32c(&bytes[..84]).to_le_bytes(),
        bytes[84..88],
        "header CRC"
    );
    let page_size = u32::from_le_bytes(bytes[4..8].try_into().unwrap()) as usize;
    let (pages, blocks) = (word(bytes, 40) as usize, word(bytes, 48) as usize);
    let first = TABLE_HEADER as usize + blocks * 64;
    assert_eq!(bytes.len(), first + pages * page_size, "table length");
    let mut entries = Vec::new();
    for page in bytes[first..].chunks(page_size) {
        assert_eq!(crc32c(&page[4..]).to_le_bytes(), page[..4], "page CRC");
        let mut at = 8;
        for _ in 0..u16::from_le_bytes([page[5], page[6]]) {
            let len = usize::from(u16::from_le_bytes([page[at], page[at + 1]]));
            entries.push((
                page[at + 2..at + 2 + len].to_vec(),
                word(page, at + 2 + len),
            ));
            at += len + 10;
        }
    }
    entries.sort();
    assert_eq!(entries.len() as u64, word(bytes, 32), "count");
    (bytes[..40].to_vec(), entries)
}

/// CRC-32C (Castagnoli), bitwise: independent of the crate the code uses.
pub fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Everything a `fmt` subscriber writes, kept for the test to read.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs `work` with a subscriber on this thread and returns what it
/// logged at INFO and above.
pub fn captured(work: impl FnOnce()) -> String {
    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    tracing::subscriber::with_default(subscriber, work);
    out.text()
}

/// Every event at DEBUG and above of this test process, from a global
/// subscriber set on first use. For events that other tests running at
/// the same time also cause: a scoped subscriber (`captured`) can miss an
/// event whose callsite another thread registers meanwhile, a global one
/// cannot. Callers pick their own lines (e.g. by their temporary
/// directory, which the embedded log's events name).
pub fn global_log() -> &'static Captured {
    static LOG: std::sync::OnceLock<Captured> = std::sync::OnceLock::new();
    LOG.get_or_init(|| {
        let out = Captured::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::DEBUG)
            .finish();
        tracing::subscriber::set_global_default(subscriber)
            .expect("no other global subscriber in this test process");
        out
    })
}
