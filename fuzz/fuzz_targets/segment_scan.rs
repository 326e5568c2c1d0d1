//! A segment file made of valid frames, garbage and zeros, through the
//! verifying scan recovery runs: never a panic, and what it reports is
//! consistent (valid bytes within the file, every record of a clean run of
//! frames found, the resync scan only landing on frames that verify).
#![no_main]

use std::io::Write;

use arbitrary::Arbitrary;
use bus_embedded::fuzzing::{self, Record};
use bus_fuzz::{ArbRecord, fix_frame_crc, scratch_root};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
enum Chunk {
    /// A frame at the expected base (plus `skew`).
    Frame {
        skew: i8,
        stored_at: u64,
        records: Vec<ArbRecord>,
    },
    /// Bytes with a frame's checksum fixed up.
    Framed(Vec<u8>),
    Raw(Vec<u8>),
    Zeros(u16),
}

#[derive(Debug, Arbitrary)]
struct Input {
    base: u16,
    index_interval: u16,
    chunks: Vec<Chunk>,
}

fuzz_target!(|input: Input| {
    let base = u64::from(input.base);
    let mut bytes = Vec::new();
    let mut next = base;
    let mut clean = true;
    let mut uids = Vec::new();
    for chunk in input.chunks {
        match chunk {
            Chunk::Frame {
                skew,
                stored_at,
                records,
            } => {
                let frame_base = next.saturating_add_signed(i64::from(skew));
                let records: Vec<Record> = records.into_iter().map(Into::into).collect();
                let Ok(frame) = fuzzing::encode_frame(frame_base, stored_at, &records) else {
                    continue;
                };
                if skew != 0 || records.is_empty() {
                    clean = false;
                }
                for (i, record) in records.iter().enumerate() {
                    if let Some(uid) = &record.uid {
                        uids.push((uid.clone(), frame_base + i as u64));
                    }
                }
                next = frame_base.saturating_add(records.len() as u64);
                bytes.extend_from_slice(&frame);
            }
            Chunk::Framed(mut raw) => {
                fix_frame_crc(&mut raw);
                clean = false;
                bytes.extend_from_slice(&raw);
            }
            Chunk::Raw(raw) => {
                clean &= raw.is_empty();
                bytes.extend_from_slice(&raw);
            }
            Chunk::Zeros(n) => {
                clean &= n == 0;
                bytes.resize(bytes.len() + usize::from(n), 0);
            }
        }
    }
    let mut file = tempfile::tempfile_in(scratch_root()).expect("scratch file");
    file.write_all(&bytes).expect("write");
    let interval = u64::from(input.index_interval).max(1);
    let scan = fuzzing::scan_segment(&file, base, interval).expect("scan");
    let len = bytes.len() as u64;
    assert!(scan.valid_len <= len);
    if scan.fault.is_none() {
        assert_eq!(scan.valid_len, len);
    }
    assert!(scan.end >= base);
    assert!(
        scan.index
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1)
    );
    if scan.end > base {
        assert_eq!(scan.index.first(), Some(&(base, 0)));
    }
    assert!(scan.uids.iter().all(|&(_, o)| o >= base && o < scan.end));
    if clean {
        assert_eq!(scan.fault, None);
        assert_eq!(scan.end, next);
        assert_eq!(scan.uids, uids);
    }
    if let Some((pos, found)) = fuzzing::next_verified_frame(&file, 0, len, 0).expect("resync") {
        let frame = fuzzing::decode_frame(&bytes[pos as usize..]).expect("resync found a frame");
        assert_eq!(frame.base, found);
        assert!(frame.count > 0);
    }
});
