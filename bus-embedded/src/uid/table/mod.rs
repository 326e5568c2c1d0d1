//! The UID table of a sealed segment: its `(UID, offset)` pairs in a hash
//! table of checksummed pages on disk (`<base>.uids`), read one page per
//! lookup with `pread`, and a blocked Bloom filter (about 1.25 bytes per
//! UID) that answers most absent UIDs without I/O. The partition's
//! `locator` names the segments a UID may be in, so the tables it covers
//! are read without their filter, which stays on disk; a table the locator
//! does not cover holds its filter in memory once asked (issue 15).
//!
//! The file is a hint, never trusted blindly: its header names the
//! segment's base, end offset and byte length and carries a CRC, the
//! filter has its own CRC (checked when the filter is first read, and by
//! every full read of the table), and every page carries a CRC checked on
//! each read. A file that
//! is missing, cut, damaged or stale is rebuilt from the segment.
//!
//! ```text
//! header  88 bytes: "BUT2", page size u32, base, end, log_len, count,
//!         pages, filter blocks, home pages (u64 each: the first `home
//!         pages` are where UIDs' home pages are picked; pages past them
//!         hold only what overflowed), hash key (2 × u64), filter CRC
//!         u32, header CRC u32
//! filter  filter blocks × 64 bytes
//! pages   pages × page size: CRC u32 (of the rest of the page), flags u8
//!         (bit 0: a UID whose home is this page or an earlier one went
//!         further), entries u16, one zero byte, then entries
//!         (UID length u16, UID bytes, offset u64) and zeros
//! ```
//!
//! A UID's home page and filter bits are picked by its SipHash under the
//! table's own random key ([`Key`], drawn each time a table is written),
//! so UIDs cannot be chosen to pile into one page chain (HashDoS); a
//! lookup reads pages from the home page while they are flagged as
//! overflowed. The format depends on that hash: changing it means a new
//! magic.
//!
//! Tables of the first format ("BUT1", a 72-byte header without a key,
//! pages placed by unkeyed FNV) are still read whole, checked as strictly,
//! and rewritten in this format the first time a lookup needs them; they
//! are never looked up by hash.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, OnceLock};

use crate::uid::keyed::Key;

mod sealed;

pub(crate) use sealed::SealedUids;

const MAGIC: &[u8; 4] = b"BUT2";
/// Header bytes.
pub(crate) const HEADER: usize = 88;
/// The first format's magic and header bytes (no key).
const MAGIC_V1: &[u8; 4] = b"BUT1";
const HEADER_V1: usize = 72;
/// Bytes before a page's entries.
const PAGE_HEAD: usize = 8;
/// Bytes of an entry besides its UID.
const ENTRY_EXTRA: usize = 2 + 8;
/// Filter block: one cache line.
const BLOCK: usize = 64;
/// Filter bits per UID (about 1% false positives with [`PROBES`]).
const BITS_PER_UID: usize = 10;
/// Bits set per UID, all in one block.
const PROBES: u32 = 7;
/// Pages are filled to about this share (percent), so few overflow.
const FILL_PERCENT: usize = 70;
/// Page sizes tried, smallest first: the smallest that holds the longest
/// entry (a UID of up to `bus_core::MAX_UID_BYTES` fits the largest).
const PAGE_SIZES: [usize; 3] = [512, 1024, 4096];

/// `h` scaled to `0..n`.
fn scale(h: u64, n: u64) -> u64 {
    u64::try_from((u128::from(h) * u128::from(n)) >> 64).unwrap_or(0)
}

/// The filter block and the bits of `h` in it.
fn filter_bits(h: u64, blocks: u64) -> (u64, [u32; PROBES as usize]) {
    let block = scale(h, blocks);
    let mut second = h ^ 0x9e37_79b9_7f4a_7c15;
    second = second.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    second ^= second >> 29;
    let mut bits = [0u32; PROBES as usize];
    for (i, bit) in bits.iter_mut().enumerate() {
        *bit = u32::try_from((second >> (9 * i)) & 511).unwrap_or(0);
    }
    (block, bits)
}

