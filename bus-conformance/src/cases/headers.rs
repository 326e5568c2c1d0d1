//! C25 record headers: round trip through fetch and subscriptions, bad
//! input refused with nothing stored, records without headers unchanged,
//! forged headers caught by the tag.

use bus_core::auth::{RecordAuth, RecordParts};
use bus_core::{
    BusError, Headers, MAX_HEADER_VALUE_BYTES, MAX_HEADERS, Selector, StartAt, SubscribeOptions,
    SubscriptionItem,
};
use serde_json::json;

use super::subscribe::{next_item, subscribe};
use crate::util::{ok, publish_n};
use crate::{CaseResult, Ctx, RawRecord, assert_err};

const KEY: [u8; 32] = [0x25; 32];

fn headers(pairs: &[(&str, &str)]) -> Headers {
    ok(
        "headers",
        Headers::try_from_pairs(pairs.iter().map(|&(name, value)| (name, value))),
    )
}

fn require_headers(ctx: &Ctx) -> CaseResult {
    ctx.require(ctx.caps().headers, "the backend does not store headers")
}

/// The next subscription item, which must be a record: its offset and headers.
fn next_record(sub: &mut bus_core::Subscription, what: &str) -> (u64, Headers) {
    match next_item(sub, what) {
        Ok(SubscriptionItem::Record { event, headers, .. }) => (event.offset, headers),
        other => panic!("{what}: expected a record, got {other:?}"),
    }
}

/// C25: headers published with a record come back, exactly, through
/// fetch, a subscription's history and its live tail; a record without
/// headers beside it comes back with none; the value and key are the
/// same as a plain publish's; a UID publish with headers dedups (C6).
pub fn c25_headers_round_trip_through_fetch_and_subscribe(ctx: &mut Ctx) -> CaseResult {
    require_headers(ctx)?;
    ctx.set_control_key(KEY);
    let topic = ctx.simple_topic("t", 1);
    let first = headers(&[
        (
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ),
        ("content-type", "application/json; charset=utf-8"),
        ("note", " spaces kept, ünïcode, 100% = ok "),
        ("empty", ""),
    ]);
    let bus = ctx.bus();
    let ack = ok(
        "publish_with_headers",
        bus.publish_with_headers(&topic, "k", &json!({"n": 0}), None, &first),
    );
    assert_eq!(ack.offset, 0);
    ok("publish", bus.publish(&topic, "k", &json!({"n": 1})));
    let second = headers(&[("only", "one")]);
    let uid_ack = ok(
        "publish_with_headers (UID)",
        bus.publish_with_headers(&topic, "k", &json!({"n": 2}), Some("u-25"), &second),
    );
    let retry = ok(
        "publish_with_headers (retry)",
        bus.publish_with_headers(&topic, "k", &json!({"n": 2}), Some("u-25"), &second),
    );
    assert_eq!(
        retry, uid_ack,
        "a retry with headers returns the first ack (C6)"
    );
    let fetched = ok(
        "fetch_with_headers",
        bus.fetch_with_headers(&topic, 0, 0, 10),
    );
    let seen: Vec<_> = fetched
        .iter()
        .map(|record| (record.event.offset, record.headers.clone()))
        .collect();
    assert_eq!(
        seen,
        [(0, first.clone()), (1, Headers::new()), (2, second.clone())]
    );
    assert_eq!(fetched[0].event.value, json!({"n": 0}));
    assert_eq!(fetched[0].event.key, "k");
    let plain = ok("fetch", bus.fetch(&topic, 0, 0, 10));
    assert_eq!(
        plain,
        fetched
            .iter()
            .map(|record| record.event.clone())
            .collect::<Vec<_>>(),
        "fetch returns the same events without their headers"
    );
    let mut sub = subscribe(
        bus,
        &topic,
        Selector::Partition(0),
        StartAt::Beginning,
        SubscribeOptions::default(),
    );
    assert_eq!(next_record(&mut sub, "history 0"), (0, first.clone()));
    assert_eq!(next_record(&mut sub, "history 1"), (1, Headers::new()));
    assert_eq!(next_record(&mut sub, "history 2"), (2, second));
    let live = headers(&[("live", "yes")]);
    ok(
        "publish_with_headers (live)",
        bus.publish_with_headers(&topic, "k", &json!({"n": 3}), None, &live),
    );
    assert_eq!(next_record(&mut sub, "live 3"), (3, live));
    Ok(())
}

/// C25: headers over a limit (too many, a name or value too long, an empty
/// or non-ASCII name, a name the bus or the broker keeps for itself, a
/// control character) are `InvalidArgument` on field `headers`, and
/// nothing is stored — on every backend, including one that stores no
/// headers.
pub fn c25_bad_headers_are_refused_and_nothing_stored(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 1);
    let bus = ctx.bus();
    let too_many = Headers::from_stored((0..=MAX_HEADERS).map(|i| (format!("h{i}"), "v")));
    let long_value = "v".repeat(MAX_HEADER_VALUE_BYTES + 1);
    let long_name = "n".repeat(65);
    let bad: Vec<Headers> = vec![
        too_many,
        Headers::from_stored([("big", long_value.as_str())]),
        Headers::from_stored([(long_name.as_str(), "v")]),
        Headers::from_stored([("", "v")]),
        Headers::from_stored([("naïve", "v")]),
        Headers::from_stored([("with space", "v")]),
        Headers::from_stored([("bus-uid", "forged")]),
        Headers::from_stored([("Bus-Tag", "00")]),
        Headers::from_stored([("Nats-Msg-Id", "x")]),
        Headers::from_stored([("line", "a\r\nInjected: 1")]),
    ];
    for headers in &bad {
        for uid in [None, Some("u-bad")] {
            assert_err!(
                bus.publish_with_headers(&topic, "k", &json!({"n": 1}), uid, headers),
                BusError::InvalidArgument { ref field, .. } if field == "headers"
            );
        }
    }
    let offsets = ok("offsets", bus.offsets(&topic, 0));
    assert_eq!(offsets.next, 0, "a refused publish stores nothing");
    assert!(ok("find", bus.find_event_by_uid(&topic, "k", "u-bad")).is_none());
    // The UID stays free for a good publish.
    let ack = ok(
        "publish after refusals",
        bus.publish_idempotent(&topic, "k", &json!({"n": 1}), "u-bad"),
    );
    assert_eq!(ack.offset, 0);
    Ok(())
}

