//! Per-topic frame compression (`TopicSpec::compression`): records read
//! back the same through every read path, after a clean close and after a
//! crash; a torn compressed batch is never partly visible; damage inside a
//! compressed frame is reported like any other; the setting can change on
//! an existing topic with every record still readable.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::path::Path;

use crate::support::{
    TOPIC, assert_gap_free, copy_tree, frame_starts, open, read_all, recovery_point, segments,
    value_for,
};
use bus_core::{
    BatchRecord, BusError, Compression, EventBus, Manifest, Selector, StartAt, SubscribeOptions,
    Subscription, SubscriptionItem, TopicSpec,
};
use bus_embedded::EmbeddedBus;

const CODECS: [Compression; 2] = [Compression::Lz4, Compression::Zstd];
/// Records published one by one before the batch.
const SINGLE: usize = 20;
/// Records of the batch.
const BATCH: usize = 1000;
/// Records published with a UID seen before (deduplicated).
const REPEATS: usize = 5;

fn uid(i: usize) -> String {
    format!("u{i}")
}

fn provision_with(bus: &dyn EventBus, compression: Compression) {
    bus.provision(&Manifest::new([
        TopicSpec::new(TOPIC, 1).with_compression(compression)
    ]))
    .unwrap();
}

/// Publishes `SINGLE` records one by one, a batch of `BATCH`, then repeats
/// of earlier UIDs that must deduplicate to their first offsets.
fn publish_all(bus: &dyn EventBus) {
    for i in 0..SINGLE {
        let ack = bus
            .publish_idempotent(TOPIC, "k", &value_for(&uid(i), i), &uid(i))
            .unwrap();
        assert_eq!(ack.offset, i as u64);
    }
    let batch: Vec<BatchRecord> = (SINGLE..SINGLE + BATCH)
        .map(|i| BatchRecord::new("k", value_for(&uid(i), i)).with_uid(uid(i)))
        .collect();
    let acks = bus.publish_batch(TOPIC, &batch).unwrap();
    assert_eq!(acks.last().unwrap().offset, (SINGLE + BATCH - 1) as u64);
    for i in [0, 7, SINGLE, SINGLE + 500, SINGLE + BATCH - 1]
        .into_iter()
        .take(REPEATS)
    {
        let ack = bus
            .publish_idempotent(TOPIC, "k", &value_for("ignored", 0), &uid(i))
            .unwrap();
        assert_eq!(ack.offset, i as u64, "a repeat of uid {i} dedups");
    }
}

/// Every record through fetch (singly and in pages) and find-by-UID.
fn assert_reads(bus: &EmbeddedBus, n: usize, what: &str) {
    let events = read_all(bus, 0).unwrap();
    assert_eq!(events.len(), n, "{what}");
    assert_gap_free(&events);
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event.value, value_for(&uid(i), i), "{what}: offset {i}");
    }
    let paged = bus.fetch(TOPIC, 0, 0, 1000).unwrap();
    assert_eq!(paged.len(), n.min(1000), "{what}");
    for i in 0..n {
        let page = bus.fetch(TOPIC, 0, i as u64, 1).unwrap();
        assert_eq!(page.len(), 1, "{what}: offset {i}");
        assert_eq!(page[0].value, value_for(&uid(i), i), "{what}: offset {i}");
    }
    for i in (0..n).step_by(37).chain([n - 1]) {
        let found = bus.find_event_by_uid(TOPIC, "k", &uid(i)).unwrap();
        assert_eq!(found.map(|e| e.offset), Some(i as u64), "{what}: uid {i}");
    }
    assert_eq!(
        bus.find_event_by_uid(TOPIC, "k", "absent").unwrap(),
        None,
        "{what}"
    );
}

fn log_len(dir: &Path) -> u64 {
    segments(dir, 0)
        .iter()
        .map(|log| std::fs::metadata(log).unwrap().len())
        .sum()
}

#[test]
fn compressed_topics_read_back_across_a_clean_close() {
    let plain = tempfile::tempdir().unwrap();
    {
        let bus = open(plain.path());
        provision_with(&bus, Compression::None);
        publish_all(&bus);
    }
    for compression in CODECS {
        let dir = tempfile::tempdir().unwrap();
        {
            let bus = open(dir.path());
            provision_with(&bus, compression);
            publish_all(&bus);
            assert_reads(&bus, SINGLE + BATCH, &format!("{compression}, open"));
        }
        let bus = open(dir.path());
        assert_reads(&bus, SINGLE + BATCH, &format!("{compression}, reopened"));
        assert_eq!(
            bus.topic_spec(TOPIC).unwrap().unwrap().compression,
            compression
        );
        assert!(
            log_len(dir.path()) < log_len(plain.path()),
            "{compression}: {} bytes, uncompressed {}",
            log_len(dir.path()),
            log_len(plain.path())
        );
    }
}

