//! Building a locator from its segments' UIDs, and loading (checking) a
//! locator file written earlier.

use std::fs::File;
use std::os::unix::fs::FileExt as _;
use std::path::Path;

use super::writer::Writer;
use super::{
    CHUNK, ENTRIES_AT, ENTRY, FP_BITS, HEADER, Locator, MAGIC, MAX_Q, MIN_FP_BITS, SLOT_BYTES,
    SLOTS, SegmentId, Slot, Unfit, build_bits, entry_check, pack, random_key, read_region,
    summary_bits, word, word32,
};

impl Locator {
    /// A locator with a fresh key covering the segments `ids` (at most
    /// [`SLOTS`]: the last ones), whose UIDs `uids_of(i)` reads in turn,
    /// written at `path`.
    pub fn build<E: From<std::io::Error>>(
        path: &Path,
        ids: &[SegmentId],
        mut uids_of: impl FnMut(usize) -> Result<Vec<(String, u64)>, E>,
    ) -> Result<Self, E> {
        let skip = ids.len().saturating_sub(SLOTS);
        let key = random_key();
        let hasher = Self::empty_with(path, key, 0);
        // The hash's top 56 bits and the slot, packed into one word: bucket
        // and fingerprint come from the top `q + 16` bits (q <= 32).
        let mut all: Vec<u64> = Vec::new();
        for (slot, i) in (skip..ids.len()).enumerate() {
            for (uid, _) in uids_of(i)? {
                all.push((hasher.hash(uid.as_bytes()) & !0xff) | slot as u64);
            }
        }
        if ids.len() == skip {
            return Ok(hasher);
        }
        all.sort_unstable();
        let q = build_bits(all.len() as u64);
        let mut slots = vec![None; SLOTS];
        for (slot, id) in ids[skip..].iter().enumerate() {
            slots[slot] = Some(Slot {
                id: *id,
                entries: 0,
            });
        }
        let io = |error: Unfit| match error {
            Unfit::Io(error) => E::from(error),
            Unfit::Rebuild => E::from(std::io::Error::other("UID locator: too many entries")),
        };
        let mut out = Writer::new(path, key, q, FP_BITS, slots, true).map_err(io)?;
        for packed in all {
            let (bucket, fp) = Self::place(packed & !0xff, q, FP_BITS);
            let class = u8::try_from(packed & 0xff).unwrap_or(0);
            out.push(pack(bucket, fp, class)).map_err(io)?;
        }
        out.finish().map_err(io)
    }

