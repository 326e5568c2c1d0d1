//! The reference trait's own usage, compiled and run against bus-core: code
//! written against `av_bridge::bus` (the reference `EventBus`, its error and
//! record types, `partition_for`) must build unchanged and behave the same.
//!
//! Everything here uses only names the reference exports, spelled the way
//! the reference spells them: tuple variants built and matched by position,
//! the records built by struct literal, a bus that implements just the
//! reference's required methods and relies on its provided defaults.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::sync::Mutex;

use bus_core::{BusError, EventBus, PublishAck, StoredEvent, partition_for};

/// A test double as a harness would write it against the reference trait:
/// only `publish`, `fetch`, `partitions` and `topics`.
struct VecBus {
    partitions: u32,
    log: Mutex<HashMap<(String, u32), Vec<StoredEvent>>>,
}

impl VecBus {
    fn new(partitions: u32) -> Self {
        Self {
            partitions,
            log: Mutex::new(HashMap::new()),
        }
    }
}

impl EventBus for VecBus {
    fn publish(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
    ) -> Result<PublishAck, BusError> {
        if topic != "audit" {
            return Err(BusError::UnknownTopic(topic.to_owned()));
        }
        let partition = partition_for(key, self.partitions);
        let mut log = self
            .log
            .lock()
            .map_err(|_| BusError::Backend("log lock poisoned".to_owned()))?;
        let events = log.entry((topic.to_owned(), partition)).or_default();
        let offset = events.len() as u64;
        events.push(StoredEvent {
            partition,
            offset,
            key: key.to_owned(),
            value: value.clone(),
            stored_at: 1_700_000_000_000 + offset,
        });
        Ok(PublishAck {
            topic: topic.to_owned(),
            partition,
            offset,
        })
    }

