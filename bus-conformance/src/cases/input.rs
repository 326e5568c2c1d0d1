//! C5/C12 limits and bad input, C13 errors.

use bus_core::{
    BatchRecord, BusError, EventBus, MAX_JSON_DEPTH, PartitionOffsets, TopicSpec,
    backend::json_depth, partition_for,
};
use serde_json::{Value, json};

use crate::util::{fetch_all, ok};
use crate::{CaseResult, Ctx, assert_err};

/// `depth` levels of arrays (`arrays`) or of alternating arrays and
/// objects around `1`.
fn nested(depth: usize, arrays: bool) -> Value {
    (0..depth).fold(json!(1), |inner, level| {
        if arrays || level % 2 == 0 {
            json!([inner])
        } else {
            json!({ "d": inner })
        }
    })
}

/// C5: a value nested exactly [`MAX_JSON_DEPTH`] deep is stored and reads
/// back equal, published alone, by UID or in a batch, and after a reopen.
pub fn c05_values_at_the_depth_limit_round_trip(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 1);
    let values = [
        nested(MAX_JSON_DEPTH, true),
        nested(MAX_JSON_DEPTH, false),
        json!({ "metadata": { "uid": "deep-meta" }, "deep": nested(MAX_JSON_DEPTH - 1, true) }),
    ];
    for value in &values {
        assert_eq!(json_depth(value), MAX_JSON_DEPTH);
    }
    let bus = ctx.bus();
    let mut acks = vec![
        ok("publish", bus.publish(&topic, "k", &values[0])),
        ok(
            "publish_idempotent",
            bus.publish_idempotent(&topic, "k", &values[1], "deep-1"),
        ),
    ];
    acks.extend(ok(
        "publish_batch",
        bus.publish_batch(&topic, &[BatchRecord::new("k", values[2].clone())]),
    ));
    let offsets: Vec<u64> = acks.iter().map(|ack| ack.offset).collect();
    assert_eq!(offsets, [0, 1, 2]);
    let check = |bus: &dyn EventBus| {
        let stored = fetch_all(bus, &topic, 0, 0);
        let got: Vec<&Value> = stored.iter().map(|event| &event.value).collect();
        assert_eq!(got, values.iter().collect::<Vec<_>>());
        assert_eq!(
            ok("find", bus.find_event_by_uid(&topic, "k", "deep-1")),
            Some(acks[1].clone())
        );
    };
    check(ctx.bus());
    if ctx.reopen().is_ok() {
        check(ctx.bus());
    }
    Ok(())
}

/// C5: a value nested deeper than [`MAX_JSON_DEPTH`] (which serde_json, and
/// so fetch, could not decode from 128 on) is refused at publish with
/// `TooDeep`, alone, by UID or anywhere in a batch; nothing is stored and
/// the UID is not taken.
pub fn c05_too_deep_values_are_refused(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 1);
    let fine = json!({ "fine": true });
    for depth in [MAX_JSON_DEPTH + 1, 128, 1_000] {
        let deep = nested(depth, depth % 2 == 0);
        let uid = format!("deep-{depth}");
        let refused = |result: Result<(), BusError>| {
            let error = result
                .err()
                .unwrap_or_else(|| panic!("depth {depth}: accepted"));
            assert!(
                matches!(
                    &error,
                    BusError::TooDeep { topic: named, depth: found, limit: MAX_JSON_DEPTH }
                        if *named == topic && *found == depth
                ),
                "depth {depth}: expected TooDeep, got {error:?}"
            );
            assert!(!error.is_transient());
        };
        let bus = ctx.bus();
        refused(bus.publish(&topic, "k", &deep).map(drop));
        refused(bus.publish_idempotent(&topic, "k", &deep, &uid).map(drop));
        refused(
            bus.publish_batch(
                &topic,
                &[
                    BatchRecord::new("k", fine.clone()),
                    BatchRecord::new("k", deep.clone()).with_uid(uid.clone()),
                    BatchRecord::new("k", fine.clone()),
                ],
            )
            .map(drop),
        );
        assert_eq!(
            ok("offsets", bus.offsets(&topic, 0)),
            PartitionOffsets { first: 0, next: 0 },
            "depth {depth}: nothing stored"
        );
        assert_eq!(ok("find", bus.find_event_by_uid(&topic, "k", &uid)), None);
    }
    let bus = ctx.bus();
    assert_eq!(ok("publish", bus.publish(&topic, "k", &fine)).offset, 0);
    let taken = ok(
        "publish a refused UID",
        bus.publish_idempotent(&topic, "k", &fine, &format!("deep-{}", MAX_JSON_DEPTH + 1)),
    );
    assert_eq!(taken.offset, 1, "the refused UID was not remembered");
    Ok(())
}

/// C12: a value over `max_record_bytes` is refused with its own error and
/// nothing is stored; one just under fits.
pub fn c12_oversized_value_is_refused(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.topic("t");
    ctx.provision([TopicSpec::new(topic.clone(), 1).with_max_record_bytes(1_000)]);
    let fits = json!({ "p": "x".repeat(900) });
    let over = json!({ "p": "x".repeat(1_001) });
    assert_err!(
        ctx.bus().publish(&topic, "k", &over),
        BusError::TooLarge { limit: 1_000, ref topic, .. } if topic.ends_with("-t")
    );
    assert_err!(
        ctx.bus().publish_idempotent(&topic, "k", &over, "u"),
        BusError::TooLarge { .. }
    );
    assert!(fetch_all(ctx.bus(), &topic, 0, 0).is_empty());
    let ack = ok("publish fits", ctx.bus().publish(&topic, "k", &fits));
    assert_eq!(ack.offset, 0);
    // The refused UID was not remembered.
    let small = ok(
        "publish",
        ctx.bus().publish_idempotent(&topic, "k", &json!(1), "u"),
    );
    assert_eq!(small.offset, 1);
    Ok(())
}

