//! The partition's UID locator: which sealed segments may hold a UID, in
//! one lookup, however many segments the partition has (issue 15).
//!
//! Each sealed segment's UIDs are in its own on-disk table (`uid::table`).
//! Asking every segment's filter in turn cost one cache miss per segment
//! per lookup (78 per partition at 10,000,000 records), on every dedup
//! check of a batch too. The locator is one structure for the partition:
//! per UID of a covered segment, a 16-bit fingerprint of its keyed hash and
//! the segment's slot (8 bits), sorted by hash, behind a directory of
//! buckets (the top `q` bits of the hash). A lookup reads one directory
//! entry and a bucket of about 8–16 entries and names the candidate
//! segments, usually none or one; the caller then reads one page of each
//! candidate's table. It never misses a UID of a covered segment; a false
//! candidate costs one page read that finds nothing (about 1 in
//! `2^(q + fingerprint bits) / UIDs`, under 1%).
//!
//! Memory holds only the directory (4 bytes per bucket), a 64-bit summary
//! per bucket (two bits per fingerprint) and a 32-bit check per bucket
//! (together about 1.3 bytes per UID)
//! and the slots: the entries (3 bytes per UID, ~30 MB at 10,000,000 UIDs)
//! stay in the file, and a lookup reads its bucket with one `pread`
//! (through the page cache: file pages, not anonymous memory), unless the
//! summary shows the fingerprint is not there (about 9 in 10 lookups of a
//! new UID, so a batch's dedup checks mostly read nothing).
//!
//! Covering a newly sealed segment writes a new file, merging the old
//! file's entries (read in order; copied in runs between the new ones
//! when none is dropped) with the segment's, and renames it over the old
//! one, so memory never holds the entries; lookups go on with the old
//! file meanwhile (asking the new segment through its filter). Then the
//! directory and summaries are changed in place (lookups wait for that
//! pass, a few ms at 10,000,000 UIDs), so memory never holds two copies
//! of them either; only when the directory grows or segments go is a new
//! locator made.
//!
//! At most [`SLOTS`] segments are covered (the newest, as segments are
//! sealed); older ones, and any sealed while the locator was being loaded,
//! are asked through their own filters as before.
//!
//! The hash is SipHash with a random key drawn when the locator is built
//! and kept in its file's header: UIDs are chosen by callers, and with a
//! known hash they could be picked to fill one bucket (HashDoS).
//!
//! Persisted as `uid-locator` in the partition's directory, a hint like
//! the other index files: rewritten (not synced) whenever it changes, synced
//! at a clean close, checked against its CRCs and against the sealed
//! segments on load (the first lookup after an open), and rebuilt from the
//! segments' tables when missing, damaged, stale or of an older format
//! (`BUL1` kept the entries in memory). Segments sealed after it was
//! written are added from their tables. A bucket read on a lookup is
//! checked against memory: a sum of a bijection of each entry (4 bytes per
//! bucket, so changing any one entry always shows), the bucket's summary,
//! and its order. A bucket that fails (the file damaged under the running
//! bus) is not answered from: the lookup asks every sealed segment's
//! filter, and the next open finds the file's CRC wrong and rebuilds it.
//!
//! ```text
//! header  48 bytes: "BUL2", q u32, fingerprint bits u32, slots u32,
//!         key (2 × u64), entries u64, zero u32, header CRC u32
//! entries entries × 3 bytes: fingerprint u16 (left-aligned, its top bits
//!         count), slot u8; sorted by (bucket, fingerprint)
//! dir     (2^q + 1) × u32: where each bucket's entries start
//! slots   slots × 32 bytes: base, end, byte length, entries (u64 each;
//!         all ones: a free slot)
//! crc     u32 of everything after the header
//! ```

use std::fs::File;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use bus_core::backend::sync::{read, write};

use crate::uid::keyed::Key;

mod file;
mod merge;
mod writer;

/// Segments a locator covers at most (a slot is one byte per entry).
pub(crate) const SLOTS: usize = 256;
/// The file's name in the partition's directory.
pub(crate) const FILE: &str = "uid-locator";
const MAGIC: &[u8; 4] = b"BUL2";
const HEADER: usize = 48;
const SLOT_BYTES: usize = 32;
/// Bytes of one entry: fingerprint and slot.
const ENTRY: usize = 3;
/// Where the entries start in the file.
const ENTRIES_AT: u64 = HEADER as u64;
/// Bytes read or written at once when a whole file is streamed (a
/// multiple of an entry's and a directory word's size).
const CHUNK: usize = 3 * 4 * 4096;
/// Fingerprint bits after a build; each doubling of the directory takes
/// one (its bit becomes a bucket bit), down to [`MIN_FP_BITS`].
const FP_BITS: u32 = 16;
const MIN_FP_BITS: u32 = 10;
/// Entries per bucket on average: the directory doubles past `MAX_FILL`,
/// a build sizes it for `BUILD_FILL`.
const MAX_FILL: u64 = 16;
const BUILD_FILL: u64 = 8;
const MAX_Q: u32 = 32;
const MIN_Q: u32 = 6;

