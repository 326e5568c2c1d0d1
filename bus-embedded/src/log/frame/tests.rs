//! The frame format's tests: round trips, bounded frames, compression, and
//! damaged or forged frames refused without a panic.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]
use super::*;

#[test]
fn round_trip() {
    let a = NewRecord {
        key: "k".into(),
        uid: Some("u".into()),
        tag: Some(vec![1; 32]),
        headers: Vec::new(),
        value: b"{}".to_vec(),
    };
    let b = NewRecord {
        key: String::new(),
        uid: None,
        tag: None,
        headers: Vec::new(),
        value: b"1".to_vec(),
    };
    let bytes = encode(7, 99, &[&a, &b]).unwrap();
    let prefix: [u8; PREFIX] = bytes[..PREFIX].try_into().unwrap();
    assert_eq!(body_len(&prefix) as usize, bytes.len() - PREFIX);
    let mut raw = Vec::new();
    let frame = decode(&prefix, &bytes[PREFIX..], &mut raw).unwrap();
    assert_eq!(
        (frame.base, frame.count, frame.stored_at, frame.end()),
        (7, 2, 99, 9)
    );
    let records: Vec<_> = frame.records().collect();
    assert_eq!(records[0].uid, Some(&b"u"[..]));
    assert_eq!(records[1].value, b"1");
    let mut bad = bytes.clone();
    bad[20] ^= 1;
    assert_eq!(
        decode(&prefix, &bad[PREFIX..], &mut Vec::new()).unwrap_err(),
        Fault::Checksum
    );
}

fn plain() -> Encoder {
    Encoder::new(Compression::None)
}

fn numbered(n: usize, value_bytes: usize) -> Vec<NewRecord> {
    (0..n)
        .map(|i| NewRecord {
            key: i.to_string(),
            uid: Some(format!("u{i}")),
            tag: None,
            headers: Vec::new(),
            value: vec![b'1'; value_bytes],
        })
        .collect()
}

/// Decodes every frame of `bytes` in order (the header fields; a
/// compressed frame's records are checked by `decode_records`).
fn decode_all(bytes: &[u8]) -> Vec<Frame<'_>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let prefix: [u8; PREFIX] = bytes[at..at + PREFIX].try_into().unwrap();
        let end = at + PREFIX + body_len(&prefix) as usize;
        let mut raw = Vec::new();
        let f = decode(&prefix, &bytes[at + PREFIX..end], &mut raw).unwrap();
        let records_len = f.records.len();
        out.push(Frame {
            version: f.version,
            continued: f.continued,
            lead: f.lead,
            base: f.base,
            count: f.count,
            stored_at: f.stored_at,
            codec: f.codec,
            records: if f.codec.is_some() {
                &[]
            } else {
                &bytes[end - records_len..end]
            },
        });
        at = end;
    }
    out
}

/// A record's `(key, uid, value)`, owned.
type Owned = (Vec<u8>, Option<Vec<u8>>, Vec<u8>);

/// Every record of every frame of `bytes`.
fn decode_records(bytes: &[u8]) -> Vec<Owned> {
    let mut out = Vec::new();
    let mut raw = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let prefix: [u8; PREFIX] = bytes[at..at + PREFIX].try_into().unwrap();
        let end = at + PREFIX + body_len(&prefix) as usize;
        let frame = decode(&prefix, &bytes[at + PREFIX..end], &mut raw).unwrap();
        out.extend(
            frame
                .records()
                .map(|r| (r.key.to_vec(), r.uid.map(<[u8]>::to_vec), r.value.to_vec())),
        );
        at = end;
    }
    out
}

