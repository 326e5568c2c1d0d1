//! Writing a locator file: entries pushed in file order, then the
//! directory, the slots and the CRCs, and a rename over the old file.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use super::{
    CHUNK, ENTRIES_AT, HEADER, Locator, MAGIC, SLOTS, Slot, Unfit, Update, entry_check,
    summary_bits, tmp_path, unpack,
};

/// Writes a new locator file from its entries, pushed in file order.
pub(super) struct Writer {
    file: File,
    tmp: PathBuf,
    path: PathBuf,
    key: (u64, u64),
    q: u32,
    r: u32,
    slots: Vec<Option<Slot>>,
    buf: Vec<u8>,
    /// Where `buf` goes in the file.
    at: u64,
    crc: u32,
    /// Entries per bucket, then (at the end) the directory.
    counts: Vec<u32>,
    summary: Vec<u64>,
    check: Vec<u32>,
    pub(super) per_slot: Vec<u64>,
    pub(super) n: u64,
    last: Option<u64>,
}

impl Writer {
    pub(super) fn new(
        path: &Path,
        key: (u64, u64),
        q: u32,
        r: u32,
        slots: Vec<Option<Slot>>,
        sized: bool,
    ) -> Result<Self, Unfit> {
        let tmp = tmp_path(path);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        let buckets = 1usize.checked_shl(q).ok_or(Unfit::Rebuild)?;
        // Counts and summaries of every bucket, unless the caller streams
        // the directory (`finish_update`).
        let (dir, summary, check) = if sized {
            (vec![0; buckets + 1], vec![0; buckets], vec![0; buckets])
        } else {
            (Vec::new(), Vec::new(), Vec::new())
        };
        Ok(Self {
            file,
            tmp,
            path: path.to_owned(),
            key,
            q,
            r,
            slots,
            buf: Vec::with_capacity(CHUNK),
            at: ENTRIES_AT,
            crc: 0,
            counts: dir,
            summary,
            check,
            per_slot: vec![0; SLOTS],
            n: 0,
            last: None,
        })
    }

    pub(super) fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.buf.extend_from_slice(bytes);
        if self.buf.len() >= CHUNK {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.crc = crc32c::crc32c_append(self.crc, &self.buf);
        self.file.write_all_at(&self.buf, self.at)?;
        self.at += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }

    /// Appends an entry (packed); entries must come in order. A repeat of
    /// the last one is skipped.
    pub(super) fn push(&mut self, packed: u64) -> Result<(), Unfit> {
        if self.last == Some(packed) {
            return Ok(());
        }
        self.last = Some(packed);
        let (bucket, fp, class) = unpack(packed);
        let count = self.counts.get_mut(bucket).ok_or(Unfit::Rebuild)?;
        *count = count.checked_add(1).ok_or(Unfit::Rebuild)?;
        self.summary[bucket] |= summary_bits(fp);
        self.check[bucket] = self.check[bucket].wrapping_add(entry_check(fp, class));
        self.per_slot[usize::from(class)] += 1;
        self.n += 1;
        let [a, b] = fp.to_le_bytes();
        Ok(self.put(&[a, b, class])?)
    }

    /// Writes the directory, slots and header, and puts the file in place.
    pub(super) fn finish(mut self) -> Result<Locator, Unfit> {
        let buckets = self.counts.len().checked_sub(1).ok_or(Unfit::Rebuild)?;
        let mut at = 0u32;
        for count in &mut self.counts[..buckets] {
            let n = *count;
            *count = at;
            at = at.checked_add(n).ok_or(Unfit::Rebuild)?;
        }
        self.counts[buckets] = at;
        let counts = std::mem::take(&mut self.counts);
        for d in &counts {
            self.put(&d.to_le_bytes())?;
        }
        for (i, slot) in self.slots.iter_mut().enumerate() {
            match slot {
                Some(slot) => slot.entries = self.per_slot[i],
                // Entries of no segment: a bug, not worth trusting.
                None if self.per_slot[i] > 0 => return Err(Unfit::Rebuild),
                None => {}
            }
        }
        let slots = self.write_tail()?;
        let mut out = Locator {
            key: self.key,
            q: self.q,
            r: self.r,
            dir: counts,
            summary: std::mem::take(&mut self.summary),
            check: std::mem::take(&mut self.check),
            n: self.n,
            slots,
            by_base: Vec::new(),
            file: Some(self.file),
            path: self.path,
        };
        out.index_slots();
        Ok(out)
    }

    /// Writes the directory of `old` (the current locator's) plus the
    /// entries `fresh`, then the slots and header, and puts the file in
    /// place; the counts and summaries were not kept.
    pub(super) fn finish_update(mut self, old: &[u32], fresh: Vec<u64>) -> Result<Update, Unfit> {
        let mut next = fresh.iter().map(|&f| unpack(f).0).peekable();
        let mut added = 0u32;
        let mut words = Vec::with_capacity(CHUNK);
        for (bucket, &start) in old.iter().enumerate() {
            while next.next_if(|&b| b < bucket).is_some() {
                added = added.checked_add(1).ok_or(Unfit::Rebuild)?;
            }
            words.extend_from_slice(
                &start
                    .checked_add(added)
                    .ok_or(Unfit::Rebuild)?
                    .to_le_bytes(),
            );
            if words.len() >= CHUNK {
                self.put(&words)?;
                words.clear();
            }
        }
        self.put(&words)?;
        if next.next().is_some() {
            return Err(Unfit::Rebuild);
        }
        for (i, slot) in self.slots.iter_mut().enumerate() {
            match slot {
                Some(slot) => slot.entries = self.per_slot[i],
                None if self.per_slot[i] > 0 => return Err(Unfit::Rebuild),
                None => {}
            }
        }
        let n = self.n;
        let slots = self.write_tail()?;
        Ok(Update {
            file: self.file,
            n,
            slots,
            fresh,
        })
    }

    /// Writes the slots, the CRC and the header, and renames the file into
    /// place; returns the slots.
    fn write_tail(&mut self) -> Result<Vec<Option<Slot>>, Unfit> {
        let slots = std::mem::take(&mut self.slots);
        for slot in &slots {
            let words = slot.map_or([u64::MAX; 4], |s| {
                [s.id.base, s.id.end, s.id.log_len, s.entries]
            });
            for w in words {
                self.put(&w.to_le_bytes())?;
            }
        }
        self.flush()?;
        let crc = self.crc;
        self.file.write_all_at(&crc.to_le_bytes(), self.at)?;
        let mut head = Vec::with_capacity(HEADER);
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&self.q.to_le_bytes());
        head.extend_from_slice(&self.r.to_le_bytes());
        head.extend_from_slice(&u32::try_from(SLOTS).unwrap_or(0).to_le_bytes());
        head.extend_from_slice(&self.key.0.to_le_bytes());
        head.extend_from_slice(&self.key.1.to_le_bytes());
        head.extend_from_slice(&self.n.to_le_bytes());
        head.extend_from_slice(&0u32.to_le_bytes());
        let crc = crc32c::crc32c(&head);
        head.extend_from_slice(&crc.to_le_bytes());
        self.file.write_all_at(&head, 0)?;
        std::fs::rename(&self.tmp, &self.path)?;
        Ok(slots)
    }
}