/// A sealed segment as the locator knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SegmentId {
    pub base: u64,
    pub end: u64,
    pub log_len: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    id: SegmentId,
    entries: u64,
}

/// Candidate slots of a lookup, one bit each.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Candidates([u64; SLOTS / 64]);

impl Candidates {
    fn set(&mut self, slot: u8) {
        self.0[usize::from(slot) / 64] |= 1 << (slot % 64);
    }

    /// The slots set, ascending.
    pub fn slots(self) -> impl Iterator<Item = usize> {
        self.0.into_iter().enumerate().flat_map(|(i, mut word)| {
            std::iter::from_fn(move || {
                let bit = word.trailing_zeros();
                (bit < 64).then(|| {
                    word &= word - 1;
                    i * 64 + bit as usize
                })
            })
        })
    }
}

/// What a merge made: a new locator, or (the common case) a new file
/// and what to change in the current locator's directory and summaries
/// (see [`Locator::apply`]), so memory never holds two copies of them.
pub(crate) enum Merged {
    New(Locator),
    Update(Update),
}

/// A new file whose directory is the current one's plus `fresh` (packed
/// entries, sorted).
pub(crate) struct Update {
    file: File,
    n: u64,
    slots: Vec<Option<Slot>>,
    fresh: Vec<u64>,
}

/// Why a locator could not be changed or written.
#[derive(Debug)]
pub(crate) enum Unfit {
    /// The fingerprints would grow too short (or the file is not what it
    /// was): build the locator anew from the tables.
    Rebuild,
    Io(std::io::Error),
}

impl From<std::io::Error> for Unfit {
    fn from(error: std::io::Error) -> Self {
        Self::Io(error)
    }
}

/// See the module documentation.
pub(crate) struct Locator {
    key: (u64, u64),
    /// Bucket bits.
    q: u32,
    /// Fingerprint bits that count (the top ones of each entry's).
    r: u32,
    /// `2^q + 1` starts: bucket `b` is entries `dir[b]..dir[b + 1]`.
    dir: Vec<u32>,
    /// Per bucket, the [`summary_bits`] of its entries' fingerprints: a
    /// lookup whose bits are not all set reads nothing (most lookups of a
    /// new UID, i.e. every dedup check of a batch of new records).
    summary: Vec<u64>,
    /// Per bucket, the wrapping sum of its entries' [`entry_check`]s: a
    /// bucket read from the file must add up to it (and to its summary),
    /// so a damaged or foreign file is never answered from.
    check: Vec<u32>,
    /// Entries in the file.
    n: u64,
    slots: Vec<Option<Slot>>,
    /// Covered segments' bases, ascending, with their slot.
    by_base: Vec<(u64, u8)>,
    /// The file holding the entries (still readable once a newer file
    /// replaced it); `None` for an empty locator never written.
    file: Option<File>,
    /// Where its file is, or will be written.
    path: PathBuf,
}

impl std::fmt::Debug for Locator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locator")
            .field("q", &self.q)
            .field("r", &self.r)
            .field("entries", &self.n)
            .field("segments", &self.by_base.len())
            .finish_non_exhaustive()
    }
}

/// A fresh random key.
fn random_key() -> (u64, u64) {
    let Key(a, b) = Key::random();
    (a, b)
}

/// Bucket bits for `total` entries in a fresh build (at least
/// [`MIN_Q`], so a small locator can grow 64-fold before a rebuild).
fn build_bits(total: u64) -> u32 {
    let mut q = MIN_Q;
    while total > BUILD_FILL << q && q < MAX_Q {
        q += 1;
    }
    q
}

fn fp_mask(r: u32) -> u16 {
    if r == 0 { 0 } else { u16::MAX << (16 - r) }
}

