//! Hooks for tests that write around the bus (conformance C14 cases, crash
//! tests). Not a stable API.

use std::path::Path;

use bus_core::{BusError, Headers};

use crate::bus::EmbeddedBus;
use crate::log::frame::{NewRecord, encode_headers};

pub use crate::options::FileLayer;

/// Appends one record with exactly these bytes and tag (a valid CRC, but no
/// signing or checks) to `topic`/`partition` of the bus stored in `dir`,
/// which must not be open. Returns the record's offset.
pub fn append_raw_record(
    dir: &Path,
    topic: &str,
    partition: u32,
    key: &str,
    uid: Option<&str>,
    value: &[u8],
    tag: Option<&[u8]>,
) -> Result<u64, BusError> {
    append_raw_record_with_headers(dir, topic, partition, key, uid, value, tag, &Headers::new())
}

/// [`append_raw_record`] of a record that carries `headers` (C25),
/// unchecked, as a foreign writer could store them.
#[allow(clippy::too_many_arguments)]
pub fn append_raw_record_with_headers(
    dir: &Path,
    topic: &str,
    partition: u32,
    key: &str,
    uid: Option<&str>,
    value: &[u8],
    tag: Option<&[u8]>,
    headers: &Headers,
) -> Result<u64, BusError> {
    let headers = encode_headers(headers).map_err(|reason| BusError::invalid("headers", reason))?;
    let bus = EmbeddedBus::open(dir)?;
    bus.append_raw(
        topic,
        partition,
        NewRecord {
            key: key.to_owned(),
            uid: uid.map(str::to_owned),
            tag: tag.map(<[u8]>::to_vec),
            headers,
            value: value.to_vec(),
        },
    )
}

/// The directory of `topic`/`partition` under the data directory `dir`.
pub fn partition_dir(dir: &Path, topic: &str, partition: u32) -> std::path::PathBuf {
    dir.join("topics")
        .join(crate::topics::dir_name(topic))
        .join(format!("p{partition:04}"))
}

/// The recovery-point file of `topic`/`partition` under the data directory
/// `dir` (tests restore an older one to stand for a crash before close).
pub fn recovery_point_path(dir: &Path, topic: &str, partition: u32) -> std::path::PathBuf {
    crate::log::checkpoint::path(&partition_dir(dir, topic, partition))
}
