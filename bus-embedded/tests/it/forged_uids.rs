//! Forged records carrying a UID (appended around the bus, without a valid
//! tag) neither capture deduplication nor answer `find_event_by_uid`, before
//! or after the genuine record, and after a reopen (C6, C7, C14).
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::path::Path;

use bus_core::EventBus;
use bus_embedded::testing::append_raw_record;
use bus_embedded::{EmbeddedBus, Options};
use serde_json::json;

use crate::support::{TOPIC, frame_starts, open, provision, segments, value_for};

const KEY: [u8; 32] = [7; 32];

fn keyed(dir: &Path) -> EmbeddedBus {
    let bus = EmbeddedBus::open_with(dir, Options::default().segment_bytes(300)).unwrap();
    bus.set_control_key(KEY).unwrap();
    bus
}

fn forge(dir: &Path, uid: &str) -> u64 {
    append_raw_record(dir, TOPIC, 0, "k", Some(uid), br#"{"forged":1}"#, None).unwrap()
}

#[test]
fn forged_uid_does_not_capture_dedup_or_find() {
    let dir = tempfile::tempdir().unwrap();
    {
        let bus = keyed(dir.path());
        provision(&bus, 1);
        bus.publish(TOPIC, "k", &json!({"n": 0})).unwrap();
    }
    assert_eq!(forge(dir.path(), "pay-42"), 1);
    let genuine = json!({"amount": 42});
    let ack = {
        let bus = keyed(dir.path());
        assert_eq!(bus.find_event_by_uid(TOPIC, "k", "pay-42").unwrap(), None);
        let ack = bus
            .publish_idempotent(TOPIC, "k", &genuine, "pay-42")
            .unwrap();
        assert_eq!(ack.offset, 2);
        assert_eq!(bus.fetch(TOPIC, 0, 2, 1).unwrap()[0].value, genuine);
        assert_eq!(
            bus.find_event_by_uid(TOPIC, "k", "pay-42").unwrap(),
            Some(ack.clone())
        );
        assert_eq!(
            bus.publish_idempotent(TOPIC, "k", &genuine, "pay-42")
                .unwrap(),
            ack
        );
        // Seal the segments holding both copies, so their .uids persist.
        for i in 0..10 {
            bus.publish(TOPIC, "k", &value_for("pad", i)).unwrap();
        }
        assert!(segments(dir.path(), 0).len() > 1);
        ack
    };
    // A reopen (from persisted UID files) still prefers the authentic copy.
    let bus = keyed(dir.path());
    let next = bus.offsets(TOPIC, 0).unwrap().next;
    assert_eq!(
        bus.publish_idempotent(TOPIC, "k", &genuine, "pay-42")
            .unwrap(),
        ack
    );
    assert_eq!(
        bus.find_event_by_uid(TOPIC, "k", "pay-42").unwrap(),
        Some(ack)
    );
    assert_eq!(bus.offsets(TOPIC, 0).unwrap().next, next, "stored nothing");
}

#[test]
fn forged_copy_after_the_genuine_one_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let ack = {
        let bus = keyed(dir.path());
        provision(&bus, 1);
        bus.publish_idempotent(TOPIC, "k", &json!({"a": 1}), "pay-7")
            .unwrap()
    };
    // The bus dedups the raw append itself, so forge offset 1 elsewhere and
    // append its frame to the log, as a writer around the bus could.
    let other = tempfile::tempdir().unwrap();
    provision(&open(other.path()), 1);
    open(other.path()).publish(TOPIC, "k", &json!(0)).unwrap();
    assert_eq!(forge(other.path(), "pay-7"), 1);
    let forged = std::fs::read(&segments(other.path(), 0)[0]).unwrap();
    let log = segments(dir.path(), 0)[0].clone();
    let mut bytes = std::fs::read(&log).unwrap();
    bytes.extend_from_slice(&forged[frame_starts(&forged)[1]..]);
    std::fs::write(&log, &bytes).unwrap();

    let bus = keyed(dir.path());
    assert_eq!(
        bus.offsets(TOPIC, 0).unwrap().next,
        2,
        "the forgery is in the log"
    );
    assert_eq!(
        bus.publish_idempotent(TOPIC, "k", &json!({"a": 1}), "pay-7")
            .unwrap(),
        ack
    );
    assert_eq!(
        bus.find_event_by_uid(TOPIC, "k", "pay-7").unwrap(),
        Some(ack)
    );
    assert_eq!(bus.offsets(TOPIC, 0).unwrap().next, 2, "stored nothing");
}
