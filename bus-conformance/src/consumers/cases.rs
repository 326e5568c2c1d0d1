//! The durable-consumer cases, named by rule (C20–C23).
#![allow(clippy::unwrap_used, clippy::missing_panics_doc, missing_docs)]

use std::time::{Duration, Instant};

use bus_core::consumer::{ConsumeOptions, Consumer, Delivery, OwnerPolicy};
use bus_core::{BusError, EventBus, Manifest, Selector, StartAt, TopicSpec, partition_for};
use serde_json::json;

use super::{ConsumerBus, ConsumerCtx};

const WAIT: Duration = Duration::from_secs(10);

fn open(
    bus: &dyn ConsumerBus,
    topic: &str,
    name: &str,
    start: StartAt,
    options: ConsumeOptions,
) -> Consumer {
    match bus.consume(topic, name, Selector::Topic, start, options) {
        Ok(consumer) => consumer,
        Err(error) => panic!("consume {topic}/{name} failed: {error}"),
    }
}

/// Exactly `n` deliveries, each within [`WAIT`].
fn take(consumer: &mut Consumer, n: usize) -> Vec<Delivery> {
    (0..n)
        .map(|i| match consumer.recv_timeout(WAIT) {
            Ok(Some(delivery)) => delivery,
            other => panic!("delivery {i} of {n}: {other:?}"),
        })
        .collect()
}

/// Nothing more is waiting now.
fn assert_idle(consumer: &mut Consumer) {
    let more = consumer.try_recv().unwrap();
    assert!(more.is_none(), "unexpected delivery {more:?}");
}

fn publish_n(bus: &dyn EventBus, topic: &str, n: u64) {
    for i in 0..n {
        bus.publish(topic, &format!("k{i}"), &json!({"n": i}))
            .unwrap();
    }
}

fn numbers(deliveries: &[Delivery]) -> Vec<u64> {
    let mut out: Vec<u64> = deliveries
        .iter()
        .map(|d| d.event.value["n"].as_u64().unwrap())
        .collect();
    out.sort_unstable();
    out
}

fn dead_letter_topic(ctx: &ConsumerCtx) -> String {
    ctx.simple_topic("dlq", 1)
}

pub fn c20_new_consumer_starts_at_start_if_new(ctx: &mut ConsumerCtx) {
    let topic = ctx.simple_topic("start", 2);
    publish_n(ctx.bus(), &topic, 3);
    let mut from_start = open(
        ctx.bus(),
        &topic,
        "a",
        StartAt::Beginning,
        ConsumeOptions::default(),
    );
    let mut from_now = open(
        ctx.bus(),
        &topic,
        "b",
        StartAt::Now,
        ConsumeOptions::default(),
    );
    assert_eq!(numbers(&take(&mut from_start, 3)), vec![0, 1, 2]);
    assert_idle(&mut from_start);
    assert_idle(&mut from_now);
    ctx.bus().publish(&topic, "late", &json!({"n": 9})).unwrap();
    let late = take(&mut from_now, 1);
    assert_eq!(late[0].event.value["n"], 9);
    assert_eq!(late[0].delivery_count, 1);
    assert_eq!(late[0].consumer(), "b");
}

pub fn c20_restart_continues_after_the_acked_offset_per_partition(ctx: &mut ConsumerCtx) {
    let topic = ctx.simple_topic("restart", 2);
    publish_n(ctx.bus(), &topic, 20);
    let mut consumer = open(
        ctx.bus(),
        &topic,
        "r",
        StartAt::Beginning,
        ConsumeOptions::default(),
    );
    let first = take(&mut consumer, 20);
    // Partition 0: everything; partition 1: through its third record.
    let p1: Vec<&Delivery> = first.iter().filter(|d| d.partition == 1).collect();
    for d in first.iter().filter(|d| d.partition == 0) {
        consumer.ack(d).unwrap();
    }
    consumer.ack_through(1, p1[2].offset).unwrap();
    let expected: Vec<u64> = p1[3..]
        .iter()
        .map(|d| d.event.value["n"].as_u64().unwrap())
        .collect();
    drop(consumer);
    ctx.reopen();
    // start_if_new is ignored for an existing consumer.
    let mut again = open(
        ctx.bus(),
        &ctx.topic("restart"),
        "r",
        StartAt::Now,
        ConsumeOptions::default(),
    );
    let redelivered = take(&mut again, expected.len());
    let mut want = expected.clone();
    want.sort_unstable();
    assert_eq!(numbers(&redelivered), want);
    assert!(
        redelivered
            .iter()
            .all(|d| d.partition == 1 && d.delivery_count == 2)
    );
    assert_idle(&mut again);
}

