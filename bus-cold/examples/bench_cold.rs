//! The cold tier's benchmark (C24, #30): archive rate and cold replay rate
//! beside object_store's raw put/get of the same object bytes, the latency
//! of the first read of a cold range, and bytes per record.
//!
//! ```text
//! cargo run --release -p bus-cold --example bench_cold -- [RECORDS]
//! ```
//!
//! Local files always; the S3 server too when BUS_S3_ENDPOINT and
//! BUS_S3_BUCKET are set (scripts/seaweedfs.sh start). Prints a table; asserts nothing.
#![allow(
    clippy::unwrap_used,
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation
)]

use std::sync::Arc;
use std::time::Instant;

use bus_cold::{ColdLocation, ColdRecord, ColdTier, DEFAULT_OBJECT_RECORDS, S3Location, format};
use bus_core::Compression;
use bus_core::auth::{RecordAuth, RecordParts};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

fn records(topic: &str, n: u64) -> Vec<ColdRecord> {
    let auth = RecordAuth::new(&[3; 32]);
    (0..n)
        .map(|offset| {
            let key = format!("agent-{}", offset % 16);
            let uid = Some(format!("evt-{offset:012}"));
            let value = format!(
                r#"{{"kind":"audit","actor":"agent-{}","action":"update","seq":{offset},"ok":true}}"#,
                offset % 16
            )
            .into_bytes();
            let tag = auth.tag(RecordParts { topic, partition: 0, key: &key, uid: uid.as_deref(), value: &value });
            ColdRecord { offset, stored_at: 1_796_000_000_000 + offset, key, uid, value, tag: Some(tag), headers: Default::default() }
        })
        .collect()
}

/// Where the object of the consecutive records `c` belongs.
fn place<'a>(topic: &'a str, c: &[ColdRecord]) -> format::Place<'a> {
    format::Place {
        topic,
        partition: 0,
        from: c[0].offset,
        end: c[0].offset + c.len() as u64,
    }
}

fn raw_store(location: &ColdLocation) -> Arc<dyn ObjectStore> {
    match location {
        ColdLocation::Local { root } => {
            Arc::new(object_store::local::LocalFileSystem::new_with_prefix(root).unwrap())
        }
        ColdLocation::S3 { s3, .. } => Arc::new(
            object_store::aws::AmazonS3Builder::new()
                .with_bucket_name(&s3.bucket)
                .with_region(&s3.region)
                .with_endpoint(s3.endpoint.clone().unwrap_or_default())
                .with_allow_http(true)
                .with_skip_signature(true)
                .build()
                .unwrap(),
        ),
        ColdLocation::Memory => Arc::new(object_store::memory::InMemory::new()),
    }
}

