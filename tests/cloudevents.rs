//! Feature `cloudevents` through `bus::open`: events built with the SDK
//! (`bus::cloudevents::sdk`) are published on memory, the embedded log and
//! (with their features, when the tests' brokers are there) NATS, Kafka and
//! PostgreSQL, read back by fetch (after a reopen, on the log) and by a live
//! subscription, and map back to events equal to the originals; events the
//! bus cannot carry leave nothing stored.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bus::cloudevents::sdk::{AttributesWriter, Event, EventBuilder, EventBuilderV10};
use bus::cloudevents::{self as ce, Spelling};
use bus::{
    BusError, EventBus, Manifest, Selector, StartAt, SubscribeOptions, SubscriptionItem, TopicSpec,
};
use serde_json::json;

const TOPIC: &str = "cloudevents";

fn manifest() -> Manifest {
    Manifest::new([TopicSpec::new(TOPIC, 3)])
}

/// A topic of this test's own on a shared broker (its records outlive the run).
#[cfg(any(feature = "nats", feature = "kafka", feature = "postgres"))]
fn broker_topic() -> String {
    format!("ce-{}", bus_conformance::namespace_id(12))
}

fn events() -> Vec<Event> {
    let json = EventBuilderV10::new()
        .id("evt-1")
        .source("https://supervisor.example/agents")
        .ty("com.example.agent.started")
        .subject("agent-1")
        .time("2026-12-07T01:02:03.5Z")
        .extension("partitionkey", "agent-1")
        .extension("runid", "r-77")
        .data_with_schema(
            "application/json",
            "https://supervisor.example/schemas/start.json",
            json!({"pid": 4242, "argv": ["run", "--fast"]}),
        )
        .build()
        .unwrap();
    let text = EventBuilderV10::new()
        .id("evt-2")
        .source("/agents/agent-1")
        .ty("com.example.agent.log")
        .subject("agent-1")
        .data("text/plain; charset=utf-8", "started in 3 ms")
        .build()
        .unwrap();
    let empty = EventBuilderV10::new()
        .id("evt-3")
        .source("/agents/agent-1")
        .ty("com.example.agent.heartbeat")
        .subject("agent-1")
        .build()
        .unwrap();
    vec![json, text, empty]
}

/// Publishes the events, reads them back live and by fetch, and checks
/// each maps back to its original.
fn round_trip(bus: &dyn EventBus, topic: &str) -> u32 {
    let mut live = bus
        .subscribe(
            topic,
            Selector::Key("agent-1".into()),
            StartAt::Beginning,
            SubscribeOptions::default(),
        )
        .unwrap();
    let originals = events();
    let mut partition = None;
    for event in &originals {
        let ack = ce::publish(bus, topic, event).unwrap();
        assert_eq!(*partition.get_or_insert(ack.partition), ack.partition);
    }
    let partition = partition.unwrap();

    for original in &originals {
        match live.recv_timeout(Duration::from_secs(10)).unwrap() {
            Some(SubscriptionItem::Record { event, headers, .. }) => {
                let record = bus::StoredRecord { event, headers };
                assert_eq!(&ce::to_event(&record).unwrap(), original);
            }
            other => panic!("expected {}, got {other:?}", original),
        }
    }

    let fetched = bus.fetch_with_headers(topic, partition, 0, 10).unwrap();
    let back: Vec<Event> = fetched.iter().map(|r| ce::to_event(r).unwrap()).collect();
    assert_eq!(back, originals);
    assert_eq!(fetched[0].event.key, "agent-1");
    let runid = Spelling::for_bus(bus).header("runid");
    assert_eq!(fetched[0].headers.get(&runid), Some("r-77"));
    partition
}

#[test]
fn sdk_events_round_trip_on_the_embedded_log_across_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let partition = {
        let bus = bus::open(&url, &manifest()).unwrap();
        assert_eq!(Spelling::for_bus(&*bus), Spelling::Underscore);
        round_trip(&*bus, TOPIC)
    };
    let bus = bus::open(&url, &manifest()).unwrap();
    let fetched = bus.fetch_with_headers(TOPIC, partition, 0, 10).unwrap();
    let back: Vec<Event> = fetched.iter().map(|r| ce::to_event(r).unwrap()).collect();
    assert_eq!(back, events(), "what the log kept across the reopen");
}

#[test]
fn sdk_events_round_trip_on_memory() {
    let bus = bus::open("memory://", &manifest()).unwrap();
    round_trip(&*bus, TOPIC);
}

/// The round trip on a broker: `url` from the tests' environment, or a
/// loud skip (a failure when brokers are required).
#[cfg(any(feature = "nats", feature = "kafka", feature = "postgres"))]
fn on_broker(
    found: Result<String, bus_conformance::Unavailable>,
    url: impl Fn(String) -> String,
    test: &str,
    spelling: Spelling,
) {
    let found = match found {
        Ok(found) => found,
        Err(why) => {
            assert!(
                !bus_conformance::brokers_required(),
                "BUS_REQUIRE_BROKERS=1 but {why}"
            );
            bus_conformance::loud(&format!("SKIPPED {test}: {why}"));
            return;
        }
    };
    let topic = broker_topic();
    let bus = bus::open(
        &url(found),
        &Manifest::new([TopicSpec::new(topic.as_str(), 3)]),
    )
    .unwrap();
    assert_eq!(Spelling::for_bus(&*bus), spelling);
    round_trip(&*bus, &topic);
}

#[cfg(feature = "nats")]
#[test]
fn sdk_events_round_trip_on_nats() {
    on_broker(
        bus_conformance::brokers::nats_url(),
        |url| url,
        "sdk_events_round_trip_on_nats",
        Spelling::Dash,
    );
}

#[cfg(feature = "kafka")]
#[test]
fn sdk_events_round_trip_on_kafka() {
    on_broker(
        bus_conformance::brokers::kafka_brokers(),
        |brokers| format!("kafka://{brokers}"),
        "sdk_events_round_trip_on_kafka",
        Spelling::Underscore,
    );
}

#[cfg(feature = "postgres")]
#[test]
fn sdk_events_round_trip_on_postgres() {
    on_broker(
        bus_conformance::brokers::postgres_url(),
        |url| url,
        "sdk_events_round_trip_on_postgres",
        Spelling::Underscore,
    );
}

#[test]
fn refused_events_leave_nothing_on_the_embedded_log() {
    let dir = tempfile::tempdir().unwrap();
    let bus = bus::open(&format!("file://{}", dir.path().display()), &manifest()).unwrap();
    let mut too_long = events().remove(0);
    too_long.set_subject(Some("s".repeat(2000)));
    let mut blank_type = events().remove(0);
    blank_type.set_type("");
    let bytes = EventBuilderV10::new()
        .id("b")
        .source("/s")
        .ty("t")
        .data("application/octet-stream", vec![0xff_u8, 0x00])
        .build()
        .unwrap();
    for (event, field) in [
        (too_long, "headers"),
        (blank_type, "ce_type"),
        (bytes, "data"),
    ] {
        match ce::publish(&*bus, TOPIC, &event) {
            Err(BusError::InvalidArgument { field: got, .. }) => assert_eq!(got, field),
            other => panic!("expected InvalidArgument on {field}, got {other:?}"),
        }
    }
    for partition in 0..3 {
        assert_eq!(bus.offsets(TOPIC, partition).unwrap().next, 0);
    }
}
