//! How streams spell their UID subjects (C6, C7; issue #32). Streams this
//! version creates record `bus.uid-subjects` and name each UID by a
//! 16-character token with no `Nats-Msg-Id` (the server's memory per UID);
//! streams of earlier versions, which have no such key, keep their 64-digit
//! subjects and their records answer for their UIDs; a spelling this version
//! does not know is not taken for a topic.

use crate::common;

use async_nats::jetstream::stream::Config;
use bus_core::{BusError, EventBus, Manifest, PartitionOffsets, TopicSpec};
use bus_nats::NatsBus;
use bus_nats::naming::{
    KEY_HEADER, META_UID_SUBJECTS, UID_HEADER, UidSubjects, encode_header_text, record_subject,
    record_subject_as, stream_name,
};
use common::cleanup;
use serde_json::json;

fn bus() -> Option<NatsBus> {
    common::shared_bus("uid_subjects", "uids")
}

/// The stream's config with its UID spelling set to `value` (removed for
/// `None`), as the version that wrote `value` would have created it.
fn respell(stream: &str, value: Option<&str>) {
    common::raw(async |js| {
        let info = js
            .get_stream(stream)
            .await
            .expect("stream")
            .info()
            .await
            .expect("info")
            .clone();
        let mut config: Config = info.config;
        match value {
            Some(value) => config
                .metadata
                .insert(META_UID_SUBJECTS.to_owned(), value.to_owned()),
            None => config.metadata.remove(META_UID_SUBJECTS),
        };
        js.update_stream(config).await.expect("update stream");
    });
}

/// The stream message at `sequence`: its subject and whether it carries a
/// `Nats-Msg-Id`.
fn stored(stream: &str, sequence: u64) -> (String, bool) {
    common::raw(async |js| {
        let message = js
            .get_stream(stream)
            .await
            .expect("stream")
            .get_raw_message(sequence)
            .await
            .expect("message");
        (
            message.subject.to_string(),
            message.headers.get("Nats-Msg-Id").is_some(),
        )
    })
}

#[test]
fn new_streams_spell_uids_short_and_send_no_msg_id() {
    let Some(bus) = bus() else { return };
    bus.provision(&Manifest::new([TopicSpec::new("t", 1)]))
        .expect("provision");
    let stream = stream_name(bus.prefix(), "t", 0);
    let recorded = common::raw(async |js| {
        let mut handle = js.get_stream(&stream).await.expect("stream");
        let info = handle.info().await.expect("info");
        info.config.metadata.get(META_UID_SUBJECTS).cloned()
    });
    assert_eq!(
        recorded.as_deref(),
        UidSubjects::CURRENT.recorded_as(),
        "the spelling is recorded on the stream"
    );
    let value = json!({"n": 1});
    let ack = bus
        .publish_idempotent("t", "k", &value, "order-1")
        .expect("publish");
    let (subject, msg_id) = stored(&stream, ack.offset + 1);
    assert_eq!(subject, record_subject(&stream, Some("order-1")));
    let token = subject.rsplit('.').next().expect("token");
    assert_eq!(token.len(), 16, "{subject}");
    assert!(
        token
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
        "{subject}"
    );
    assert!(!msg_id, "no Nats-Msg-Id on a stream of the short spelling");
    // Dedup and find answer from that subject, also for another process.
    assert_eq!(
        bus.publish_idempotent("t", "k", &json!({"n": 2}), "order-1")
            .expect("retry"),
        ack
    );
    let other = common::same_prefix(&bus);
    assert_eq!(
        other
            .publish_idempotent("t", "k", &value, "order-1")
            .expect("retry elsewhere"),
        ack
    );
    assert_eq!(
        other.find_event_by_uid("t", "k", "order-1").expect("find"),
        Some(ack)
    );
    assert_eq!(
        other.offsets("t", 0).expect("offsets"),
        PartitionOffsets { first: 0, next: 1 },
        "one record stored"
    );
    cleanup(&bus);
}

#[test]
fn streams_of_earlier_versions_keep_their_64_digit_subjects() {
    let Some(bus) = bus() else { return };
    bus.provision(&Manifest::new([TopicSpec::new("t", 1)]))
        .expect("provision");
    let stream = stream_name(bus.prefix(), "t", 0);
    // As an earlier version created the stream (no spelling recorded) and
    // stored a UID record on it.
    respell(&stream, None);
    common::raw(async |js| {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(KEY_HEADER, encode_header_text("k"));
        headers.insert(UID_HEADER, encode_header_text("old-1"));
        headers.insert("Nats-Msg-Id", bus_nats::naming::uid_hash("old-1"));
        headers.insert("Nats-Expected-Last-Subject-Sequence", "0");
        js.publish_with_headers(
            record_subject_as(&stream, Some("old-1"), UidSubjects::Sha256Hex),
            headers,
            br#"{"old":true}"#.to_vec().into(),
        )
        .await
        .expect("send")
        .await
        .expect("ack");
    });
    let bus = common::same_prefix(&bus);
    let found = bus
        .find_event_by_uid("t", "k", "old-1")
        .expect("find")
        .expect("the earlier version's record answers for its UID");
    assert_eq!(found.offset, 0);
    assert_eq!(
        bus.publish_idempotent("t", "k", &json!({"old": true}), "old-1")
            .expect("retry"),
        found,
        "dedup finds the earlier record"
    );
    let new = bus
        .publish_idempotent("t", "k", &json!({"new": true}), "new-1")
        .expect("publish");
    let (subject, msg_id) = stored(&stream, new.offset + 1);
    assert_eq!(
        subject,
        record_subject_as(&stream, Some("new-1"), UidSubjects::Sha256Hex),
        "a new UID on an earlier stream keeps its spelling"
    );
    assert!(msg_id, "and its Nats-Msg-Id");
    assert_eq!(
        bus.offsets("t", 0).expect("offsets"),
        PartitionOffsets { first: 0, next: 2 }
    );
    cleanup(&bus);
}

#[test]
fn a_spelling_this_version_does_not_know_is_not_taken_for_a_topic() {
    let Some(bus) = bus() else { return };
    let manifest = Manifest::new([TopicSpec::new("t", 1)]);
    bus.provision(&manifest).expect("provision");
    respell(&stream_name(bus.prefix(), "t", 0), Some("from-the-future"));
    let other = common::same_prefix(&bus);
    assert!(
        matches!(other.partitions("t"), Err(BusError::UnknownTopic(_))),
        "a stream it cannot write correctly is no topic of this bus"
    );
    match other.provision(&manifest) {
        Err(BusError::Conflict {
            property, existing, ..
        }) => {
            assert!(property.contains("UID subjects"), "{property}");
            assert!(existing.contains("from-the-future"), "{existing}");
        }
        other => panic!("expected a Conflict naming the UID subjects, got {other:?}"),
    }
    cleanup(&bus);
}
