//! C17/C18, round 2: delivery positions and resuming from them, starts past
//! the head or in the future, options no subscription can honour, and the
//! end of a subscription with its bus.

use std::time::Duration;

use bus_core::{BusError, Selector, StartAt, SubscribeOptions, now_ms};
use serde_json::json;

use super::subscribe::{ITEM_WAIT, assert_quiet, n_of, next_event, subscribe};
use crate::util::{key_for_partition, ok, publish_n};
use crate::{CaseResult, Ctx};

/// C17: `positions()` is the next offset not yet handed to the caller (not
/// how far the subscription read ahead), and a checkpoint of it resumes
/// with no gap and no duplicate.
pub fn c17_positions_are_where_delivery_continues(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 1);
    let bus = ctx.bus();
    publish_n(bus, &topic, "k", 100);
    let mut sub = subscribe(
        bus,
        &topic,
        Selector::Partition(0),
        StartAt::Beginning,
        SubscribeOptions::default(),
    );
    assert_eq!(sub.positions(), vec![(0, 0)], "nothing delivered yet");
    assert_eq!(next_event(&mut sub, "the first record").offset, 0);
    assert_eq!(
        sub.positions(),
        vec![(0, 1)],
        "one record delivered: delivery continues at offset 1"
    );
    for offset in 1..10 {
        assert_eq!(next_event(&mut sub, "the next record").offset, offset);
    }
    let checkpoint = sub.positions();
    assert_eq!(checkpoint, vec![(0, 10)]);
    drop(sub);
    let mut resumed = subscribe(
        bus,
        &topic,
        Selector::Partition(0),
        StartAt::Positions(checkpoint),
        SubscribeOptions::default(),
    );
    for offset in 10..100 {
        assert_eq!(
            next_event(&mut resumed, "the records after the checkpoint").offset,
            offset,
            "resumed with no gap and no duplicate"
        );
    }
    assert_quiet(&mut resumed, "nothing beyond what was published");
    Ok(())
}

/// C17: a whole-topic subscription resumes from per-partition positions,
/// keeping its merged view; a partition the positions omit starts at its
/// oldest record.
pub fn c17_topic_subscription_resumes_from_positions(ctx: &mut Ctx) -> CaseResult {
    const PARTITIONS: u32 = 3;
    let topic = ctx.simple_topic("t", PARTITIONS);
    let keys: Vec<String> = (0..PARTITIONS)
        .map(|p| key_for_partition("k", p, PARTITIONS))
        .collect();
    let bus = ctx.bus();
    let mut sent = vec![0u64; PARTITIONS as usize];
    let mut publish_round = |bus: &dyn bus_core::EventBus| {
        for (partition, key) in keys.iter().enumerate() {
            let n = sent[partition];
            ok("publish", bus.publish(&topic, key, &json!({ "n": n })));
            sent[partition] += 1;
        }
    };
    for _ in 0..5 {
        publish_round(bus);
    }
    let mut sub = subscribe(
        bus,
        &topic,
        Selector::Topic,
        StartAt::Beginning,
        SubscribeOptions::default(),
    );
    let mut seen: Vec<Vec<u64>> = vec![Vec::new(); PARTITIONS as usize];
    for _ in 0..7 {
        let event = next_event(&mut sub, "part of the history");
        seen[event.partition as usize].push(event.offset);
    }
    let checkpoint = sub.positions();
    for &(partition, next) in &checkpoint {
        assert_eq!(
            next,
            seen[partition as usize].len() as u64,
            "partition {partition}: the position is what was delivered"
        );
    }
    drop(sub);
    for _ in 0..2 {
        publish_round(bus);
    }
    let mut resumed = subscribe(
        bus,
        &topic,
        Selector::Topic,
        StartAt::Positions(checkpoint),
        SubscribeOptions::default(),
    );
    for _ in 7..21 {
        let event = next_event(&mut resumed, "the rest after the checkpoint");
        assert_eq!(n_of(&event), event.offset);
        seen[event.partition as usize].push(event.offset);
    }
    for (partition, offsets) in seen.iter().enumerate() {
        assert_eq!(
            offsets,
            &(0..7).collect::<Vec<u64>>(),
            "partition {partition}: every record once, in order, across the resume"
        );
    }
    assert_quiet(&mut resumed, "nothing twice");
    // A partition the positions leave out starts at its oldest record.
    let mut partial = subscribe(
        bus,
        &topic,
        Selector::Topic,
        StartAt::Positions(vec![(0, 7), (1, 7)]),
        SubscribeOptions::default(),
    );
    let first = next_event(&mut partial, "the omitted partition from its start");
    assert_eq!((first.partition, first.offset), (2, 0));
    Ok(())
}