pub fn c20_key_consumer_resumes_past_other_keys(ctx: &mut ConsumerCtx) {
    let topic = ctx.simple_topic("keyed", 2);
    let mine = "agent-1";
    let partition = partition_for(mine, 2);
    let other = (0..)
        .map(|i| format!("other-{i}"))
        .find(|k| partition_for(k, 2) == partition)
        .unwrap();
    for n in 0..6 {
        let key = if n % 2 == 0 { mine } else { other.as_str() };
        ctx.bus().publish(&topic, key, &json!({"n": n})).unwrap();
    }
    let by_key = || {
        ctx.bus()
            .consume(
                &topic,
                "k",
                Selector::Key(mine.to_owned()),
                StartAt::Beginning,
                ConsumeOptions::default(),
            )
            .unwrap()
    };
    let mut consumer = by_key();
    let got = take(&mut consumer, 3);
    assert!(got.iter().all(|d| d.event.key == mine));
    for d in &got {
        consumer.ack(d).unwrap();
    }
    assert_idle(&mut consumer);
    drop(consumer);
    // The other key's records count as passed: the cursor is at the head.
    let info = ctx.bus().consumers(&topic).unwrap();
    assert_eq!(info[0].selector, Selector::Key(mine.to_owned()));
    assert_eq!(info[0].partitions.len(), 1);
    assert_eq!(
        (
            info[0].partitions[0].cursor,
            info[0].partitions[0].lag_records
        ),
        (6, 0)
    );
    let mut again = by_key();
    assert_idle(&mut again);
    ctx.bus().publish(&topic, mine, &json!({"n": 6})).unwrap();
    assert_eq!(take(&mut again, 1)[0].event.value["n"], 6);
}

pub fn c21_acked_records_are_never_delivered_again(ctx: &mut ConsumerCtx) {
    let topic = ctx.simple_topic("acked", 1);
    publish_n(ctx.bus(), &topic, 10);
    let mut consumer = open(
        ctx.bus(),
        &topic,
        "x",
        StartAt::Beginning,
        ConsumeOptions::default(),
    );
    let all = take(&mut consumer, 10);
    // Out of order: the odd offsets only.
    for d in all.iter().filter(|d| d.offset % 2 == 1) {
        consumer.ack(d).unwrap();
        // A second ack of the same delivery is harmless.
        consumer.ack(d).unwrap();
    }
    drop(consumer);
    ctx.reopen();
    let mut again = open(
        ctx.bus(),
        &topic,
        "x",
        StartAt::Beginning,
        ConsumeOptions::default(),
    );
    let back = take(&mut again, 5);
    let offsets: Vec<u64> = back.iter().map(|d| d.offset).collect();
    assert_eq!(offsets, vec![0, 2, 4, 6, 8]);
    for d in &back {
        again.ack(d).unwrap();
    }
    assert_idle(&mut again);
    drop(again);
    ctx.reopen();
    let mut third = open(
        ctx.bus(),
        &topic,
        "x",
        StartAt::Beginning,
        ConsumeOptions::default(),
    );
    assert_idle(&mut third);
    assert_eq!(third.cursor(), vec![(0, 10)]);
}

pub fn c21_unacked_records_come_back_after_ack_wait_with_their_count(ctx: &mut ConsumerCtx) {
    let topic = ctx.simple_topic("wait", 1);
    publish_n(ctx.bus(), &topic, 2);
    let options = ConsumeOptions::default().ack_wait(Duration::from_millis(200));
    let mut consumer = open(ctx.bus(), &topic, "w", StartAt::Beginning, options);
    let first = take(&mut consumer, 2);
    consumer.ack(&first[1]).unwrap();
    let started = Instant::now();
    let again = take(&mut consumer, 1);
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "redelivered before ack_wait"
    );
    assert_eq!((again[0].offset, again[0].delivery_count), (0, 2));
    let third = take(&mut consumer, 1);
    assert_eq!((third[0].offset, third[0].delivery_count), (0, 3));
    consumer.ack(&third[0]).unwrap();
    // An ack through an older delivery of the same record is harmless.
    consumer.ack(&first[0]).unwrap();
    assert!(
        consumer
            .recv_timeout(Duration::from_millis(400))
            .unwrap()
            .is_none()
    );
}

