//! Shared pieces of the fuzz targets: arbitrary records, checksum fix-ups
//! (so mutations reach the parsers behind a CRC) and scratch files on tmpfs.

use arbitrary::Arbitrary;
use bus_embedded::fuzzing::{DecodedRecord, Record};

/// A record the fuzzer builds field by field.
#[derive(Debug, Clone, Arbitrary)]
pub struct ArbRecord {
    /// Partition key.
    pub key: String,
    /// Event UID.
    pub uid: Option<String>,
    /// Authentication tag.
    pub tag: Option<Vec<u8>>,
    /// Value bytes.
    pub value: Vec<u8>,
}

impl From<ArbRecord> for Record {
    fn from(r: ArbRecord) -> Self {
        Record {
            key: r.key,
            uid: r.uid,
            tag: r.tag,
            headers: Vec::new(),
            value: r.value,
        }
    }
}

/// The decoded form of an encoded record.
pub fn decoded(r: &Record) -> DecodedRecord {
    DecodedRecord {
        key: r.key.as_bytes().to_vec(),
        uid: r.uid.as_ref().map(|u| u.as_bytes().to_vec()),
        tag: r.tag.clone(),
        headers: r.headers.clone(),
        value: r.value.clone(),
    }
}

/// A decoded record back as an encodable one, when its text fields are UTF-8.
pub fn encodable(r: &DecodedRecord) -> Option<Record> {
    Some(Record {
        key: String::from_utf8(r.key.clone()).ok()?,
        uid: match &r.uid {
            Some(uid) => Some(String::from_utf8(uid.clone()).ok()?),
            None => None,
        },
        tag: r.tag.clone(),
        headers: r.headers.clone(),
        value: r.value.clone(),
    })
}

/// Rewrites the CRC of the frame at the start of `bytes` (prefix bytes 4..8
/// over the body its length announces, or over all that follows).
pub fn fix_frame_crc(bytes: &mut [u8]) {
    if bytes.len() < 8 {
        return;
    }
    let len = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
    let end = 8usize.saturating_add(len).min(bytes.len());
    let crc = crc32c::crc32c(&bytes[8..end]);
    bytes[4..8].copy_from_slice(&crc.to_le_bytes());
}

/// Rewrites the trailing CRC of an index or UID file.
pub fn fix_trailing_crc(bytes: &mut [u8]) {
    let Some(split) = bytes.len().checked_sub(4) else {
        return;
    };
    let crc = crc32c::crc32c(&bytes[..split]);
    bytes[split..].copy_from_slice(&crc.to_le_bytes());
}

/// Where scratch files go: tmpfs when there is one, so fsync is free.
pub fn scratch_root() -> std::path::PathBuf {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// Writes seed inputs for the byte-level targets under `corpus/`: each
/// frame of the segments the real bus wrote (for `frame_decode`) and their
/// `.idx` / `.uids` hint files (for `index_decode`), in the layout those
/// targets read.
pub fn write_seeds(
    corpus: &std::path::Path,
    prefix: &str,
    files: &std::collections::BTreeMap<std::path::PathBuf, Vec<u8>>,
) -> std::io::Result<()> {
    use bus_embedded::fuzzing::decode_frame;
    let frames = corpus.join("frame_decode");
    let hints = corpus.join("index_decode");
    std::fs::create_dir_all(&frames)?;
    std::fs::create_dir_all(&hints)?;
    for (i, (path, bytes)) in files.iter().enumerate() {
        let name = path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        match path.extension().and_then(|e| e.to_str()) {
            Some("log") => {
                let mut at = 0;
                while let Ok(frame) = decode_frame(&bytes[at..]) {
                    let mut seed = vec![0u8];
                    seed.extend_from_slice(&bytes[at..at + frame.len]);
                    std::fs::write(frames.join(format!("{prefix}{i}-{name}-{at}")), seed)?;
                    at += frame.len;
                }
            }
            // Header: `uids` flag, no CRC fix-up, base and bound from the file.
            Some(ext @ ("idx" | "uids")) => {
                let mut seed = vec![u8::from(ext == "uids"), 0, 1];
                seed.extend_from_slice(&[0; 16]);
                seed.extend_from_slice(bytes);
                std::fs::write(hints.join(format!("{prefix}{i}-{name}")), seed)?;
            }
            _ => {}
        }
    }
    Ok(())
}
