//! C24 on the embedded log (feature `cold`): sealed history archived to a
//! cold tier (local files, and the S3 server when BUS_S3_ENDPOINT is set),
//! expired from the hot log, and read back through the same `fetch` and
//! `subscribe` with the same offsets, values and `stored_at`, tags verified.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation
)]

use std::time::{Duration, Instant};

use bus_core::{
    EventBus, Manifest, Selector, StartAt, StoredEvent, SubscribeOptions, SubscriptionItem,
    TopicSpec,
};
use bus_embedded::{EmbeddedBus, Options, cold};
use serde_json::json;

const KEY: [u8; 32] = [9; 32];

fn locations(dir: &std::path::Path) -> Vec<(String, String)> {
    let mut all = vec![(
        "local".to_owned(),
        format!("file://{}", dir.join("cold").display()),
    )];
    match (
        std::env::var("BUS_S3_ENDPOINT"),
        std::env::var("BUS_S3_BUCKET"),
    ) {
        (Ok(endpoint), Ok(bucket)) if !endpoint.is_empty() => {
            let prefix = format!("embedded-{}-{}", std::process::id(), bus_core::now_ms());
            all.push((
                "s3".to_owned(),
                format!("s3://{bucket}/{prefix}?endpoint={endpoint}"),
            ));
        }
        _ if std::env::var("BUS_REQUIRE_BROKERS").is_ok_and(|v| v == "1") => {
            panic!(
                "S3 required (BUS_REQUIRE_BROKERS=1): set BUS_S3_ENDPOINT and BUS_S3_BUCKET (scripts/seaweedfs.sh start)"
            )
        }
        _ => eprintln!(
            "\n*** SKIPPED the S3 case of bus-embedded/tests/cold.rs: BUS_S3_ENDPOINT / BUS_S3_BUCKET not set ***\n"
        ),
    }
    all
}

fn fetch_all(
    bus: &EmbeddedBus,
    topic: &str,
    partition: u32,
    from: u64,
    page: usize,
) -> Vec<StoredEvent> {
    let mut out = Vec::new();
    let mut next = from;
    loop {
        let got = bus.fetch(topic, partition, next, page).unwrap();
        let Some(last) = got.last() else { return out };
        assert_eq!(
            got[0].offset, next,
            "page from {next} starts at {}",
            got[0].offset
        );
        next = last.offset + 1;
        out.extend(got);
    }
}

/// Equal event lists, or a panic naming the first difference (not both lists).
fn same(got: &[StoredEvent], want: &[StoredEvent], what: &str) {
    if let Some(i) = (0..got.len().max(want.len())).find(|&i| got.get(i) != want.get(i)) {
        panic!(
            "{what}: {} events, {} wanted; first difference at index {i}: got {:?}, wanted {:?}",
            got.len(),
            want.len(),
            got.get(i),
            want.get(i)
        );
    }
}

#[test]
fn history_below_the_hot_log_start_reads_from_the_cold_tier() {
    let dir = tempfile::tempdir().unwrap();
    for (name, location) in locations(dir.path()) {
        let data = dir.path().join(format!("bus-{name}"));
        let bus = EmbeddedBus::open_with(&data, Options::default().segment_bytes(4096)).unwrap();
        bus.set_control_key(KEY).unwrap();
        let topic = format!("audit-{name}");
        let mut spec = TopicSpec::new(&topic, 2);
        spec.retention_ms = Some(1);
        bus.provision(&Manifest::new([spec])).unwrap();
        for n in 0..1500 {
            let value = json!({"n": n, "f": 0.1, "s": "é", "metadata": {"uid": format!("u-{n}")}});
            bus.publish(&topic, &format!("k{}", n % 5), &value).unwrap();
        }
        let before: Vec<Vec<StoredEvent>> =
            (0..2).map(|p| fetch_all(&bus, &topic, p, 0, 333)).collect();
        assert_eq!(before.iter().map(Vec::len).sum::<usize>(), 1500);

        // Archiving needs a tier; attach one, archive, archive again.
        assert!(cold::archive(&bus, &topic).is_err(), "{name}: no tier yet");
        cold::attach(&bus, &topic, &location).unwrap();
        let archived = cold::archive_all(&bus, &topic).unwrap();
        assert_eq!(archived, 1500, "{name}");
        assert_eq!(
            cold::archive_all(&bus, &topic).unwrap(),
            0,
            "{name}: idempotent"
        );
        assert_eq!(
            cold::archive(&bus, &topic).unwrap(),
            0,
            "{name}: idempotent"
        );

        // Retention drops the whole hot log; new records go on at the next offsets.
        bus.maintenance(bus_core::now_ms() + 60_000).unwrap();
        let mut before = before;
        for n in 1500..1540 {
            let ack = bus
                .publish(&topic, &format!("k{}", n % 5), &json!({"n": n}))
                .unwrap();
            before[ack.partition as usize]
                .extend(bus.fetch(&topic, ack.partition, ack.offset, 1).unwrap());
        }
        for partition in 0..2u32 {
            let hot_start = bus.offsets(&topic, partition).unwrap().first;
            assert!(
                hot_start > 100,
                "{name}: retention left the hot log at {hot_start}"
            );
            // fetch: the same records from 0, across the cold/hot seam, any page size.
            for page in [1, 7, 500, 5000] {
                same(
                    &fetch_all(&bus, &topic, partition, 0, page),
                    &before[partition as usize],
                    &format!("{name} p{partition} page {page}"),
                );
            }
            assert!(
                bus.offsets(&topic, partition).unwrap().retained() < 40,
                "{name}: the hot log was expired"
            );
            let seam = fetch_all(&bus, &topic, partition, hot_start - 3, 5);
            same(
                &seam,
                &before[partition as usize][hot_start as usize - 3..],
                &format!("{name}: the seam"),
            );
            // subscribe from offset 0: cold records first, then hot, same events.
            let mut sub = bus
                .subscribe(
                    &topic,
                    Selector::Partition(partition),
                    StartAt::Offset(0),
                    SubscribeOptions::default(),
                )
                .unwrap();
            let mut got = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(30);
            while got.len() < before[partition as usize].len() && Instant::now() < deadline {
                if let Some(SubscriptionItem::Record { event, .. }) =
                    sub.recv_timeout(Duration::from_millis(200)).unwrap()
                {
                    got.push(event);
                }
            }
            same(
                &got,
                &before[partition as usize],
                &format!("{name} p{partition}: subscribe"),
            );
        }
        drop(bus);
        // Reopened (a new process would): the topic still knows its tier.
        let bus = EmbeddedBus::open(&data).unwrap();
        bus.set_control_key(KEY).unwrap();
        same(
            &fetch_all(&bus, &topic, 0, 0, 100),
            &before[0],
            &format!("{name}: after reopen"),
        );
        // A wrong control key: the cold records fail their tags (C14).
        let bus2 = {
            drop(bus);
            let bus = EmbeddedBus::open(&data).unwrap();
            bus.set_control_key([1; 32]).unwrap();
            bus
        };
        match bus2.fetch(&topic, 0, 0, 10) {
            Err(bus_core::BusError::Integrity { offset: 0, .. }) => {}
            other => panic!("{name}: expected Integrity at offset 0, got {other:?}"),
        }
    }
}

