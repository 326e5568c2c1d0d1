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

mod cold_support;

use cold_support::locations;

const KEY: [u8; 32] = [9; 32];

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
            let hot_start = cold::hot_offsets(&bus, &topic, partition).unwrap().first;
            assert_eq!(
                bus.offsets(&topic, partition).unwrap().first,
                0,
                "{name}: the retained range begins in the tier"
            );
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
                cold::hot_offsets(&bus, &topic, partition)
                    .unwrap()
                    .retained()
                    < 40,
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
    cold::attach_with(
        &bus,
        "gap",
        &format!("file://{}", dir.path().join("cold").display()),
        false,
    )
    .unwrap();
    // Only the sealed segments: the active one's records are not archived...
    let archived = cold::archive(&bus, "gap").unwrap();
    assert!(archived > 0 && archived < 600, "{archived}");
    // ...and retention (without "expire only what is archived") drops them too.
    bus.maintenance(bus_core::now_ms() + 60_000).unwrap();
    let hot_start = cold::hot_offsets(&bus, "gap", 0).unwrap().first;
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

/// "Expire only what is archived" (the default of `attach`): retention
/// keeps every segment the tier does not hold, however old, and drops it
/// once an archive covers it; no read ever meets a hole.
#[test]
fn retention_expires_only_what_is_archived() {
    let dir = tempfile::tempdir().unwrap();
    let bus = EmbeddedBus::open_with(
        dir.path().join("bus"),
        Options::default().segment_bytes(4096),
    )
    .unwrap();
    let mut spec = TopicSpec::new("kept", 1);
    spec.retention_ms = Some(1);
    bus.provision(&Manifest::new([spec])).unwrap();
    for n in 0..600 {
        bus.publish("kept", "k", &json!({"n": n})).unwrap();
    }
    let location = format!("file://{}", dir.path().join("cold").display());
    cold::attach(&bus, "kept", &location).unwrap();
    let later = bus_core::now_ms() + 60_000;
    // Nothing archived: nothing expires.
    assert_eq!(bus.maintenance(later).unwrap(), 0);
    assert_eq!(bus.offsets("kept", 0).unwrap().first, 0);
    // The sealed segments archived: those expire, the active one stays.
    let archived = cold::archive(&bus, "kept").unwrap();
    assert!(archived > 0 && archived < 600, "{archived}");
    let expired = bus.maintenance(later).unwrap();
    assert_eq!(expired, archived, "exactly what the tier holds");
    assert_eq!(cold::hot_offsets(&bus, "kept", 0).unwrap().first, archived);
    assert_eq!(bus.offsets("kept", 0).unwrap().first, 0, "the tier's start");
    // Everything archived: the rest expires too; every record still reads.
    cold::archive_all(&bus, "kept").unwrap();
    assert_eq!(bus.maintenance(later).unwrap(), 600 - archived);
    assert_eq!(cold::hot_offsets(&bus, "kept", 0).unwrap().first, 600);
    let all = fetch_all(&bus, "kept", 0, 0, 128);
    assert_eq!(all.len(), 600);
    assert!(
        all.iter()
            .zip(0u64..)
            .all(|(e, n)| e.offset == n && e.value["n"] == n)
    );
}

/// Headers travel to the cold tier with their record (C25 beside C24):
/// archived, expired from the hot log, and read back by
/// `fetch_with_headers` from the tier, under the record's tag.
#[test]
fn records_with_headers_read_back_from_the_cold_tier() {
    let dir = tempfile::tempdir().unwrap();
    let bus = EmbeddedBus::open_with(
        dir.path().join("bus"),
        Options::default().segment_bytes(4096),
    )
    .unwrap();
    bus.set_control_key(KEY).unwrap();
    let mut spec = TopicSpec::new("tagged", 1);
    spec.retention_ms = Some(1);
    bus.provision(&Manifest::new([spec])).unwrap();
    let headers = bus_core::Headers::try_from_pairs([("trace", "abc"), ("x-n", "ü")]).unwrap();
    for n in 0..200 {
        let with = if n % 3 == 0 {
            headers.clone()
        } else {
            bus_core::Headers::default()
        };
        bus.publish_with_headers("tagged", "k", &json!({"n": n}), None, &with)
            .unwrap();
    }
    let before = bus.fetch_with_headers("tagged", 0, 0, 500).unwrap();
    assert_eq!(before.len(), 200);
    let cold_dir = dir.path().join("cold");
    cold::attach(&bus, "tagged", &format!("file://{}", cold_dir.display())).unwrap();
    assert_eq!(cold::archive_all(&bus, "tagged").unwrap(), 200);
    bus.maintenance(bus_core::now_ms() + 60_000).unwrap();
    let hot_start = cold::hot_offsets(&bus, "tagged", 0).unwrap().first;
    assert!(hot_start > 100, "retention left the hot log at {hot_start}");
    let after = bus.fetch_with_headers("tagged", 0, 0, 500).unwrap();
    assert_eq!(after, before, "headers, values and stored_at from the tier");
    assert_eq!(after[3].headers, headers);
    assert!(after[4].headers.is_empty());
}

