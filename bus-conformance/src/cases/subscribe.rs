//! C17–C19 live subscriptions.

use std::time::{Duration, Instant};

use bus_core::auth::{RecordAuth, RecordParts};
use bus_core::{
    BusError, EventBus, Selector, StartAt, StoredEvent, SubscribeOptions, Subscription,
    SubscriptionItem, TopicSpec, now_ms,
};
use serde_json::json;

use crate::util::{key_for_partition, ok, poll_until, publish_n};
use crate::{CaseResult, Ctx, RawRecord};

/// Longest wait for one item (network backends included).
pub(super) const ITEM_WAIT: Duration = Duration::from_secs(15);
/// How long "nothing more arrives" is watched for.
pub(super) const QUIET: Duration = Duration::from_millis(300);

pub(super) fn subscribe(
    bus: &dyn EventBus,
    topic: &str,
    selector: Selector,
    start: StartAt,
    options: SubscribeOptions,
) -> Subscription {
    ok("subscribe", bus.subscribe(topic, selector, start, options))
}

/// The next item, within [`ITEM_WAIT`].
pub(super) fn next_item(sub: &mut Subscription, what: &str) -> Result<SubscriptionItem, BusError> {
    let deadline = Instant::now() + ITEM_WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match sub.recv_timeout(left) {
            Ok(Some(item)) => return Ok(item),
            Ok(None) if Instant::now() < deadline => {}
            Ok(None) => panic!("no item within {ITEM_WAIT:?} waiting for {what}"),
            Err(error) => return Err(error),
        }
    }
}

/// The next item, which must be a record.
pub(super) fn next_event(sub: &mut Subscription, what: &str) -> StoredEvent {
    match next_item(sub, what) {
        Ok(SubscriptionItem::Record { event, .. }) => event,
        other => panic!("{what}: expected a record, got {other:?}"),
    }
}

/// Asserts nothing arrives for [`QUIET`].
pub(super) fn assert_quiet(sub: &mut Subscription, what: &str) {
    match sub.recv_timeout(QUIET) {
        Ok(None) => {}
        other => panic!("{what}: expected nothing, got {other:?}"),
    }
}

pub(super) fn n_of(event: &StoredEvent) -> u64 {
    event.value["n"]
        .as_u64()
        .unwrap_or_else(|| panic!("no n in {event:?}"))
}

/// C17: a key subscription delivers only that key's records (the reference's
/// per-stream subscription), history and live alike.
pub fn c17_key_subscriber_sees_only_its_key(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 2);
    let mine = key_for_partition("mine", 0, 2);
    let other_same_partition = key_for_partition("other", 0, 2);
    let other_partition = key_for_partition("far", 1, 2);
    let bus = ctx.bus();
    ok(
        "publish",
        bus.publish(&topic, &other_same_partition, &json!({"n": 100})),
    );
    ok("publish", bus.publish(&topic, &mine, &json!({"n": 0})));
    let mut sub = subscribe(
        bus,
        &topic,
        Selector::Key(mine.clone()),
        StartAt::Beginning,
        SubscribeOptions::default(),
    );
    let first = next_event(&mut sub, "history of the key");
    assert_eq!((first.key.as_str(), n_of(&first)), (mine.as_str(), 0));
    for (key, n) in [
        (&other_partition, 101),
        (&other_same_partition, 102),
        (&mine, 1),
    ] {
        ok("publish", bus.publish(&topic, key, &json!({ "n": n })));
    }
    let live = next_event(&mut sub, "live record of the key");
    assert_eq!((live.key.as_str(), n_of(&live)), (mine.as_str(), 1));
    assert_quiet(&mut sub, "other keys must not be delivered");
    Ok(())
}

/// C17: a topic subscription sees every key of every partition, each
/// partition in offset order.
pub fn c17_topic_subscriber_sees_every_partition_in_order(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 3);
    let keys: Vec<String> = (0..3).map(|p| key_for_partition("k", p, 3)).collect();
    let bus = ctx.bus();
    let mut sub = subscribe(
        bus,
        &topic,
        Selector::Topic,
        StartAt::Beginning,
        SubscribeOptions::default(),
    );
    for round in 0..4u64 {
        for key in &keys {
            ok("publish", bus.publish(&topic, key, &json!({ "n": round })));
        }
    }
    let mut seen: Vec<Vec<u64>> = vec![Vec::new(); 3];
    for _ in 0..12 {
        let event = next_event(&mut sub, "records of every partition");
        assert_eq!(event.key, keys[event.partition as usize]);
        seen[event.partition as usize].push(event.offset);
    }
    for (partition, offsets) in seen.iter().enumerate() {
        assert_eq!(
            offsets,
            &vec![0, 1, 2, 3],
            "partition {partition} in order, once"
        );
    }
    assert_quiet(&mut sub, "nothing beyond what was published");
    Ok(())
}

