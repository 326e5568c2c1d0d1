//! C6 idempotent publish and C7 find by UID.

use std::sync::{Arc, Barrier};

use bus_core::auth::{RecordAuth, RecordParts};
use bus_core::{BatchRecord, BusError, EventBus, PublishAck, partition_for};
use serde_json::json;

use crate::util::{fetch_all, ok, publish_n};
use crate::{CaseResult, Ctx, RawRecord, assert_err};

fn stored_count(ctx: &Ctx, topic: &str, key: &str) -> usize {
    let partitions = ok("partitions", ctx.bus().partitions(topic));
    fetch_all(ctx.bus(), topic, partition_for(key, partitions), 0).len()
}

/// C6: a UID already stored returns the original ack and stores nothing.
pub fn c06_retry_returns_original_ack(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 2);
    let first = ok(
        "publish",
        ctx.bus()
            .publish_idempotent(&topic, "k", &json!({"v": 1}), "uid-1"),
    );
    let other = ok(
        "publish",
        ctx.bus()
            .publish_idempotent(&topic, "k", &json!({"v": 2}), "uid-2"),
    );
    let retry = ok(
        "retry",
        ctx.bus()
            .publish_idempotent(&topic, "k", &json!({"v": 1}), "uid-1"),
    );
    assert_eq!(retry, first);
    assert_ne!(other.offset, first.offset);
    assert_eq!(stored_count(ctx, &topic, "k"), 2);
    // A retry carrying a different value is still the same event.
    let changed = ok(
        "retry",
        ctx.bus()
            .publish_idempotent(&topic, "k", &json!({"v": 9}), "uid-2"),
    );
    assert_eq!(changed, other);
    assert_eq!(stored_count(ctx, &topic, "k"), 2);
    Ok(())
}

/// C6: a string `metadata.uid` deduplicates a plain publish too.
pub fn c06_metadata_uid_dedups_plain_publish(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 1);
    let value = json!({"metadata": {"uid": "evt-7"}, "body": 1});
    let first = ok("publish", ctx.bus().publish(&topic, "k", &value));
    assert_eq!(ok("again", ctx.bus().publish(&topic, "k", &value)), first);
    assert_eq!(
        ok(
            "explicit",
            ctx.bus().publish_idempotent(&topic, "k", &value, "evt-7")
        ),
        first
    );
    // A non-string metadata.uid is just data.
    let numeric = json!({"metadata": {"uid": 7}});
    let a = ok("numeric", ctx.bus().publish(&topic, "k", &numeric));
    let b = ok("numeric", ctx.bus().publish(&topic, "k", &numeric));
    assert_ne!(a, b);
    assert_eq!(stored_count(ctx, &topic, "k"), 3);
    Ok(())
}

/// C6: a `metadata.uid` that differs from the given UID is an argument
/// error, and an empty UID too; nothing is stored.
pub fn c06_uid_mismatch_is_invalid_argument(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 1);
    let value = json!({"metadata": {"uid": "a"}});
    assert_err!(
        ctx.bus().publish_idempotent(&topic, "k", &value, "b"),
        BusError::InvalidArgument { .. }
    );
    assert_err!(
        ctx.bus().publish_idempotent(&topic, "k", &json!({}), ""),
        BusError::InvalidArgument { .. }
    );
    assert_err!(
        ctx.bus()
            .publish_batch(&topic, &[BatchRecord::new("k", value).with_uid("b")]),
        BusError::InvalidArgument { .. }
    );
    assert_eq!(stored_count(ctx, &topic, "k"), 0);
    Ok(())
}

/// C6: dedup holds across a reopen of the bus.
pub fn c06_dedup_survives_reopen(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 3);
    let acks: Vec<PublishAck> = (0..10)
        .map(|i| {
            ok(
                "publish",
                ctx.bus()
                    .publish_idempotent(&topic, &format!("k{i}"), &json!(i), &format!("u{i}")),
            )
        })
        .collect();
    ctx.reopen()?;
    for (i, ack) in acks.iter().enumerate() {
        let retry = ok(
            "retry",
            ctx.bus()
                .publish_idempotent(&topic, &format!("k{i}"), &json!(i), &format!("u{i}")),
        );
        assert_eq!(&retry, ack, "uid u{i} after reopen");
    }
    let total: usize = (0..3)
        .map(|p| fetch_all(ctx.bus(), &topic, p, 0).len())
        .sum();
    assert_eq!(total, 10);
    Ok(())
}