#[test]
fn compressed_topics_read_back_after_a_crash() {
    for compression in CODECS {
        let live = tempfile::tempdir().unwrap();
        let crashed = tempfile::tempdir().unwrap();
        let bus = open(live.path());
        provision_with(&bus, compression);
        publish_all(&bus);
        // The state kill -9 leaves: no clean close, every UID of the active
        // segment rebuilt by the recovery scan from compressed frames.
        copy_tree(live.path(), crashed.path());
        drop(bus);
        let bus = open(crashed.path());
        assert_reads(&bus, SINGLE + BATCH, &format!("{compression}, recovered"));
        let ack = bus
            .publish_idempotent(TOPIC, "k", &value_for("x", 0), &uid(SINGLE + 3))
            .unwrap();
        assert_eq!(
            ack.offset,
            (SINGLE + 3) as u64,
            "{compression}: dedup after recovery"
        );
    }
}

#[test]
fn sealed_compressed_segments_and_read_only_opens_read_back() {
    for compression in CODECS {
        let dir = tempfile::tempdir().unwrap();
        {
            let options = bus_embedded::Options::default().segment_bytes(1 << 10);
            let bus = EmbeddedBus::open_with(dir.path(), options).unwrap();
            provision_with(&bus, compression);
            publish_all(&bus);
        }
        assert!(
            segments(dir.path(), 0).len() > 2,
            "{compression}: several segments"
        );
        let reader = EmbeddedBus::open_read_only(dir.path()).unwrap();
        assert_reads(
            &reader,
            SINGLE + BATCH,
            &format!("{compression}, read-only"),
        );
        drop(reader);
        let bus = open(dir.path());
        assert_reads(&bus, SINGLE + BATCH, &format!("{compression}, sealed"));
        drop(bus);
        // Every index, UID table and the locator rebuilt from the frames.
        let pdir = bus_embedded::testing::partition_dir(dir.path(), TOPIC, 0);
        let mut removed = 0;
        for entry in std::fs::read_dir(&pdir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_str().unwrap().to_owned();
            let hint = ["idx", "uids", "cidx", "cuids"]
                .iter()
                .any(|ext| path.extension().is_some_and(|e| e == *ext));
            if hint || name == "uid-locator" {
                std::fs::remove_file(&path).unwrap();
                removed += 1;
            }
        }
        assert!(removed > 2, "{compression}: {removed} hint files");
        let bus = open(dir.path());
        assert_reads(&bus, SINGLE + BATCH, &format!("{compression}, rebuilt"));
    }
}

/// A compressed batch written by a session killed before it closed, cut
/// anywhere: none of it is visible after open, and the log goes on.
#[test]
fn a_torn_compressed_batch_at_the_tail_is_truncated_whole() {
    for compression in CODECS {
        let dir = tempfile::tempdir().unwrap();
        {
            let bus = open(dir.path());
            provision_with(&bus, compression);
            for i in 0..SINGLE {
                bus.publish_idempotent(TOPIC, "k", &value_for(&uid(i), i), &uid(i))
                    .unwrap();
            }
        }
        let log = segments(dir.path(), 0)[0].clone();
        let before = std::fs::read(&log).unwrap().len();
        let stale_point = std::fs::read(recovery_point(dir.path(), 0)).unwrap();
        {
            let bus = open(dir.path());
            let batch: Vec<BatchRecord> = (SINGLE..SINGLE + 200)
                .map(|i| BatchRecord::new("k", value_for(&uid(i), i)).with_uid(uid(i)))
                .collect();
            bus.publish_batch(TOPIC, &batch).unwrap();
        }
        let full = std::fs::read(&log).unwrap();
        let frames: Vec<usize> = frame_starts(&full)
            .into_iter()
            .filter(|&s| s >= before)
            .collect();
        assert!(frames.len() >= 3, "{compression}: several frames");
        let mut cuts: Vec<usize> = frames
            .iter()
            .flat_map(|&s| [s, s + 1, s + 8, s + 30, s + 40])
            .chain((before..full.len()).step_by(211))
            .chain([full.len() - 1])
            .filter(|&c| c > before && c < full.len())
            .collect();
        cuts.dedup();
        for cut in cuts {
            std::fs::write(&log, &full[..cut]).unwrap();
            std::fs::write(recovery_point(dir.path(), 0), &stale_point).unwrap();
            let bus = open(dir.path());
            let what = format!("{compression}: cut at byte {cut}");
            let events = read_all(&bus, 0).unwrap();
            assert_eq!(events.len(), SINGLE, "{what}");
            assert_eq!(
                bus.find_event_by_uid(TOPIC, "k", &uid(SINGLE + 150))
                    .unwrap(),
                None,
                "{what}"
            );
            let ack = bus.publish(TOPIC, "k", &value_for("after", 0)).unwrap();
            assert_eq!(ack.offset, SINGLE as u64, "{what}");
        }
    }
}

