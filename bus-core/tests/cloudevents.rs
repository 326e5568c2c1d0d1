//! Feature `cloudevents`: events the SDK built go through the mapping and
//! the memory bus and come back equal; the SDK's own binary-mode machinery
//! reads our records and agrees with our headers; bad input is refused
//! with the header at fault named, nothing stored.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use bus_core::cloudevents::{self as ce, RecordMessage, Spelling};
use bus_core::memory::MemoryBus;
use bus_core::{BusError, EventBus, Headers, Manifest, StoredEvent, StoredRecord, TopicSpec};
use cloudevents::event::{ExtensionValue, SpecVersion};
use cloudevents::message::{BinaryDeserializer, BinarySerializer, MessageAttributeValue};
use cloudevents::{AttributesReader, AttributesWriter, Data, Event, EventBuilder, EventBuilderV10};
use serde_json::json;

const TOPIC: &str = "events";

fn bus() -> MemoryBus {
    let bus = MemoryBus::new();
    bus.provision(&Manifest::new([TopicSpec::new(TOPIC, 4)]))
        .unwrap();
    bus
}

/// Every attribute of CloudEvents 1.0 set, two string extensions, JSON data.
fn full_event() -> Event {
    EventBuilderV10::new()
        .id("evt-0001")
        .source("https://shop.example/orders?region=eu")
        .ty("com.example.order.placed")
        .subject("customer-9")
        .time("2026-12-07T01:02:03.456789Z")
        .extension("partitionkey", "tenant-3")
        .extension("tenant", "acme")
        .data_with_schema(
            "application/json",
            "https://shop.example/schemas/order.json",
            json!({"total": 42, "lines": [{"sku": "a-1", "qty": 2}], "note": "ünïcode"}),
        )
        .build()
        .unwrap()
}

fn records(bus: &MemoryBus) -> Vec<StoredRecord> {
    (0..4)
        .flat_map(|partition| bus.fetch_with_headers(TOPIC, partition, 0, 100).unwrap())
        .collect()
}

fn record(headers: &[(&str, &str)], value: serde_json::Value) -> StoredRecord {
    StoredRecord {
        event: StoredEvent {
            partition: 0,
            offset: 0,
            key: "k".into(),
            value,
            stored_at: 0,
        },
        headers: Headers::from_stored(headers.iter().copied()),
    }
}

fn minimal_headers() -> Vec<(&'static str, &'static str)> {
    vec![
        ("ce_specversion", "1.0"),
        ("ce_id", "id-1"),
        ("ce_source", "/producer"),
        ("ce_type", "com.example.thing"),
    ]
}