/// C12: the default 1 MiB limit holds.
pub fn c12_default_limit_is_one_mib(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 1);
    let over = json!("x".repeat(1024 * 1024));
    assert_err!(
        ctx.bus().publish(&topic, "k", &over),
        BusError::TooLarge {
            limit: 1_048_576,
            ..
        }
    );
    let big = json!("y".repeat(512 * 1024));
    let ack = ok("publish 512 KiB", ctx.bus().publish(&topic, "k", &big));
    assert_eq!(
        ok("fetch", ctx.bus().fetch(&topic, 0, ack.offset, 1))[0].value,
        big
    );
    // Exactly the limit fits on every backend: a broker's own message limit
    // must leave room for it and the record's headers.
    let exact = json!("z".repeat(1024 * 1024 - 2));
    let ack = ok(
        "publish exactly 1 MiB",
        ctx.bus().publish(&topic, "k", &exact),
    );
    assert_eq!(
        ok("fetch", ctx.bus().fetch(&topic, 0, ack.offset, 1))[0].value,
        exact
    );
    Ok(())
}

fn round_trip_or_invalid(bus: &dyn EventBus, topic: &str, key: &str) {
    match bus.publish(topic, key, &json!({"key": key})) {
        Ok(ack) => {
            assert_eq!(ack.partition, partition_for(key, 2));
            let got = ok("fetch", bus.fetch(topic, ack.partition, ack.offset, 1));
            assert_eq!(got[0].key, key, "key must round-trip exactly");
        }
        Err(BusError::InvalidArgument { .. }) => {}
        Err(other) => {
            panic!("key {key:?}: expected a round trip or InvalidArgument, got {other:?}")
        }
    }
}

/// C12: odd keys either round-trip exactly or fail as invalid arguments;
/// never a panic or a partial record.
pub fn c12_odd_keys(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 2);
    let bus = ctx.bus();
    let ack = ok("empty key", bus.publish(&topic, "", &json!(1)));
    assert_eq!(
        ok("fetch", bus.fetch(&topic, ack.partition, ack.offset, 1))[0].key,
        ""
    );
    for key in [
        "with space",
        "ünïcödé-🔑",
        "a.b.c",
        "*",
        ">",
        "with\0nul",
        "line\nbreak",
        "tab\tkey",
        "quote\"back\\slash",
        &"k".repeat(1024),
        &"k".repeat(100_000),
    ] {
        round_trip_or_invalid(bus, &topic, key);
    }
    let before: usize = (0..2).map(|p| fetch_all(bus, &topic, p, 0).len()).sum();
    assert!(before >= 6);
    Ok(())
}

/// C12: odd UIDs either work or fail as invalid arguments.
pub fn c12_odd_uids(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 1);
    for uid in [
        "a.b",
        "*",
        ">",
        "with space",
        "ü-🔑",
        "nul\0",
        &"u".repeat(2_000),
    ] {
        match ctx
            .bus()
            .publish_idempotent(&topic, "k", &json!({ "uid": uid }), uid)
        {
            Ok(ack) => {
                let again = ok(
                    "retry",
                    ctx.bus().publish_idempotent(&topic, "k", &json!(0), uid),
                );
                assert_eq!(again, ack, "uid {uid:?} must deduplicate");
                assert_eq!(
                    ok("find", ctx.bus().find_event_by_uid(&topic, "k", uid)),
                    Some(ack)
                );
            }
            Err(BusError::InvalidArgument { .. }) => {}
            Err(other) => panic!("uid {uid:?}: {other:?}"),
        }
    }
    Ok(())
}

/// C13: errors name what they are about and never carry the control key.
pub fn c13_errors_name_the_subject_and_hide_secrets(ctx: &mut Ctx) -> CaseResult {
    let key = [0x5a; 32];
    ctx.set_control_key(key);
    let topic = ctx.simple_topic("t", 2);
    let ghost = ctx.topic("ghost");
    let errors = [
        ctx.bus().publish(&ghost, "k", &json!(1)).err(),
        ctx.bus().fetch(&topic, 9, 0, 1).err(),
        ctx.bus()
            .publish_idempotent(&topic, "k", &json!({"metadata": {"uid": "a"}}), "b")
            .err(),
    ];
    let [Some(unknown), Some(partition), Some(mismatch)] = errors else {
        panic!("expected three errors, got {errors:?}");
    };
    assert!(unknown.to_string().contains(&ghost), "{unknown}");
    let text = partition.to_string();
    assert!(text.contains(&topic) && text.contains('9'), "{text}");
    assert!(mismatch.to_string().contains("uid"), "{mismatch}");
    let secret_hex = "5a5a5a5a";
    for error in [unknown, partition, mismatch] {
        let shown = format!("{error} {error:?}").to_lowercase();
        assert!(
            !shown.contains(secret_hex) && !shown.contains("90, 90, 90"),
            "{shown}"
        );
    }
    Ok(())
}
