//! C24 on the embedded log (feature `cold`): a cold tier the topic's
//! manifest declares (`[topics.cold]`: where, and how long) is checked by
//! `provision` before anything is created, and kept by `maintenance`:
//! archived before hot retention drops anything, read back through the same
//! `fetch`, expired after its own retention.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bus_core::consumer::{ConsumeOptions, DurableConsumers};
use bus_core::{BusError, ColdSpec, EventBus, Manifest, Selector, StartAt, StoredEvent, TopicSpec};
use bus_embedded::{EmbeddedBus, Options, cold};
use serde_json::json;

mod cold_support;

use cold_support::locations;

const HOUR_MS: u64 = 3_600_000;

fn open(dir: &std::path::Path) -> EmbeddedBus {
    EmbeddedBus::open_with(dir, Options::default().segment_bytes(4096)).unwrap()
}

fn read_all(bus: &EmbeddedBus, topic: &str) -> Vec<StoredEvent> {
    let mut out: Vec<StoredEvent> = Vec::new();
    let mut next = 0;
    loop {
        let page = bus.fetch(topic, 0, next, 128).unwrap();
        let Some(last) = page.last() else { return out };
        next = last.offset + 1;
        out.extend(page);
    }
}

#[test]
fn a_declared_tier_is_archived_read_and_expired_by_maintenance() {
    let dir = tempfile::tempdir().unwrap();
    for (name, location) in locations(dir.path()) {
        let data = dir.path().join(format!("bus-{name}"));
        let topic = format!("kept-{name}");
        let manifest = Manifest::from_toml_str(&format!(
            "[[topics]]\nname = {topic:?}\npartitions = 1\nretention_ms = 1\n\
             [topics.cold]\nlocation = {location:?}\nretention_ms = {HOUR_MS}\n"
        ))
        .unwrap();
        let bus = open(&data);
        bus.provision(&manifest).unwrap();
        for n in 0..400 {
            bus.publish(&topic, "k", &json!({ "n": n })).unwrap();
        }
        let written = read_all(&bus, &topic);
        assert_eq!(written.len(), 400, "{name}");

        // Hot retention past every record: maintenance archives first, so
        // the hot log empties and nothing is lost.
        let expired = bus.maintenance(bus_core::now_ms() + 60_000).unwrap();
        assert_eq!(expired, 400, "{name}: the whole hot log expired");
        drop(bus);

        // The declaration survives a reopen (it is part of the topic's spec).
        let bus = open(&data);
        let spec = bus.topic_spec(&topic).unwrap().unwrap();
        assert_eq!(
            spec.cold,
            Some(ColdSpec::new(location.clone()).with_retention_ms(HOUR_MS)),
            "{name}"
        );
        assert_eq!(
            read_all(&bus, &topic),
            written,
            "{name}: read back from the tier"
        );
        // A durable consumer starting at the beginning is served from the tier too.
        let mut consumer = bus
            .consume(
                &topic,
                "from-the-start",
                Selector::Topic,
                StartAt::Beginning,
                ConsumeOptions::default(),
            )
            .unwrap();
        for want in &written {
            let delivery = consumer
                .recv_timeout(Duration::from_secs(10))
                .unwrap()
                .unwrap_or_else(|| panic!("{name}: no delivery of offset {}", want.offset));
            assert_eq!(delivery.event, *want, "{name}");
            consumer.ack(&delivery).unwrap();
        }
        drop(consumer);
        let ack = bus.publish(&topic, "k", &json!({ "n": 400 })).unwrap();
        assert_eq!(
            ack.offset, 400,
            "{name}: publishing goes on at the next offset"
        );

        // Within the cold retention nothing cold goes: only the new hot
        // record, archived first, leaves the hot log.
        let removed = bus.maintenance(bus_core::now_ms() + 60_000).unwrap();
        assert_eq!(removed, 1, "{name}");
        assert_eq!(read_all(&bus, &topic).len(), 401, "{name}");

        // Past it (two hours on, an hour kept), the tier drops every
        // record; reads from 0 find nothing, publishing goes on.
        let removed = bus.maintenance(bus_core::now_ms() + 2 * HOUR_MS).unwrap();
        assert_eq!(removed, 401, "{name}: records removed");
        assert_eq!(read_all(&bus, &topic), Vec::new(), "{name}");
        assert_eq!(bus.offsets(&topic, 0).unwrap().first, 401, "{name}");
        let ack = bus.publish(&topic, "k", &json!({ "n": 401 })).unwrap();
        assert_eq!(ack.offset, 401, "{name}");
    }
}