/// C6: concurrent retries of one UID from many threads store one record.
pub fn c06_concurrent_retries_store_one(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 2);
    let threads = 16;
    for round in 0..5 {
        let uid = format!("race-{round}");
        let barrier = Arc::new(Barrier::new(threads));
        let acks: Vec<PublishAck> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let (barrier, uid, topic) = (Arc::clone(&barrier), uid.clone(), topic.clone());
                    let bus = ctx.bus();
                    scope.spawn(move || {
                        barrier.wait();
                        ok(
                            "race",
                            bus.publish_idempotent(&topic, "k", &json!({ "t": t }), &uid),
                        )
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| panic!("publisher panicked")))
                .collect()
        });
        assert!(
            acks.windows(2).all(|w| w[0] == w[1]),
            "round {round}: {acks:?}"
        );
        assert_eq!(stored_count(ctx, &topic, "k"), round + 1);
    }
    Ok(())
}

/// C7: find returns the ack of the record with that UID, `None` otherwise,
/// never another record's ack.
pub fn c07_find_by_uid(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 4);
    let mut acks = Vec::new();
    for i in 0..30 {
        let key = format!("agent-{}", i % 6);
        let uid = format!("evt-{i}");
        let ack = if i % 2 == 0 {
            ctx.bus()
                .publish_idempotent(&topic, &key, &json!({ "i": i }), &uid)
        } else {
            ctx.bus()
                .publish(&topic, &key, &json!({ "i": i, "metadata": { "uid": uid } }))
        };
        // Records without UIDs in between must not confuse the index.
        ok(
            "filler",
            ctx.bus().publish(&topic, &key, &json!({ "filler": i })),
        );
        acks.push((key, uid, ok("publish", ack)));
    }
    for (key, uid, ack) in &acks {
        let found = ok("find", ctx.bus().find_event_by_uid(&topic, key, uid));
        assert_eq!(found.as_ref(), Some(ack), "uid {uid}");
    }
    assert_eq!(
        ok(
            "find",
            ctx.bus()
                .find_event_by_uid(&topic, "agent-0", "evt-missing")
        ),
        None
    );
    Ok(())
}

/// C7: find works after a reopen.
pub fn c07_find_after_reopen(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 2);
    let ack = ok(
        "publish",
        ctx.bus().publish_idempotent(&topic, "k", &json!(1), "kept"),
    );
    ctx.reopen()?;
    assert_eq!(
        ok("find", ctx.bus().find_event_by_uid(&topic, "k", "kept")),
        Some(ack)
    );
    assert_eq!(
        ok("find", ctx.bus().find_event_by_uid(&topic, "k", "never")),
        None
    );
    Ok(())
}

/// C6: batch publish deduplicates like single publishes, also within the batch.
pub fn c06_batch_publish_dedups(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 1);
    let first = ok(
        "publish",
        ctx.bus().publish_idempotent(&topic, "k", &json!(1), "b-1"),
    );
    let twice = json!({"metadata": {"uid": "b-2"}});
    let acks = ok(
        "batch",
        ctx.bus().publish_batch(
            &topic,
            &[
                BatchRecord::new("k", json!(1)).with_uid("b-1"),
                BatchRecord::new("k", twice.clone()),
                BatchRecord::new("k", twice),
            ],
        ),
    );
    assert_eq!(acks[0], first, "a UID stored before the batch");
    assert_eq!(acks[1], acks[2], "a UID repeated inside the batch");
    assert_eq!(stored_count(ctx, &topic, "k"), 2);
    Ok(())
}

/// C6: an empty `metadata.uid` is no UID: such records are not deduplicated.
pub fn c06_empty_metadata_uid_is_no_uid(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 1);
    let value = json!({"metadata": {"uid": ""}});
    let a = ok("publish", ctx.bus().publish(&topic, "k", &value));
    let b = ok("again", ctx.bus().publish(&topic, "k", &value));
    assert_ne!(a, b);
    assert_eq!(stored_count(ctx, &topic, "k"), 2);
    Ok(())
}

