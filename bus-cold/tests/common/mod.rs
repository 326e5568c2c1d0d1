//! Shared by the cold tier's tests: where to archive (local files, memory,
//! and the S3 server named by BUS_S3_ENDPOINT / BUS_S3_BUCKET), and records
//! that look like a backend's (tags, UIDs, exact value bytes).
#![allow(dead_code, clippy::unwrap_used, clippy::cast_possible_truncation)]

pub mod server;

use bus_cold::{ColdLocation, ColdRecord, S3Location};
use bus_core::auth::{RecordAuth, RecordParts};

/// The control key the tests sign with.
pub const KEY: [u8; 32] = [7; 32];

pub fn auth() -> RecordAuth {
    RecordAuth::new(&KEY)
}

/// A name no other test (or run) uses.
pub fn unique(name: &str) -> String {
    format!(
        "{name}-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    )
}

/// Records `from..end` of `topic`/`partition` as a backend with a control
/// key would store them: every third has a UID, every one a tag, every fifth
/// headers.
pub fn records(topic: &str, partition: u32, from: u64, end: u64) -> Vec<ColdRecord> {
    let auth = auth();
    (from..end)
        .map(|offset| {
            let key = format!("key-{}", offset % 7);
            let uid = (offset % 3 == 0).then(|| format!("uid-{offset}"));
            // Bytes as a backend stored them: a float and an escape that a
            // re-encoding could change must come back exactly.
            let value = format!(
                r#"{{"n":{offset},"f":0.1000000000000000055511151231257827,"s":"\u00e9"}}"#
            )
            .into_bytes();
            // Every fifth carries headers (C25), covered by its tag.
            let headers = if offset % 5 == 0 {
                bus_core::Headers::from_stored([
                    ("traceparent", format!("t-{offset}")),
                    ("x-n", "é".into()),
                ])
            } else {
                bus_core::Headers::default()
            };
            let tag = auth.tag_with(
                RecordParts {
                    topic,
                    partition,
                    key: &key,
                    uid: uid.as_deref(),
                    value: &value,
                },
                &headers,
            );
            ColdRecord {
                offset,
                stored_at: 1_700_000_000_000 + offset * 3,
                key,
                uid,
                value,
                tag: Some(tag),
                headers,
            }
        })
        .collect()
}

/// The S3 server of the tests, or `None` after a loud skip (a panic with
/// BUS_REQUIRE_BROKERS=1).
pub fn s3(prefix: &str) -> Option<ColdLocation> {
    let endpoint = std::env::var("BUS_S3_ENDPOINT")
        .ok()
        .filter(|e| !e.is_empty());
    let bucket = std::env::var("BUS_S3_BUCKET")
        .ok()
        .filter(|b| !b.is_empty());
    match (endpoint, bucket) {
        (Some(endpoint), Some(bucket)) => Some(ColdLocation::S3 {
            s3: S3Location {
                endpoint: Some(endpoint),
                bucket,
                region: "us-east-1".into(),
                access_key_id: None,
                secret_access_key: None,
            },
            prefix: prefix.to_owned(),
        }),
        _ if std::env::var("BUS_REQUIRE_BROKERS").is_ok_and(|v| v == "1") => {
            panic!(
                "S3 required (BUS_REQUIRE_BROKERS=1): set BUS_S3_ENDPOINT and BUS_S3_BUCKET (scripts/seaweedfs.sh start)"
            )
        }
        _ => {
            eprintln!(
                "\n*** SKIPPED the S3 case of {prefix}: BUS_S3_ENDPOINT / BUS_S3_BUCKET not set (scripts/seaweedfs.sh start) ***\n"
            );
            None
        }
    }
}

/// Every location to run a case against: (name, location, the temp dir to keep alive).
pub fn locations(name: &str) -> Vec<(String, ColdLocation, Option<tempfile::TempDir>)> {
    let dir = tempfile::tempdir().unwrap();
    let mut all = vec![
        ("memory".to_owned(), ColdLocation::Memory, None),
        (
            "local".to_owned(),
            ColdLocation::Local {
                root: dir.path().to_owned(),
            },
            Some(dir),
        ),
    ];
    if let Some(s3) = s3(&unique(name)) {
        all.push(("s3".to_owned(), s3, None));
    }
    all
}
