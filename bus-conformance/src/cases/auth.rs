//! C14 authenticated records.

use bus_core::auth::{RecordAuth, RecordParts};
use bus_core::{BusError, StoredEvent};
use serde_json::json;

use crate::util::{fetch_all, key_for_partition, ok, publish_n};
use crate::{CaseResult, Ctx, RawRecord, assert_err};

const KEY: [u8; 32] = [0x11; 32];
const OTHER_KEY: [u8; 32] = [0x22; 32];

/// C14: with a control key, records round-trip and verify.
pub fn c14_signed_records_verify(ctx: &mut Ctx) -> CaseResult {
    ctx.set_control_key(KEY);
    let topic = ctx.simple_topic("t", 2);
    let ack = ok(
        "publish",
        ctx.bus()
            .publish_idempotent(&topic, "k", &json!({"a": 1}), "u1"),
    );
    publish_n(ctx.bus(), &topic, "k", 3);
    let all = fetch_all(ctx.bus(), &topic, ack.partition, 0);
    assert_eq!(all.len(), 4);
    assert_eq!(all[0].value, json!({"a": 1}));
    Ok(())
}

fn expect_forged(result: Result<Vec<StoredEvent>, BusError>, offset: u64) {
    assert_err!(result, BusError::Integrity { offset: o, .. } if o == offset);
}

/// C14: records written around the bus (no tag, a tag made with another
/// key, a tag over other content) are never returned as authentic; fetch
/// names the failing offset and the caller can skip past it.
pub fn c14_forged_records_fail_with_integrity(ctx: &mut Ctx) -> CaseResult {
    ctx.set_control_key(KEY);
    let topic = ctx.simple_topic("t", 1);
    ok("publish", ctx.bus().publish(&topic, "k", &json!({"n": 0})));
    let value = br#"{"forged":true}"#.to_vec();
    let parts = RecordParts {
        topic: &topic,
        partition: 0,
        key: "k",
        uid: None,
        value: &value,
    };
    let other_key_tag = RecordAuth::new(&OTHER_KEY).tag(parts).to_vec();
    let other_content_tag = RecordAuth::new(&KEY)
        .tag(RecordParts {
            value: b"{\"n\":0}",
            ..parts
        })
        .to_vec();
    for tag in [
        None,
        Some(other_key_tag),
        Some(other_content_tag),
        Some(vec![0; 5]),
    ] {
        let raw = RawRecord {
            key: "k".to_owned(),
            uid: None,
            value: value.clone(),
            tag,
            ..Default::default()
        };
        ctx.inject_raw(&topic, 0, &raw)?;
    }
    ok("publish", ctx.bus().publish(&topic, "k", &json!({"n": 5})));
    match ctx.bus().fetch(&topic, 0, 0, 10) {
        Ok(prefix) => {
            // Returning the authentic prefix before the forgery is fine.
            assert_eq!(prefix.len(), 1, "{prefix:?}");
            assert_eq!(prefix[0].value, json!({"n": 0}));
        }
        Err(BusError::Integrity { offset: 1, .. }) => {}
        Err(other) => panic!("expected Integrity at offset 1, got {other:?}"),
    }
    for offset in 1..=4 {
        expect_forged(ctx.bus().fetch(&topic, 0, offset, 10), offset);
    }
    let last = ok("fetch past forgeries", ctx.bus().fetch(&topic, 0, 5, 10));
    assert_eq!(last.len(), 1);
    assert_eq!(last[0].value, json!({"n": 5}));
    Ok(())
}

/// C14: a correctly signed injected record is accepted (the check is the
/// tag, not who wrote it).
pub fn c14_correct_tag_from_outside_is_accepted(ctx: &mut Ctx) -> CaseResult {
    ctx.set_control_key(KEY);
    let topic = ctx.simple_topic("t", 1);
    let value = br#"{"outside":1}"#.to_vec();
    let tag = RecordAuth::new(&KEY).tag(RecordParts {
        topic: &topic,
        partition: 0,
        key: "k",
        uid: Some("ext-1"),
        value: &value,
    });
    let raw = RawRecord {
        key: "k".to_owned(),
        uid: Some("ext-1".to_owned()),
        value,
        tag: Some(tag.to_vec()),
        ..Default::default()
    };
    ctx.inject_raw(&topic, 0, &raw)?;
    let got = ok("fetch", ctx.bus().fetch(&topic, 0, 0, 10));
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].value, json!({"outside": 1}));
    assert_eq!(got[0].key, "k");
    Ok(())
}

