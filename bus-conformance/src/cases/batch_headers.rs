//! C25 headers in batches: `publish_batch_with_headers` stores each
//! record's headers as `publish_with_headers` does (covered by the tag,
//! back through fetch and subscriptions), and refuses a batch with one bad
//! header whole, storing nothing.

use bus_core::{
    BatchRecord, BatchRecordWithHeaders, BusError, Headers, Selector, StartAt, SubscribeOptions,
    SubscriptionItem,
};
use serde_json::json;

use super::subscribe::{next_item, subscribe};
use crate::util::{key_for_partition, ok};
use crate::{CaseResult, Ctx, assert_err};

const KEY: [u8; 32] = [0x52; 32];

fn headers(pairs: &[(&str, &str)]) -> Headers {
    ok(
        "headers",
        Headers::try_from_pairs(pairs.iter().map(|&(name, value)| (name, value))),
    )
}

/// C25/C5/C6: a batch with headers over two partitions acks in the batch's
/// order; each record reads back with its own headers (none for a record
/// given none) through fetch and a subscription, under a control key (so
/// the tag covers them, C14); a UID repeated in the batch or in a later
/// batch is the first record (C6); an empty batch stores nothing.
pub fn c25_batch_headers_round_trip(ctx: &mut Ctx) -> CaseResult {
    ctx.require(ctx.caps().headers, "the backend does not store headers")?;
    ctx.set_control_key(KEY);
    let topic = ctx.simple_topic("t", 2);
    let (a, b) = (key_for_partition("a", 0, 2), key_for_partition("b", 1, 2));
    let h0 = headers(&[("ce_type", "order.created"), ("note", " ünï 100% ")]);
    let h2 = headers(&[(
        "traceparent",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    )]);
    let h3 = headers(&[("only", "b")]);
    let batch = [
        BatchRecord::new(a.as_str(), json!({"n": 0})).with_headers(h0.clone()),
        BatchRecordWithHeaders::from(BatchRecord::new(a.as_str(), json!({"n": 1}))),
        BatchRecord::new(a.as_str(), json!({"n": 2}))
            .with_uid("u-batch")
            .with_headers(h2.clone()),
        BatchRecord::new(b.as_str(), json!({"n": 3})).with_headers(h3.clone()),
        // The same UID again in the batch: the first record's ack.
        BatchRecord::new(a.as_str(), json!({"n": 2}))
            .with_uid("u-batch")
            .with_headers(h2.clone()),
    ];
    let bus = ctx.bus();
    let acks = ok(
        "publish_batch_with_headers",
        bus.publish_batch_with_headers(&topic, &batch),
    );
    let places: Vec<_> = acks.iter().map(|ack| (ack.partition, ack.offset)).collect();
    assert_eq!(places, [(0, 0), (0, 1), (0, 2), (1, 0), (0, 2)]);
    let retry = ok(
        "publish_batch_with_headers (retry)",
        bus.publish_batch_with_headers(&topic, &batch[2..3]),
    );
    assert_eq!(
        retry,
        [acks[2].clone()],
        "a retried UID is the first record"
    );
    assert!(ok("empty batch", bus.publish_batch_with_headers(&topic, &[])).is_empty());
    let read = |partition| {
        ok(
            "fetch_with_headers",
            bus.fetch_with_headers(&topic, partition, 0, 10),
        )
        .into_iter()
        .map(|record| (record.event.value, record.headers))
        .collect::<Vec<_>>()
    };
    assert_eq!(
        read(0),
        [
            (json!({"n": 0}), h0.clone()),
            (json!({"n": 1}), Headers::new()),
            (json!({"n": 2}), h2.clone()),
        ]
    );
    assert_eq!(read(1), [(json!({"n": 3}), h3)]);
    let mut sub = subscribe(
        bus,
        &topic,
        Selector::Partition(0),
        StartAt::Beginning,
        SubscribeOptions::default(),
    );
    for (offset, expected) in [(0, h0), (1, Headers::new()), (2, h2)] {
        match next_item(&mut sub, "a batch record") {
            Ok(SubscriptionItem::Record { event, headers, .. }) => {
                assert_eq!((event.offset, headers), (offset, expected));
            }
            other => panic!("expected the record at {offset}, got {other:?}"),
        }
    }
    Ok(())
}

/// C25/C12: a batch in which one record has a bad header (a reserved name,
/// a control character, an empty name) is `InvalidArgument` on field
/// `headers`, and nothing of it is stored — not the good records before
/// it, not a UID — on every backend, including one that stores no headers.
pub fn c25_batch_with_a_bad_header_stores_nothing(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 2);
    let (a, b) = (key_for_partition("a", 0, 2), key_for_partition("b", 1, 2));
    let bus = ctx.bus();
    let good = |key: &str, n: u32| BatchRecord::new(key, json!({ "n": n }));
    for bad in [
        Headers::from_stored([("bus-uid", "forged")]),
        Headers::from_stored([("line", "a\r\nInjected: 1")]),
        Headers::from_stored([("", "v")]),
    ] {
        let batch = [
            good(&a, 0).into(),
            good(&b, 1).with_uid("u-refused").into(),
            good(&a, 2).with_headers(bad),
        ];
        assert_err!(
            bus.publish_batch_with_headers(&topic, &batch),
            BusError::InvalidArgument { ref field, .. } if field == "headers"
        );
    }
    for partition in 0..2 {
        let offsets = ok("offsets", bus.offsets(&topic, partition));
        assert_eq!(offsets.next, 0, "a refused batch stored on {partition}");
    }
    assert!(ok("find", bus.find_event_by_uid(&topic, &b, "u-refused")).is_none());
    let stored = ok(
        "publish_batch_with_headers (no headers)",
        bus.publish_batch_with_headers(&topic, &[good(&b, 1).with_uid("u-refused").into()]),
    );
    assert_eq!(stored[0].offset, 0, "the UID stayed free");
    Ok(())
}
