//! The read-back of records the broker stored but reported without an
//! offset ([`crate::locate`]), against the broker of `BUS_KAFKA_BROKERS`.
//! The reports themselves come from librdkafka's retries under load (the
//! failure CI met in C9's sixty-four threads); here the records are stored
//! by the bus, so their true offsets are known, and then handed to the
//! read-back as if their reports had had none.

use std::time::{Duration, Instant};

use bus_core::backend::BatchItem;
use bus_core::{BusError, EventBus, Headers, Manifest, TopicSpec};
use serde_json::json;

use crate::locate::{Start, after_scan, resolve};
use crate::publish::{Prepared, prepare_all};
use crate::{KafkaBus, KafkaOptions};

/// A bus on its own manifest topic and its options, or `None` (a loud
/// skip) without a broker.
fn bus(test: &str) -> Option<(KafkaBus, KafkaOptions)> {
    let brokers = match bus_conformance::brokers::kafka_brokers() {
        Ok(brokers) => brokers,
        Err(why) => {
            assert!(
                !bus_conformance::brokers_required(),
                "{test}: BUS_REQUIRE_BROKERS=1 but {}",
                why.0
            );
            bus_conformance::loud(&format!("SKIPPED kafka::{test}: {}", why.0));
            return None;
        }
    };
    let id = bus_conformance::namespace_id(12);
    let options = KafkaOptions::new(brokers.trim().split(',').map(str::to_owned))
        .manifest_topic(format!("bus-test-manifest-{id}"));
    let bus = KafkaBus::connect_with(options.clone()).unwrap_or_else(|e| panic!("connect: {e}"));
    Some((bus, options))
}

/// A new one-partition topic of `writer`'s, and the time it was made
/// (epoch ms): the `since` of publishes that follow.
fn one_partition_topic(writer: &KafkaBus) -> (String, i64) {
    let topic = format!("locate-{}", bus_conformance::namespace_id(8));
    writer
        .provision(&Manifest::new([TopicSpec::new(topic.clone(), 1)]))
        .unwrap_or_else(|e| panic!("provision: {e}"));
    let since = i64::try_from(bus_core::now_ms()).unwrap_or(i64::MAX);
    (topic, since)
}

