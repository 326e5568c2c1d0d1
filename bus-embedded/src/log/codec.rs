//! Frame compression: the codecs a compressed frame may name, the writer's
//! compressor (its buffers and zstd context kept across frames), and
//! decompression bounded by the length the frame announces.

use std::cell::RefCell;

use bus_core::Compression;

/// Codec byte of an LZ4 block.
pub(crate) const LZ4: u8 = 1;
/// Codec byte of a Zstandard frame.
pub(crate) const ZSTD: u8 = 2;

/// The codec byte a topic's setting writes, `None` when it stores records as they are.
pub(crate) fn codec_of(compression: Compression) -> Option<u8> {
    match compression {
        Compression::None => None,
        Compression::Lz4 => Some(LZ4),
        Compression::Zstd => Some(ZSTD),
    }
}

/// What the writer of a partition compresses with.
pub(crate) struct Encoder {
    compression: Compression,
    /// The records of the frame being written, before compression.
    pub(crate) raw: Vec<u8>,
    /// Made on first use and kept: a zstd context costs more to set up
    /// than a small frame costs to compress.
    zstd: Option<zstd::bulk::Compressor<'static>>,
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder")
            .field("compression", &self.compression)
            .finish_non_exhaustive()
    }
}

impl Encoder {
    pub(crate) fn new(compression: Compression) -> Self {
        Self {
            compression,
            raw: Vec::new(),
            zstd: None,
        }
    }

    /// The topic's setting.
    pub(crate) fn compression(&self) -> Compression {
        self.compression
    }

    /// Applies to the frames written from now on.
    pub(crate) fn set(&mut self, compression: Compression) {
        self.compression = compression;
    }

    /// Appends [`Encoder::raw`] compressed to `out` and returns the codec
    /// byte, or leaves `out` as it was and returns `None` when the topic
    /// does not compress or the compressor fails.
    pub(crate) fn compress_raw(&mut self, out: &mut Vec<u8>) -> Option<u8> {
        let codec = codec_of(self.compression)?;
        let start = out.len();
        let written = match codec {
            LZ4 => {
                out.resize(
                    start + lz4_flex::block::get_maximum_output_size(self.raw.len()),
                    0,
                );
                lz4_flex::block::compress_into(&self.raw, &mut out[start..]).ok()
            }
            _ => {
                if self.zstd.is_none() {
                    self.zstd = zstd::bulk::Compressor::new(zstd::DEFAULT_COMPRESSION_LEVEL).ok();
                }
                let compressor = self.zstd.as_mut()?;
                out.resize(start + zstd::zstd_safe::compress_bound(self.raw.len()), 0);
                compressor
                    .compress_to_buffer(&self.raw, &mut out[start..])
                    .ok()
            }
        };
        match written {
            Some(n) => {
                out.truncate(start + n);
                Some(codec)
            }
            None => {
                out.truncate(start);
                None
            }
        }
    }
}

thread_local! {
    /// This thread's zstd decompression context, reused by every frame it
    /// reads (set up once, not per frame or per fetch).
    static ZSTD_READER: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
}

