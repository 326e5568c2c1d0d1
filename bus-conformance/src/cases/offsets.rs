//! C3 one partitioner, C4 offsets, C5 fetch.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bus_core::{BusError, MAX_JSON_DEPTH, TopicSpec, now_ms, partition_for};
use serde_json::{Value, json};

use crate::util::{assert_contiguous, fetch_all, key_for_partition, ok, publish_n};
use crate::{CaseResult, Ctx, assert_err};

/// Slack allowed between the test's clock and the backend's `stored_at`.
const CLOCK_SKEW_MS: u64 = 5_000;

/// C3: every key lands on `partition_for(key, n)`, and is fetched from there.
pub fn c03_keys_land_on_partition_for(ctx: &mut Ctx) -> CaseResult {
    // Pinned FNV-1a 64 vectors: "a" = 0xaf63dc4c8601ec8c, "foobar" =
    // 0x85944171f73967e8, "" = 0xcbf29ce484222325, taken mod n.
    for (key, n, want) in [("a", 8, 4), ("foobar", 7, 6), ("", 1024, 805)] {
        assert_eq!(partition_for(key, n), want, "C3 vector {key:?} mod {n}");
    }
    let vectors = ctx.simple_topic("vec7", 7);
    let ack = ok("publish", ctx.bus().publish(&vectors, "foobar", &json!(1)));
    assert_eq!(
        ack.partition, 6,
        "\"foobar\" lands on partition 6 of 7 on every backend"
    );
    for partitions in [1, 7] {
        let topic = ctx.simple_topic(&format!("p{partitions}"), partitions);
        for i in 0..40 {
            let key = format!("agent-{i}");
            let ack = ok(
                "publish",
                ctx.bus().publish(&topic, &key, &json!({ "i": i })),
            );
            assert_eq!(ack.partition, partition_for(&key, partitions), "key {key}");
            assert_eq!(ack.topic, topic);
            let got = ok(
                "fetch",
                ctx.bus().fetch(&topic, ack.partition, ack.offset, 1),
            );
            assert_eq!(
                (got[0].key.as_str(), &got[0].value),
                (key.as_str(), &json!({ "i": i }))
            );
        }
    }
    Ok(())
}

/// C4: offsets are partition-local, start at 0 and grow by exactly 1.
pub fn c04_offsets_start_at_zero_and_grow_by_one(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 4);
    let mut per_partition: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for i in 0..60 {
        let ack = ok(
            "publish",
            ctx.bus().publish(&topic, &format!("k{i}"), &json!(i)),
        );
        per_partition
            .entry(ack.partition)
            .or_default()
            .push(ack.offset);
    }
    assert!(
        per_partition.len() > 1,
        "keys should spread over partitions"
    );
    for (partition, offsets) in per_partition {
        let expected: Vec<u64> = (0..offsets.len() as u64).collect();
        assert_eq!(offsets, expected, "partition {partition}");
        let stored = fetch_all(ctx.bus(), &topic, partition, 0);
        assert_eq!(
            stored.iter().map(|e| e.offset).collect::<Vec<_>>(),
            expected
        );
    }
    Ok(())
}

/// C4: the ack's offset is where the record is stored.
pub fn c04_ack_offset_is_the_stored_offset(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 2);
    let key = key_for_partition("k", 1, 2);
    for i in 0..20 {
        let value = json!({ "i": i, "pad": "x".repeat(i) });
        let ack = ok("publish", ctx.bus().publish(&topic, &key, &value));
        let got = ok("fetch", ctx.bus().fetch(&topic, 1, ack.offset, 1));
        assert_eq!(got.len(), 1);
        assert_eq!(
            (got[0].offset, got[0].partition, &got[0].value),
            (ack.offset, 1, &value)
        );
    }
    Ok(())
}

/// C4: after a reopen, offsets continue; none is reused.
pub fn c04_offsets_continue_after_reopen(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 1);
    publish_n(ctx.bus(), &topic, "k", 5);
    ctx.reopen()?;
    let after = publish_n(ctx.bus(), &topic, "k", 2);
    assert_eq!(
        after.iter().map(|a| a.offset).collect::<Vec<_>>(),
        vec![5, 6]
    );
    ctx.reopen()?;
    let all = fetch_all(ctx.bus(), &topic, 0, 0);
    assert_eq!(all.len(), 7);
    assert_contiguous(&all);
    assert_eq!(all[6].value, json!({ "n": 1 }));
    Ok(())
}

