//! Sequential replay through the read-ahead cursor (contract C5 and C8):
//! once a reader continues where it stopped, bus-nats asks the server for
//! the next pages before they are fetched. These cases pin that the pages
//! asked for ahead never reorder, repeat or drop a record: while records
//! keep arriving, when the page size changes between calls, when the
//! reader jumps elsewhere, and when the server deletes the reader's
//! consumer under it.

use crate::common;

use bus_core::{BatchRecord, EventBus, Manifest, StoredEvent, TopicSpec};
use bus_nats::NatsBus;
use bus_nats::naming::stream_name;
use common::{cleanup, raw};
use futures::StreamExt;
use serde_json::json;

fn bus() -> Option<NatsBus> {
    common::shared_bus("replay", "rep")
}

fn publish_range(bus: &NatsBus, topic: &str, range: std::ops::Range<u64>) {
    let records: Vec<BatchRecord> = range
        .map(|i| BatchRecord::new("k", json!({ "i": i })))
        .collect();
    for chunk in records.chunks(500) {
        bus.publish_batch(topic, chunk).expect("publish");
    }
}

/// Checks that `events` are exactly the records `from..` in order.
fn assert_run(events: &[StoredEvent], from: u64) {
    for (expected, event) in (from..).zip(events) {
        assert_eq!(event.offset, expected, "offsets out of order");
        assert_eq!(event.value, json!({ "i": expected }), "value of {expected}");
    }
}

#[test]
fn replay_while_records_arrive_returns_each_once_in_order() {
    let Some(bus) = bus() else { return };
    bus.provision(&Manifest::new([TopicSpec::new("t", 1)]))
        .expect("provision");
    publish_range(&bus, "t", 0..2_000);
    let mut next = 0u64;
    let mut stored = 2_000u64;
    // Every page is followed by more records, so the request sent ahead
    // meets a stream that grew after it was asked for.
    while next < stored {
        let page = bus.fetch("t", 0, next, 300).expect("fetch");
        assert!(!page.is_empty(), "empty page at {next} of {stored}");
        assert_run(&page, next);
        next += page.len() as u64;
        if stored < 4_000 {
            publish_range(&bus, "t", stored..stored + 70);
            stored += 70;
        }
    }
    assert_eq!(next, stored);
    // At the end: nothing, then the next record as soon as it is stored.
    assert!(bus.fetch("t", 0, next, 300).expect("fetch").is_empty());
    publish_range(&bus, "t", stored..stored + 1);
    assert_run(&bus.fetch("t", 0, next, 300).expect("fetch"), next);
    cleanup(&bus);
}

#[test]
fn page_sizes_may_change_and_the_reader_may_jump() {
    let Some(bus) = bus() else { return };
    bus.provision(&Manifest::new([TopicSpec::new("t", 1)]))
        .expect("provision");
    publish_range(&bus, "t", 0..3_000);
    let mut next = 0u64;
    for max in [500, 500, 20, 900, 9, 3, 700, 1_000, 1_000] {
        let page = bus.fetch("t", 0, next, max).expect("fetch");
        let left = usize::try_from(3_000 - next).expect("small");
        assert_eq!(page.len(), max.min(left), "page at {next}");
        assert_run(&page, next);
        next += page.len() as u64;
    }
    assert_eq!(next, 3_000);
    // Backwards and forwards while pages are asked for ahead.
    for (from, max) in [
        (100u64, 400),
        (500, 400),
        (900, 400),
        (10, 50),
        (2_990, 400),
    ] {
        let page = bus.fetch("t", 0, from, max).expect("fetch");
        let left = usize::try_from(3_000 - from).expect("small");
        assert_eq!(page.len(), max.min(left), "page at {from}");
        assert_run(&page, from);
    }
    cleanup(&bus);
}

#[test]
fn replay_continues_after_the_server_deletes_the_reader() {
    let Some(bus) = bus() else { return };
    bus.provision(&Manifest::new([TopicSpec::new("t", 1)]))
        .expect("provision");
    publish_range(&bus, "t", 0..5_000);
    let mut next = 0u64;
    for _ in 0..3 {
        let page = bus.fetch("t", 0, next, 400).expect("fetch");
        assert_run(&page, next);
        next += page.len() as u64;
    }
    // The reader's consumer is gone (as after the server's idle expiry or
    // a restart) while a request for the next pages is outstanding.
    let stream = stream_name(bus.prefix(), "t", 0);
    let deleted = raw(async |js| {
        let stream = js.get_stream(&stream).await.expect("stream");
        let names: Vec<String> = stream
            .consumer_names()
            .filter_map(|name| async move { name.ok() })
            .collect()
            .await;
        for name in &names {
            stream.delete_consumer(name).await.expect("delete consumer");
        }
        names.len()
    });
    assert_eq!(deleted, 1, "one reader consumer per partition");
    while next < 5_000 {
        let page = bus.fetch("t", 0, next, 400).expect("fetch");
        assert!(!page.is_empty(), "empty page at {next}");
        assert_run(&page, next);
        next += page.len() as u64;
    }
    assert!(bus.fetch("t", 0, next, 400).expect("fetch").is_empty());
    cleanup(&bus);
}