#[test]
fn a_batch_is_split_into_bounded_frames_all_but_the_last_continued() {
    let records = numbered(1000, 200);
    let refs: Vec<&NewRecord> = records.iter().collect();
    let (bytes, positions) = encode_batch(10, 5, &refs, &mut plain()).unwrap();
    let frames = decode_all(&bytes);
    assert_eq!(frames.len(), 1000_usize.div_ceil(FRAME_RECORDS));
    assert_eq!(positions.len(), frames.len());
    let mut next = 10;
    for (i, frame) in frames.iter().enumerate() {
        assert_eq!(frame.base, next);
        assert_eq!(positions[i].0, next);
        assert_eq!(frame.continued, i + 1 < frames.len());
        assert_eq!(frame.batch_base(), 10);
        assert!(frame.count as usize <= FRAME_RECORDS);
        next = frame.end();
    }
    assert_eq!(next, 1010);
    // Large records: bounded by bytes, one oversized record alone.
    let big = numbered(3, FRAME_BYTES);
    let refs: Vec<&NewRecord> = big.iter().collect();
    let (bytes, _) = encode_batch(0, 5, &refs, &mut plain()).unwrap();
    let counts: Vec<u32> = decode_all(&bytes).iter().map(|f| f.count).collect();
    assert_eq!(counts, vec![1, 1, 1]);
    // A small batch stays one closing frame, as `encode` writes it.
    let (bytes, _) = encode_batch(0, 5, &refs[..1], &mut plain()).unwrap();
    assert_eq!(bytes, encode(0, 5, &refs[..1]).unwrap());
}

#[test]
fn version_1_frames_still_decode() {
    let records = numbered(2, 10);
    let refs: Vec<&NewRecord> = records.iter().collect();
    let mut v1 = Vec::new();
    encode_into(&mut v1, VERSION_1, false, 0, 7, 99, &refs).unwrap();
    assert_eq!(v1[PREFIX + 1], 1);
    assert!(encode_into(&mut Vec::new(), VERSION_1, true, 0, 7, 99, &refs).is_err());
    assert!(encode_into(&mut Vec::new(), VERSION_1, false, 1, 7, 99, &refs).is_err());
    assert_eq!(v1, encode(7, 99, &refs).unwrap());
    let mut v2 = Vec::new();
    encode_into(&mut v2, VERSION, false, 0, 7, 99, &refs).unwrap();
    assert_eq!(v2.len(), v1.len() + 5);
    let frame = decode_all(&v1)[0];
    assert_eq!(
        (frame.version, frame.continued, frame.base, frame.count),
        (1, false, 7, 2)
    );
    assert_eq!(peek(&v1), Some((v1.len() as u64 - PREFIX as u64, 7)));
    assert_eq!(peek(&v2), Some((v2.len() as u64 - PREFIX as u64, 7)));
    let records: Vec<_> = frame.records().collect();
    assert_eq!(records[1].uid, Some(&b"u1"[..]));
}

#[test]
fn unknown_frame_flags_are_malformed() {
    let records = numbered(1, 10);
    let mut bytes = Vec::new();
    encode_into(&mut bytes, VERSION, false, 0, 0, 1, &[&records[0]]).unwrap();
    bytes[PREFIX + 2] = 0x80;
    let crc = crc32c::crc32c(&bytes[PREFIX..]);
    bytes[4..8].copy_from_slice(&crc.to_le_bytes());
    let prefix: [u8; PREFIX] = bytes[..PREFIX].try_into().unwrap();
    assert!(matches!(
        decode(&prefix, &bytes[PREFIX..], &mut Vec::new()),
        Err(Fault::Malformed(_))
    ));
}

#[test]
fn unknown_record_flags_are_malformed() {
    // Found by the `frame_decode` fuzz target: flags 0xA5 (a UID plus
    // bits no writer sets) with a valid checksum decoded, and
    // re-encoded differently.
    let record = NewRecord {
        key: "k0".into(),
        uid: Some("u0".into()),
        tag: None,
        headers: Vec::new(),
        value: br#"{"n":0}"#.to_vec(),
    };
    let mut bytes = encode(0, 1, &[&record]).unwrap();
    let flags_at = PREFIX + BODY_HEADER_V1;
    assert_eq!(bytes[flags_at], HAS_UID);
    bytes[flags_at] = 0xA5;
    let crc = crc32c::crc32c(&bytes[PREFIX..]);
    bytes[4..8].copy_from_slice(&crc.to_le_bytes());
    let prefix: [u8; PREFIX] = bytes[..PREFIX].try_into().unwrap();
    assert!(matches!(
        decode(&prefix, &bytes[PREFIX..], &mut Vec::new()),
        Err(Fault::Malformed(_))
    ));
}

