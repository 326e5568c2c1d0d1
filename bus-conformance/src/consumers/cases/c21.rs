//! C21 at least once, with acknowledgement.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc, missing_docs)]

use std::time::{Duration, Instant};

use bus_core::consumer::{ConsumeOptions, OwnerPolicy};
use bus_core::{BusError, StartAt};

use super::{ConsumerCtx, WAIT, assert_idle, dead_letter_topic, open, publish_n, take};

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
    // Taken before the first delivery, so however long the ack below takes
    // (a Kafka transaction, a loaded machine) the bound stays exact: the
    // record is due `ack_wait` after a delivery made after this instant.
    let started = Instant::now();
    let first = take(&mut consumer, 2);
    consumer.ack(&first[1]).unwrap();
    let again = take(&mut consumer, 1);
    assert!(
        started.elapsed() >= Duration::from_millis(200),
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

/// Acknowledgements the issue lists as bad input: another consumer's
/// delivery, another topic's, one handed out by an earlier instance of the
/// same consumer, and past what was delivered. Each is `InvalidArgument`
/// and changes nothing, in memory or stored: after a restart every record
/// comes back. A second ack of the same delivery (or of one an
/// `ack_through` covered, or a nack after an ack) is harmless: `Ok` and
/// nothing written to the dead-letter topic.
pub fn c21_refused_acks_change_nothing_stored(ctx: &mut ConsumerCtx) {
    let topic = ctx.simple_topic("refused", 1);
    let other = ctx.simple_topic("elsewhere", 1);
    let dlq = dead_letter_topic(ctx);
    publish_n(ctx.bus(), &topic, 3);
    publish_n(ctx.bus(), &other, 1);
    let with_dlq = || ConsumeOptions::default().dead_letter(dlq.clone());
    // An instance that is gone: its deliveries belong to nobody now.
    let mut earlier = open(ctx.bus(), &topic, "a", StartAt::Beginning, with_dlq());
    let stale = take(&mut earlier, 1).remove(0);
    drop(earlier);
    let mut mine = open(ctx.bus(), &topic, "a", StartAt::Beginning, with_dlq());
    let mut theirs = open(ctx.bus(), &topic, "b", StartAt::Beginning, with_dlq());
    let mut foreign = open(ctx.bus(), &other, "a", StartAt::Beginning, with_dlq());
    // Offsets 0 and 1 delivered, none acknowledged.
    take(&mut mine, 2);
    let their = take(&mut theirs, 1).remove(0);
    let elsewhere = take(&mut foreign, 1).remove(0);
    let refused = |result: Result<(), BusError>, what: &str| match result {
        Err(BusError::InvalidArgument { .. }) => {}
        other => panic!("{what}: expected InvalidArgument, got {other:?}"),
    };
    refused(mine.ack(&their), "another consumer's delivery");
    refused(
        mine.nack(&their, "x"),
        "nack of another consumer's delivery",
    );
    refused(mine.ack(&elsewhere), "another topic's delivery");
    refused(
        mine.nack(&elsewhere, "x"),
        "nack of another topic's delivery",
    );
    refused(mine.ack(&stale), "an earlier instance's delivery");
    refused(mine.ack_through(0, 2), "past what was delivered");
    refused(mine.ack_through(0, u64::MAX), "far past what was delivered");
    refused(mine.ack_through(1, 0), "a partition not consumed");
    assert_eq!(mine.cursor(), vec![(0, 0)], "nothing moved in memory");
    mine.flush().unwrap();
    let info = ctx.bus().consumers(&topic).unwrap();
    let a = info.iter().find(|c| c.name == "a").unwrap();
    assert_eq!(
        (a.partitions[0].cursor, a.partitions[0].acked_above),
        (0, 0),
        "nothing moved in the store"
    );
    drop((mine, theirs, foreign));
    ctx.reopen();
    let mut again = open(ctx.bus(), &topic, "a", StartAt::Beginning, with_dlq());
    let back = take(&mut again, 3);
    assert_eq!(
        back.iter().map(|d| d.offset).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    // Second acknowledgements are harmless.
    again.ack(&back[0]).unwrap();
    again.ack(&back[0]).unwrap();
    again.nack(&back[0], "after the ack").unwrap();
    again.ack_through(0, 1).unwrap();
    again.ack(&back[1]).unwrap();
    again.ack_through(0, 1).unwrap();
    assert_eq!(again.cursor(), vec![(0, 2)]);
    let dead = ctx.bus().fetch(&dlq, 0, 0, 10).unwrap();
    assert!(
        dead.is_empty(),
        "a nack after an ack dead-lettered {dead:?}"
    );
}
