//! A sealed segment's UID table (`<base>.uids`, see `uidtable`): arbitrary
//! bytes (with the header CRC fixed up so mutations reach the filter and
//! pages) never panic a load or lookup, and whatever answers stays inside
//! the segment and agrees with the table's own entries; a table encoded
//! from arbitrary UIDs finds each at exactly its offsets and nothing else.
#![no_main]

use std::collections::BTreeMap;
use std::io::Write as _;

use arbitrary::{Arbitrary, Unstructured};
use bus_embedded::fuzzing::{FuzzUidTable, encode_uid_table};
use bus_fuzz::scratch_root;
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
enum Input {
    /// Bytes as a table file of the segment its header names.
    Bytes {
        fix_header_crc: bool,
        fix_page_crc: bool,
        probes: Vec<String>,
        bytes: Vec<u8>,
    },
    /// A table encoded from these UIDs (offsets taken modulo the segment,
    /// one UID per offset).
    Encoded {
        key: (u64, u64),
        base: u32,
        span: u16,
        uids: Vec<(String, u16)>,
        probes: Vec<String>,
    },
}

fn word(bytes: &[u8], at: usize) -> u64 {
    bytes
        .get(at..at + 8)
        .map_or(0, |w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
}

fn load(bytes: &[u8], base: u64, end: u64, log_len: u64) -> Option<FuzzUidTable> {
    let path = scratch_root().join(format!("bus-fuzz-uid-table-{}", std::process::id()));
    let mut file = std::fs::File::create(&path).ok()?;
    file.write_all(bytes).ok()?;
    drop(file);
    let table = FuzzUidTable::load(std::fs::File::open(&path).ok()?, base, end, log_len);
    let _ = std::fs::remove_file(&path);
    table
}

fuzz_target!(|data: &[u8]| {
    let Ok(input) = Input::arbitrary(&mut Unstructured::new(data)) else {
        return;
    };
    match input {
        Input::Bytes {
            fix_header_crc,
            fix_page_crc,
            probes,
            mut bytes,
        } => {
            // The header CRC of either format: "BUT1" (72 bytes, CRC at
            // 68) or "BUT2" (88 bytes, with the key; CRC at 84).
            let head = if bytes.starts_with(b"BUT1") { 72 } else { 88 };
            if fix_header_crc && bytes.len() >= head {
                let crc = crc32c::crc32c(&bytes[..head - 4]);
                bytes[head - 4..head].copy_from_slice(&crc.to_le_bytes());
            }
            let (base, end, log_len) = (word(&bytes, 8), word(&bytes, 16), word(&bytes, 24));
            if fix_page_crc && bytes.len() >= head {
                // The first page, wherever the header puts it.
                let page = u32::from_le_bytes(bytes[4..8].try_into().unwrap_or_default());
                let at = head.saturating_add(
                    usize::try_from(word(&bytes, 48).saturating_mul(64)).unwrap_or(usize::MAX),
                );
                let page_end = at.saturating_add(page as usize);
                if page >= 8 && page_end <= bytes.len() {
                    let crc = crc32c::crc32c(&bytes[at + 4..page_end]);
                    bytes[at..at + 4].copy_from_slice(&crc.to_le_bytes());
                }
            }
            let Some(table) = load(&bytes, base, end, log_len) else {
                return;
            };
            let entries = table.entries();
            if let Some(entries) = &entries {
                assert!(entries.iter().all(|&(_, o)| o >= base && o < end));
                assert!(entries.windows(2).all(|w| w[0].1 <= w[1].1));
            }
            let mut asked: Vec<String> = probes;
            if let Some(entries) = &entries {
                asked.extend(entries.iter().take(16).map(|(u, _)| u.clone()));
            }
            for uid in asked {
                let Some(found) = table.get(uid.as_bytes()) else {
                    continue;
                };
                assert!(found.iter().all(|&o| o >= base && o < end));
                assert!(found.windows(2).all(|w| w[0] <= w[1]));
                if let Some(entries) = &entries {
                    // A lookup never invents an offset the table lacks.
                    for offset in &found {
                        assert!(entries.iter().any(|(u, o)| u == &uid && o == offset));
                    }
                }
            }
        }
        Input::Encoded {
            key,
            base,
            span,
            uids,
            probes,
        } => {
            let base = u64::from(base);
            let span = u64::from(span).max(1);
            let end = base + span;
            let mut uids: Vec<(String, u64)> = uids
                .into_iter()
                .map(|(u, o)| (u, base + u64::from(o) % span))
                .collect();
            // A record has one UID at most, so an offset appears once.
            uids.sort_by_key(|&(_, o)| o);
            uids.dedup_by_key(|(_, o)| *o);
            let Some(bytes) = encode_uid_table(key, base, end, 4242, &uids) else {
                assert!(uids.iter().any(|(u, _)| u.len() > 4000));
                return;
            };
            let table = load(&bytes, base, end, 4242).expect("an encoded table loads");
            let mut want: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
            for (uid, offset) in &uids {
                want.entry(uid).or_default().push(*offset);
            }
            for (uid, offsets) in &want {
                let mut offsets = offsets.clone();
                offsets.sort_unstable();
                assert_eq!(table.get(uid.as_bytes()), Some(offsets));
            }
            for probe in &probes {
                if !want.contains_key(probe.as_str()) {
                    assert_eq!(table.get(probe.as_bytes()), Some(Vec::new()));
                }
            }
            assert_eq!(table.entries().map(|e| e.len()), Some(uids.len()));
        }
    }
});
