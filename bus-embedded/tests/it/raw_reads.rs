//! `fetch_raw` (the read path beside the trait): the same records as
//! `fetch_with_headers`, their values as the bytes stored, and under a
//! control key the same refusal of a forged record (C5, C14, C25).
#![allow(clippy::unwrap_used)]

use bus_core::{BusError, EventBus, Headers};
use bus_embedded::testing::append_raw_record;
use bus_embedded::{EmbeddedBus, Options};
use serde_json::json;

use crate::support::{TOPIC, provision};

#[test]
fn raw_reads_return_the_stored_bytes_of_the_same_records() {
    let dir = tempfile::tempdir().unwrap();
    let bus = EmbeddedBus::open_with(dir.path(), Options::default().segment_bytes(400)).unwrap();
    provision(&bus, 1);
    let headers = Headers::try_from_pairs([("trace", "t-1")]).unwrap();
    for n in 0..20 {
        let value = json!({"n": n, "text": "é\u{1F600}", "big": 12_345_678_901_234_567_u64});
        if n % 3 == 0 {
            bus.publish_with_headers(TOPIC, "k", &value, None, &headers)
                .unwrap();
        } else {
            bus.publish(TOPIC, "k", &value).unwrap();
        }
    }
    for (from, max) in [(0, 100), (5, 3), (19, 10), (20, 10), (7, 0)] {
        let raw = bus.fetch_raw(TOPIC, 0, from, max).unwrap();
        let full = bus.fetch_with_headers(TOPIC, 0, from, max).unwrap();
        let plain = bus.fetch(TOPIC, 0, from, max).unwrap();
        assert_eq!(raw.len(), full.len(), "from {from} max {max}");
        assert_eq!(plain.len(), full.len());
        for ((raw, full), plain) in raw.iter().zip(&full).zip(&plain) {
            assert_eq!(raw.offset, full.event.offset);
            assert_eq!(raw.key, full.event.key);
            assert_eq!(raw.stored_at, full.event.stored_at);
            assert_eq!(raw.headers, full.headers);
            assert_eq!(raw.value, serde_json::to_vec(&full.event.value).unwrap());
            assert_eq!(plain, &full.event);
        }
    }
    assert!(matches!(
        bus.fetch_raw("nope", 0, 0, 10),
        Err(BusError::UnknownTopic(_))
    ));
    assert!(bus.fetch_raw(TOPIC, 1, 0, 10).is_err());
}

#[test]
fn a_forged_record_ends_a_raw_read_as_it_ends_a_fetch() {
    let dir = tempfile::tempdir().unwrap();
    {
        let bus = EmbeddedBus::open(dir.path()).unwrap();
        bus.set_control_key([7; 32]).unwrap();
        provision(&bus, 1);
        bus.publish(TOPIC, "k", &json!({"n": 0})).unwrap();
    }
    append_raw_record(dir.path(), TOPIC, 0, "k", None, br#"{"forged":1}"#, None).unwrap();
    let bus = EmbeddedBus::open(dir.path()).unwrap();
    bus.set_control_key([7; 32]).unwrap();
    bus.publish(TOPIC, "k", &json!({"n": 2})).unwrap();
    let raw = bus.fetch_raw(TOPIC, 0, 0, 10).unwrap();
    assert_eq!(raw.len(), 1, "the authentic prefix only");
    assert_eq!(raw[0].value, br#"{"n":0}"#);
    assert_eq!(bus.fetch(TOPIC, 0, 0, 10).unwrap().len(), 1);
    for fetched in [
        bus.fetch_raw(TOPIC, 0, 1, 10).map(|_| ()),
        bus.fetch(TOPIC, 0, 1, 10).map(|_| ()),
    ] {
        assert!(
            matches!(fetched, Err(BusError::Integrity { offset: 1, .. })),
            "{fetched:?}"
        );
    }
    assert_eq!(
        bus.fetch_raw(TOPIC, 0, 2, 10).unwrap()[0].value,
        br#"{"n":2}"#
    );
}