/// C5: ranges, `max`, the end of the log and beyond.
pub fn c05_fetch_ranges_and_limits(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 1);
    publish_n(ctx.bus(), &topic, "k", 10);
    let bus = ctx.bus();
    let offsets = |from: u64, max: usize| -> Vec<u64> {
        ok("fetch", bus.fetch(&topic, 0, from, max))
            .iter()
            .map(|e| e.offset)
            .collect()
    };
    assert_eq!(offsets(0, 100), (0..10).collect::<Vec<_>>());
    assert_eq!(offsets(3, 4), vec![3, 4, 5, 6]);
    assert_eq!(offsets(9, 5), vec![9]);
    assert_eq!(offsets(0, 1), vec![0]);
    assert!(offsets(0, 0).is_empty(), "max = 0 must be empty");
    assert!(offsets(10, 5).is_empty(), "at the end must be empty");
    assert!(offsets(11, 5).is_empty(), "past the end must be empty");
    assert!(
        offsets(u64::MAX, 5).is_empty(),
        "far past the end must be empty"
    );
    let values: Vec<Value> = ok("fetch", bus.fetch(&topic, 0, 2, 3))
        .into_iter()
        .map(|e| e.value)
        .collect();
    assert_eq!(
        values,
        vec![json!({"n": 2}), json!({"n": 3}), json!({"n": 4})]
    );
    Ok(())
}

/// C5: an empty partition and the end of a partition answer promptly
/// (within a second: a long-poll that waits out its timeout fails this).
pub fn c05_fetch_at_end_returns_promptly(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 2);
    let key = key_for_partition("k", 0, 2);
    publish_n(ctx.bus(), &topic, &key, 3);
    for (partition, offset) in [(1, 0), (0, 3), (0, 50), (1, 7)] {
        let started = Instant::now();
        let got = ok("fetch", ctx.bus().fetch(&topic, partition, offset, 100));
        let took = started.elapsed();
        assert!(
            got.is_empty(),
            "fetch {partition}@{offset} returned {got:?}"
        );
        assert!(
            took < Duration::from_secs(1),
            "fetch at the end of {partition} took {took:?}: it must not wait for records"
        );
    }
    Ok(())
}

/// C5: values come back equal: unicode, extreme numbers, nesting, empties.
pub fn c05_values_round_trip_exactly(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 3);
    let mut deep = json!("bottom");
    // Inside `{"deep": ..}` below: as deep as the bus accepts.
    for depth in 0..MAX_JSON_DEPTH - 1 {
        deep = if depth % 2 == 0 {
            json!([deep])
        } else {
            json!({ "d": deep })
        };
    }
    let values = vec![
        json!({}),
        json!([]),
        json!(null),
        json!(true),
        json!("a string"),
        json!(0),
        json!({"unicode": "héllo wörld ✓ 日本語 🚀 \u{10FFFF}", "rtl": "مرحبا"}),
        json!({"escapes": "quote\" backslash\\ nul\u{0} tab\t newline\n"}),
        json!({"u64": u64::MAX, "i64": i64::MIN, "neg": -1, "float": -0.5, "big": 1.0e300, "tiny": 5e-324}),
        json!({"deep": deep}),
        json!({"list": (0..1000).collect::<Vec<_>>()}),
        json!({"": "", " ": [{}, [], null]}),
    ];
    for (i, value) in values.iter().enumerate() {
        let key = format!("key-{i}");
        let before = now_ms();
        let ack = ok("publish", ctx.bus().publish(&topic, &key, value));
        let after = now_ms();
        let got = ok(
            "fetch",
            ctx.bus().fetch(&topic, ack.partition, ack.offset, 1),
        );
        let event = &got[0];
        assert_eq!(&event.value, value, "value #{i}");
        assert_eq!(event.key, key);
        assert_eq!(event.partition, ack.partition);
        assert!(
            event.stored_at + CLOCK_SKEW_MS >= before && event.stored_at <= after + CLOCK_SKEW_MS,
            "stored_at {} not within {before}..{after}",
            event.stored_at
        );
    }
    Ok(())
}

