//! Kafka records (key, headers, value, timestamp as a consumer receives
//! them) through the reader's header extraction and the record decoder:
//! never a panic, only `Integrity` errors; a record carrying the headers
//! the bus publishes decodes to what was published, and dedup indexes its
//! UID.
#![no_main]

use arbitrary::Arbitrary;
use bus_core::BusError;
use bus_core::auth::{RecordAuth, RecordParts, to_hex};
use bus_kafka::fuzzing::{self, HeaderPair, Message, TAG_HEADER, UID_HEADER};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Input {
    topic: String,
    partition: u32,
    control_key: Option<[u8; 32]>,
    offset: u64,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Option<Vec<HeaderPair>>,
    timestamp: Option<i64>,
    /// For the round trip: the record the bus would publish.
    record_key: String,
    uid: Option<String>,
    payload: Vec<u8>,
}

fuzz_target!(|input: Input| {
    let auth = input.control_key.as_ref().map(RecordAuth::new);
    let message = Message {
        offset: input.offset,
        key: input.key.as_deref(),
        value: input.value.as_deref(),
        headers: input.headers.as_deref(),
        timestamp: input.timestamp,
    };
    match fuzzing::decode(&input.topic, input.partition, auth.as_ref(), &message) {
        Ok(event) => assert_eq!(event.offset, input.offset),
        Err(error) => assert!(matches!(error, BusError::Integrity { .. }), "{error:?}"),
    }
    let _ = fuzzing::indexed_uid(&input.topic, input.partition, auth.as_ref(), &message);

    let parts = RecordParts {
        topic: &input.topic,
        partition: input.partition,
        key: &input.record_key,
        uid: input.uid.as_deref(),
        value: &input.payload,
    };
    let mut headers: Vec<HeaderPair> = Vec::new();
    if let Some(uid) = &input.uid {
        headers.push((UID_HEADER.to_owned(), Some(uid.clone().into_bytes())));
    }
    if let Some(auth) = &auth {
        headers.push((
            TAG_HEADER.to_owned(),
            Some(to_hex(&auth.tag(parts)).into_bytes()),
        ));
    }
    let sent = Message {
        key: Some(input.record_key.as_bytes()),
        value: Some(&input.payload),
        headers: (!headers.is_empty()).then_some(&headers[..]),
        ..message
    };
    let json: Option<serde_json::Value> = serde_json::from_slice(&input.payload).ok();
    match fuzzing::decode(&input.topic, input.partition, auth.as_ref(), &sent) {
        Ok(event) => {
            assert_eq!(event.key, input.record_key);
            assert_eq!(Some(event.value), json);
            let expected = input.timestamp.filter(|&t| t >= 0).map_or(0, |t| t as u64);
            assert_eq!(event.stored_at, expected);
        }
        Err(error) => {
            assert!(json.is_none(), "own record refused: {error:?}");
            assert!(matches!(error, BusError::Integrity { .. }));
        }
    }
    assert_eq!(
        fuzzing::indexed_uid(&input.topic, input.partition, auth.as_ref(), &sent),
        input.uid
    );
});