pub fn c21_a_crash_takes_back_only_acks_not_yet_durable(ctx: &mut ConsumerCtx) {
    let topic = ctx.simple_topic("batch", 1);
    publish_n(ctx.bus(), &topic, 6);
    let batched = || {
        ConsumeOptions::default()
            .ack_every(100)
            .owner(OwnerPolicy::TakeOver)
    };
    let mut consumer = open(ctx.bus(), &topic, "b", StartAt::Beginning, batched());
    let all = take(&mut consumer, 6);
    consumer.ack(&all[0]).unwrap();
    consumer.ack(&all[1]).unwrap();
    consumer.flush().unwrap();
    consumer.ack(&all[2]).unwrap();
    // A crash: nothing runs on the way out (its owner lock stays held).
    std::mem::forget(consumer);
    let mut after = open(ctx.bus(), &topic, "b", StartAt::Beginning, batched());
    let back = take(&mut after, 4);
    let offsets: Vec<u64> = back.iter().map(|d| d.offset).collect();
    assert_eq!(
        offsets,
        vec![2, 3, 4, 5],
        "the durable acks hold, the later one is taken back"
    );
    assert_idle(&mut after);
}

pub fn c21_ack_interval_writes_pending_acks_while_recv_waits(ctx: &mut ConsumerCtx) {
    let topic = ctx.simple_topic("interval", 1);
    publish_n(ctx.bus(), &topic, 2);
    let options = ConsumeOptions::default()
        .ack_every(1_000)
        .ack_interval(Duration::from_millis(100));
    let mut consumer = open(ctx.bus(), &topic, "i", StartAt::Beginning, options);
    let got = take(&mut consumer, 2);
    consumer.ack(&got[0]).unwrap();
    consumer.ack(&got[1]).unwrap();
    let stored = |ctx: &ConsumerCtx| ctx.bus().consumers(&topic).unwrap()[0].partitions[0].cursor;
    assert_eq!(stored(ctx), 0, "batched: not written yet");
    // The interval write happens inside the waiting recv.
    let deadline = Instant::now() + WAIT;
    while stored(ctx) != 2 {
        assert!(
            Instant::now() < deadline,
            "the interval write never happened"
        );
        assert!(
            consumer
                .recv_timeout(Duration::from_millis(50))
                .unwrap()
                .is_none()
        );
    }
}

pub fn c22_nack_dead_letters_with_metadata_then_acks(ctx: &mut ConsumerCtx) {
    let topic = ctx.simple_topic("poison", 1);
    let dlq = dead_letter_topic(ctx);
    ctx.bus()
        .publish(&topic, "bad", &json!({"n": 0, "metadata": {"uid": "u-0"}}))
        .unwrap();
    ctx.bus().publish(&topic, "good", &json!({"n": 1})).unwrap();
    let options = || ConsumeOptions::default().dead_letter(dlq.clone());
    let mut consumer = open(ctx.bus(), &topic, "d", StartAt::Beginning, options());
    let got = take(&mut consumer, 2);
    consumer.nack(&got[0], "cannot parse").unwrap();
    consumer.ack(&got[1]).unwrap();
    let letters = ctx.bus().fetch(&dlq, 0, 0, 10).unwrap();
    assert_eq!(letters.len(), 1);
    let letter = &letters[0];
    assert_eq!(letter.key, "bad");
    let meta = &letter.value["dead_letter"];
    assert_eq!(meta["topic"], json!(topic));
    assert_eq!(meta["partition"], 0);
    assert_eq!(meta["offset"], 0);
    assert_eq!(meta["key"], "bad");
    assert_eq!(meta["uid"], "u-0");
    assert_eq!(meta["reason"], "cannot parse");
    assert_eq!(meta["delivery_count"], 1);
    assert_eq!(meta["consumer"], "d");
    assert_eq!(letter.value["value"]["n"], 0);
    // The source record is acknowledged: not delivered again after a restart.
    drop(consumer);
    ctx.reopen();
    let mut again = open(ctx.bus(), &topic, "d", StartAt::Beginning, options());
    assert_idle(&mut again);
    // The dead-letter topic is an ordinary topic: subscribe and consume work.
    let mut sub = ctx
        .bus()
        .subscribe(
            &dlq,
            Selector::Topic,
            StartAt::Beginning,
            Default::default(),
        )
        .unwrap();
    assert!(sub.recv_timeout(WAIT).unwrap().is_some());
    let mut reader = open(
        ctx.bus(),
        &dlq,
        "triage",
        StartAt::Beginning,
        ConsumeOptions::default(),
    );
    assert_eq!(
        take(&mut reader, 1)[0].event.value["dead_letter"]["reason"],
        "cannot parse"
    );
}