fn events(n: usize) -> Vec<NewRecord> {
    (0..n)
        .map(|i| NewRecord {
            key: format!("user-{}", i % 7),
            uid: Some(format!("evt-{i:08}")),
            tag: None,
            headers: Vec::new(),
            value: format!(
                r#"{{"kind":"login","user":"user-{}","n":{i},"ok":true}}"#,
                i % 7
            )
            .into_bytes(),
        })
        .collect()
}

#[test]
fn compressed_batches_keep_their_frames_and_records() {
    let records = events(100);
    let refs: Vec<&NewRecord> = records.iter().collect();
    let (plain_bytes, plain_positions) = encode_batch(3, 5, &refs, &mut plain()).unwrap();
    for compression in [Compression::Lz4, Compression::Zstd] {
        let mut encoder = Encoder::new(compression);
        let (bytes, positions) = encode_batch(3, 5, &refs, &mut encoder).unwrap();
        assert!(bytes.len() < plain_bytes.len(), "{compression}");
        let bases: Vec<u64> = positions.iter().map(|p| p.0).collect();
        let plain_bases: Vec<u64> = plain_positions.iter().map(|p| p.0).collect();
        assert_eq!(bases, plain_bases);
        let frames = decode_all(&bytes);
        for (i, frame) in frames.iter().enumerate() {
            assert_eq!(frame.version, VERSION);
            assert!(frame.codec.is_some());
            assert_eq!(frame.continued, i + 1 < frames.len());
            assert_eq!(frame.batch_base(), 3);
            assert_eq!(
                peek(&bytes[positions[i].1 as usize..]).unwrap().1,
                frame.base
            );
        }
        assert_eq!(decode_records(&bytes), decode_records(&plain_bytes));
        // A flipped stored byte fails the checksum, before decompression.
        let first_end = positions[1].1 as usize;
        for at in [PREFIX + 3, PREFIX + BODY_HEADER + 2, first_end - 1] {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            let prefix: [u8; PREFIX] = bad[..PREFIX].try_into().unwrap();
            assert_eq!(
                decode(&prefix, &bad[PREFIX..first_end], &mut Vec::new()).unwrap_err(),
                Fault::Checksum
            );
        }
    }
}

#[test]
fn compressed_frames_are_indexed_every_frame_records_too() {
    let interval = 4096;
    assert!(index_due(None, 0, 0, false, interval));
    // Plain frames: by bytes only, as before.
    assert!(!index_due(Some((0, 0)), 100, 4095, false, interval));
    assert!(index_due(Some((0, 0)), 100, 4096, false, interval));
    // Compressed frames: also once FRAME_RECORDS records have passed.
    let records = FRAME_RECORDS as u64;
    assert!(!index_due(Some((0, 0)), records - 1, 500, true, interval));
    assert!(index_due(Some((0, 0)), records, 500, true, interval));
    assert!(index_due(Some((0, 0)), 1, 4096, true, interval));
}

/// Every byte of a compressed frame changed and the checksum fixed (as
/// the `frame_decode` fuzz target does): decoding never panics, and
/// what decodes holds whole records.
#[test]
fn changed_compressed_frames_with_fixed_checksums_never_panic() {
    let records = events(16);
    let refs: Vec<&NewRecord> = records.iter().collect();
    for compression in [Compression::Lz4, Compression::Zstd] {
        let mut encoder = Encoder::new(compression);
        let (bytes, _) = encode_batch(0, 5, &refs, &mut encoder).unwrap();
        let mut raw = Vec::new();
        for at in PREFIX..bytes.len() {
            for flip in [0x01, 0x80, 0xFF] {
                let mut bad = bytes.clone();
                bad[at] ^= flip;
                let crc = crc32c::crc32c(&bad[PREFIX..]);
                bad[4..8].copy_from_slice(&crc.to_le_bytes());
                let prefix: [u8; PREFIX] = bad[..PREFIX].try_into().unwrap();
                if let Ok(frame) = decode(&prefix, &bad[PREFIX..], &mut raw) {
                    assert_eq!(frame.records().count(), frame.count as usize);
                }
            }
        }
    }
}