/// C17: records published while the history is being read appear once, in
/// order: no gap and no duplicate at the seam between history and live tail.
pub fn c17_history_then_live_has_no_gap_or_duplicate(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 1);
    const BEFORE: u64 = 300;
    const DURING: u64 = 300;
    for n in 0..BEFORE {
        ok(
            "publish",
            ctx.bus().publish(&topic, "k", &json!({ "n": n })),
        );
    }
    let bus = ctx.bus();
    let mut sub = subscribe(
        bus,
        &topic,
        Selector::Partition(0),
        StartAt::Beginning,
        SubscribeOptions::default(),
    );
    std::thread::scope(|scope| {
        let publisher = scope.spawn(|| {
            for n in BEFORE..BEFORE + DURING {
                ok("publish", bus.publish(&topic, "k", &json!({ "n": n })));
            }
        });
        for expected in 0..BEFORE + DURING {
            let event = next_event(&mut sub, "history then live");
            assert_eq!(event.offset, expected, "offsets once, in order");
            assert_eq!(n_of(&event), expected);
        }
        publisher.join().expect("publisher thread");
    });
    assert_quiet(&mut sub, "no duplicate after the seam");
    Ok(())
}

/// C17: start "now" delivers every record acked after `subscribe` returned
/// and none acked before; an offset start and a time start begin where they
/// say.
pub fn c17_start_positions(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 1);
    let bus = ctx.bus();
    publish_n(bus, &topic, "k", 3);
    let mut now = subscribe(
        bus,
        &topic,
        Selector::Partition(0),
        StartAt::Now,
        SubscribeOptions::default(),
    );
    let mut at_offset = subscribe(
        bus,
        &topic,
        Selector::Key("k".to_owned()),
        StartAt::Offset(2),
        SubscribeOptions::default(),
    );
    // stored_at has millisecond resolution: step past the last stored_at.
    let last = ok("fetch", bus.fetch(&topic, 0, 2, 1));
    let mut cutoff = last[0].stored_at + 1;
    while now_ms() < cutoff {
        std::thread::yield_now();
    }
    ok("publish", bus.publish(&topic, "k", &json!({"n": 3})));
    let fourth = ok("fetch", bus.fetch(&topic, 0, 3, 1));
    cutoff = fourth[0].stored_at;
    ok("publish", bus.publish(&topic, "k", &json!({"n": 4})));
    let mut by_time = subscribe(
        bus,
        &topic,
        Selector::Topic,
        StartAt::Time(cutoff),
        SubscribeOptions::default(),
    );
    assert_eq!(next_event(&mut now, "first record after now").offset, 3);
    assert_eq!(next_event(&mut now, "second record after now").offset, 4);
    assert_quiet(&mut now, "nothing acked before subscribe");
    let offsets: Vec<u64> = (0..3)
        .map(|_| next_event(&mut at_offset, "from offset 2").offset)
        .collect();
    assert_eq!(offsets, vec![2, 3, 4]);
    assert_eq!(
        next_event(&mut by_time, "first record at or after the time").offset,
        3,
        "the first record with stored_at >= the time"
    );
    Ok(())
}

/// C17: subscribing to an unknown topic or partition is that error; an
/// offset start with a whole-topic selector is an argument error.
pub fn c17_subscribe_errors(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 2);
    let unknown = ctx.topic("never-provisioned");
    let bus = ctx.bus();
    let options = SubscribeOptions::default;
    crate::assert_err!(
        bus.subscribe(&unknown, Selector::Topic, StartAt::Beginning, options()),
        BusError::UnknownTopic(_)
    );
    crate::assert_err!(
        bus.subscribe(
            &topic,
            Selector::Partition(2),
            StartAt::Beginning,
            options()
        ),
        BusError::UnknownPartition { partition: 2, .. }
    );
    crate::assert_err!(
        bus.subscribe(&topic, Selector::Topic, StartAt::Offset(0), options()),
        BusError::InvalidArgument { .. }
    );
    assert!(
        !bus.topics().contains(&unknown),
        "subscribing must not create the topic"
    );
    Ok(())
}