/// `items` as the bus prepares them for `topic`.
fn prepared(bus: &KafkaBus, topic: &str, items: &[BatchItem<'_>]) -> (String, Vec<Prepared>) {
    let entry = bus.entry(topic).unwrap_or_else(|e| panic!("entry: {e}"));
    let prepared = prepare_all(None, &entry, items).unwrap_or_else(|e| panic!("{e}"));
    (entry.kafka_topic, prepared)
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

/// The deadline of a read-back expected to find nothing: it watches the
/// partition until then.
fn soon() -> Instant {
    Instant::now() + Duration::from_secs(1)
}

fn offsets(found: Vec<Result<u64, BusError>>) -> Vec<u64> {
    found
        .into_iter()
        .map(|r| r.unwrap_or_else(|e| panic!("resolve: {e}")))
        .collect()
}

/// A [`Start`] at `since_ms` with no floors (a bus that saw no report).
fn at(since_ms: i64) -> Start {
    Start {
        since_ms,
        floors: std::collections::HashMap::new(),
    }
}

fn unknown(n: usize) -> Vec<Result<Option<u64>, BusError>> {
    (0..n).map(|_| Ok(None)).collect()
}

fn connect(options: &KafkaOptions) -> KafkaBus {
    KafkaBus::connect_with(options.clone()).unwrap_or_else(|e| panic!("connect: {e}"))
}

#[test]
fn records_reported_without_an_offset_are_found_in_order_and_never_twice() {
    let Some((writer, options)) = bus("records_reported_without_an_offset_are_found") else {
        return;
    };
    let (topic, since) = one_partition_topic(&writer);
    let headers = Headers::try_from_pairs([("trace", "t-1")]).unwrap_or_else(|e| panic!("{e}"));
    let none = Headers::new();
    let (same, other) = (json!({ "n": 1 }), json!({ "n": 2 }));
    let item = |value, uid, headers| BatchItem {
        key: "k",
        value,
        uid,
        headers,
    };
    // Identical records, one with headers, one with a UID, stored by
    // another bus: the reader's own reports never named them.
    let items = [
        item(&same, None, &none),
        item(&same, None, &none),
        item(&same, None, &headers),
        item(&other, Some("u-1"), &none),
    ];
    let acks = writer
        .publish_many(&topic, &items)
        .unwrap_or_else(|e| panic!("publish_many: {e}"));
    let want: Vec<u64> = acks.iter().map(|ack| ack.offset).collect();
    let (kafka_topic, records) = prepared(&writer, &topic, &items);
    let reader = connect(&options);
    // No report had an offset: the identical records get distinct offsets,
    // in produce order.
    let found = resolve(
        &reader.core,
        &kafka_topic,
        &records,
        unknown(4),
        &at(since),
        deadline(),
    );
    assert_eq!(offsets(found), want);
    // Handed out once: the same records reported again are not found, and
    // that is a timeout (stored, offset unknown), never a wrong offset.
    let again = resolve(
        &reader.core,
        &kafka_topic,
        &records[..2],
        unknown(2),
        &at(since),
        soon(),
    );
    assert!(
        again
            .iter()
            .all(|r| matches!(r, Err(BusError::Timeout { .. }))),
        "{again:?}"
    );
    // A record appended before the publish began (less the clock slack)
    // is not the one looked for.
    let fresh = connect(&options);
    let late = resolve(
        &fresh.core,
        &kafka_topic,
        &records[3..],
        unknown(1),
        &at(since + 120_000),
        soon(),
    );
    assert!(
        matches!(late[..], [Err(BusError::Timeout { .. })]),
        "{late:?}"
    );
    // The call's neighbours bound a record: told that the first record was
    // stored at its offset, the second is found after it, not the identical
    // first.
    let outcomes = vec![Ok(Some(want[0])), Ok(None)];
    let found = resolve(
        &fresh.core,
        &kafka_topic,
        &records[..2],
        outcomes,
        &at(since),
        deadline(),
    );
    assert_eq!(offsets(found), want[..2]);
    // A heartbeat: a bus published the same record before (its report
    // named the offset), then again, and this time the report had none.
    // The earlier one, and every identical record stored before it, lie at
    // or below the floor: the new record is found above it.
    let heartbeat = connect(&options);
    let first = heartbeat
        .publish(&topic, "k", &same)
        .unwrap_or_else(|e| panic!("publish: {e}"));
    let start = Start::now(&heartbeat.core, &kafka_topic, &records[..1]);
    assert_eq!(start.floors.get(&0), Some(&first.offset));
    let second = writer
        .publish(&topic, "k", &same)
        .unwrap_or_else(|e| panic!("publish: {e}"));
    let found = resolve(
        &heartbeat.core,
        &kafka_topic,
        &records[..1],
        unknown(1),
        &start,
        deadline(),
    );
    assert_eq!(offsets(found), [second.offset]);
    // A record never stored is not found either; an error passes through.
    let (_, never) = prepared(&writer, &topic, &[item(&json!({ "n": 3 }), None, &none)]);
    let failed = || BusError::backend("kafka", "refused");
    let records = [never[0].clone(), never[0].clone()];
    let got = resolve(
        &reader.core,
        &kafka_topic,
        &records,
        vec![Ok(None), Err(failed())],
        &at(since),
        soon(),
    );
    assert!(matches!(got[0], Err(BusError::Timeout { .. })), "{got:?}");
    assert_eq!(
        got[1].as_ref().err().map(ToString::to_string),
        Some(failed().to_string())
    );
}

#[test]
fn a_record_appended_after_the_first_scan_is_found() {
    let test = "a_record_appended_after_the_first_scan_is_found";
    let Some((writer, options)) = bus(test) else {
        return;
    };
    let (topic, since) = one_partition_topic(&writer);
    let value = json!({ "appended": "after the scan" });
    let none = Headers::new();
    let items = [BatchItem {
        key: "k",
        value: &value,
        uid: None,
        headers: &none,
    }];
    let (kafka_topic, records) = prepared(&writer, &topic, &items);
    let reader = connect(&options);
    // The broker made the record visible only after the read-back's first
    // scan of the partition (its report had come without an offset).
    let stored = std::sync::Arc::new(std::sync::Mutex::new(None));
    {
        let (stored, topic, value) = (std::sync::Arc::clone(&stored), topic.clone(), value.clone());
        after_scan::set(move || {
            let ack = writer
                .publish(&topic, "k", &value)
                .unwrap_or_else(|e| panic!("publish: {e}"));
            *stored.lock().unwrap_or_else(|e| e.into_inner()) = Some(ack.offset);
        });
    }
    let found = resolve(
        &reader.core,
        &kafka_topic,
        &records,
        unknown(1),
        &at(since),
        deadline(),
    );
    let want = stored
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .unwrap_or_else(|| panic!("the step after the scan did not run"));
    assert_eq!(offsets(found), [want]);
}