fn rate(n: f64, secs: f64) -> String {
    format!("{:>12.0}", n / secs)
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200_000);
    let dir = tempfile::tempdir().unwrap();
    let mut locations = vec![(
        "local files",
        ColdLocation::Local {
            root: dir.path().join("cold"),
        },
    )];
    if let (Ok(endpoint), Ok(bucket)) = (
        std::env::var("BUS_S3_ENDPOINT"),
        std::env::var("BUS_S3_BUCKET"),
    ) {
        let prefix = format!("bench-{}-{}", std::process::id(), bus_core::now_ms());
        locations.push((
            "SeaweedFS S3",
            ColdLocation::S3 {
                s3: S3Location {
                    endpoint: Some(endpoint),
                    bucket,
                    region: "us-east-1".into(),
                    access_key_id: None,
                    secret_access_key: None,
                },
                prefix,
            },
        ));
    } else {
        eprintln!("(S3 skipped: BUS_S3_ENDPOINT / BUS_S3_BUCKET not set)");
    }
    let topic = "bench";
    let all = records(topic, n);
    let value_bytes: usize = all.iter().map(|r| r.value.len()).sum();
    let objects: Vec<Vec<u8>> = all
        .chunks(DEFAULT_OBJECT_RECORDS)
        .map(|c| format::encode(place(topic, c), c).unwrap())
        .collect();
    let object_bytes: usize = objects.iter().map(Vec::len).sum();
    let compressed_bytes = |compression: Compression| -> usize {
        all.chunks(DEFAULT_OBJECT_RECORDS)
            .map(|c| {
                format::encode_compressed(place(topic, c), c, compression)
                    .unwrap()
                    .len()
            })
            .sum()
    };
    println!(
        "{n} records, {} objects of up to {DEFAULT_OBJECT_RECORDS}; value JSON {:.1} B/record; cold object {:.1} B/record uncompressed, {:.1} LZ4, {:.1} zstd (key, UID, stored_at, 32-byte tag, framing)",
        objects.len(),
        value_bytes as f64 / n as f64,
        object_bytes as f64 / n as f64,
        compressed_bytes(Compression::Lz4) as f64 / n as f64,
        compressed_bytes(Compression::Zstd) as f64 / n as f64,
    );
    println!(
        "{:<14} {:<34} {:>12} {:>10}",
        "store", "phase", "records/s", "MB/s"
    );
    for (name, location) in locations {
        let tier = ColdTier::open(&location).unwrap();
        let t = Instant::now();
        for chunk in all.chunks(DEFAULT_OBJECT_RECORDS) {
            tier.archive_records(topic, 0, chunk).unwrap();
        }
        let archive = t.elapsed().as_secs_f64();
        let row = |phase: &str, secs: f64| {
            println!(
                "{name:<14} {phase:<34} {} {:>10.1}",
                rate(n as f64, secs),
                object_bytes as f64 / secs / 1e6
            );
        };
        row("archive (object + manifest)", archive);
        // Raw: the same bytes, one create per object, no manifest.
        let raw = raw_store(&location);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let root = match &location {
            ColdLocation::S3 { prefix, .. } => format!("{prefix}-raw"),
            _ => "raw".into(),
        };
        let t = Instant::now();
        rt.block_on(async {
            for (i, bytes) in objects.iter().enumerate() {
                raw.put(
                    &Path::from(format!("{root}/{i}")),
                    PutPayload::from(bytes.clone()),
                )
                .await
                .unwrap();
            }
        });
        row("raw put of the same bytes", t.elapsed().as_secs_f64());
        // First read of a cold range: a fresh tier (no cached manifest or object).
        let fresh = ColdTier::open(&location).unwrap();
        let t = Instant::now();
        let first = fresh.read(topic, 0, n / 2, 1).unwrap();
        let first_ms = t.elapsed().as_secs_f64() * 1e3;
        assert_eq!(first[0].offset, n / 2);
        // Replay everything through the tier, in pages of 1000, tags verified.
        let auth = RecordAuth::new(&[3; 32]);
        let replay = ColdTier::open(&location).unwrap();
        let t = Instant::now();
        let mut from = 0;
        while from < n {
            let page = replay.fetch(topic, 0, from, 1000, Some(&auth)).unwrap();
            from = page.last().unwrap().offset + 1;
        }
        row(
            "cold replay (fetch, tags checked)",
            t.elapsed().as_secs_f64(),
        );
        let t = Instant::now();
        rt.block_on(async {
            for i in 0..objects.len() {
                raw.get(&Path::from(format!("{root}/{i}")))
                    .await
                    .unwrap()
                    .bytes()
                    .await
                    .unwrap();
            }
        });
        row("raw get of the same objects", t.elapsed().as_secs_f64());
        println!(
            "{name:<14} {:<34} {first_ms:>12.1} ms",
            "first read of a cold range"
        );
        // The same records through compressing tiers (MB/s of the
        // uncompressed object bytes, for comparison with the rows above).
        for compression in [Compression::Lz4, Compression::Zstd] {
            let topic = format!("bench-{compression}");
            let tier = ColdTier::open(&location)
                .unwrap()
                .with_compression(compression);
            let records = self::records(&topic, n);
            let t = Instant::now();
            for chunk in records.chunks(DEFAULT_OBJECT_RECORDS) {
                tier.archive_records(&topic, 0, chunk).unwrap();
            }
            row(
                &format!("archive, {compression}"),
                t.elapsed().as_secs_f64(),
            );
            let replay = ColdTier::open(&location).unwrap();
            let t = Instant::now();
            let mut from = 0;
            while from < n {
                let page = replay.fetch(&topic, 0, from, 1000, Some(&auth)).unwrap();
                from = page.last().unwrap().offset + 1;
            }
            row(
                &format!("cold replay, {compression}"),
                t.elapsed().as_secs_f64(),
            );
        }
    }
}