fn word(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

fn word32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// Two bits of 64 for a fingerprint (its top 6 bits, and the next 6):
/// with 8–16 entries per bucket, about 1 in 10 lookups of an absent UID
/// still reads its bucket.
fn summary_bits(fp: u16) -> u64 {
    (1u64 << (fp >> 10)) | (1u64 << ((fp >> 4) & 63))
}

/// An entry's share of its bucket's check: a bijection of its 24 bits, so
/// changing any one entry of a bucket always changes the bucket's sum.
fn entry_check(fp: u16, slot: u8) -> u32 {
    let mut h = ((u32::from(fp) << 8) | u32::from(slot)).wrapping_mul(0x9e37_79b1);
    h ^= h >> 15;
    h.wrapping_mul(0x85eb_ca77)
}

/// An entry packed into one word, ordered as the file orders entries:
/// bucket (up to 32 bits), fingerprint, slot.
fn pack(bucket: usize, fp: u16, class: u8) -> u64 {
    ((bucket as u64) << 24) | (u64::from(fp) << 8) | u64::from(class)
}

fn unpack(packed: u64) -> (usize, u16, u8) {
    (
        usize::try_from(packed >> 24).unwrap_or(usize::MAX),
        u16::try_from((packed >> 8) & 0xffff).unwrap_or(0),
        u8::try_from(packed & 0xff).unwrap_or(0),
    )
}

/// Calls `each` with the bytes `from..from + len` of `file` in order, in
/// chunks of at most [`CHUNK`] bytes (so each holds whole entries or
/// directory words when `from` starts one).
fn read_region(
    file: &File,
    from: u64,
    len: u64,
    mut each: impl FnMut(&[u8]) -> Result<(), Unfit>,
) -> Result<(), Unfit> {
    let mut buf = vec![0u8; CHUNK];
    let mut at = 0u64;
    while at < len {
        let n = usize::try_from(len - at).map_or(CHUNK, |n| n.min(CHUNK));
        file.read_exact_at(&mut buf[..n], from + at)?;
        each(&buf[..n])?;
        at += n as u64;
    }
    Ok(())
}

/// The temporary name a new file is written under before it is renamed.
fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

impl Locator {
    #[cfg(test)]
    /// An empty locator with a fresh key, to be written at `path`.
    pub fn empty(path: &Path) -> Self {
        Self::empty_with(path, random_key(), 0)
    }

    fn empty_with(path: &Path, key: (u64, u64), q: u32) -> Self {
        Self {
            key,
            q,
            r: FP_BITS,
            dir: vec![0; (1usize << q) + 1],
            summary: vec![0; 1usize << q],
            check: vec![0; 1usize << q],
            n: 0,
            slots: vec![None; SLOTS],
            by_base: Vec::new(),
            file: None,
            path: path.to_owned(),
        }
    }

    /// The keyed hash of `uid`.
    pub fn hash(&self, uid: &[u8]) -> u64 {
        Key(self.key.0, self.key.1).hash(uid)
    }

    /// Bucket and fingerprint of hash `h` at `q` bucket bits and `r`
    /// fingerprint bits.
    fn place(h: u64, q: u32, r: u32) -> (usize, u16) {
        let bucket = if q == 0 { 0 } else { h >> (64 - q) };
        let fp = u16::try_from((h << q) >> 48).unwrap_or(0) & fp_mask(r);
        (usize::try_from(bucket).unwrap_or(0), fp)
    }

    /// The slots whose segment may hold the UID of [`Locator::hash`] `h`:
    /// one read of its bucket from the file (none when the bucket is
    /// empty).
    pub fn candidates(&self, h: u64) -> std::io::Result<Candidates> {
        let (bucket, fp) = Self::place(h, self.q, self.r);
        let mut out = Candidates::default();
        let (Some(&from), Some(&to)) = (self.dir.get(bucket), self.dir.get(bucket + 1)) else {
            return Ok(out);
        };
        let want = summary_bits(fp);
        let Some(file) = self
            .file
            .as_ref()
            .filter(|_| from < to && self.summary.get(bucket).is_some_and(|s| s & want == want))
        else {
            return Ok(out);
        };
        let len = (to - from) as usize * ENTRY;
        let mut small = [0u8; 64 * ENTRY];
        let mut large = Vec::new();
        let buf = if len <= small.len() {
            &mut small[..len]
        } else {
            large.resize(len, 0);
            &mut large[..]
        };
        file.read_exact_at(buf, ENTRIES_AT + u64::from(from) * ENTRY as u64)?;
        // The whole bucket is checked against the memory's sum and summary
        // (and its order): a damaged entry could hide a stored UID.
        let (mut sum, mut bits, mut last, mut ordered) = (0u32, 0u64, 0u16, true);
        for entry in buf.chunks_exact(ENTRY) {
            let (stored, slot) = (u16::from_le_bytes([entry[0], entry[1]]), entry[2]);
            sum = sum.wrapping_add(entry_check(stored, slot));
            bits |= summary_bits(stored);
            ordered &= stored >= last && self.slot(usize::from(slot)).is_some();
            last = stored;
            if stored == fp {
                out.set(slot);
            }
        }
        if !ordered || self.check.get(bucket) != Some(&sum) || bits != self.summary[bucket] {
            tracing::warn!(
                path = %self.path.display(),
                bucket,
                "UID locator bucket does not match its check: asking the segments' filters"
            );
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("UID locator bucket {bucket} does not match its check"),
            ));
        }
        Ok(out)
    }

    /// The segment in `slot`.
    pub fn slot(&self, slot: usize) -> Option<SegmentId> {
        self.slots.get(slot).copied().flatten().map(|s| s.id)
    }

    /// Covered segments' bases, ascending.
    pub fn covered(&self) -> impl Iterator<Item = u64> + '_ {
        self.by_base.iter().map(|&(base, _)| base)
    }

    /// Covered segments with a base in `from..to`.
    pub fn covered_between(&self, from: u64, to: u64) -> usize {
        self.by_base
            .partition_point(|&(base, _)| base < to)
            .saturating_sub(self.by_base.partition_point(|&(base, _)| base < from))
    }

    /// Whether the segment `id` is covered.
    pub fn covers(&self, id: SegmentId) -> bool {
        self.by_base
            .binary_search_by_key(&id.base, |&(base, _)| base)
            .ok()
            .and_then(|i| self.slot(usize::from(self.by_base[i].1)))
            == Some(id)
    }

    /// UIDs held.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        usize::try_from(self.n).unwrap_or(usize::MAX)
    }

    /// Bytes of memory it holds besides its fixed part (the directory and
    /// the summaries).
    #[cfg(test)]
    pub fn heap_bytes(&self) -> usize {
        self.dir.capacity() * 4 + self.summary.capacity() * 8 + self.check.capacity() * 4
    }

    /// Fsyncs its file (and the directory's entry for it), at a clean close.
    pub fn sync(&self) -> std::io::Result<()> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        file.sync_data()?;
        crate::fsutil::sync_dir(self.path.parent().unwrap_or_else(|| Path::new(".")))
    }
}