    pub(super) fn index_slots(&mut self) {
        self.by_base = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some((s.as_ref()?.id.base, u8::try_from(i).ok()?)))
            .collect();
        self.by_base.sort_unstable();
    }

    /// Reads the file at `path`: `Err("missing")`, `Err("stale")` for the
    /// older format, or `Err("damaged")` when it is not a whole, consistent
    /// one of this format. Streams it (its
    /// CRC and per-slot counts), keeping only the directory and slots.
    pub fn load(path: &Path) -> Result<Self, &'static str> {
        let file = match File::open(path) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Err("missing"),
            Err(_) => return Err("damaged"),
        };
        let mut magic = [0u8; 4];
        if file.read_exact_at(&mut magic, 0).is_ok() && &magic == b"BUL1" {
            // The format that kept the entries in memory: built anew.
            return Err("stale");
        }
        Self::decode(path, file).ok_or("damaged")
    }

    fn decode(path: &Path, file: File) -> Option<Self> {
        let len = file.metadata().ok()?.len();
        let mut head = [0u8; HEADER];
        file.read_exact_at(&mut head, 0).ok()?;
        if !head.starts_with(MAGIC) || crc32c::crc32c(&head[..44]) != word32(&head, 44)? {
            return None;
        }
        let (q, r, slots) = (word32(&head, 4)?, word32(&head, 8)?, word32(&head, 12)?);
        let key = (word(&head, 16)?, word(&head, 24)?);
        let n = word(&head, 32)?;
        if q > MAX_Q || !(MIN_FP_BITS..=FP_BITS).contains(&r) || slots as usize != SLOTS {
            return None;
        }
        let buckets = 1u64.checked_shl(q)?;
        let entries_len = n.checked_mul(ENTRY as u64)?;
        let dir_len = buckets.checked_add(1)?.checked_mul(4)?;
        let slots_len = (SLOTS * SLOT_BYTES) as u64;
        let body = entries_len.checked_add(dir_len)?.checked_add(slots_len)?;
        if len != ENTRIES_AT.checked_add(body)?.checked_add(4)? {
            return None;
        }
        // The directory first (it says which bucket each entry is in),
        // then the entries; the CRC over the bytes in file order.
        let mut dir = Vec::with_capacity(usize::try_from(buckets + 1).ok()?);
        read_region(&file, ENTRIES_AT + entries_len, dir_len, |chunk| {
            dir.extend(
                chunk
                    .chunks_exact(4)
                    .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])),
            );
            Ok(())
        })
        .ok()?;
        // Consistent: a monotone directory over all entries.
        let monotone = dir.first() == Some(&0)
            && dir.last().map(|&d| u64::from(d)) == Some(n)
            && dir.windows(2).all(|w| w[0] <= w[1]);
        if !monotone {
            return None;
        }
        let mut crc = 0u32;
        let mut per_slot = [0u64; SLOTS];
        let mut summary = vec![0u64; dir.len() - 1];
        let mut check = vec![0u32; dir.len() - 1];
        let (mut index, mut bucket) = (0u32, 0usize);
        read_region(&file, ENTRIES_AT, entries_len, |chunk| {
            crc = crc32c::crc32c_append(crc, chunk);
            for entry in chunk.chunks_exact(ENTRY) {
                while dir.get(bucket + 1).is_some_and(|&end| end <= index) {
                    bucket += 1;
                }
                index += 1;
                per_slot[usize::from(entry[2])] += 1;
                let fp = u16::from_le_bytes([entry[0], entry[1]]);
                summary[bucket] |= summary_bits(fp);
                check[bucket] = check[bucket].wrapping_add(entry_check(fp, entry[2]));
            }
            Ok(())
        })
        .ok()?;
        let mut bytes = Vec::with_capacity(CHUNK);
        for words in dir.chunks(CHUNK / 4) {
            bytes.clear();
            bytes.extend(words.iter().flat_map(|w| w.to_le_bytes()));
            crc = crc32c::crc32c_append(crc, &bytes);
        }
        let mut tail = vec![0u8; SLOTS * SLOT_BYTES + 4];
        file.read_exact_at(&mut tail, ENTRIES_AT + entries_len + dir_len)
            .ok()?;
        crc = crc32c::crc32c_append(crc, &tail[..SLOTS * SLOT_BYTES]);
        if crc != word32(&tail, SLOTS * SLOT_BYTES)? {
            return None;
        }
        let mut out = Self::empty_with(path, key, 0);
        out.q = q;
        out.r = r;
        out.n = n;
        for (i, slot) in out.slots.iter_mut().enumerate() {
            let at = i * SLOT_BYTES;
            let words = [
                word(&tail, at)?,
                word(&tail, at + 8)?,
                word(&tail, at + 16)?,
                word(&tail, at + 24)?,
            ];
            if words != [u64::MAX; 4] {
                *slot = Some(Slot {
                    id: SegmentId {
                        base: words[0],
                        end: words[1],
                        log_len: words[2],
                    },
                    entries: words[3],
                });
            }
        }
        // Each entry of a covered slot, as many per slot as the slot says.
        for (slot, &count) in out.slots.iter().zip(&per_slot) {
            if slot.map_or(0, |s| s.entries) != count {
                return None;
            }
        }
        out.dir = dir;
        out.summary = summary;
        out.check = check;
        out.file = Some(file);
        out.index_slots();
        Some(out)
    }
}