pub fn c22_max_deliver_dead_letters(ctx: &mut ConsumerCtx) {
    let topic = ctx.simple_topic("maxdeliver", 1);
    let dlq = dead_letter_topic(ctx);
    publish_n(ctx.bus(), &topic, 1);
    let options = ConsumeOptions::default()
        .dead_letter(dlq.clone())
        .max_deliver(2)
        .ack_wait(Duration::from_millis(100));
    let mut consumer = open(ctx.bus(), &topic, "m", StartAt::Beginning, options);
    let counts: Vec<u32> = take(&mut consumer, 2)
        .iter()
        .map(|d| d.delivery_count)
        .collect();
    assert_eq!(counts, vec![1, 2]);
    // Third time round it goes to the dead-letter topic instead.
    let deadline = Instant::now() + WAIT;
    while ctx.bus().fetch(&dlq, 0, 0, 10).unwrap().is_empty() {
        assert!(Instant::now() < deadline, "never dead-lettered");
        assert!(
            consumer
                .recv_timeout(Duration::from_millis(50))
                .unwrap()
                .is_none()
        );
    }
    let letters = ctx.bus().fetch(&dlq, 0, 0, 10).unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].value["dead_letter"]["delivery_count"], 2);
    assert_eq!(
        letters[0].value["dead_letter"]["reason"],
        "max_deliver reached"
    );
    assert_eq!(consumer.cursor(), vec![(0, 1)]);
}