/// As `batch_frames.rs` asserts it for plain frames: opening fails with
/// `Corrupt`, or the read does.
fn assert_corrupt(dir: &Path, what: &str) {
    match EmbeddedBus::open(dir) {
        Err(BusError::Corrupt { .. }) => {}
        Err(other) => panic!("{what}: expected Corrupt, got {other:?}"),
        Ok(bus) => match read_all(&bus, 0) {
            Err(BusError::Corrupt { .. }) => {}
            other => panic!("{what}: damage not reported: {:?}", other.map(|e| e.len())),
        },
    }
}

#[test]
fn a_flipped_byte_inside_a_compressed_frame_is_reported_as_damage() {
    for compression in CODECS {
        let dir = tempfile::tempdir().unwrap();
        {
            let bus = open(dir.path());
            provision_with(&bus, compression);
            publish_all(&bus);
        }
        let log = segments(dir.path(), 0)[0].clone();
        let full = std::fs::read(&log).unwrap();
        let starts = frame_starts(&full);
        // Frames of the batch (compressed), never its last.
        let batch: Vec<usize> = starts[SINGLE..starts.len() - 2].to_vec();
        for &frame in [batch[0], batch[batch.len() / 2]].iter() {
            let len = u32::from_le_bytes(full[frame..frame + 4].try_into().unwrap()) as usize;
            assert!(len > 60, "{compression}: a compressed batch frame");
            // Length, checksum, the frame flags, codec, raw length, data.
            for pick in [0usize, 5, 10, 8 + 27, 8 + 30, 8 + 32, 8 + 40, 8 + len - 1] {
                let mut bytes = full.clone();
                bytes[frame + pick] ^= 0x01;
                std::fs::write(&log, &bytes).unwrap();
                assert_corrupt(
                    dir.path(),
                    &format!("{compression}: byte {pick} of frame at {frame}"),
                );
            }
        }
        std::fs::write(&log, &full).unwrap();
        assert_reads(
            &open(dir.path()),
            SINGLE + BATCH,
            &format!("{compression}, restored"),
        );
    }
}

#[test]
fn compression_can_change_on_an_existing_topic() {
    let dir = tempfile::tempdir().unwrap();
    let batch = |from: usize| -> Vec<BatchRecord> {
        (from..from + 100)
            .map(|i| BatchRecord::new("k", value_for(&uid(i), i)).with_uid(uid(i)))
            .collect()
    };
    {
        let bus = open(dir.path());
        provision_with(&bus, Compression::None);
        bus.publish_batch(TOPIC, &batch(0)).unwrap();
    }
    // Measured after a clean close, which cuts the zeros written ahead.
    let plain_log = log_len(dir.path());
    let mut written = 100;
    for (step, compression) in [Compression::Zstd, Compression::None, Compression::Lz4]
        .into_iter()
        .enumerate()
    {
        let before = log_len(dir.path());
        {
            let bus = open(dir.path());
            // A read-only follower opened before the change follows it.
            let reader = EmbeddedBus::open_read_only(dir.path()).unwrap();
            assert_reads(&bus, written, &format!("before step {step}"));
            provision_with(&bus, compression);
            assert_eq!(
                bus.topic_spec(TOPIC).unwrap().unwrap().compression,
                compression
            );
            assert_eq!(
                reader.topic_spec(TOPIC).unwrap().unwrap().compression,
                compression,
                "the follower reports the stored spec"
            );
            provision_with(&reader, compression);
            bus.publish_batch(TOPIC, &batch(written)).unwrap();
            written += 100;
            assert_reads(&bus, written, &format!("step {step}, {compression}"));
        }
        // The batch of this step is stored as the setting says: plain takes
        // what the first plain batch took (within the few bytes its longer
        // numbers add), compressed takes less.
        let grew = log_len(dir.path()) - before;
        if compression == Compression::None {
            assert!(
                grew >= plain_log && grew < plain_log + plain_log / 10,
                "step {step}: {grew} bytes, plain batch {plain_log}"
            );
        } else {
            assert!(
                grew * 2 < plain_log,
                "step {step}, {compression}: {grew} bytes, plain batch {plain_log}"
            );
        }
        let bus = open(dir.path());
        assert_eq!(
            bus.topic_spec(TOPIC).unwrap().unwrap().compression,
            compression,
            "the change is saved"
        );
        assert_reads(&bus, written, &format!("step {step}, reopened"));
    }
}

