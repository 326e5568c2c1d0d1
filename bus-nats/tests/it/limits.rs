//! Server-specific checks beside the shared suite. C12 against the server's
//! own limit: a topic whose largest record cannot fit in one NATS message is
//! refused at provisioning, naming the field and the fix, and a record of
//! exactly the default 1 MiB limit round-trips (scripts/nats.sh starts the
//! server with `max_payload: 8MB`). C6/C14: concurrent retries behind a
//! forged UID record still store one genuine record.

use crate::common;

use bus_core::{BusError, EventBus, Manifest, TopicSpec};
use bus_nats::NatsBus;
use common::cleanup;
use serde_json::json;

fn bus() -> Option<NatsBus> {
    common::shared_bus("limits", "lim")
}

#[test]
fn records_larger_than_the_server_allows_are_refused_at_provisioning() {
    let Some(bus) = bus() else { return };
    let manifest = Manifest::new([
        TopicSpec::new("fits", 1),
        TopicSpec::new("huge", 1).with_max_record_bytes(64 * 1024 * 1024),
    ]);
    match bus.provision(&manifest) {
        Err(BusError::InvalidArgument { field, .. }) => {
            assert_eq!(field, "topics[1].max_record_bytes");
        }
        other => panic!("expected InvalidArgument for max_record_bytes, got {other:?}"),
    }
    // Refused before anything was created, the fitting topic included.
    for topic in ["fits", "huge"] {
        assert!(
            matches!(bus.partitions(topic), Err(BusError::UnknownTopic(_))),
            "{topic} was created"
        );
    }
    cleanup(&bus);
}

#[test]
fn a_record_of_exactly_one_mib_round_trips() {
    let Some(bus) = bus() else { return };
    bus.provision(&Manifest::new([TopicSpec::new("t", 1)]))
        .expect("provision");
    // A JSON string of n bytes encodes to n + 2 (the quotes).
    let value = json!("z".repeat(1024 * 1024 - 2));
    assert_eq!(serde_json::to_vec(&value).expect("json").len(), 1024 * 1024);
    let ack = bus
        .publish_idempotent("t", "k", &value, "one-mib")
        .expect("publish 1 MiB");
    let got = bus.fetch("t", 0, ack.offset, 1).expect("fetch");
    assert_eq!(got[0].value, value);
    cleanup(&bus);
}

#[test]
fn concurrent_retries_behind_a_forged_uid_store_one_record() {
    use bus_nats::naming::{
        KEY_HEADER, UID_HEADER, encode_header_text, record_subject, stream_name,
    };
    let Some(bus) = bus() else { return };
    bus.set_control_key([7; 32]).expect("key");
    bus.provision(&Manifest::new([TopicSpec::new("t", 1)]))
        .expect("provision");
    let stream = stream_name(bus.prefix(), "t", 0);
    common::raw(async |js| {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(KEY_HEADER, encode_header_text("k"));
        headers.insert(UID_HEADER, encode_header_text("pay-1"));
        // Even the bus's window-dedup id cannot make a forgery answer.
        headers.insert("Nats-Msg-Id", bus_nats::naming::uid_hash("pay-1"));
        js.publish_with_headers(
            record_subject(&stream, Some("pay-1")),
            headers,
            br#"{"forged":true}"#.to_vec().into(),
        )
        .await
        .expect("send")
        .await
        .expect("ack");
    });
    let value = json!({"amount": 1});
    let acks: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|_| scope.spawn(|| bus.publish_idempotent("t", "k", &value, "pay-1")))
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().expect("thread").expect("publish"))
            .collect()
    });
    assert!(acks.iter().all(|ack| *ack == acks[0]), "{acks:?}");
    assert_eq!(acks[0].offset, 1, "stored right after the forgery");
    assert_eq!(
        bus.offsets("t", 0).expect("offsets"),
        bus_core::PartitionOffsets { first: 0, next: 2 },
        "one genuine record beside the forgery"
    );
    assert_eq!(
        bus.find_event_by_uid("t", "k", "pay-1").expect("find"),
        Some(acks[0].clone())
    );
    cleanup(&bus);
}

/// `topic_spec` reports the spec recorded on the server, the one provision
/// verifies against: another bus on the same prefix reads it back equal,
/// and an unknown topic is `UnknownTopic`.
#[test]
fn topic_spec_reads_back_the_provisioned_spec() {
    let Some(bus) = bus() else { return };
    let spec = TopicSpec::new("described", 2)
        .with_retention_ms(3_600_000)
        .with_dedup_window_ms(5_000)
        .with_max_record_bytes(4_096);
    bus.provision(&Manifest::new([spec.clone()]))
        .expect("provision");
    assert_eq!(
        bus.topic_spec("described").expect("topic_spec"),
        Some(spec.clone())
    );
    let other = common::same_prefix(&bus);
    assert_eq!(
        other.topic_spec("described").expect("topic_spec"),
        Some(spec)
    );
    assert!(
        matches!(other.topic_spec("ghost"), Err(BusError::UnknownTopic(ref t)) if t == "ghost"),
        "an unknown topic must be UnknownTopic"
    );
    cleanup(&bus);
}