/// Recovery takes a segment ending in a zero byte for zeros written
/// ahead; compressed frames, like plain ones, end in a non-zero byte.
#[test]
fn compressed_frames_never_end_in_a_zero_byte() {
    // Random hex values: zstd stores them as literals only, a block
    // that ends in a zero byte (a sequence count of 0) before the end
    // marker.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let hex: Vec<NewRecord> = (0..64)
        .map(|i| {
            let digits: String = (0..300)
                .map(|_| {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1);
                    char::from(b"0123456789abcdef"[(state >> 60) as usize])
                })
                .collect();
            NewRecord {
                key: "k".to_owned(),
                uid: None,
                tag: None,
                headers: Vec::new(),
                value: format!(r#"{{"trace":"{digits}","n":{i}}}"#).into_bytes(),
            }
        })
        .collect();
    let (mut compressed, mut zero_before_end) = (0, 0);
    for n in 1..=128 {
        let records = if n <= 64 {
            events(n)
        } else {
            hex[..n - 64].to_vec()
        };
        let refs: Vec<&NewRecord> = records.iter().collect();
        for compression in [Compression::Lz4, Compression::Zstd] {
            let mut encoder = Encoder::new(compression);
            let (bytes, positions) = encode_batch(0, 5, &refs, &mut encoder).unwrap();
            for (i, &(_, at, packed)) in positions.iter().enumerate() {
                let end = positions.get(i + 1).map_or(bytes.len(), |p| p.1 as usize);
                compressed += usize::from(packed);
                assert_ne!(
                    bytes[end - 1],
                    0,
                    "{compression}, {n} records, frame at {at}"
                );
                // Without the end byte, this frame would end in zero.
                zero_before_end += usize::from(packed && bytes[end - 2] == 0);
            }
        }
    }
    assert!(compressed > 100, "{compressed} frames compressed");
    assert!(zero_before_end > 0, "no compressed records ended in zero");
}

#[test]
fn records_that_do_not_shrink_are_stored_uncompressed() {
    let record = NewRecord {
        key: "k".into(),
        uid: None,
        tag: None,
        headers: Vec::new(),
        value: b"1".to_vec(),
    };
    let mut encoder = Encoder::new(Compression::Zstd);
    let (bytes, _) = encode_batch(0, 5, &[&record], &mut encoder).unwrap();
    assert_eq!(bytes, encode(0, 5, &[&record]).unwrap());
}

/// A compressed frame of `records` with its section replaced by
/// `codec`, `raw_len` and `packed`, the checksum fixed.
fn forged(codec: u8, raw_len: u32, packed: &[u8]) -> Vec<u8> {
    let mut bytes = vec![0; PREFIX];
    bytes.extend_from_slice(&[MAGIC, VERSION, COMPRESSED]);
    bytes.extend_from_slice(&7u64.to_le_bytes());
    bytes.extend_from_slice(&1u32.to_le_bytes());
    bytes.extend_from_slice(&9u64.to_le_bytes());
    bytes.extend_from_slice(&0u32.to_le_bytes());
    assert_eq!(bytes.len(), PREFIX + BODY_HEADER);
    bytes.push(codec);
    bytes.extend_from_slice(&raw_len.to_le_bytes());
    bytes.extend_from_slice(packed);
    bytes.push(COMPRESSED_END);
    refixed(bytes)
}