    fn fetch(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, BusError> {
        if topic != "audit" {
            return Err(BusError::UnknownTopic(topic.to_owned()));
        }
        let log = self
            .log
            .lock()
            .map_err(|_| BusError::Backend("log lock poisoned".to_owned()))?;
        Ok(log
            .get(&(topic.to_owned(), partition))
            .map(|events| {
                events
                    .iter()
                    .filter(|event| event.offset >= offset)
                    .take(max)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default())
    }

    fn partitions(&self, topic: &str) -> Result<u32, BusError> {
        if topic == "audit" {
            Ok(self.partitions)
        } else {
            Err(BusError::UnknownTopic(topic.to_owned()))
        }
    }

    fn topics(&self) -> Vec<String> {
        vec!["audit".to_owned()]
    }
}

/// What a caller of the reference does with an error: match every
/// reference variant by its shape.
fn describe(error: &BusError) -> String {
    match error {
        BusError::UnknownTopic(topic) => format!("unknown {topic}"),
        BusError::Io(io) => format!("io {}", io.kind()),
        BusError::Serde(serde) => format!("serde line {}", serde.line()),
        BusError::Backend(message) => format!("backend {message}"),
        _ => "other".to_owned(),
    }
}

#[test]
fn every_reference_error_variant_builds_matches_and_displays_as_the_reference() {
    let unknown = BusError::UnknownTopic("t".to_owned());
    assert_eq!(describe(&unknown), "unknown t");
    assert_eq!(
        unknown.to_string(),
        "unknown topic \"t\" (provision it via the manifest first)"
    );

    // `#[from]` conversions, as `?` uses them.
    let io: BusError = std::io::Error::from(std::io::ErrorKind::NotFound).into();
    assert_eq!(describe(&io), "io entity not found");
    assert!(io.to_string().starts_with("bus io: "));
    let serde: BusError = serde_json::from_str::<u32>("\n\"x\"").unwrap_err().into();
    assert_eq!(describe(&serde), "serde line 2");
    assert!(serde.to_string().starts_with("bus serde: "));
    fn question_mark() -> Result<(), BusError> {
        std::fs::read("/definitely/not/here")?;
        Ok(())
    }
    assert!(matches!(question_mark(), Err(BusError::Io(_))));

    let backend = BusError::Backend("x".to_owned());
    assert_eq!(describe(&backend), "backend x");
    assert_eq!(backend.to_string(), "bus backend: x");
    // A string-only failure has no cause behind it.
    assert!(std::error::Error::source(&backend).is_none());
}

#[test]
fn a_bus_with_only_the_required_methods_gets_the_reference_defaults() {
    let bus = VecBus::new(4);
    let value = |i: u64| serde_json::json!({ "metadata": { "uid": format!("u{i}") }, "i": i });
    let mut acks = Vec::new();
    for i in 0..10 {
        acks.push(bus.publish("audit", "agent-1", &value(i)).unwrap());
    }
    assert_eq!(acks[9].offset, 9);
    assert_eq!(acks[9].partition, partition_for("agent-1", 4));

    // Provided defaults: set_control_key accepts, publish_idempotent
    // publishes, find_event_by_uid scans, maintenance does nothing.
    bus.set_control_key([7; 32]).unwrap();
    let again = bus
        .publish_idempotent("audit", "agent-1", &value(10), "u10")
        .unwrap();
    assert_eq!(again.offset, 10);
    let found = bus.find_event_by_uid("audit", "agent-1", "u7").unwrap();
    assert_eq!(found, Some(acks[7].clone()));
    assert_eq!(
        bus.find_event_by_uid("audit", "agent-1", "nope").unwrap(),
        None
    );
    assert_eq!(bus.maintenance(0).unwrap(), 0);
    assert!(matches!(
        bus.find_event_by_uid("missing", "agent-1", "u1"),
        Err(BusError::UnknownTopic(topic)) if topic == "missing"
    ));

    // The trait is object-safe and used through a reference, as the
    // harness holds it.
    let dynamic: &dyn EventBus = &bus;
    assert_eq!(dynamic.topics(), vec!["audit".to_owned()]);
    assert_eq!(
        dynamic
            .fetch("audit", acks[0].partition, 3, 2)
            .unwrap()
            .iter()
            .map(|event| event.offset)
            .collect::<Vec<_>>(),
        vec![3, 4]
    );
}

#[test]
fn records_serialize_to_the_reference_json_and_back() {
    let ack = PublishAck {
        topic: "audit".to_owned(),
        partition: 3,
        offset: 42,
    };
    let json = serde_json::to_value(&ack).unwrap();
    assert_eq!(
        json,
        serde_json::json!({ "topic": "audit", "partition": 3, "offset": 42 })
    );
    assert_eq!(serde_json::from_value::<PublishAck>(json).unwrap(), ack);

    let event = StoredEvent {
        partition: 1,
        offset: 7,
        key: "agent-1".to_owned(),
        value: serde_json::json!({ "kind": "audit", "n": [1, 2] }),
        stored_at: 1_700_000_000_123,
    };
    let text = serde_json::to_string(&event).unwrap();
    assert_eq!(
        text,
        r#"{"partition":1,"offset":7,"key":"agent-1","value":{"kind":"audit","n":[1,2]},"stored_at":1700000000123}"#
    );
    assert_eq!(serde_json::from_str::<StoredEvent>(&text).unwrap(), event);
    // Clone, Debug and equality, as the reference derives them.
    assert_eq!(event.clone(), event);
    assert!(format!("{ack:?}").contains("PublishAck"));
}

#[test]
fn partition_for_is_the_references_fnv1a() {
    // The reference's own tests.
    assert_eq!(
        partition_for("agent-inst-1", 8),
        partition_for("agent-inst-1", 8)
    );
    let spread: std::collections::HashSet<u32> = (0..100)
        .map(|i| partition_for(&format!("inst-{i}"), 8))
        .collect();
    assert!(spread.len() >= 6, "poor partition spread: {spread:?}");
    assert_eq!(partition_for("x", 0), 0);
    // FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c: the same partition everywhere.
    assert_eq!(
        partition_for("a", 1000),
        (0xaf63_dc4c_8601_ec8c_u64 % 1000) as u32
    );
}
