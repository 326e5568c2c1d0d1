//! Arbitrary bytes as an embedded-log frame: decoding never panics (nor
//! allocates past what a compressed section can expand to), a frame that
//! decodes is found by the resync scan's `peek`, and re-encoding its
//! records gives back exactly its bytes (one encoding per plain frame; a
//! compressed one re-encodes to a frame of the same records).
#![no_main]

use bus_core::Compression;
use bus_embedded::fuzzing::{self, FRAME_PREFIX};
use bus_fuzz::{encodable, fix_frame_crc};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut bytes = rest.to_vec();
    // Half the inputs get a valid checksum, so mutations reach the parser.
    if mode & 1 == 1 {
        fix_frame_crc(&mut bytes);
    }
    let _ = fuzzing::peek_frame(&bytes);
    let Ok(frame) = fuzzing::decode_frame(&bytes) else {
        return;
    };
    assert_eq!(frame.records.len(), frame.count as usize);
    assert_eq!(
        fuzzing::peek_frame(&bytes),
        Some(((frame.len - FRAME_PREFIX) as u64, frame.base)),
        "a valid frame must look like one to the resync scan"
    );
    let records: Option<Vec<_>> = frame.records.iter().map(encodable).collect();
    if let (Some(records), Some(codec)) = (&records, frame.codec) {
        // Another encoder may compress the same records differently.
        let compression = if codec == 1 {
            Compression::Lz4
        } else {
            Compression::Zstd
        };
        let again = fuzzing::encode_frame_compressed(
            compression,
            frame.continued,
            frame.lead,
            frame.base,
            frame.stored_at,
            records,
        )
        .expect("a decoded frame encodes");
        let back = fuzzing::decode_frame(&again).expect("a re-encoded frame decodes");
        assert_eq!(back.records, frame.records);
        assert_eq!((back.base, back.count), (frame.base, frame.count));
        return;
    }
    if let Some(records) = records {
        let again = fuzzing::encode_frame_as(
            frame.version,
            frame.continued,
            frame.lead,
            frame.base,
            frame.stored_at,
            &records,
        )
        .expect("a decoded frame encodes");
        assert_eq!(again, bytes[..frame.len], "decode is not canonical");
    }
});