/// C17: a start past a partition's head is an argument error naming the
/// head (never a subscription that silently misses what comes next);
/// positions must name the selector's partitions once each. A start at the
/// head itself is the next record.
pub fn c17_start_past_the_head_is_an_error_naming_it(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 2);
    let key = key_for_partition("k", 0, 2);
    let bus = ctx.bus();
    publish_n(bus, &topic, &key, 10);
    let options = SubscribeOptions::default;
    match bus.subscribe(
        &topic,
        Selector::Partition(0),
        StartAt::Offset(1000),
        options(),
    ) {
        Err(BusError::InvalidArgument { field, reason }) => {
            assert_eq!(field, "start");
            assert!(
                reason.contains("1000") && reason.contains("next offset is 10"),
                "names the offset and the head: {reason}"
            );
        }
        other => panic!("offset past the head: expected InvalidArgument, got {other:?}"),
    }
    for (selector, positions) in [
        (Selector::Topic, vec![(0, 11)]),
        (Selector::Topic, vec![(5, 0)]),
        (Selector::Topic, vec![(0, 1), (0, 2)]),
        (Selector::Partition(0), vec![(1, 0)]),
        (Selector::Key(key.clone()), vec![(1, 0)]),
    ] {
        crate::assert_err!(
            bus.subscribe(
                &topic,
                selector.clone(),
                StartAt::Positions(positions.clone()),
                options()
            ),
            BusError::InvalidArgument { .. }
        );
    }
    let mut at_head = subscribe(
        bus,
        &topic,
        Selector::Partition(0),
        StartAt::Offset(10),
        options(),
    );
    for n in 10..15 {
        ok("publish", bus.publish(&topic, &key, &json!({ "n": n })));
    }
    for offset in 10..15 {
        assert_eq!(
            next_event(&mut at_head, "records published after a start at the head").offset,
            offset
        );
    }
    Ok(())
}

/// C17: a start time in the future delivers only records stored at or
/// after it, not the ones published while waiting for it.
pub fn c17_start_time_in_the_future_delivers_only_later_records(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 1);
    let bus = ctx.bus();
    ok("publish", bus.publish(&topic, "k", &json!({"n": 0})));
    let time = now_ms() + 1_000;
    let mut sub = subscribe(
        bus,
        &topic,
        Selector::Topic,
        StartAt::Time(time),
        SubscribeOptions::default(),
    );
    ok("publish", bus.publish(&topic, "k", &json!({"n": 1})));
    // Watch the subscription while the clock gets there: nothing stored
    // before the time may come out.
    while now_ms() <= time {
        let left = Duration::from_millis(time.saturating_sub(now_ms()) + 1);
        match sub.recv_timeout(left) {
            Ok(None) => {}
            other => panic!("before the start time: expected nothing, got {other:?}"),
        }
    }
    ok("publish", bus.publish(&topic, "k", &json!({"n": 2})));
    let first = next_event(&mut sub, "the first record stored after the time");
    assert_eq!(
        n_of(&first),
        2,
        "records stored before the time are not delivered"
    );
    assert!(first.stored_at >= time);
    assert_eq!(
        sub.positions(),
        vec![(0, 3)],
        "the records passed over count as behind the subscriber"
    );
    assert_quiet(&mut sub, "nothing else");
    Ok(())
}