/// C17: dropping one subscription, under pressure, disturbs no other.
pub fn c17_drop_disturbs_no_other(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 1);
    let bus = ctx.bus();
    let open = || {
        subscribe(
            bus,
            &topic,
            Selector::Topic,
            StartAt::Now,
            SubscribeOptions::default().max_lag(4),
        )
    };
    let mut staying = open();
    let leaving = open();
    ok("publish", bus.publish(&topic, "k", &json!({"n": 1})));
    drop(leaving);
    ok("publish", bus.publish(&topic, "k", &json!({"n": 2})));
    assert_eq!(n_of(&next_event(&mut staying, "first")), 1);
    assert_eq!(n_of(&next_event(&mut staying, "second")), 2);
    let mut later = open();
    ok("publish", bus.publish(&topic, "k", &json!({"n": 3})));
    assert_eq!(n_of(&next_event(&mut staying, "third")), 3);
    assert_eq!(
        n_of(&next_event(&mut later, "a new subscription still works")),
        3
    );
    Ok(())
}

/// C18: 10 records published into `max_lag = 4` before the first read:
/// `Lagged(6)`, then the newest four, then the next one live.
pub fn c18_bounded_lag_reports_the_dropped_prefix_then_keeps_working(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 1);
    let bus = ctx.bus();
    let mut sub = subscribe(
        bus,
        &topic,
        Selector::Topic,
        StartAt::Now,
        SubscribeOptions::default().max_lag(4),
    );
    for n in 1..=10 {
        ok("publish", bus.publish(&topic, "k", &json!({ "n": n })));
    }
    assert_eq!(
        ok("lag", next_item(&mut sub, "the lag notice")),
        SubscriptionItem::Lagged {
            partition: 0,
            skipped: 6,
            next_offset: 6
        },
        "10 published into max_lag 4 must report exactly the 6 skipped"
    );
    for n in 7..=10 {
        assert_eq!(n_of(&next_event(&mut sub, "the surviving window")), n);
    }
    ok("publish", bus.publish(&topic, "k", &json!({"n": 11})));
    assert_eq!(
        n_of(&next_event(&mut sub, "a subscription survives its lag")),
        11
    );
    Ok(())
}

/// C18: a subscriber that keeps up is never told it lagged.
pub fn c18_subscriber_that_keeps_up_never_lags(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 1);
    let bus = ctx.bus();
    let mut sub = subscribe(
        bus,
        &topic,
        Selector::Topic,
        StartAt::Now,
        SubscribeOptions::default().max_lag(4),
    );
    for n in 1..=64 {
        ok("publish", bus.publish(&topic, "k", &json!({ "n": n })));
        assert_eq!(n_of(&next_event(&mut sub, "each record in turn")), n);
    }
    Ok(())
}

/// C18: 64 subscribers fall behind identically; each reports its own loss
/// and recovers (no shared cursor).
pub fn c18_many_subscribers_lag_independently(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 1);
    let bus = ctx.bus();
    let mut subs: Vec<Subscription> = (0..64)
        .map(|_| {
            subscribe(
                bus,
                &topic,
                Selector::Topic,
                StartAt::Now,
                SubscribeOptions::default().max_lag(4),
            )
        })
        .collect();
    for n in 1..=11 {
        ok("publish", bus.publish(&topic, "k", &json!({ "n": n })));
    }
    for (i, sub) in subs.iter_mut().enumerate() {
        assert_eq!(
            ok("lag", next_item(sub, "lag notice")),
            SubscriptionItem::Lagged {
                partition: 0,
                skipped: 7,
                next_offset: 7
            },
            "subscriber {i} reports its own loss"
        );
        for n in 8..=11 {
            assert_eq!(n_of(&next_event(sub, "window")), n, "subscriber {i}");
        }
    }
    Ok(())
}

/// C18: without a bound, a slow subscriber loses only what retention expired
/// before it read it, is told exactly how many, and continues at the log
/// start.
pub fn c18_retention_overtaking_a_slow_subscriber_is_reported(ctx: &mut Ctx) -> CaseResult {
    ctx.require(
        ctx.caps().maintenance_retention,
        "retention is not run by maintenance",
    )?;
    let topic = ctx.topic("t");
    ctx.provision([TopicSpec::new(topic.clone(), 1).with_retention_ms(1_000)]);
    let bus = ctx.bus();
    let mut sub = subscribe(
        bus,
        &topic,
        Selector::Topic,
        StartAt::Beginning,
        SubscribeOptions::default(),
    );
    publish_n(bus, &topic, "k", 5);
    let expired = ok("maintenance", bus.maintenance(now_ms() + 60_000));
    assert_eq!(expired, 5);
    ok("publish", bus.publish(&topic, "k", &json!({"n": 5})));
    assert_eq!(
        ok("lag", next_item(&mut sub, "the retention lag")),
        SubscriptionItem::Lagged {
            partition: 0,
            skipped: 5,
            next_offset: 5
        },
        "records 0..=4 expired unread"
    );
    assert_eq!(next_event(&mut sub, "continues after the lag").offset, 5);
    Ok(())
}