/// C25: a record without headers is the record it always was: its tag is
/// the tag of before headers existed (a record written that way by
/// another client, or stored by an older version of the bus, still
/// verifies), and it reads back with no headers.
pub fn c25_records_without_headers_are_unchanged(ctx: &mut Ctx) -> CaseResult {
    ctx.set_control_key(KEY);
    let topic = ctx.simple_topic("t", 1);
    let value = br#"{"n":0}"#.to_vec();
    // The tag as every version before headers computed it.
    let old_tag = RecordAuth::new(&KEY)
        .tag(RecordParts {
            topic: &topic,
            partition: 0,
            key: "k",
            uid: None,
            value: &value,
        })
        .to_vec();
    ctx.inject_raw(
        &topic,
        0,
        &RawRecord {
            key: "k".to_owned(),
            uid: None,
            value,
            tag: Some(old_tag),
            ..Default::default()
        },
    )?;
    // Published after the injected record (a broker client may learn where
    // a partition ends from its own publishes).
    let bus = ctx.bus();
    ok("publish", bus.publish(&topic, "k", &json!({"n": 1})));
    let records = ok(
        "fetch_with_headers",
        bus.fetch_with_headers(&topic, 0, 0, 10),
    );
    assert_eq!(records.len(), 2, "{records:?}");
    for record in &records {
        assert!(record.headers.is_empty(), "{record:?}");
    }
    assert_eq!(records[0].event.value, json!({"n": 0}));
    Ok(())
}

/// C25 with C14: a header added to, removed from or changed in a signed
/// record fails as `Integrity` naming its offset, through fetch and a
/// subscription; the records around it read.
pub fn c25_forged_headers_fail_with_integrity(ctx: &mut Ctx) -> CaseResult {
    require_headers(ctx)?;
    ctx.set_control_key(KEY);
    let topic = ctx.simple_topic("t", 1);
    let value = br#"{"n":1}"#.to_vec();
    let parts = RecordParts {
        topic: &topic,
        partition: 0,
        key: "k",
        uid: None,
        value: &value,
    };
    let auth = RecordAuth::new(&KEY);
    let signed = headers(&[("role", "user")]);
    let forged = [
        // Changed: the tag of role=user on role=admin.
        (headers(&[("role", "admin")]), auth.tag_with(parts, &signed)),
        // Added: a headerless record's tag with a header slipped in.
        (headers(&[("role", "admin")]), auth.tag(parts)),
        // Removed: the tag of role=user with no headers left.
        (Headers::new(), auth.tag_with(parts, &signed)),
    ];
    let published = publish_n(ctx.bus(), &topic, "k", 1);
    assert_eq!(published[0].offset, 0);
    for (carried, tag) in &forged {
        ctx.inject_raw(
            &topic,
            0,
            &RawRecord {
                key: "k".to_owned(),
                uid: None,
                value: value.clone(),
                tag: Some(tag.to_vec()),
                headers: carried.clone(),
            },
        )?;
    }
    // A correctly signed record with headers from outside verifies (C14).
    ctx.inject_raw(
        &topic,
        0,
        &RawRecord {
            key: "k".to_owned(),
            uid: None,
            value: value.clone(),
            tag: Some(auth.tag_with(parts, &signed).to_vec()),
            headers: signed.clone(),
        },
    )?;
    let bus = ctx.bus();
    for offset in 1..=3 {
        assert_err!(
            bus.fetch_with_headers(&topic, 0, offset, 1),
            BusError::Integrity { offset: o, .. } if o == offset
        );
        assert_err!(
            bus.fetch(&topic, 0, offset, 1),
            BusError::Integrity { offset: o, .. } if o == offset
        );
    }
    let good = ok(
        "fetch_with_headers",
        bus.fetch_with_headers(&topic, 0, 4, 1),
    );
    assert_eq!(good.len(), 1);
    assert_eq!(good[0].headers, signed);
    let mut sub = subscribe(
        bus,
        &topic,
        Selector::Partition(0),
        StartAt::Beginning,
        SubscribeOptions::default(),
    );
    assert_eq!(next_record(&mut sub, "authentic 0").0, 0);
    for offset in 1..=3 {
        match next_item(&mut sub, "a forged record") {
            Err(BusError::Integrity { offset: o, .. }) if o == offset => {}
            other => panic!("expected Integrity at {offset}, got {other:?}"),
        }
    }
    assert_eq!(next_record(&mut sub, "authentic 4"), (4, signed));
    Ok(())
}