/// Reads racing retention at the hot/cold boundary: an archiver archives
/// everything and runs retention (which then drops whole segments, the
/// active one rolled) in a loop while a publisher appends and readers page
/// from 0. A reader that measured the hot start before a drop reads the
/// tier again: every page is consecutive from the offset asked for, and a
/// replay holds every record published before it began.
#[test]
fn reads_racing_retention_at_the_boundary_are_gap_free() {
    const RECORDS: u64 = 300;
    let dir = tempfile::tempdir().unwrap();
    let bus = EmbeddedBus::open_with(
        dir.path().join("bus"),
        Options::default().segment_bytes(512),
    )
    .unwrap();
    let mut spec = TopicSpec::new("race", 1);
    spec.retention_ms = Some(1);
    bus.provision(&Manifest::new([spec])).unwrap();
    let location = format!("file://{}", dir.path().join("cold").display());
    cold::attach(&bus, "race", &location).unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    let deadline = Instant::now() + Duration::from_secs(60);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for n in 0..RECORDS {
                bus.publish("race", "k", &json!({"n": n})).unwrap();
            }
        });
        scope.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::Acquire) && Instant::now() < deadline {
                cold::archive_all(&bus, "race").unwrap();
                bus.maintenance(bus_core::now_ms() + 60_000).unwrap();
            }
        });
        let readers: Vec<_> = (0..2)
            .map(|_| {
                scope.spawn(|| {
                    let mut replays = 0;
                    loop {
                        let head = bus.offsets("race", 0).unwrap().next;
                        let all = fetch_all(&bus, "race", 0, 0, 7);
                        assert!(all.len() as u64 >= head, "{} of {head}", all.len());
                        assert!(
                            all.iter()
                                .zip(0u64..)
                                .all(|(e, n)| e.offset == n && e.value["n"] == n)
                        );
                        replays += 1;
                        if head >= RECORDS || Instant::now() > deadline {
                            return replays;
                        }
                    }
                })
            })
            .collect();
        for reader in readers {
            assert!(reader.join().unwrap() > 0);
        }
        done.store(true, std::sync::atomic::Ordering::Release);
    });
    cold::archive_all(&bus, "race").unwrap();
    bus.maintenance(bus_core::now_ms() + 60_000).unwrap();
    assert_eq!(
        cold::hot_offsets(&bus, "race", 0).unwrap().first,
        RECORDS,
        "all expired"
    );
    assert_eq!(fetch_all(&bus, "race", 0, 0, 100).len() as u64, RECORDS);
}