#[test]
fn authenticated_records_in_compressed_frames_verify_and_forgeries_do_not() {
    const KEY: [u8; 32] = [9; 32];
    for compression in CODECS {
        let dir = tempfile::tempdir().unwrap();
        {
            let bus = open(dir.path());
            bus.set_control_key(KEY).unwrap();
            provision_with(&bus, compression);
            publish_all(&bus);
        }
        // A record appended by someone without the key claims a stored UID.
        let forged = bus_embedded::testing::append_raw_record(
            dir.path(),
            TOPIC,
            0,
            "k",
            Some(&uid(3)),
            br#"{"forged":1}"#,
            None,
        )
        .unwrap();
        let bus = open(dir.path());
        bus.set_control_key(KEY).unwrap();
        // Every genuine record, read from compressed frames, verifies.
        for i in 0..SINGLE + BATCH {
            let page = bus.fetch(TOPIC, 0, i as u64, 1).unwrap();
            assert_eq!(page[0].value, value_for(&uid(i), i), "{compression}: {i}");
        }
        let found = bus.find_event_by_uid(TOPIC, "k", &uid(3)).unwrap();
        assert_eq!(found.map(|a| a.offset), Some(3), "{compression}");
        // The forgery is refused, never returned as a record.
        assert!(
            bus.fetch(TOPIC, 0, forged, 1).is_err(),
            "{compression}: forged record at {forged} returned"
        );
    }
}

#[test]
fn an_unknown_compression_in_a_manifest_is_an_argument_error() {
    for text in [
        "[[topics]]\nname = \"t\"\npartitions = 1\ncompression = \"snappy\"\n",
        r#"{"topics":[{"name":"t","partitions":1,"compression":"gzip"}]}"#,
    ] {
        match Manifest::parse(text) {
            Err(BusError::InvalidArgument { .. }) => {}
            other => panic!("{text}: {other:?}"),
        }
    }
}

#[test]
fn a_read_only_open_does_not_change_compression() {
    let dir = tempfile::tempdir().unwrap();
    {
        let bus = open(dir.path());
        provision_with(&bus, Compression::None);
    }
    let reader = EmbeddedBus::open_read_only(dir.path()).unwrap();
    let changed = reader.provision(&Manifest::new([
        TopicSpec::new(TOPIC, 1).with_compression(Compression::Zstd)
    ]));
    assert!(
        matches!(changed, Err(BusError::ReadOnly { .. })),
        "{changed:?}"
    );
}

/// The next `n` records of `sub` as `(offset, value)`, failing at the deadline.
fn receive(sub: &mut Subscription, n: usize) -> Vec<(u64, serde_json::Value)> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut out = Vec::new();
    while out.len() < n {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        assert!(!left.is_zero(), "only {} of {n} records arrived", out.len());
        match sub.recv_timeout(left).unwrap() {
            Some(SubscriptionItem::Record { event, .. }) => out.push((event.offset, event.value)),
            Some(other) => panic!("unexpected item {other:?}"),
            None => {}
        }
    }
    out
}

#[test]
fn subscriptions_deliver_compressed_history_and_live_batches() {
    for compression in CODECS {
        let dir = tempfile::tempdir().unwrap();
        let bus = open(dir.path());
        provision_with(&bus, compression);
        publish_all(&bus);
        let subscribe = |bus: &EmbeddedBus| {
            bus.subscribe(
                TOPIC,
                Selector::Topic,
                StartAt::Beginning,
                SubscribeOptions::default(),
            )
            .unwrap()
        };
        let mut sub = subscribe(&bus);
        let reader = EmbeddedBus::open_read_only(dir.path()).unwrap();
        let mut follower = subscribe(&reader);
        let n = SINGLE + BATCH;
        let more: Vec<BatchRecord> = (n..n + 100)
            .map(|i| BatchRecord::new("k", value_for(&uid(i), i)).with_uid(uid(i)))
            .collect();
        bus.publish_batch(TOPIC, &more).unwrap();
        for (who, sub) in [("writer", &mut sub), ("read-only", &mut follower)] {
            let got = receive(sub, n + 100);
            for (i, (offset, value)) in got.iter().enumerate() {
                assert_eq!(*offset, i as u64, "{compression}, {who}");
                assert_eq!(*value, value_for(&uid(i), i), "{compression}, {who}");
            }
        }
    }
}