/// Decompresses `packed` into `out`, which ends up exactly `raw_len`
/// bytes long. Nothing is allocated beyond `raw_len` bytes, so a frame that
/// announces little and expands to much is refused, not followed; an
/// unknown codec, an oversized `raw_len`, a decompression error or a length
/// other than `raw_len` are all refused with the reason (the caller's
/// malformed frame). `limit` is the most any frame may announce.
pub(crate) fn decompress(
    codec: u8,
    packed: &[u8],
    raw_len: u32,
    limit: u64,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    if u64::from(raw_len) > limit {
        return Err(format!("compressed records announce {raw_len} bytes"));
    }
    // The most a codec's format can expand `packed` to: an LZ4 block
    // spends at least one byte per 255 bytes of output, a zstd block at
    // least four per 128 KiB. A frame announcing more is refused before
    // anything is allocated, so a few stored bytes never cost gigabytes.
    let most = match codec {
        LZ4 => packed.len().saturating_mul(255).saturating_add(64),
        ZSTD => packed.len().saturating_mul(1 << 15).saturating_add(1 << 17),
        _ => return Err(format!("unknown codec {codec}")),
    };
    let raw_len = usize::try_from(raw_len).map_err(|e| e.to_string())?;
    if raw_len > most {
        return Err(format!(
            "{} compressed bytes announce {raw_len} bytes, more than the codec can expand them to",
            packed.len()
        ));
    }
    out.clear();
    out.resize(raw_len, 0);
    let written = if codec == LZ4 {
        lz4_flex::block::decompress_into(packed, out).map_err(|e| format!("lz4: {e}"))?
    } else {
        ZSTD_READER.with(|cell| {
            let mut cell = cell.borrow_mut();
            if cell.is_none() {
                *cell = Some(
                    zstd::bulk::Decompressor::new().map_err(|e| format!("zstd context: {e}"))?,
                );
            }
            let Some(decompressor) = cell.as_mut() else {
                return Err("zstd context".to_owned());
            };
            decompressor
                .decompress_to_buffer(packed, out.as_mut_slice())
                .map_err(|e| format!("zstd: {e}"))
        })?
    };
    if written != raw_len {
        return Err(format!(
            "records decompress to {written} bytes, not the {raw_len} announced"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A frame's limit (`frame::MAX_BODY`).
    const LIMIT: u64 = 1 << 31;

    fn packed(compression: Compression, raw: &[u8]) -> (u8, Vec<u8>) {
        let mut encoder = Encoder::new(compression);
        encoder.raw = raw.to_vec();
        let mut out = vec![9];
        let codec = encoder.compress_raw(&mut out).unwrap();
        assert_eq!(out[0], 9, "appends");
        (codec, out[1..].to_vec())
    }

    #[test]
    fn both_codecs_round_trip_into_a_reused_buffer() {
        let raw: Vec<u8> = br#"{"kind":"login","user":"alice"}"#.repeat(50);
        let mut out = Vec::new();
        for compression in [Compression::Lz4, Compression::Zstd] {
            let (codec, bytes) = packed(compression, &raw);
            assert!(bytes.len() < raw.len() / 4, "{compression}");
            decompress(
                codec,
                &bytes,
                u32::try_from(raw.len()).unwrap(),
                LIMIT,
                &mut out,
            )
            .unwrap();
            assert_eq!(out, raw);
        }
        assert_eq!(Encoder::new(Compression::None).compress_raw(&mut out), None);
    }

    #[test]
    fn a_wrong_length_or_codec_is_malformed_never_followed() {
        let raw = vec![b'a'; 10_000];
        let mut out = Vec::new();
        for compression in [Compression::Lz4, Compression::Zstd] {
            let (codec, bytes) = packed(compression, &raw);
            // Announcing less than it expands to: refused within the bound.
            let mut fresh = Vec::new();
            let short = decompress(codec, &bytes, 100, LIMIT, &mut fresh);
            assert!(short.is_err(), "{compression}");
            assert!(
                fresh.capacity() < 1000,
                "allocated past the announced length"
            );
            let long = decompress(codec, &bytes, 20_000, LIMIT, &mut out);
            assert!(long.is_err(), "{compression}");
            let cut = decompress(codec, &bytes[..bytes.len() / 2], 10_000, LIMIT, &mut out);
            assert!(cut.is_err(), "{compression}");
        }
        assert!(decompress(7, b"x", 1, LIMIT, &mut out).is_err());
        assert!(decompress(LZ4, b"x", u32::MAX, LIMIT, &mut out).is_err());
        // A few bytes announcing megabytes: refused before allocating.
        let mut fresh = Vec::new();
        for codec in [LZ4, ZSTD] {
            let bomb = decompress(codec, &[0; 8], 64 << 20, LIMIT, &mut fresh);
            assert!(bomb.is_err());
            assert_eq!(fresh.capacity(), 0);
        }
    }

    #[test]
    fn the_expansion_bound_admits_what_the_codecs_write() {
        // Runs of one byte compress the most.
        let raw = vec![0u8; 4 << 20];
        let mut out = Vec::new();
        for compression in [Compression::Lz4, Compression::Zstd] {
            let (codec, bytes) = packed(compression, &raw);
            decompress(
                codec,
                &bytes,
                u32::try_from(raw.len()).unwrap(),
                LIMIT,
                &mut out,
            )
            .unwrap();
            assert_eq!(out.len(), raw.len(), "{compression}");
        }
    }
}
