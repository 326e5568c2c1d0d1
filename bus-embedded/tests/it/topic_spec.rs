//! A damaged `topic.json` (found by the `recovery` fuzz target): one
//! flipped digit turns `"partitions": 1` into 6. Opened as it was, the bus
//! re-partitioned a topic that holds records, so keys landed on new, empty
//! partitions and find-by-UID stopped finding what was published: it must
//! be `Corrupt` instead.

#![allow(clippy::unwrap_used)]

use bus_core::{BusError, EventBus, Manifest, TopicSpec};
use bus_embedded::EmbeddedBus;

#[test]
fn a_damaged_partition_count_is_corrupt_not_a_new_topic() {
    let dir = tempfile::tempdir().unwrap();
    {
        let bus = EmbeddedBus::open(dir.path()).unwrap();
        bus.provision(&Manifest::new([TopicSpec::new("t", 1)]))
            .unwrap();
        bus.publish_idempotent("t", "k", &serde_json::json!(1), "u")
            .unwrap();
    }
    let spec = dir.path().join("topics/t/topic.json");
    let text = std::fs::read_to_string(&spec).unwrap();
    // The fuzzer's edit: byte 33 ('1' of "partitions": 1) xor 7 = '6'.
    let damaged = text.replacen("\"partitions\": 1", "\"partitions\": 6", 1);
    assert_ne!(damaged, text);
    std::fs::write(&spec, damaged).unwrap();
    match EmbeddedBus::open(dir.path()) {
        Err(BusError::Corrupt { .. }) => {}
        Err(other) => panic!("expected Corrupt, got {other:?}"),
        Ok(bus) => panic!(
            "opened with {} partitions; find_event_by_uid now answers {:?}",
            bus.partitions("t").unwrap(),
            bus.find_event_by_uid("t", "k", "u")
        ),
    }
}
