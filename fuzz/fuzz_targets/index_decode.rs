//! Arbitrary bytes as a sealed segment's `.idx` or `.uids` hint file:
//! decoding never panics, what decodes is consistent with the segment it
//! was checked against, and re-encoding it gives back the same bytes.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use bus_embedded::fuzzing;
use bus_fuzz::fix_trailing_crc;
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Header {
    uids: bool,
    fix_crc: bool,
    /// Take base and length/end from the file itself (so they match).
    from_file: bool,
    base: u64,
    bound: u64,
}

fn word(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(header) = Header::arbitrary(&mut u) else {
        return;
    };
    let mut bytes = u.take_rest().to_vec();
    if header.fix_crc {
        fix_trailing_crc(&mut bytes);
    }
    if header.uids {
        let (base, end) = if header.from_file {
            (word(&bytes, 4).unwrap_or(0), word(&bytes, 12).unwrap_or(0))
        } else {
            (header.base, header.bound)
        };
        let Some(uids) = fuzzing::decode_uids(&bytes, base, end) else {
            return;
        };
        assert!(uids.iter().all(|&(_, o)| o >= base && o < end));
        assert_eq!(fuzzing::encode_uids(base, end, &uids), bytes);
    } else {
        let (base, len) = if header.from_file {
            (word(&bytes, 4).unwrap_or(0), word(&bytes, 20).unwrap_or(0))
        } else {
            (header.base, header.bound)
        };
        let Some(index) = fuzzing::decode_index(&bytes, base, len) else {
            return;
        };
        assert_eq!(index.len, len);
        assert!(index.end >= base);
        assert!(
            index
                .entries
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1)
        );
        assert!(
            index
                .entries
                .iter()
                .all(|&(o, p)| o >= base && o < index.end && p < len)
        );
        if index.end > base {
            assert_eq!(index.entries.first(), Some(&(base, 0)));
            // Every offset of the segment has a place to start reading.
            for offset in [base, index.end - 1, base + (index.end - base) / 2] {
                let (start, pos) = fuzzing::index_floor(&index, offset);
                assert!(start <= offset && pos < len);
            }
        }
        assert_eq!(fuzzing::encode_index(base, &index), bytes);
    }
});