/// C18: `max_lag(0)` would skip every record: an argument error naming it.
pub fn c18_max_lag_zero_is_an_invalid_argument(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 1);
    let bus = ctx.bus();
    crate::assert_err!(
        bus.subscribe(
            &topic,
            Selector::Topic,
            StartAt::Beginning,
            SubscribeOptions::default().max_lag(0)
        ),
        BusError::InvalidArgument { ref field, .. } if field == "max_lag"
    );
    // One is the smallest bound, and it works.
    let mut sub = subscribe(
        bus,
        &topic,
        Selector::Topic,
        StartAt::Now,
        SubscribeOptions::default().max_lag(1),
    );
    ok("publish", bus.publish(&topic, "k", &json!({"n": 0})));
    assert_eq!(n_of(&next_event(&mut sub, "a record within max_lag 1")), 0);
    Ok(())
}

/// C18: a key subscription counts its lag in its own key's records: other
/// keys sharing its partition never make it skip, and when its own records
/// overflow the bound, `Lagged` counts only those.
pub fn c18_key_subscription_counts_lag_in_its_own_records(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 1);
    let bus = ctx.bus();
    let mut sub = subscribe(
        bus,
        &topic,
        Selector::Key("mine".to_owned()),
        StartAt::Now,
        SubscribeOptions::default().max_lag(4),
    );
    let mut mine = Vec::new();
    let mut publish = |key: &str, n: u64| {
        let ack = ok("publish", bus.publish(&topic, key, &json!({ "n": n })));
        if key == "mine" {
            mine.push(ack.offset);
        }
    };
    // Three of its own among sixty others: behind by 3, within the bound.
    for n in 0..60 {
        publish("other", 100 + n);
        if n % 20 == 19 {
            publish("mine", n / 20);
        }
    }
    for n in 0..3 {
        let event = next_event(&mut sub, "the key's records, none skipped");
        assert_eq!((event.key.as_str(), n_of(&event)), ("mine", n));
    }
    // Ten more of its own, interleaved: six over the bound of four.
    for n in 3..13 {
        publish("other", 200 + n);
        publish("mine", n);
    }
    match super::subscribe::next_item(&mut sub, "the lag notice") {
        Ok(bus_core::SubscriptionItem::Lagged {
            skipped,
            next_offset,
            ..
        }) => {
            assert_eq!(skipped, 6, "counts the key's own records only");
            assert_eq!(next_offset, mine[9], "goes on at the 7th of the ten");
        }
        other => panic!("expected Lagged, got {other:?}"),
    }
    for n in 9..13 {
        assert_eq!(n_of(&next_event(&mut sub, "the newest four")), n);
    }
    assert_quiet(&mut sub, "nothing else");
    Ok(())
}

/// C17: a subscription ends (`None`, closed) when the bus it came from is
/// dropped, instead of waiting forever.
pub fn c17_subscription_ends_when_its_bus_is_dropped(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 1);
    let mut sub = subscribe(
        ctx.bus(),
        &topic,
        Selector::Topic,
        StartAt::Now,
        SubscribeOptions::default(),
    );
    // Drops the bus (and opens another on the same storage).
    ctx.reopen()?;
    let started = std::time::Instant::now();
    match sub.recv_timeout(ITEM_WAIT) {
        Ok(None) => {}
        other => panic!("after the bus was dropped: expected the end, got {other:?}"),
    }
    assert!(
        started.elapsed() < ITEM_WAIT,
        "the subscription must end, not wait out its timeout"
    );
    assert!(sub.is_closed());
    assert!(sub.recv().is_none(), "recv() ends too");
    Ok(())
}
