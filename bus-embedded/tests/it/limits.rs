//! Values at the size limit round-trip (C12).
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use bus_core::EventBus;
use serde_json::json;

use crate::support::{TOPIC, open, provision};

#[test]
fn value_of_exactly_one_mib_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let bus = open(dir.path());
    provision(&bus, 1);
    let value = json!("y".repeat((1 << 20) - 2));
    assert_eq!(serde_json::to_vec(&value).unwrap().len(), 1 << 20);
    let ack = bus.publish(TOPIC, "k", &value).unwrap();
    assert_eq!(bus.fetch(TOPIC, 0, ack.offset, 1).unwrap()[0].value, value);
}