/// Segments missing from a stored locator that are added one by one on
/// load; with more, it is built anew.
pub(crate) const CATCH_UP: usize = 8;

/// A partition's locator, loaded on its first lookup.
#[derive(Debug, Default)]
pub(crate) struct LocatorCell {
    pub(crate) current: RwLock<Option<Arc<Locator>>>,
    /// Whether the file holds `current` durably (synced).
    pub(crate) persisted: AtomicBool,
    /// Held by whoever loads or changes the locator (one file writer).
    pub(crate) loading: Mutex<()>,
}

impl LocatorCell {
    pub fn get(&self) -> Option<Arc<Locator>> {
        read(&self.current).clone()
    }

    pub(crate) fn set(&self, locator: Locator, persisted: bool) -> Arc<Locator> {
        let locator = Arc::new(locator);
        *write(&self.current) = Some(Arc::clone(&locator));
        self.persisted.store(persisted, Ordering::Release);
        locator
    }

    /// Applies `update` to the current locator: in place unless a lookup
    /// holds it at this moment (then to a copy). Lookups wait for the pass
    /// over the directory (a few ms at 10,000,000 UIDs) rather than memory
    /// holding the directory and summaries twice (and glibc keeping the
    /// freed copy: RssAnon). `None` when there is no current locator.
    pub(crate) fn apply(&self, update: Update) -> Option<Arc<Locator>> {
        let mut current = write(&self.current);
        let locator = current.as_mut()?;
        self.persisted.store(false, Ordering::Release);
        match Arc::get_mut(locator) {
            Some(only) => only.apply(update),
            None => {
                let mut next = locator.copy_without_file();
                next.apply(update);
                *locator = Arc::new(next);
            }
        }
        Some(Arc::clone(locator))
    }

    /// The locator to sync at close, if the file does not hold it durably.
    pub fn unpersisted(&self) -> Option<Arc<Locator>> {
        (!self.persisted.load(Ordering::Acquire))
            .then(|| self.get())
            .flatten()
    }
}

#[cfg(test)]
mod tests;