/// Exactly the record the bus stores for `uid` (same key, value bytes and,
/// under `control_key`, the same tag), as a foreign client would copy it.
fn exact_copy(
    topic: &str,
    key: &str,
    uid: &str,
    value: &serde_json::Value,
    control_key: Option<[u8; 32]>,
) -> RawRecord {
    let bytes = serde_json::to_vec(value).unwrap_or_else(|error| panic!("encode: {error}"));
    let tag = control_key.map(|control_key| {
        RecordAuth::new(&control_key)
            .tag(RecordParts {
                topic,
                partition: 0,
                key,
                uid: Some(uid),
                value: &bytes,
            })
            .to_vec()
    });
    RawRecord {
        key: key.to_owned(),
        uid: Some(uid.to_owned()),
        value: bytes,
        tag,
        ..Default::default()
    }
}

/// Byte-exact replays, written later into the partition by a foreign
/// client, of a UID record the bus published and of one a foreign client
/// wrote first: the first record of each UID keeps answering for it
/// (contracts C6, C7, C14), also after a reopen.
pub(crate) fn replay_keeps_the_original(
    ctx: &mut Ctx,
    control_key: Option<[u8; 32]>,
) -> CaseResult {
    if let Some(key) = control_key {
        ctx.set_control_key(key);
    }
    let topic = ctx.simple_topic("t", 1);
    let key = "k";
    let value = json!({"amount": 7, "note": "ünï"});
    let published = ok(
        "publish",
        ctx.bus().publish_idempotent(&topic, key, &value, "pay-7"),
    );
    publish_n(ctx.bus(), &topic, key, 1);
    let foreign = exact_copy(&topic, key, "pay-8", &value, control_key);
    ctx.inject_raw(&topic, 0, &foreign)?;
    let foreign_first = ok("offsets", ctx.bus().offsets(&topic, 0)).next - 1;
    ctx.inject_raw(
        &topic,
        0,
        &exact_copy(&topic, key, "pay-7", &value, control_key),
    )?;
    ctx.inject_raw(&topic, 0, &foreign)?;
    let stored = ok("offsets", ctx.bus().offsets(&topic, 0)).next;
    assert_eq!(
        stored,
        foreign_first + 3,
        "three records written around the bus"
    );
    // The copies are exact: each reads back as a valid record of its own.
    let copies = ok(
        "fetch the copies",
        ctx.bus().fetch(&topic, 0, foreign_first, 3),
    );
    assert_eq!(copies.len(), 3);
    for copy in &copies {
        assert_eq!((copy.key.as_str(), &copy.value), (key, &value));
    }
    let firsts = [
        ("pay-7", published),
        (
            "pay-8",
            PublishAck {
                topic: topic.clone(),
                partition: 0,
                offset: foreign_first,
            },
        ),
    ];
    let check = |bus: &dyn EventBus, when: &str| {
        for (uid, first) in &firsts {
            let first = Some(first.clone());
            let answers = [
                ("find_event_by_uid", bus.find_event_by_uid(&topic, key, uid)),
                (
                    "a retry",
                    bus.publish_idempotent(&topic, key, &value, uid).map(Some),
                ),
                (
                    "a metadata.uid retry",
                    bus.publish(&topic, key, &json!({"metadata": {"uid": uid}}))
                        .map(Some),
                ),
                (
                    "a batch retry",
                    bus.publish_batch(
                        &topic,
                        &[BatchRecord::new(key, value.clone()).with_uid(*uid)],
                    )
                    .map(|acks| acks.into_iter().next()),
                ),
            ];
            for (what, answer) in answers {
                assert_eq!(
                    ok(what, answer),
                    first,
                    "{when}: {what} of {uid} must answer the first record of the UID"
                );
            }
        }
        assert_eq!(
            ok("offsets", bus.offsets(&topic, 0)).next,
            stored,
            "{when}: the retries stored nothing"
        );
    };
    check(ctx.bus(), "before reopen");
    if ctx.reopen().is_ok() {
        check(ctx.bus(), "after reopen");
    }
    Ok(())
}

/// C6/C7: without a control key, the first record of a UID answers for it:
/// a byte-exact replay written later never takes its place.
pub fn c07_replayed_record_does_not_answer_for_its_uid(ctx: &mut Ctx) -> CaseResult {
    replay_keeps_the_original(ctx, None)
}