pub fn c22_unprovisioned_dead_letter_topic_is_refused_naming_it(ctx: &mut ConsumerCtx) {
    let topic = ctx.simple_topic("nodlq", 1);
    let missing = ctx.topic("missing-dlq");
    let error = ctx
        .bus()
        .consume(
            &topic,
            "n",
            Selector::Topic,
            StartAt::Beginning,
            ConsumeOptions::default().dead_letter(missing.clone()),
        )
        .unwrap_err();
    match &error {
        BusError::InvalidArgument { field, reason } => {
            assert_eq!(field, "dead_letter");
            assert!(reason.contains(&missing), "{reason}");
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    assert!(
        ctx.bus().consumers(&topic).unwrap().is_empty(),
        "nothing stored"
    );
    assert!(!ctx.bus().topics().contains(&missing), "not created");
}

pub fn c23_second_owner_fails_waits_or_takes_over(ctx: &mut ConsumerCtx) {
    let topic = ctx.simple_topic("owner", 1);
    let bus = ctx.bus();
    let first = open(
        bus,
        &topic,
        "o",
        StartAt::Beginning,
        ConsumeOptions::default(),
    );
    let try_open = |policy| {
        bus.consume(
            &topic,
            "o",
            Selector::Topic,
            StartAt::Beginning,
            ConsumeOptions::default().owner(policy),
        )
    };
    assert!(matches!(
        try_open(OwnerPolicy::Fail),
        Err(BusError::ConsumerBusy { .. })
    ));
    assert!(matches!(
        try_open(OwnerPolicy::Wait(Duration::from_millis(100))),
        Err(BusError::Timeout { .. })
    ));
    // A waiter gets it once the owner goes away.
    let waited = std::thread::scope(|scope| {
        let waiter = scope.spawn(|| try_open(OwnerPolicy::Wait(WAIT)));
        drop(first);
        waiter.join().unwrap()
    });
    let waited = waited.unwrap();
    let taker = try_open(OwnerPolicy::TakeOver).unwrap();
    drop(taker);
    drop(waited);
    // Nobody owns it now: Fail succeeds.
    assert!(try_open(OwnerPolicy::Fail).is_ok());
}

pub fn c23_fenced_instance_acks_nothing(ctx: &mut ConsumerCtx) {
    let topic = ctx.simple_topic("fence", 1);
    publish_n(ctx.bus(), &topic, 3);
    let mut old = open(
        ctx.bus(),
        &topic,
        "f",
        StartAt::Beginning,
        ConsumeOptions::default(),
    );
    let got = take(&mut old, 3);
    old.ack(&got[0]).unwrap();
    let takeover = ConsumeOptions::default().owner(OwnerPolicy::TakeOver);
    let mut new = open(ctx.bus(), &topic, "f", StartAt::Beginning, takeover);
    assert!(matches!(old.ack(&got[1]), Err(BusError::Fenced { .. })));
    assert!(matches!(
        old.ack_through(0, 2),
        Err(BusError::Fenced { .. })
    ));
    assert!(matches!(old.flush(), Err(BusError::Fenced { .. })));
    assert!(matches!(old.try_recv(), Err(BusError::Fenced { .. })));
    let info = ctx.bus().consumers(&topic).unwrap();
    assert_eq!(
        info[0].partitions[0].cursor, 1,
        "the fenced acks advanced nothing"
    );
    let back = take(&mut new, 2);
    assert_eq!(
        back.iter().map(|d| d.offset).collect::<Vec<_>>(),
        vec![1, 2]
    );
    // A reset fences the running instance too.
    ctx.bus()
        .reset_consumer(&topic, "f", StartAt::Beginning)
        .unwrap();
    assert!(matches!(new.ack(&back[0]), Err(BusError::Fenced { .. })));
}

pub fn c20_consumers_show_lag_in_records_and_time(ctx: &mut ConsumerCtx) {
    let topic = ctx.simple_topic("lag", 2);
    let key0 = (0..)
        .map(|i| format!("k{i}"))
        .find(|k| partition_for(k, 2) == 0)
        .unwrap();
    for n in 0..5 {
        ctx.bus().publish(&topic, &key0, &json!({"n": n})).unwrap();
    }
    let mut consumer = open(
        ctx.bus(),
        &topic,
        "l",
        StartAt::Beginning,
        ConsumeOptions::default(),
    );
    let got = take(&mut consumer, 5);
    consumer.ack(&got[0]).unwrap();
    consumer.ack(&got[2]).unwrap();
    let info = ctx.bus().consumers(&topic).unwrap();
    assert_eq!(info.len(), 1);
    assert_eq!(info[0].name, "l");
    assert_eq!(info[0].selector, Selector::Topic);
    let p0 = &info[0].partitions[0];
    assert_eq!(
        (p0.partition, p0.cursor, p0.acked_above, p0.lag_records),
        (0, 1, 1, 3)
    );
    let age = p0.lag_time.expect("a lag in time");
    assert!(age < Duration::from_secs(600), "{age:?}");
    let p1 = &info[0].partitions[1];
    assert_eq!((p1.cursor, p1.lag_records, p1.lag_time), (0, 0, None));
    consumer.ack_through(0, 4).unwrap();
    let info = ctx.bus().consumers(&topic).unwrap();
    assert_eq!(
        (
            info[0].partitions[0].lag_records,
            info[0].partitions[0].lag_time
        ),
        (0, None)
    );
}

pub fn c20_reset_and_delete(ctx: &mut ConsumerCtx) {
    let topic = ctx.simple_topic("reset", 1);
    publish_n(ctx.bus(), &topic, 3);
    let mut consumer = open(
        ctx.bus(),
        &topic,
        "z",
        StartAt::Beginning,
        ConsumeOptions::default(),
    );
    let got = take(&mut consumer, 3);
    consumer.ack_through(0, got[2].offset).unwrap();
    drop(consumer);
    ctx.bus()
        .reset_consumer(&topic, "z", StartAt::Offset(1))
        .unwrap();
    let mut again = open(
        ctx.bus(),
        &topic,
        "z",
        StartAt::Beginning,
        ConsumeOptions::default(),
    );
    assert_eq!(
        take(&mut again, 2)
            .iter()
            .map(|d| d.offset)
            .collect::<Vec<_>>(),
        vec![1, 2]
    );
    drop(again);
    assert!(ctx.bus().delete_consumer(&topic, "z").unwrap());
    assert!(ctx.bus().consumers(&topic).unwrap().is_empty());
    assert!(!ctx.bus().delete_consumer(&topic, "z").unwrap());
    assert!(matches!(
        ctx.bus().reset_consumer(&topic, "z", StartAt::Beginning),
        Err(BusError::InvalidArgument { ref field, .. }) if field == "consumer"
    ));
    // Deleted: the name starts afresh at start_if_new.
    let mut fresh = open(
        ctx.bus(),
        &topic,
        "z",
        StartAt::Beginning,
        ConsumeOptions::default(),
    );
    assert_eq!(take(&mut fresh, 3)[0].offset, 0);
}

pub fn c20_bad_input_is_refused_and_changes_nothing(ctx: &mut ConsumerCtx) {
    let topic = ctx.simple_topic("bad", 2);
    let other = ctx.simple_topic("other", 1);
    let dlq = dead_letter_topic(ctx);
    publish_n(ctx.bus(), &topic, 4);
    publish_n(ctx.bus(), &other, 1);
    let bus = ctx.bus();
    let field_of = |result: Result<Consumer, BusError>| match result {
        Err(BusError::InvalidArgument { field, .. }) => field,
        other => panic!("expected InvalidArgument, got {other:?}"),
    };
    let consume = |name: &str, options: ConsumeOptions| {
        bus.consume(&topic, name, Selector::Topic, StartAt::Beginning, options)
    };
    for bad in ["", ".", "..", "a b", "x/y", &"n".repeat(201)] {
        assert_eq!(
            field_of(consume(bad, ConsumeOptions::default())),
            "consumer",
            "{bad:?}"
        );
    }
    assert_eq!(
        field_of(consume(
            "c",
            ConsumeOptions::default().ack_wait(Duration::ZERO)
        )),
        "ack_wait"
    );
    let zero = ConsumeOptions::default()
        .dead_letter(dlq.clone())
        .max_deliver(0);
    assert_eq!(field_of(consume("c", zero)), "max_deliver");
    assert_eq!(
        field_of(consume("c", ConsumeOptions::default().max_deliver(3))),
        "max_deliver"
    );
    assert_eq!(
        field_of(consume("c", ConsumeOptions::default().ack_every(0))),
        "ack_every"
    );
    assert!(matches!(
        bus.consume(
            &ctx.topic("never"),
            "c",
            Selector::Topic,
            StartAt::Beginning,
            ConsumeOptions::default()
        ),
        Err(BusError::UnknownTopic(_))
    ));
    assert!(
        bus.consumers(&topic).unwrap().is_empty(),
        "no refused consume stored anything"
    );

    let mut mine = open(
        bus,
        &topic,
        "c",
        StartAt::Beginning,
        ConsumeOptions::default(),
    );
    let mut theirs = open(
        bus,
        &topic,
        "d",
        StartAt::Beginning,
        ConsumeOptions::default(),
    );
    let mut elsewhere = open(
        bus,
        &other,
        "c",
        StartAt::Beginning,
        ConsumeOptions::default(),
    );
    let delivered = take(&mut mine, 1).remove(0);
    let their = take(&mut theirs, 1).remove(0);
    let foreign = take(&mut elsewhere, 1).remove(0);
    let cursor = mine.cursor();
    assert!(matches!(
        mine.ack(&their),
        Err(BusError::InvalidArgument { .. })
    ));
    assert!(matches!(
        mine.ack(&foreign),
        Err(BusError::InvalidArgument { .. })
    ));
    assert!(matches!(
        mine.nack(&their, "x"),
        Err(BusError::InvalidArgument { .. })
    ));
    let p = delivered.partition;
    assert!(matches!(
        mine.ack_through(p, delivered.offset + 1),
        Err(BusError::InvalidArgument { .. })
    ));
    assert!(matches!(
        mine.ack_through(7, 0),
        Err(BusError::InvalidArgument { .. })
    ));
    assert_eq!(mine.cursor(), cursor, "refused acks changed nothing");
    // A second ack of the same delivery is harmless.
    mine.ack(&delivered).unwrap();
    mine.ack(&delivered).unwrap();
    // A consumer of a different selector under an existing name is refused.
    drop(mine);
    let manifest = Manifest::new([TopicSpec::new(topic.clone(), 2)]);
    bus.provision(&manifest).unwrap();
    assert_eq!(
        field_of(bus.consume(
            &topic,
            "c",
            Selector::Partition(0),
            StartAt::Beginning,
            ConsumeOptions::default()
        )),
        "selector"
    );
}