/// A topic archived on one machine, its directory lost, and restored into
/// a new directory from the tier alone: the same history from offset 0,
/// publishing at the next offsets, and the tier still named after a reopen.
#[test]
fn a_new_directory_is_restored_from_the_cold_tier() {
    let dir = tempfile::tempdir().unwrap();
    for (name, location) in locations(dir.path()) {
        let topic = format!("restored-{name}");
        let mut spec = TopicSpec::new(&topic, 2);
        spec.retention_ms = Some(1);
        let headers = bus_core::Headers::try_from_pairs([("trace", "t-1")]).unwrap();
        let (before, with_headers, ends) = {
            let old = dir.path().join(format!("old-{name}"));
            let bus = EmbeddedBus::open_with(&old, Options::default().segment_bytes(4096)).unwrap();
            bus.set_control_key(KEY).unwrap();
            bus.provision(&Manifest::new([spec.clone()])).unwrap();
            for n in 0..600 {
                let value = json!({"n": n, "metadata": {"uid": format!("u-{n}")}});
                if n % 7 == 0 {
                    bus.publish_with_headers(
                        &topic,
                        &format!("k{}", n % 5),
                        &value,
                        None,
                        &headers,
                    )
                    .unwrap();
                } else {
                    bus.publish(&topic, &format!("k{}", n % 5), &value).unwrap();
                }
            }
            cold::attach(&bus, &topic, &location).unwrap();
            assert_eq!(cold::archive_all(&bus, &topic).unwrap(), 600, "{name}");
            let before: Vec<Vec<StoredEvent>> =
                (0..2).map(|p| fetch_all(&bus, &topic, p, 0, 100)).collect();
            let ends: Vec<u64> = (0..2)
                .map(|p| bus.offsets(&topic, p).unwrap().next)
                .collect();
            let with_headers = bus.fetch_with_headers(&topic, 0, 0, 600).unwrap();
            drop(bus);
            std::fs::remove_dir_all(&old).unwrap();
            (before, with_headers, ends)
        };

        // Another control key: the newest archived record fails its tag,
        // and nothing is restored.
        let wrong = EmbeddedBus::open(dir.path().join(format!("wrong-{name}"))).unwrap();
        wrong.set_control_key([1; 32]).unwrap();
        assert!(
            matches!(
                cold::restore(&wrong, &spec, &location),
                Err(bus_core::BusError::Integrity { .. })
            ),
            "{name}: a restore with another key"
        );
        assert!(wrong.topics().is_empty(), "{name}");

        let new = dir.path().join(format!("new-{name}"));
        let bus = EmbeddedBus::open(&new).unwrap();
        bus.set_control_key(KEY).unwrap();
        assert_eq!(
            cold::restore(&bus, &spec, &location).unwrap(),
            ends,
            "{name}"
        );
        for p in 0..2u32 {
            let offsets = bus.offsets(&topic, p).unwrap();
            assert_eq!(offsets.next, ends[p as usize], "{name} p{p}: next offset");
            same(
                &fetch_all(&bus, &topic, p, 0, 77),
                &before[p as usize],
                &format!("{name} p{p}: restored history"),
            );
        }
        assert_eq!(
            bus.fetch_with_headers(&topic, 0, 0, 600).unwrap(),
            with_headers,
            "{name}: headers and stored_at"
        );
        // Publishing continues at the next offset of its partition.
        let ack = bus.publish(&topic, "k1", &json!({"n": 600})).unwrap();
        assert_eq!(ack.offset, ends[ack.partition as usize], "{name}");
        // A restore is not a provision: the topic exists now.
        assert!(
            matches!(
                cold::restore(&bus, &spec, &location),
                Err(bus_core::BusError::Conflict { .. })
            ),
            "{name}: restore over a provisioned topic"
        );
        drop(bus);
        // Reopened: the restored topic still reads its history from the tier.
        let bus = EmbeddedBus::open(&new).unwrap();
        bus.set_control_key(KEY).unwrap();
        let mut want = before[ack.partition as usize].clone();
        want.extend(bus.fetch(&topic, ack.partition, ack.offset, 1).unwrap());
        same(
            &fetch_all(&bus, &topic, ack.partition, 0, 500),
            &want,
            &format!("{name}: after reopen"),
        );
    }
}