#[test]
fn offsets_expired_before_they_were_archived_are_an_error_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let bus = EmbeddedBus::open_with(
        dir.path().join("bus"),
        Options::default().segment_bytes(4096),
    )
    .unwrap();
    let mut spec = TopicSpec::new("gap", 1);
    spec.retention_ms = Some(1);
    bus.provision(&Manifest::new([spec])).unwrap();
    for n in 0..600 {
        bus.publish("gap", "k", &json!({"n": n})).unwrap();
    }
    cold::attach(
        &bus,
        "gap",
        &format!("file://{}", dir.path().join("cold").display()),
    )
    .unwrap();
    // Only the sealed segments: the active one's records are not archived...
    let archived = cold::archive(&bus, "gap").unwrap();
    assert!(archived > 0 && archived < 600, "{archived}");
    // ...and retention (without "expire only what is archived") drops them too.
    bus.maintenance(bus_core::now_ms() + 60_000).unwrap();
    let hot_start = bus.offsets("gap", 0).unwrap().first;
    assert_eq!(hot_start, 600);
    // Below what the tier holds: served; in the hole: an error naming it.
    assert_eq!(bus.fetch("gap", 0, 0, 10).unwrap().len(), 10);
    let tail = bus.fetch("gap", 0, archived - 2, 100).unwrap();
    assert_eq!(tail.len(), 2, "the page ends where the tier does");
    match bus.fetch("gap", 0, archived, 10) {
        Err(error @ bus_core::BusError::Corrupt { .. }) => {
            assert!(
                error
                    .to_string()
                    .contains(&format!("gap/0 [{archived}, 600)")),
                "{error}"
            );
        }
        other => panic!("expected Corrupt naming [{archived}, 600), got {other:?}"),
    }
}

/// The cold tier's objects have no place for headers yet (C25 beside C24):
/// a record with headers is refused before its object is written, so
/// nothing is archived half and the hot log keeps every record.
#[test]
fn a_record_with_headers_is_not_archived_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let bus = EmbeddedBus::open(dir.path().join("bus")).unwrap();
    bus.provision(&Manifest::new([TopicSpec::new("tagged", 1)]))
        .unwrap();
    for n in 0..5 {
        bus.publish("tagged", "k", &json!({"n": n})).unwrap();
    }
    let headers = bus_core::Headers::try_from_pairs([("trace", "abc")]).unwrap();
    bus.publish_with_headers("tagged", "k", &json!({"n": 5}), None, &headers)
        .unwrap();
    let cold_dir = dir.path().join("cold");
    cold::attach(&bus, "tagged", &format!("file://{}", cold_dir.display())).unwrap();
    match cold::archive_all(&bus, "tagged") {
        Err(error @ bus_core::BusError::Unsupported { .. }) => {
            assert!(error.to_string().contains("offset 5"), "{error}");
        }
        other => panic!("archiving a record with headers: {other:?}"),
    }
    let objects = walk(&cold_dir);
    assert!(
        objects.iter().all(|p| !p.contains("/objects/")),
        "an object was written: {objects:?}"
    );
    assert_eq!(bus.fetch("tagged", 0, 0, 10).unwrap().len(), 6);
}

fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                out.extend(walk(&path));
            } else {
                out.push(path.display().to_string());
            }
        }
    }
    out
}