/// C14: a bus reopened with another key rejects the records of the first.
pub fn c14_another_key_rejects_after_reopen(ctx: &mut Ctx) -> CaseResult {
    ctx.set_control_key(KEY);
    let topic = ctx.simple_topic("t", 1);
    publish_n(ctx.bus(), &topic, "k", 2);
    ctx.reopen()?;
    assert_eq!(
        fetch_all(ctx.bus(), &topic, 0, 0).len(),
        2,
        "same key verifies"
    );
    ctx.set_control_key(OTHER_KEY);
    ctx.reopen()?;
    expect_forged(ctx.bus().fetch(&topic, 0, 0, 10), 0);
    expect_forged(ctx.bus().fetch(&topic, 0, 1, 10), 1);
    Ok(())
}

/// C14: a tag binds the record to its partition: a record signed for
/// partition 0 and replayed into partition 1 is rejected.
pub fn c14_tag_binds_the_partition(ctx: &mut Ctx) -> CaseResult {
    ctx.set_control_key(KEY);
    let topic = ctx.simple_topic("t", 2);
    let key = key_for_partition("k", 1, 2);
    publish_n(ctx.bus(), &topic, &key, 2);
    assert_eq!(
        fetch_all(ctx.bus(), &topic, 1, 0).len(),
        2,
        "own records on partition 1 verify"
    );
    let value = br#"{"replayed":true}"#.to_vec();
    let tag = RecordAuth::new(&KEY)
        .tag(RecordParts {
            topic: &topic,
            partition: 0,
            key: &key,
            uid: None,
            value: &value,
        })
        .to_vec();
    let raw = RawRecord {
        key,
        uid: None,
        value,
        tag: Some(tag),
        ..Default::default()
    };
    ctx.inject_raw(&topic, 1, &raw)?;
    expect_forged(ctx.bus().fetch(&topic, 1, 2, 10), 2);
    Ok(())
}

/// C14 + C6/C7: a forged record carrying a UID never captures it: the
/// genuine publish of that UID is stored (not answered with the forgery's
/// ack) and find returns the genuine record.
pub fn c14_forged_uid_does_not_capture_dedup(ctx: &mut Ctx) -> CaseResult {
    ctx.set_control_key(KEY);
    let topic = ctx.simple_topic("t", 1);
    let raw = RawRecord {
        key: "k".to_owned(),
        uid: Some("pay-42".to_owned()),
        value: br#"{"forged":true}"#.to_vec(),
        tag: None,
        ..Default::default()
    };
    ctx.inject_raw(&topic, 0, &raw)?;
    let genuine = json!({"amount": 42});
    let ack = ok(
        "genuine publish",
        ctx.bus()
            .publish_idempotent(&topic, "k", &genuine, "pay-42"),
    );
    assert_ne!(
        ack.offset, 0,
        "the forged record at offset 0 must not answer for pay-42"
    );
    let stored = ok("fetch genuine", ctx.bus().fetch(&topic, 0, ack.offset, 1));
    assert_eq!(stored[0].value, genuine);
    assert_eq!(
        ok("find", ctx.bus().find_event_by_uid(&topic, "k", "pay-42")),
        Some(ack.clone())
    );
    let retry = ok(
        "retry",
        ctx.bus()
            .publish_idempotent(&topic, "k", &genuine, "pay-42"),
    );
    assert_eq!(
        retry, ack,
        "once the genuine record is stored, it deduplicates"
    );
    Ok(())
}

/// C14: a byte-exact replay of an authentic UID record (its tag verifies
/// too) never takes the original's place: find-by-UID and dedup answer the
/// first authentic record, also after a reopen.
pub fn c14_replayed_record_does_not_take_the_originals_place(ctx: &mut Ctx) -> CaseResult {
    crate::cases::dedup::replay_keeps_the_original(ctx, Some(KEY))
}