/// `bytes` with the frame's length and checksum made right again.
fn refixed(mut bytes: Vec<u8>) -> Vec<u8> {
    let len = (bytes.len() - PREFIX) as u32;
    bytes[..4].copy_from_slice(&len.to_le_bytes());
    let crc = crc32c::crc32c(&bytes[PREFIX..]);
    bytes[4..8].copy_from_slice(&crc.to_le_bytes());
    bytes
}

#[test]
fn bad_compressed_sections_with_a_valid_checksum_are_malformed() {
    let records = events(3);
    let refs: Vec<&NewRecord> = records.iter().collect();
    let mut raw = Vec::new();
    put_records(&mut raw, &refs[..1]).unwrap();
    let packed = lz4_flex::block::compress(&raw);
    let raw_len = raw.len() as u32;
    let malformed = |bytes: &[u8]| {
        let prefix: [u8; PREFIX] = bytes[..PREFIX].try_into().unwrap();
        let mut raw = Vec::new();
        let decoded = decode(&prefix, &bytes[PREFIX..], &mut raw);
        matches!(decoded, Err(Fault::Malformed(_)))
    };
    // The well-formed forgery decodes (so the others fail for their fault).
    let good = forged(crate::log::codec::LZ4, raw_len, &packed);
    let prefix: [u8; PREFIX] = good[..PREFIX].try_into().unwrap();
    let mut buffer = Vec::new();
    let frame = decode(&prefix, &good[PREFIX..], &mut buffer).unwrap();
    assert_eq!(frame.codec, Some(crate::log::codec::LZ4));
    assert_eq!(
        frame.records().next().unwrap().value,
        records[0].value.as_slice()
    );
    // Three records where the header announces one: trailing bytes.
    let mut three = Vec::new();
    put_records(&mut three, &refs).unwrap();
    let three = forged(
        crate::log::codec::LZ4,
        three.len() as u32,
        &lz4_flex::block::compress(&three),
    );
    assert!(malformed(&three), "trailing records");
    // Without its end byte, or with another one.
    let mut cut = good.clone();
    cut.pop();
    assert!(malformed(&refixed(cut)), "no end byte");
    let mut other = good.clone();
    *other.last_mut().unwrap() = 0;
    assert!(malformed(&refixed(other)), "end byte zero");
    // Two records announcing more than a frame of several holds.
    let mut two = forged(crate::log::codec::LZ4, (FRAME_BYTES + 1) as u32, &packed);
    two[PREFIX + 11..PREFIX + 15].copy_from_slice(&2u32.to_le_bytes());
    assert!(malformed(&refixed(two)), "several records over FRAME_BYTES");
    assert!(malformed(&forged(9, raw_len, &packed)), "unknown codec");
    assert!(
        malformed(&forged(crate::log::codec::LZ4, raw_len - 1, &packed)),
        "short raw_len"
    );
    assert!(
        malformed(&forged(crate::log::codec::LZ4, raw_len + 1, &packed)),
        "long raw_len"
    );
    assert!(
        malformed(&forged(crate::log::codec::LZ4, u32::MAX, &packed)),
        "over MAX_BODY"
    );
    assert!(
        malformed(&forged(crate::log::codec::ZSTD, raw_len, &packed)),
        "wrong codec"
    );
    assert!(
        malformed(&forged(
            crate::log::codec::LZ4,
            raw_len,
            &packed[..packed.len() / 2]
        )),
        "cut"
    );
    let mut short = forged(crate::log::codec::LZ4, raw_len, &[]);
    short.truncate(PREFIX + BODY_HEADER + 2);
    let len = (short.len() - PREFIX) as u32;
    short[..4].copy_from_slice(&len.to_le_bytes());
    let crc = crc32c::crc32c(&short[PREFIX..]);
    short[4..8].copy_from_slice(&crc.to_le_bytes());
    assert!(malformed(&short), "no room for codec and raw_len");
}