#[test]
fn hot_retention_never_drops_what_the_declared_tier_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let bus = open(&dir.path().join("bus"));
    let location = format!("file://{}", dir.path().join("tier").display());
    let spec = TopicSpec::new("audit", 1)
        .with_retention_ms(1)
        .with_cold(ColdSpec::new(&location));
    bus.provision(&Manifest::new([spec])).unwrap();
    for n in 0..300 {
        bus.publish("audit", "k", &json!({ "n": n })).unwrap();
    }
    // Maintenance archived everything it let retention drop: archiving
    // again finds nothing new, and every offset reads back.
    let expired = bus.maintenance(bus_core::now_ms() + 60_000).unwrap();
    assert!(expired > 0, "hot retention dropped nothing");
    assert_eq!(cold::archive_all(&bus, "audit").unwrap(), 0);
    let all = read_all(&bus, "audit");
    assert_eq!(
        all.iter().map(|e| e.offset).collect::<Vec<_>>(),
        (0..300).collect::<Vec<_>>()
    );
}

#[test]
fn a_tier_that_cannot_be_used_provisions_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let bus = open(&dir.path().join("bus"));
    let cases = [
        ("ftp://host/dir", "topics[1].cold.location"),
        ("file:///proc/bus-cold-tier-here", ""),
    ];
    for (location, field) in cases {
        let manifest = Manifest::new([
            TopicSpec::new("first", 1),
            TopicSpec::new("second", 1).with_cold(ColdSpec::new(location)),
        ]);
        let error = bus.provision(&manifest).unwrap_err();
        if !field.is_empty() {
            assert!(
                matches!(&error, BusError::InvalidArgument { field: f, .. } if f == field),
                "{location}: {error:?}"
            );
        }
        assert!(
            bus.topics().is_empty(),
            "{location}: {:?} created",
            bus.topics()
        );
    }
}

#[test]
fn a_declared_location_cannot_move_but_may_go_unsaid() {
    let dir = tempfile::tempdir().unwrap();
    let bus = open(&dir.path().join("bus"));
    let here = format!("file://{}", dir.path().join("here").display());
    let there = format!("file://{}", dir.path().join("there").display());
    let declared = TopicSpec::new("audit", 1).with_cold(ColdSpec::new(&here));
    bus.provision(&Manifest::new([declared.clone()])).unwrap();
    let moved = TopicSpec::new("audit", 1).with_cold(ColdSpec::new(&there));
    match bus.provision(&Manifest::new([moved])).unwrap_err() {
        BusError::Conflict { property, .. } => assert_eq!(property, "cold.location"),
        other => panic!("expected Conflict, got {other:?}"),
    }
    // A manifest that does not mention the tier leaves it as it is.
    bus.provision(&Manifest::new([TopicSpec::new("audit", 1)]))
        .unwrap();
    assert_eq!(
        bus.topic_spec("audit").unwrap().unwrap().cold,
        declared.cold
    );

    // A tier attached by hand counts as the topic's too.
    bus.provision(&Manifest::new([TopicSpec::new("other", 1)]))
        .unwrap();
    cold::attach(&bus, "other", &here).unwrap();
    let elsewhere = TopicSpec::new("other", 1).with_cold(ColdSpec::new(&there));
    match bus.provision(&Manifest::new([elsewhere])).unwrap_err() {
        BusError::Conflict { property, .. } => assert_eq!(property, "cold.location"),
        other => panic!("expected Conflict, got {other:?}"),
    }
    let same = TopicSpec::new("other", 1).with_cold(ColdSpec::new(&here));
    bus.provision(&Manifest::new([same])).unwrap();
}