/// C5: a fetch does not skip or repeat across many pages of a long partition.
pub fn c05_paged_replay_is_complete(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 1);
    let records: Vec<_> = (0..1_500)
        .map(|i| bus_core::BatchRecord::new("k", json!({ "i": i })))
        .collect();
    for chunk in records.chunks(250) {
        ok("publish_batch", ctx.bus().publish_batch(&topic, chunk));
    }
    for page in [1, 7, 100, 1000] {
        let mut offset = 0;
        let mut seen = 0u64;
        loop {
            let got = ok("fetch", ctx.bus().fetch(&topic, 0, offset, page));
            if got.is_empty() {
                break;
            }
            assert!(got.len() <= page);
            for event in &got {
                assert_eq!(event.offset, seen);
                assert_eq!(event.value, json!({ "i": seen }));
                seen += 1;
            }
            offset = seen;
        }
        assert_eq!(seen, 1_500, "page size {page}");
    }
    Ok(())
}

/// C4/C5: a batch publish gets one ack per record, in order, contiguous.
pub fn c05_batch_publish_acks_in_order(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 3);
    let records: Vec<_> = (0..50)
        .map(|i| bus_core::BatchRecord::new(format!("k{}", i % 5), json!({ "i": i })))
        .collect();
    let acks = ok("publish_batch", ctx.bus().publish_batch(&topic, &records));
    assert_eq!(acks.len(), records.len());
    let mut next: BTreeMap<u32, u64> = BTreeMap::new();
    for (record, ack) in records.iter().zip(&acks) {
        assert_eq!(ack.partition, partition_for(&record.key, 3));
        let expected = next.entry(ack.partition).or_insert(0);
        assert_eq!(
            ack.offset, *expected,
            "batch acks must be contiguous per partition"
        );
        *expected += 1;
        let got = ok(
            "fetch",
            ctx.bus().fetch(&topic, ack.partition, ack.offset, 1),
        );
        assert_eq!(got[0].value, record.value);
    }
    assert!(ok("empty batch", ctx.bus().publish_batch(&topic, &[])).is_empty());
    Ok(())
}

/// C12: a batch with one bad record stores none of it.
pub fn c12_bad_batch_stores_nothing(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.topic("t");
    ctx.provision([TopicSpec::new(topic.clone(), 1).with_max_record_bytes(100)]);
    let mut records: Vec<_> = (0..5)
        .map(|i| bus_core::BatchRecord::new("k", json!({ "i": i })))
        .collect();
    records.push(bus_core::BatchRecord::new(
        "k",
        json!({ "big": "x".repeat(200) }),
    ));
    assert_err!(
        ctx.bus().publish_batch(&topic, &records),
        BusError::TooLarge { .. }
    );
    records.pop();
    records.push(bus_core::BatchRecord::new("bad\0key", json!(1)));
    assert_err!(
        ctx.bus().publish_batch(&topic, &records),
        BusError::InvalidArgument { .. }
    );
    assert!(
        fetch_all(ctx.bus(), &topic, 0, 0).is_empty(),
        "a refused batch left records"
    );
    Ok(())
}

/// C4/C11: `offsets` reports the retained range, also once retention
/// expired everything (when the backend runs retention in `maintenance`).
pub fn c04_offsets_report_the_retained_range(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.topic("t");
    // A minute of retention: a broker enforcing it natively keeps all five.
    ctx.provision([TopicSpec::new(topic.clone(), 2).with_retention_ms(60_000)]);
    let key = key_for_partition("k", 1, 2);
    publish_n(ctx.bus(), &topic, &key, 5);
    let range = |ctx: &Ctx, p| ok("offsets", ctx.bus().offsets(&topic, p));
    assert_eq!(
        range(ctx, 0),
        bus_core::PartitionOffsets { first: 0, next: 0 }
    );
    assert_eq!(
        range(ctx, 1),
        bus_core::PartitionOffsets { first: 0, next: 5 }
    );
    assert_err!(
        ctx.bus().offsets(&topic, 2),
        BusError::UnknownPartition { .. }
    );
    ctx.require(
        ctx.caps().maintenance_retention,
        "retention is not run by maintenance",
    )?;
    ok("maintenance", ctx.bus().maintenance(now_ms() + 120_000));
    assert_eq!(
        range(ctx, 1),
        bus_core::PartitionOffsets { first: 5, next: 5 }
    );
    Ok(())
}
