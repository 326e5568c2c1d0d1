//! C20 named cursors.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc, missing_docs)]

use std::time::Duration;

use bus_core::consumer::{ConsumeOptions, Consumer, Delivery};
use bus_core::{BusError, Manifest, Selector, StartAt, TopicSpec, partition_for};
use serde_json::json;

use super::{ConsumerCtx, assert_idle, dead_letter_topic, numbers, open, publish_n, take};

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
