//! Arbitrary records through the frame encoder, plain or compressed (lz4,
//! zstd): what encodes decodes to the same records, trailing bytes are not
//! read, and any changed byte is detected.
#![no_main]

use arbitrary::Arbitrary;
use bus_core::Compression;
use bus_embedded::fuzzing::{self, Record};
use bus_fuzz::{ArbRecord, decoded};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Input {
    base: u64,
    stored_at: u64,
    records: Vec<ArbRecord>,
    trailing: Vec<u8>,
    flip_at: u32,
    flip: u8,
    /// 0 plain, 1 lz4, 2 zstd (others plain).
    compression: u8,
}

fuzz_target!(|input: Input| {
    let records: Vec<Record> = input.records.into_iter().map(Into::into).collect();
    let encoded = match input.compression {
        1 | 2 => fuzzing::encode_frame_compressed(
            if input.compression == 1 {
                Compression::Lz4
            } else {
                Compression::Zstd
            },
            false,
            0,
            input.base,
            input.stored_at,
            &records,
        ),
        _ => fuzzing::encode_frame(input.base, input.stored_at, &records),
    };
    let Ok(mut bytes) = encoded else {
        // Only a tag over u16::MAX bytes (or a frame over 2 GiB) is refused.
        assert!(records.iter().any(|r| {
            r.tag
                .as_ref()
                .is_some_and(|t| t.len() > usize::from(u16::MAX))
        }));
        return;
    };
    let len = bytes.len();
    bytes.extend_from_slice(&input.trailing);
    let frame = fuzzing::decode_frame(&bytes).expect("an encoded frame decodes");
    assert_eq!(frame.len, len);
    assert_eq!(
        (frame.base, frame.count as usize, frame.stored_at),
        (input.base, records.len(), input.stored_at)
    );
    assert_eq!(
        frame.records,
        records.iter().map(decoded).collect::<Vec<_>>()
    );
    if input.flip != 0 {
        let at = input.flip_at as usize % len;
        bytes[at] ^= input.flip;
        let changed = fuzzing::decode_frame(&bytes);
        // A changed length may still frame a verifying body only by a
        // checksum collision; anything else must fail.
        assert!(
            changed.is_err(),
            "undetected change at byte {at}: {changed:?}"
        );
    }
});