/// C25: a record with headers sets record flag bit 2 and reads them back;
/// a record without them is encoded exactly as before headers existed (the
/// same bytes as a frame written by hand in the old layout), so old
/// segments read unchanged.
#[test]
fn headers_round_trip_and_records_without_them_keep_their_bytes() {
    let headers = bus_core::Headers::try_from_pairs([("trace", "t-1"), ("ü", "x")]);
    assert!(headers.is_err(), "names are ASCII");
    let headers = bus_core::Headers::try_from_pairs([("trace", "t-1"), ("empty", "")]).unwrap();
    let with = NewRecord {
        key: "k".into(),
        uid: None,
        tag: Some(vec![2; 32]),
        headers: encode_headers(&headers).unwrap(),
        value: b"{}".to_vec(),
    };
    let without = NewRecord {
        headers: Vec::new(),
        ..with.clone()
    };
    let bytes = encode(0, 1, &[&with, &without]).unwrap();
    let prefix: [u8; PREFIX] = bytes[..PREFIX].try_into().unwrap();
    let mut raw = Vec::new();
    let frame = decode(&prefix, &bytes[PREFIX..], &mut raw).unwrap();
    let records: Vec<_> = frame.records().collect();
    let read = decode_headers(records[0].headers.unwrap()).unwrap();
    assert_eq!(read, headers);
    assert_eq!(records[0].value, b"{}");
    assert_eq!(records[1].headers, None);
    // The old layout of the record without headers, written by hand.
    let mut old = vec![HAS_TAG];
    old.extend_from_slice(&1u32.to_le_bytes());
    old.extend_from_slice(b"k");
    old.extend_from_slice(&32u16.to_le_bytes());
    old.extend_from_slice(&[2; 32]);
    old.extend_from_slice(&2u32.to_le_bytes());
    old.extend_from_slice(b"{}");
    assert!(
        bytes.ends_with(&old),
        "a record without headers keeps the old bytes"
    );
    // A headers block that does not parse makes the frame malformed.
    for bad in [vec![1, 0], vec![1, 0, 5, 0, b'a'], vec![0, 0, 0]] {
        let forged = NewRecord {
            headers: bad,
            ..with.clone()
        };
        let bytes = encode(0, 1, &[&forged]).unwrap();
        let prefix: [u8; PREFIX] = bytes[..PREFIX].try_into().unwrap();
        assert!(matches!(
            decode(&prefix, &bytes[PREFIX..], &mut Vec::new()),
            Err(Fault::Malformed(_))
        ));
    }
}

/// A headers block has one encoding, the one `encode_headers` writes: a
/// block naming no headers, or names out of order or repeated, is refused
/// (the frame is malformed), so a frame that decodes re-encodes to its own
/// bytes (the fuzz target `frame_decode` found a frame whose headers block
/// decoded but differed from what its headers encode to).
#[test]
fn only_the_canonical_headers_block_decodes() {
    fn block(pairs: &[(&str, &str)]) -> Vec<u8> {
        let mut out = u16::try_from(pairs.len()).unwrap().to_le_bytes().to_vec();
        for (name, value) in pairs {
            for text in [name, value] {
                out.extend_from_slice(&u16::try_from(text.len()).unwrap().to_le_bytes());
                out.extend_from_slice(text.as_bytes());
            }
        }
        out
    }
    let sorted = block(&[("a", "1"), ("b", "2")]);
    let headers = decode_headers(&sorted).unwrap();
    assert_eq!(encode_headers(&headers).unwrap(), sorted);
    for bad in [
        block(&[]),
        block(&[("b", "2"), ("a", "1")]),
        block(&[("a", "1"), ("a", "2")]),
    ] {
        assert!(decode_headers(&bad).is_none(), "{bad:?}");
        let forged = NewRecord {
            key: "k".into(),
            uid: None,
            tag: None,
            headers: bad,
            value: b"{}".to_vec(),
        };
        let bytes = encode(0, 1, &[&forged]).unwrap();
        let prefix: [u8; PREFIX] = bytes[..PREFIX].try_into().unwrap();
        assert!(matches!(
            decode(&prefix, &bytes[PREFIX..], &mut Vec::new()),
            Err(Fault::Malformed(_))
        ));
    }
}