fn field(error: BusError) -> String {
    match error {
        BusError::InvalidArgument { field, .. } => field,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[test]
fn an_sdk_event_round_trips_through_the_memory_bus() {
    let bus = bus();
    let original = full_event();
    let ack = ce::publish(&bus, TOPIC, &original).unwrap();

    let stored = bus
        .fetch_with_headers(TOPIC, ack.partition, ack.offset, 1)
        .unwrap();
    assert_eq!(stored.len(), 1);
    let stored = &stored[0];
    assert_eq!(stored.event.key, "tenant-3", "the partitionkey extension");
    assert_eq!(stored.event.value["lines"][0]["sku"], "a-1");
    let names: Vec<&str> = stored.headers.iter().map(|(name, _)| name).collect();
    assert_eq!(
        names,
        [
            "ce_dataschema",
            "ce_id",
            "ce_partitionkey",
            "ce_source",
            "ce_specversion",
            "ce_subject",
            "ce_tenant",
            "ce_time",
            "ce_type",
            "content-type",
        ]
    );
    // RFC 3339, as the SDK's builder parses it.
    let time = stored.headers.get("ce_time").unwrap();
    let reparsed = EventBuilderV10::new()
        .id("i")
        .source("/s")
        .ty("t")
        .time(time)
        .build()
        .unwrap();
    assert_eq!(reparsed.time(), original.time(), "{time:?}");

    let back = ce::to_event(stored).unwrap();
    assert_eq!(back, original);
    // Field by field too, so a failure says which.
    assert_eq!(back.specversion(), SpecVersion::V10);
    assert_eq!(back.id(), "evt-0001");
    assert_eq!(back.time(), original.time());
    assert_eq!(back.dataschema(), original.dataschema());
    assert_eq!(back.datacontenttype(), Some("application/json"));
    assert_eq!(
        back.extension("tenant"),
        Some(&ExtensionValue::String("acme".into()))
    );
    assert_eq!(back.data(), original.data());
}

#[test]
fn the_dash_spelling_round_trips_and_is_detected() {
    let bus = bus();
    let original = full_event();
    let parts = ce::to_publish(&original, Spelling::Dash).unwrap();
    assert_eq!(parts.headers.get("ce-id"), Some("evt-0001"));
    assert_eq!(parts.headers.get("ce_id"), None);
    assert_eq!(parts.headers.get("content-type"), Some("application/json"));
    let ack = bus
        .publish_with_headers(TOPIC, &parts.key, &parts.value, None, &parts.headers)
        .unwrap();
    let stored = bus
        .fetch_with_headers(TOPIC, ack.partition, ack.offset, 1)
        .unwrap();
    let message = RecordMessage::new(&stored[0]).unwrap();
    assert_eq!(message.spelling(), Spelling::Dash);
    assert_eq!(ce::to_event(&stored[0]).unwrap(), original);

    // HTTP-minded tools may capitalize `ce-` names; they still read.
    let mut headers = minimal_headers()
        .into_iter()
        .map(|(name, value)| (name.replace("ce_", "Ce-"), value))
        .collect::<Vec<_>>();
    headers.push(("Content-Type".into(), "application/json"));
    let capitalized = StoredRecord {
        headers: Headers::from_stored(headers),
        ..record(&[], json!({"a": 1}))
    };
    let event = ce::to_event(&capitalized).unwrap();
    assert_eq!(event.ty(), "com.example.thing");
    assert_eq!(event.datacontenttype(), Some("application/json"));
}

#[test]
fn the_spelling_follows_the_backend() {
    assert_eq!(Spelling::for_backend("nats"), Spelling::Dash);
    for backend in ["kafka", "memory", "embedded", "postgres", "unknown"] {
        assert_eq!(Spelling::for_backend(backend), Spelling::Underscore);
    }
    assert_eq!(Spelling::for_bus(&bus()), Spelling::Underscore);
    assert_eq!(Spelling::Underscore.prefix(), "ce_");
    assert_eq!(Spelling::Dash.prefix(), "ce-");
    assert_eq!(Spelling::Dash.header("time"), "ce-time");
    assert_eq!(Spelling::Dash.header("datacontenttype"), "content-type");
}

#[test]
fn the_key_is_the_partitionkey_else_the_subject_else_the_id() {
    let mut event = full_event();
    let key = |event: &Event| ce::to_publish(event, Spelling::Underscore).unwrap().key;
    assert_eq!(key(&event), "tenant-3");
    event.remove_extension("partitionkey");
    assert_eq!(key(&event), "customer-9");
    event.set_subject(None::<String>);
    assert_eq!(key(&event), "evt-0001");
}

/// A `BinarySerializer` that writes headers the way the SDK's own Kafka
/// binding does (`ce_` + name, `datacontenttype` as `content-type`, values
/// by `MessageAttributeValue`'s `Display`), and keeps the data bytes.
#[derive(Default)]
struct SdkKafkaHeaders {
    headers: BTreeMap<String, String>,
    data: Option<Vec<u8>>,
}

impl BinarySerializer<SdkKafkaHeaders> for SdkKafkaHeaders {
    fn set_spec_version(mut self, version: SpecVersion) -> cloudevents::message::Result<Self> {
        self.headers
            .insert("ce_specversion".into(), version.to_string());
        Ok(self)
    }
    fn set_attribute(
        mut self,
        name: &str,
        value: MessageAttributeValue,
    ) -> cloudevents::message::Result<Self> {
        let name = if name == "datacontenttype" {
            "content-type".to_owned()
        } else {
            format!("ce_{name}")
        };
        self.headers.insert(name, value.to_string());
        Ok(self)
    }
    fn set_extension(
        mut self,
        name: &str,
        value: MessageAttributeValue,
    ) -> cloudevents::message::Result<Self> {
        self.headers.insert(format!("ce_{name}"), value.to_string());
        Ok(self)
    }
    fn end_with_data(mut self, bytes: Vec<u8>) -> cloudevents::message::Result<Self> {
        self.data = Some(bytes);
        Ok(self)
    }
    fn end(self) -> cloudevents::message::Result<Self> {
        Ok(self)
    }
}

#[test]
fn our_headers_are_what_the_sdk_serializes_in_binary_mode() {
    let original = full_event();
    let parts = ce::to_publish(&original, Spelling::Underscore).unwrap();
    let sdk = original
        .clone()
        .deserialize_binary(SdkKafkaHeaders::default())
        .unwrap();
    let ours: BTreeMap<String, String> = parts
        .headers
        .iter()
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect();
    assert_eq!(ours, sdk.headers);
    let sdk_value: serde_json::Value = serde_json::from_slice(&sdk.data.unwrap()).unwrap();
    assert_eq!(parts.value, sdk_value);
}

#[test]
fn the_sdk_parses_our_records_with_its_binary_deserializer() {
    let bus = bus();
    let original = full_event();
    let ack = ce::publish(&bus, TOPIC, &original).unwrap();
    let stored = bus
        .fetch_with_headers(TOPIC, ack.partition, ack.offset, 1)
        .unwrap();

    // The SDK's own Event builder, driven by our message: data as the bytes
    // a binding carries.
    let sdk_event =
        BinaryDeserializer::into_event(RecordMessage::new(&stored[0]).unwrap()).unwrap();
    assert_eq!(sdk_event.id(), original.id());
    assert_eq!(sdk_event.time(), original.time());
    let Some(Data::Binary(bytes)) = sdk_event.data() else {
        panic!("binary data expected: {:?}", sdk_event.data())
    };
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(bytes).unwrap(),
        stored[0].event.value
    );
    // The SDK's structured (JSON) form of what it parsed and of the original agree.
    let mut structured = serde_json::to_value(&sdk_event).unwrap();
    let data_base64 = structured
        .as_object_mut()
        .unwrap()
        .remove("data_base64")
        .unwrap();
    let mut expected = serde_json::to_value(&original).unwrap();
    let data = expected.as_object_mut().unwrap().remove("data").unwrap();
    assert_eq!(structured, expected);
    assert!(data_base64.is_string() && data.is_object());

    // A record another producer wrote by hand, Kafka-binding style.
    let hand = record(
        &[
            ("ce_specversion", "1.0"),
            ("ce_id", "x-7"),
            ("ce_source", "urn:producer:7"),
            ("ce_type", "com.example.other"),
            ("ce_time", "2026-12-07T03:04:05+01:00"),
            ("ce_traceid", "abc"),
            (
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
        ],
        json!([1, 2, 3]),
    );
    let event = ce::to_event(&hand).unwrap();
    assert_eq!(event.source().as_str(), "urn:producer:7");
    assert_eq!(
        event.time().unwrap().to_rfc3339(),
        "2026-12-07T02:04:05+00:00"
    );
    assert_eq!(
        event.extension("traceid"),
        Some(&ExtensionValue::String("abc".into()))
    );
    assert_eq!(event.extension("traceparent"), None, "not a ce_ header");
    assert_eq!(event.datacontenttype(), Some("application/json"));
    assert_eq!(event.data(), Some(&Data::Json(json!([1, 2, 3]))));
}

#[test]
fn typed_extensions_come_back_as_text() {
    let mut event = full_event();
    event.set_extension("attempt", 3_i64);
    event.set_extension("replayed", true);
    let parts = ce::to_publish(&event, Spelling::Underscore).unwrap();
    assert_eq!(parts.headers.get("ce_attempt"), Some("3"));
    assert_eq!(parts.headers.get("ce_replayed"), Some("true"));
    let back = ce::to_event(&record_of(&parts)).unwrap();
    assert_eq!(
        back.extension("attempt"),
        Some(&ExtensionValue::String("3".into()))
    );
    assert_eq!(
        back.extension("replayed"),
        Some(&ExtensionValue::String("true".into()))
    );
}

fn record_of(parts: &ce::PublishParts) -> StoredRecord {
    StoredRecord {
        headers: parts.headers.clone(),
        ..record(&[], parts.value.clone())
    }
}

#[test]
fn data_that_is_not_json_is_mapped_or_refused() {
    let bus = bus();
    let base = || EventBuilderV10::new().id("d-1").source("/s").ty("t");

    // Text under a text type: a JSON string, read back as text.
    let text = base().data("text/plain", "hello").build().unwrap();
    let parts = ce::to_publish(&text, Spelling::Underscore).unwrap();
    assert_eq!(parts.value, json!("hello"));
    assert_eq!(ce::to_event(&record_of(&parts)).unwrap(), text);

    // JSON as bytes or text (what the SDK's bindings hand on): the JSON value.
    let bytes = base()
        .data("application/cloudevents-data+json", br#"{"a":1}"#.to_vec())
        .build()
        .unwrap();
    let parts = ce::to_publish(&bytes, Spelling::Underscore).unwrap();
    assert_eq!(parts.value, json!({"a": 1}));
    let back = ce::to_event(&record_of(&parts)).unwrap();
    assert_eq!(back.data(), Some(&Data::Json(json!({"a": 1}))));
    assert_eq!(
        back.datacontenttype(),
        Some("application/cloudevents-data+json")
    );

    // No data: null, and back to no data.
    let empty = base().build().unwrap();
    let parts = ce::to_publish(&empty, Spelling::Underscore).unwrap();
    assert_eq!(parts.value, serde_json::Value::Null);
    assert_eq!(parts.headers.get("content-type"), None);
    assert_eq!(ce::to_event(&record_of(&parts)).unwrap(), empty);

    // Refused, nothing stored: bytes under a binary type, text that is
    // not JSON under a JSON type, JSON under a text type.
    let refused = [
        (
            base()
                .data("application/octet-stream", vec![0_u8, 159, 146, 150])
                .build()
                .unwrap(),
            "data",
        ),
        (
            base().data("application/json", "not json").build().unwrap(),
            "data",
        ),
        (
            base().data("text/plain", json!({"a": 1})).build().unwrap(),
            "content-type",
        ),
    ];
    for (event, expected) in refused {
        assert_eq!(
            field(ce::publish(&bus, TOPIC, &event).unwrap_err()),
            expected
        );
    }
    assert!(records(&bus).is_empty());
}

#[test]
fn records_missing_required_attributes_are_refused_naming_the_header() {
    for (missing, field_name) in [
        ("ce_specversion", "ce_specversion"),
        ("ce_id", "ce_id"),
        ("ce_source", "ce_source"),
        ("ce_type", "ce_type"),
    ] {
        let headers: Vec<_> = minimal_headers()
            .into_iter()
            .filter(|(name, _)| *name != missing)
            .collect();
        let error = ce::to_event(&record(&headers, json!({}))).unwrap_err();
        assert_eq!(field(error), field_name, "without {missing}");
    }
    let mut empty_id = minimal_headers();
    empty_id[1] = ("ce_id", "");
    assert_eq!(
        field(ce::to_event(&record(&empty_id, json!(1))).unwrap_err()),
        "ce_id"
    );
    // Records with no CloudEvents headers at all.
    assert_eq!(
        field(ce::to_event(&record(&[], json!(1))).unwrap_err()),
        "ce_specversion"
    );
}

#[test]
fn malformed_attributes_are_refused_naming_the_header() {
    let with = |name: &'static str, value: &'static str| {
        let mut headers = minimal_headers();
        headers.retain(|(header, _)| *header != name);
        headers.push((name, value));
        ce::to_event(&record(&headers, json!({"a": 1})))
    };
    assert_eq!(
        field(with("ce_specversion", "2.0").unwrap_err()),
        "ce_specversion"
    );
    assert_eq!(
        field(with("ce_specversion", "").unwrap_err()),
        "ce_specversion"
    );
    assert_eq!(field(with("ce_time", "yesterday").unwrap_err()), "ce_time");
    assert_eq!(
        field(with("ce_dataschema", "not a uri").unwrap_err()),
        "ce_dataschema"
    );
    assert_eq!(field(with("ce_", "x").unwrap_err()), "ce_");
    assert_eq!(
        field(with("content-type", "text/plain").unwrap_err()),
        "content-type",
        "an object under a text type"
    );
    // Both spellings on one record.
    let mut both = minimal_headers();
    both.push(("ce-specversion", "1.0"));
    assert_eq!(
        field(ce::to_event(&record(&both, json!(1))).unwrap_err()),
        "ce-specversion"
    );
    // An SDK-accepted older version still parses.
    assert_eq!(
        with("ce_specversion", "0.3").unwrap().specversion(),
        SpecVersion::V03
    );
}

#[test]
fn events_the_bus_cannot_carry_are_refused_and_nothing_is_stored() {
    let bus = bus();

    let mut long = full_event();
    long.set_extension("blob", "x".repeat(1025));
    assert_eq!(
        field(ce::publish(&bus, TOPIC, &long).unwrap_err()),
        "headers"
    );

    let mut many = full_event();
    for i in 0..10 {
        many.set_extension(&format!("ext{i}"), "v");
    }
    assert_eq!(
        field(ce::publish(&bus, TOPIC, &many).unwrap_err()),
        "headers"
    );

    let mut control = full_event();
    control.set_subject(Some("line\nbreak"));
    assert_eq!(
        field(ce::publish(&bus, TOPIC, &control).unwrap_err()),
        "headers"
    );

    for (name, blank) in [("id", 0), ("type", 1), ("source", 2)] {
        let mut event = full_event();
        match blank {
            0 => {
                event.set_id("");
            }
            1 => {
                event.set_type("");
            }
            _ => {
                event.set_source("");
            }
        }
        assert_eq!(
            field(ce::publish(&bus, TOPIC, &event).unwrap_err()),
            format!("ce_{name}")
        );
    }
    assert!(records(&bus).is_empty(), "nothing was stored");

    // The same event within the limits is stored.
    ce::publish(&bus, TOPIC, &full_event()).unwrap();
    assert_eq!(records(&bus).len(), 1);
}

#[test]
fn events_go_out_as_one_batch() {
    let bus = bus();
    let mut second = full_event();
    second.set_id("evt-0002");
    let originals = [full_event(), second];
    let batch: Vec<_> = originals
        .iter()
        .map(|event| {
            ce::to_publish(event, Spelling::Underscore)
                .unwrap()
                .into_batch_record()
        })
        .collect();
    let acks = bus.publish_batch_with_headers(TOPIC, &batch).unwrap();
    assert_eq!(acks.len(), 2);
    assert_eq!(acks[0].partition, acks[1].partition, "one partition key");
    let stored = bus
        .fetch_with_headers(TOPIC, acks[0].partition, acks[0].offset, 10)
        .unwrap();
    let back: Vec<Event> = stored.iter().map(|r| ce::to_event(r).unwrap()).collect();
    assert_eq!(back, originals);
}
