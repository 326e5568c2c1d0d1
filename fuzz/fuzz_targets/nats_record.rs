//! NATS messages (headers plus payload) through the record decoder fetch
//! and find-by-UID use: never a panic, only `Integrity` errors; a record
//! made with the bus's own headers decodes to what was published and
//! authenticates; header text percent-encoding round-trips.
#![no_main]

use arbitrary::Arbitrary;
use bus_core::BusError;
use bus_core::auth::{RecordAuth, RecordParts};
use bus_nats::fuzzing::{self, Message};
use bus_nats::naming::{decode_header_text, encode_header_text};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Input {
    topic: String,
    partition: u32,
    control_key: Option<[u8; 32]>,
    sequence: u64,
    stored_at: u64,
    headers: Option<Vec<(String, String)>>,
    payload: Vec<u8>,
    /// For the round trip: the record the bus would publish.
    key: String,
    uid: Option<String>,
    after: Option<u64>,
    text: String,
}

fuzz_target!(|input: Input| {
    let auth = input.control_key.as_ref().map(RecordAuth::new);
    let message = Message {
        headers: input.headers.as_deref(),
        payload: &input.payload,
        sequence: input.sequence,
        stored_at: input.stored_at,
    };
    match fuzzing::decode(&input.topic, input.partition, auth.as_ref(), &message) {
        Ok(event) => {
            assert_eq!(event.offset, input.sequence.saturating_sub(1));
            assert_eq!(event.stored_at, input.stored_at);
        }
        Err(error) => assert!(matches!(error, BusError::Integrity { .. }), "{error:?}"),
    }
    if let Some(uid) = &input.uid {
        let _ = fuzzing::is_authentic(&input.topic, input.partition, auth.as_ref(), uid, &message);
    }

    let encoded = encode_header_text(&input.text);
    assert!(
        encoded
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.~%".contains(&b))
    );
    assert_eq!(
        decode_header_text(&encoded).as_deref(),
        Some(input.text.as_str())
    );
    let _ = decode_header_text(&input.text);

    let parts = RecordParts {
        topic: &input.topic,
        partition: input.partition,
        key: &input.key,
        uid: input.uid.as_deref(),
        value: &input.payload,
    };
    let headers = fuzzing::record_headers(auth.as_ref(), parts, input.after)
        .expect("percent-encoded headers always travel");
    let sent = Message {
        headers: Some(&headers),
        ..message
    };
    let json: Option<serde_json::Value> = serde_json::from_slice(&input.payload).ok();
    match fuzzing::decode(&input.topic, input.partition, auth.as_ref(), &sent) {
        Ok(event) => {
            assert_eq!(event.key, input.key);
            assert_eq!(Some(event.value), json);
        }
        Err(error) => {
            assert!(json.is_none(), "own record refused: {error:?}");
            assert!(matches!(error, BusError::Integrity { .. }));
        }
    }
    if let Some(uid) = &input.uid {
        assert!(fuzzing::is_authentic(
            &input.topic,
            input.partition,
            auth.as_ref(),
            uid,
            &sent
        ));
    }
});