/// C18 on a broker's own retention (NATS `max_age`, Kafka `retention.ms`):
/// a subscriber that has not called `recv` while retention expired the
/// records it had not yet been given either gets them (its feed had already
/// read them) or one `Lagged` that counts exactly the ones it lost; every
/// offset is accounted for once, in order, and it goes on with the next
/// record.
pub fn c18_native_retention_under_a_subscription_is_accounted_exactly(ctx: &mut Ctx) -> CaseResult {
    ctx.require(
        ctx.caps().native_retention,
        "the backend has no native retention",
    )?;
    // Records published before retention runs (`publish_n` below).
    const STORED: u64 = 5;
    let topic = ctx.topic("t");
    ctx.provision([TopicSpec::new(topic.clone(), 1).with_retention_ms(1_000)]);
    let bus = ctx.bus();
    let mut sub = subscribe(
        bus,
        &topic,
        Selector::Partition(0),
        StartAt::Beginning,
        SubscribeOptions::default(),
    );
    publish_n(bus, &topic, "k", 5);
    poll_until(
        "native retention to expire the records",
        Duration::from_secs(90),
        || {
            let _ = bus.maintenance(now_ms());
            bus.fetch(&topic, 0, 0, 10)
                .is_ok_and(|events| events.is_empty())
                .then_some(())
        },
    );
    ok("publish", bus.publish(&topic, "k", &json!({"n": STORED})));
    // Offsets 0..STORED were either delivered or counted as skipped.
    let mut next = 0;
    while next <= STORED {
        match ok("an item", next_item(&mut sub, "the records or their lag")) {
            SubscriptionItem::Record { event, .. } => {
                assert_eq!(event.offset, next, "a record out of order or twice");
                next += 1;
            }
            SubscriptionItem::Lagged {
                partition,
                skipped,
                next_offset,
            } => {
                assert_eq!(partition, 0);
                assert_eq!(
                    next_offset,
                    next + skipped,
                    "a lag notice that miscounts what it skipped"
                );
                assert!(
                    next_offset <= STORED,
                    "lag past the live record: {next_offset}"
                );
                next = next_offset;
            }
        }
    }
    assert_quiet(&mut sub, "after the live record");
    Ok(())
}

/// C19: a forged record is an `Integrity` error item naming its offset, and
/// the subscription goes on after it.
pub fn c19_forged_record_is_an_error_item_then_goes_on(ctx: &mut Ctx) -> CaseResult {
    const KEY: [u8; 32] = [7; 32];
    ctx.set_control_key(KEY);
    let topic = ctx.simple_topic("t", 1);
    ok("publish", ctx.bus().publish(&topic, "k", &json!({"n": 0})));
    let value = br#"{"n":1}"#.to_vec();
    let wrong_tag = RecordAuth::new(&[9; 32])
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
            tag: Some(wrong_tag),
            ..Default::default()
        },
    )?;
    ok("publish", ctx.bus().publish(&topic, "k", &json!({"n": 2})));
    let bus = ctx.bus();
    let mut sub = subscribe(
        bus,
        &topic,
        Selector::Key("k".to_owned()),
        StartAt::Beginning,
        SubscribeOptions::default(),
    );
    assert_eq!(next_event(&mut sub, "authentic record").offset, 0);
    match next_item(&mut sub, "the forged record") {
        Err(BusError::Integrity { offset: 1, .. }) => {}
        other => panic!("expected Integrity at offset 1, got {other:?}"),
    }
    assert_eq!(next_event(&mut sub, "after the forgery").offset, 2);
    ok("publish", bus.publish(&topic, "k", &json!({"n": 3})));
    assert_eq!(next_event(&mut sub, "live after the forgery").offset, 3);
    Ok(())
}

/// C17: an idle subscription's wait returns within its timeout and delivers
/// a record published later without a poll by the caller in between.
pub fn c17_idle_wait_returns_in_time_and_wakes_on_publish(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 1);
    let bus = ctx.bus();
    let mut sub = subscribe(
        bus,
        &topic,
        Selector::Partition(0),
        StartAt::Now,
        SubscribeOptions::default(),
    );
    let started = Instant::now();
    assert!(ok("idle wait", sub.recv_timeout(Duration::from_millis(200))).is_none());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "recv_timeout(200 ms) must come back, took {:?}",
        started.elapsed()
    );
    std::thread::scope(|scope| {
        let waiter = scope.spawn(|| next_event(&mut sub, "woken by a publish"));
        ok("publish", bus.publish(&topic, "k", &json!({"n": 0})));
        assert_eq!(waiter.join().expect("waiter").offset, 0);
    });
    Ok(())
}