/// What the header of a table says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub page_size: usize,
    pub base: u64,
    pub end: u64,
    pub log_len: u64,
    pub count: u64,
    pub pages: u64,
    /// Pages a UID's home is picked among (the first ones).
    pub home_pages: u64,
    pub blocks: u64,
    /// The key pages and filter bits are placed by; `None`: a table of the
    /// first format, read whole only.
    pub key: Option<Key>,
    filter_crc: u32,
}

impl Header {
    /// Bytes of the whole file.
    /// Header bytes of this table's format.
    fn head_len(&self) -> u64 {
        if self.key.is_some() {
            HEADER as u64
        } else {
            HEADER_V1 as u64
        }
    }

    fn file_len(&self) -> Option<u64> {
        let filter = self.blocks.checked_mul(BLOCK as u64)?;
        let pages = self.pages.checked_mul(self.page_size as u64)?;
        self.head_len().checked_add(filter)?.checked_add(pages)
    }

    fn page_at(&self, page: u64) -> u64 {
        self.head_len() + self.blocks * BLOCK as u64 + page * self.page_size as u64
    }
}

fn word(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

fn word32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// Encodes the table of a segment `base..end` of `log_len` bytes holding
/// `uids` (in log order; a UID may repeat), placed by `key` (a fresh
/// [`Key::random`] for every table written). `None` when a UID is too long
/// for any page (only a foreign writer stores one): keep those in memory.
pub(crate) fn encode(
    key: Key,
    base: u64,
    end: u64,
    log_len: u64,
    uids: &[(String, u64)],
) -> Option<Vec<u8>> {
    let longest = uids.iter().map(|(u, _)| u.len()).max().unwrap_or(0);
    let page_size = *PAGE_SIZES
        .iter()
        .find(|&&size| longest + ENTRY_EXTRA <= size - PAGE_HEAD)?;
    let payload = page_size - PAGE_HEAD;
    let bytes: usize = uids.iter().map(|(u, _)| u.len() + ENTRY_EXTRA).sum();
    let pages = (bytes * 100).div_ceil(payload * FILL_PERCENT).max(1);
    let blocks = (uids.len() * BITS_PER_UID).div_ceil(BLOCK * 8).max(1);
    let mut filter = vec![0u8; blocks * BLOCK];
    let hashes: Vec<u64> = uids
        .iter()
        .map(|(uid, _)| key.hash(uid.as_bytes()))
        .collect();
    for &h in &hashes {
        let (block, bits) = filter_bits(h, blocks as u64);
        let block = usize::try_from(block).ok()? * BLOCK;
        for bit in bits {
            let bit = bit as usize;
            filter[block + bit / 8] |= 1 << (bit % 8);
        }
    }
    // By home page (among the first `pages`; entries that do not fit go on
    // to the next pages, appended past them if need be), then position in
    // `uids`, so equal UIDs keep log order.
    let mut order: Vec<(u64, usize)> = hashes
        .iter()
        .enumerate()
        .map(|(i, &h)| (scale(h, pages as u64), i))
        .collect();
    order.sort_unstable();
    let laid = lay_out(&order, uids, pages, payload)?;
    let header = Header {
        page_size,
        base,
        end,
        log_len,
        count: uids.len() as u64,
        pages: laid.len() as u64,
        home_pages: pages as u64,
        blocks: blocks as u64,
        key: Some(key),
        filter_crc: crc32c::crc32c(&filter),
    };
    let mut out = Vec::with_capacity(usize::try_from(header.file_len()?).ok()?);
    out.extend_from_slice(&encode_header(&header));
    out.extend_from_slice(&filter);
    for (flags, entries, _) in laid {
        let start = out.len();
        out.extend_from_slice(&[0; 4]);
        out.push(flags);
        out.extend_from_slice(&u16::try_from(entries.len()).ok()?.to_le_bytes());
        out.push(0);
        for i in entries {
            let (uid, offset) = &uids[i];
            out.extend_from_slice(&u16::try_from(uid.len()).ok()?.to_le_bytes());
            out.extend_from_slice(uid.as_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
        }
        out.resize(start + page_size, 0);
        let crc = crc32c::crc32c(&out[start + 4..]);
        out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
    }
    Some(out)
}

/// Page contents `(flags, entries, used bytes)`: entries placed from their
/// home page on, in `order`.
fn lay_out(
    order: &[(u64, usize)],
    uids: &[(String, u64)],
    pages: usize,
    payload: usize,
) -> Option<Vec<(u8, Vec<usize>, usize)>> {
    let mut laid: Vec<(u8, Vec<usize>, usize)> = vec![(0, Vec::new(), 0); pages];
    let mut cur = 0usize;
    for &(home, i) in order {
        let size = uids[i].0.len() + ENTRY_EXTRA;
        let mut at = cur.max(usize::try_from(home).ok()?);
        loop {
            if at == laid.len() {
                laid.push((0, Vec::new(), 0));
            }
            if laid[at].2 + size <= payload {
                break;
            }
            laid[at].0 |= 1;
            at += 1;
        }
        laid[at].1.push(i);
        laid[at].2 += size;
        cur = at;
    }
    Some(laid)
}

fn encode_header(header: &Header) -> [u8; HEADER] {
    let mut out = [0u8; HEADER];
    out[..4].copy_from_slice(MAGIC);
    out[4..8].copy_from_slice(&u32::try_from(header.page_size).unwrap_or(0).to_le_bytes());
    let words = [
        header.base,
        header.end,
        header.log_len,
        header.count,
        header.pages,
        header.blocks,
        header.home_pages,
    ];
    for (i, w) in words.iter().enumerate() {
        out[8 + i * 8..16 + i * 8].copy_from_slice(&w.to_le_bytes());
    }
    let key = header.key.unwrap_or(Key(0, 0));
    out[64..72].copy_from_slice(&key.0.to_le_bytes());
    out[72..80].copy_from_slice(&key.1.to_le_bytes());
    out[80..84].copy_from_slice(&header.filter_crc.to_le_bytes());
    let crc = crc32c::crc32c(&out[..84]);
    out[84..88].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Decodes a header (of either format), checking it against the segment
/// `base..end` of `log_len` bytes and the file's length; `None` when it
/// does not fit.
pub(crate) fn decode_header(
    bytes: &[u8],
    base: u64,
    end: u64,
    log_len: u64,
    file_len: u64,
) -> Option<Header> {
    let (key, filter_crc) = if bytes.starts_with(MAGIC) {
        let bytes = bytes.get(..HEADER)?;
        if crc32c::crc32c(&bytes[..84]) != word32(bytes, 84)? {
            return None;
        }
        (
            Some(Key(word(bytes, 64)?, word(bytes, 72)?)),
            word32(bytes, 80)?,
        )
    } else if bytes.starts_with(MAGIC_V1) {
        let bytes = bytes.get(..HEADER_V1)?;
        if crc32c::crc32c(&bytes[..68]) != word32(bytes, 68)? {
            return None;
        }
        (None, word32(bytes, 64)?)
    } else {
        return None;
    };
    let page_size = usize::try_from(word32(bytes, 4)?).ok()?;
    let header = Header {
        page_size,
        base: word(bytes, 8)?,
        end: word(bytes, 16)?,
        log_len: word(bytes, 24)?,
        count: word(bytes, 32)?,
        pages: word(bytes, 40)?,
        blocks: word(bytes, 48)?,
        home_pages: word(bytes, 56)?,
        key,
        filter_crc,
    };
    let fits = PAGE_SIZES.contains(&page_size)
        && (header.base, header.end, header.log_len) == (base, end, log_len)
        && header.pages > 0
        && header.home_pages > 0
        && header.home_pages <= header.pages
        && header.blocks > 0
        && header.count <= end - base
        && header.file_len() == Some(file_len);
    fits.then_some(header)
}

/// Reads the start of a table file into `head`: a whole header of either
/// format, or as much as a shorter file has. Returns the bytes read.
fn read_head(file: &File, head: &mut [u8; HEADER]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < HEADER {
        match file.read_at(&mut head[got..], got as u64)? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

/// Why a table cannot answer: rebuild it from the segment.
#[derive(Debug)]
pub(crate) enum Unfit {
    /// The bytes are not a table of this segment (missing, cut, damaged, stale).
    Damaged(String),
    Io(std::io::Error),
}

impl From<std::io::Error> for Unfit {
    fn from(error: std::io::Error) -> Self {
        if error.kind() == std::io::ErrorKind::UnexpectedEof {
            Self::Damaged(format!("cut short: {error}"))
        } else {
            Self::Io(error)
        }
    }
}

/// A table's Bloom filter, checked against its CRC.
#[derive(Debug)]
pub(crate) struct Filter {
    words: Vec<u64>,
    blocks: u64,
    key: Key,
}

impl Filter {
    /// Whether `uid` may be in the table (false: surely not).
    pub fn may_hold(&self, uid: &[u8]) -> bool {
        let (block, bits) = filter_bits(self.key.hash(uid), self.blocks);
        let Ok(block) = usize::try_from(block) else {
            return false;
        };
        let block = &self.words[block * (BLOCK / 8)..(block + 1) * (BLOCK / 8)];
        bits.iter().fold(true, |all, &bit| {
            all & (block[(bit / 64) as usize] & (1 << (bit % 64)) != 0)
        })
    }
}

/// A loaded table: the open file, its header and (once a lookup asks
/// for it) its filter.
#[derive(Debug)]
pub(crate) struct Table {
    file: File,
    header: Header,
    filter: OnceLock<Arc<Filter>>,
}

impl Table {
    /// Opens the table `file` of the segment `base..end` of `log_len`
    /// bytes, checking its header (the filter is read and checked when
    /// first used, the pages on every read).
    pub fn load(file: File, base: u64, end: u64, log_len: u64) -> Result<Self, Unfit> {
        let file_len = file.metadata()?.len();
        let mut head = [0u8; HEADER];
        let got = read_head(&file, &mut head)?;
        let head = &head[..got];
        let header = decode_header(head, base, end, log_len, file_len)
            .ok_or_else(|| Unfit::Damaged("header does not match the segment".to_owned()))?;
        Ok(Self {
            file,
            header,
            filter: OnceLock::new(),
        })
    }

    /// The filter, read and checked against its CRC on first use.
    fn filter(&self) -> Result<&Arc<Filter>, Unfit> {
        if let Some(filter) = self.filter.get() {
            return Ok(filter);
        }
        let blocks =
            usize::try_from(self.header.blocks).map_err(|_| Unfit::Damaged("size".into()))?;
        let mut bytes = vec![0u8; blocks * BLOCK];
        self.file
            .read_exact_at(&mut bytes, self.header.head_len())?;
        if crc32c::crc32c(&bytes) != self.header.filter_crc {
            return Err(Unfit::Damaged("filter checksum".to_owned()));
        }
        let words = bytes
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
            .collect();
        let filter = Arc::new(Filter {
            words,
            blocks: self.header.blocks,
            // A first-format table is only read whole: its filter is checked, never asked.
            key: self.header.key.unwrap_or(Key(0, 0)),
        });
        Ok(self.filter.get_or_init(|| filter))
    }

    /// Whether this is a table of the first format (unkeyed): it must be
    /// read whole ([`Table::entries`]) and rewritten before lookups.
    pub fn is_first_format(&self) -> bool {
        self.header.key.is_none()
    }

    /// Offsets of `uid` in the table, ascending.
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn get(&self, uid: &[u8]) -> Result<Vec<u64>, Unfit> {
        self.get_filtered(uid, true)
    }

    /// [`Table::get`]; `filtered`: ask the filter first (false when the
    /// partition's locator named this table, so the UID is likely here and
    /// the filter would cost a miss more).
    pub fn get_filtered(&self, uid: &[u8], filtered: bool) -> Result<Vec<u64>, Unfit> {
        let Some(key) = self.header.key else {
            return Err(Unfit::Damaged("first format: rewrite it keyed".to_owned()));
        };
        if filtered && !self.filter()?.may_hold(uid) {
            return Ok(Vec::new());
        }
        let mut page = scale(key.hash(uid), self.header.home_pages);
        let mut buf = [0u8; 4096];
        let buf = &mut buf[..self.header.page_size];
        let mut found = Vec::new();
        loop {
            if page >= self.header.pages {
                return Err(Unfit::Damaged("overflow past the last page".to_owned()));
            }
            self.file.read_exact_at(buf, self.header.page_at(page))?;
            let overflowed = scan_page(buf, |entry, offset| {
                if entry == uid {
                    found.push(offset);
                }
            })
            .ok_or_else(|| Unfit::Damaged(format!("page {page} does not verify")))?;
            if !overflowed {
                break;
            }
            page += 1;
        }
        for &offset in &found {
            if offset < self.header.base || offset >= self.header.end {
                return Err(Unfit::Damaged(format!(
                    "offset {offset} outside the segment"
                )));
            }
        }
        found.sort_unstable();
        Ok(found)
    }

    /// Every `(UID, offset)` of the table, in offset order.
    pub fn entries(&self) -> Result<Vec<(String, u64)>, Unfit> {
        // Read whole: the filter is checked too.
        self.filter()?;
        let mut buf = vec![0u8; self.header.page_size];
        let mut all = Vec::new();
        for page in 0..self.header.pages {
            self.file
                .read_exact_at(&mut buf, self.header.page_at(page))?;
            scan_page(&buf, |uid, offset| {
                all.push((String::from_utf8_lossy(uid).into_owned(), offset));
            })
            .ok_or_else(|| Unfit::Damaged(format!("page {page} does not verify")))?;
        }
        if all.len() as u64 != self.header.count
            || all
                .iter()
                .any(|&(_, o)| o < self.header.base || o >= self.header.end)
        {
            return Err(Unfit::Damaged("entries do not match the header".to_owned()));
        }
        all.sort_by_key(|&(_, offset)| offset);
        Ok(all)
    }
}

/// Verifies one page and calls `each` for its entries; returns whether it
/// is flagged as overflowed, `None` when it does not verify.
pub(crate) fn scan_page(page: &[u8], mut each: impl FnMut(&[u8], u64)) -> Option<bool> {
    if page.len() < PAGE_HEAD || crc32c::crc32c(&page[4..]) != word32(page, 0)? {
        return None;
    }
    let flags = page[4];
    let count = u16::from_le_bytes([page[5], page[6]]);
    if flags > 1 || page[7] != 0 {
        return None;
    }
    let mut at = PAGE_HEAD;
    for _ in 0..count {
        let len = usize::from(u16::from_le_bytes([*page.get(at)?, *page.get(at + 1)?]));
        let uid = page.get(at + 2..at + 2 + len)?;
        let offset = word(page, at + 2 + len)?;
        each(uid, offset);
        at += len + ENTRY_EXTRA;
    }
    Some(flags == 1)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const KEY: Key = Key(0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210);

    fn table(bytes: &[u8], base: u64, end: u64, log_len: u64) -> Result<Table, Unfit> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.uidt");
        std::fs::write(&path, bytes).unwrap();
        Table::load(File::open(&path).unwrap(), base, end, log_len)
    }

    #[test]
    fn finds_every_uid_and_none_other() {
        let mut uids: Vec<(String, u64)> =
            (0..5000u64).map(|i| (format!("e{i}"), 100 + i)).collect();
        // A UID stored twice (written around the bus) and a long one.
        uids.push(("e7".to_owned(), 5100));
        uids.push(("x".repeat(1024), 5101));
        let bytes = encode(KEY, 100, 5102, 9999, &uids).unwrap();
        let t = table(&bytes, 100, 5102, 9999).unwrap();
        assert_eq!(t.header.page_size, 4096);
        for i in 0..5000u64 {
            let want = if i == 7 {
                vec![107, 5100]
            } else {
                vec![100 + i]
            };
            assert_eq!(t.get(format!("e{i}").as_bytes()).unwrap(), want);
        }
        assert_eq!(t.get("x".repeat(1024).as_bytes()).unwrap(), vec![5101]);
        let absent = (5000..15000u64)
            .filter(|i| !t.get(format!("e{i}").as_bytes()).unwrap().is_empty())
            .count();
        assert_eq!(absent, 0);
        assert_eq!(t.entries().unwrap().len(), uids.len());
    }

    #[test]
    fn entries_that_overflow_the_last_home_page_are_found() {
        // A UID stored many times (written around the bus) whose home is
        // the last page: its copies run past it, into appended pages.
        let uid = (0..)
            .map(|i| format!("x{i}"))
            .find(|u| KEY.hash(u.as_bytes()) > u64::MAX / 100 * 99)
            .unwrap();
        let mut uids: Vec<(String, u64)> = (0..300u64).map(|i| (uid.clone(), i)).collect();
        uids.extend((300..400u64).map(|i| (format!("y{i}"), i)));
        let bytes = encode(KEY, 0, 400, 1, &uids).unwrap();
        let t = table(&bytes, 0, 400, 1).unwrap();
        assert!(t.header.pages > t.header.home_pages);
        assert_eq!(
            t.get(uid.as_bytes()).unwrap(),
            (0..300).collect::<Vec<u64>>()
        );
        for i in 300..400u64 {
            assert_eq!(t.get(format!("y{i}").as_bytes()).unwrap(), vec![i]);
        }
        assert_eq!(t.entries().unwrap().len(), 400);
    }

    /// The longest run of pages flagged as overflowed: what a lookup of
    /// the worst-placed UID reads.
    fn longest_chain(bytes: &[u8]) -> usize {
        let head = decode_header(bytes, 0, 1 << 20, 1, bytes.len() as u64).unwrap();
        let first = HEADER + usize::try_from(head.blocks).unwrap() * BLOCK;
        let (mut run, mut longest) = (0, 0);
        for page in bytes[first..].chunks(head.page_size) {
            run = if scan_page(page, |_, _| {}).unwrap() {
                run + 1
            } else {
                0
            };
            longest = longest.max(run);
        }
        longest
    }

    #[test]
    fn uids_aimed_at_one_page_under_a_known_key_spread_under_a_fresh_one() {
        // UIDs whose hash under KEY falls in the first 1/512 of the range:
        // with a known (or unkeyed) hash they share one home page, and a
        // lookup walks the whole chain. Each table draws its own key.
        let aimed: Vec<(String, u64)> = (0u64..)
            .map(|i| format!("aimed-{i}"))
            .filter(|u| KEY.hash(u.as_bytes()) < u64::MAX / 512)
            .take(1500)
            .zip(0..)
            .collect();
        let known = encode(KEY, 0, 1 << 20, 1, &aimed).unwrap();
        assert!(longest_chain(&known) > 50, "{}", longest_chain(&known));
        let fresh = encode(Key::random(), 0, 1 << 20, 1, &aimed).unwrap();
        assert!(longest_chain(&fresh) < 8, "{}", longest_chain(&fresh));
        let t = table(&fresh, 0, 1 << 20, 1).unwrap();
        for (uid, offset) in aimed.iter().step_by(37) {
            assert_eq!(t.get(uid.as_bytes()).unwrap(), vec![*offset]);
        }
    }

    #[test]
    fn empty_and_small_tables() {
        let bytes = encode(KEY, 0, 0, 0, &[]).unwrap();
        let t = table(&bytes, 0, 0, 0).unwrap();
        assert!(t.get(b"a").unwrap().is_empty());
        assert!(t.entries().unwrap().is_empty());
        let bytes = encode(KEY, 3, 4, 10, &[("a".to_owned(), 3)]).unwrap();
        assert_eq!(bytes.len(), HEADER + BLOCK + 512);
        assert_eq!(table(&bytes, 3, 4, 10).unwrap().get(b"a").unwrap(), vec![3]);
    }

    #[test]
    fn a_stale_cut_or_damaged_table_is_refused() {
        let uids: Vec<(String, u64)> = (0..300u64).map(|i| (format!("u{i}"), i)).collect();
        let bytes = encode(KEY, 0, 300, 777, &uids).unwrap();
        assert!(table(&bytes, 0, 301, 777).is_err(), "stale end");
        assert!(table(&bytes, 0, 300, 778).is_err(), "stale length");
        assert!(
            table(&bytes[..bytes.len() - 1], 0, 300, 777).is_err(),
            "cut"
        );
        // A flipped byte anywhere is refused at load or by every lookup
        // that reads its page, never answered from.
        for at in (0..bytes.len()).step_by(7) {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            let Ok(t) = table(&bad, 0, 300, 777) else {
                continue;
            };
            assert!(at >= HEADER, "header damage at {at} loaded");
            assert!(t.entries().is_err(), "damage at {at} went unseen");
            for (uid, offset) in &uids {
                match t.get(uid.as_bytes()) {
                    Ok(found) => assert_eq!(found, vec![*offset], "damage at {at}"),
                    Err(Unfit::Damaged(_)) => {}
                    Err(Unfit::Io(e)) => panic!("{e}"),
                }
            }
        }
    }
}