/// What a restore refuses, each before it writes anything: a tier without
/// the topic, a spec with fewer partitions than the tier, a damaged newest
/// object.
#[test]
fn a_restore_that_cannot_be_done_leaves_no_topic() {
    let dir = tempfile::tempdir().unwrap();
    let tier_dir = dir.path().join("tier");
    let location = format!("file://{}", tier_dir.display());
    let topic = "refused";
    {
        let bus = EmbeddedBus::open(dir.path().join("old")).unwrap();
        bus.provision(&Manifest::new([TopicSpec::new(topic, 3)]))
            .unwrap();
        for n in 0..90 {
            bus.publish(topic, &format!("k{n}"), &json!({"n": n}))
                .unwrap();
        }
        cold::attach(&bus, topic, &location).unwrap();
        cold::archive_all(&bus, topic).unwrap();
    }
    let new = dir.path().join("new");
    let bus = EmbeddedBus::open(&new).unwrap();
    let no_topic = |bus: &EmbeddedBus, what: &str| {
        assert!(bus.topics().is_empty(), "{what}: a topic was made");
        let topics_dir = new.join("topics");
        let left: Vec<_> = std::fs::read_dir(&topics_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "{what}: left {left:?}");
    };
    // Another topic's name: the tier holds nothing of it.
    match cold::restore(&bus, &TopicSpec::new("other", 3), &location) {
        Err(bus_core::BusError::InvalidArgument { reason, .. }) => {
            assert!(reason.contains("holds nothing"), "{reason}");
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    no_topic(&bus, "another topic");
    // Fewer partitions than the tier holds.
    match cold::restore(&bus, &TopicSpec::new(topic, 2), &location) {
        Err(bus_core::BusError::InvalidArgument { field, .. }) => {
            assert_eq!(field, "spec.partitions");
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    no_topic(&bus, "fewer partitions");
    // The newest object of partition 1 cut short.
    let objects = tier_dir.join(topic).join("1").join("objects");
    let newest = std::fs::read_dir(&objects)
        .unwrap()
        .map(|e| e.unwrap().path())
        .max()
        .unwrap();
    let bytes = std::fs::read(&newest).unwrap();
    std::fs::write(&newest, &bytes[..bytes.len() / 2]).unwrap();
    match cold::restore(&bus, &TopicSpec::new(topic, 3), &location) {
        Err(bus_core::BusError::Corrupt { location, .. }) => {
            assert!(
                location.contains(&format!("cold range {topic}/1")),
                "{location}"
            );
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    no_topic(&bus, "a damaged object");
    // Repaired, the same restore succeeds.
    std::fs::write(&newest, &bytes).unwrap();
    let ends = cold::restore(&bus, &TopicSpec::new(topic, 3), &location).unwrap();
    assert_eq!(ends.iter().sum::<u64>(), 90);
}

/// A topic whose spec compresses its frames is archived compressed too
/// (object format version 3) and reads back the same from the tier.
#[test]
fn a_compressed_topic_is_archived_compressed() {
    let dir = tempfile::tempdir().unwrap();
    let tier_dir = dir.path().join("tier");
    let bus = EmbeddedBus::open_with(
        dir.path().join("bus"),
        Options::default().segment_bytes(4096),
    )
    .unwrap();
    bus.set_control_key(KEY).unwrap();
    let mut spec = TopicSpec::new("zipped", 1);
    spec.retention_ms = Some(1);
    spec.compression = bus_core::Compression::Zstd;
    bus.provision(&Manifest::new([spec])).unwrap();
    for n in 0..400 {
        let value = json!({"n": n, "agent": "agent-7", "action": "tool_call", "ok": true});
        bus.publish("zipped", "k", &value).unwrap();
    }
    let before = fetch_all(&bus, "zipped", 0, 0, 100);
    cold::attach(&bus, "zipped", &format!("file://{}", tier_dir.display())).unwrap();
    assert_eq!(cold::archive_all(&bus, "zipped").unwrap(), 400);
    bus.maintenance(bus_core::now_ms() + 60_000).unwrap();
    assert!(
        cold::hot_offsets(&bus, "zipped", 0).unwrap().first > 0,
        "expired"
    );
    same(
        &fetch_all(&bus, "zipped", 0, 0, 64),
        &before,
        "from the tier",
    );
    let objects: Vec<_> = std::fs::read_dir(tier_dir.join("zipped/0/objects"))
        .unwrap()
        .map(|entry| std::fs::read(entry.unwrap().path()).unwrap())
        .collect();
    assert!(!objects.is_empty());
    for object in &objects {
        // "BUSCOLD1", then the version: 3 (compressed), codec 2 (zstd).
        assert_eq!(&object[8..11], &[0, 3, 2]);
    }
}

/// Cold retention on the embedded log: archived history older than the
/// cutoff leaves the tier in whole objects, and a read from offset 0 then
/// begins at the oldest record kept (in the tier, or hot when the tier
/// holds nothing any more), as after hot retention.
#[test]
fn cold_retention_expires_whole_objects_and_reads_begin_after_them() {
    let dir = tempfile::tempdir().unwrap();
    let bus = EmbeddedBus::open_with(
        dir.path().join("bus"),
        Options::default().segment_bytes(4096),
    )
    .unwrap();
    let mut spec = TopicSpec::new("aged", 1);
    spec.retention_ms = Some(1);
    bus.provision(&Manifest::new([spec])).unwrap();
    let location = format!("file://{}", dir.path().join("tier").display());
    cold::attach(&bus, "aged", &location).unwrap();
    for n in 0..300 {
        bus.publish("aged", "k", &json!({ "n": n })).unwrap();
    }
    assert_eq!(cold::archive_all(&bus, "aged").unwrap(), 300);
    let archived_at = bus_core::now_ms();
    bus.maintenance(archived_at + 60_000).unwrap();
    for n in 300..310 {
        bus.publish("aged", "k", &json!({ "n": n })).unwrap();
    }
    assert_eq!(fetch_all(&bus, "aged", 0, 0, 100).len(), 310);
    // Nothing is older than a cutoff before the records were stored.
    assert_eq!(
        cold::expire_cold(&bus, "aged", archived_at - 3_600_000).unwrap(),
        0
    );
    // Past every archived record: the tier holds nothing any more.
    assert_eq!(
        cold::expire_cold(&bus, "aged", archived_at + 1).unwrap(),
        300
    );
    let left = bus.fetch("aged", 0, 0, 1000).unwrap();
    let hot_first = bus.offsets("aged", 0).unwrap().first;
    assert_eq!(left.first().map(|e| e.offset), Some(hot_first));
    assert_eq!(left.last().map(|e| e.offset), Some(309));
    // Archiving goes on at the tier's end, never below it again.
    assert_eq!(cold::archive_all(&bus, "aged").unwrap(), 10);
}
