//! C22 poison records go somewhere.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc, missing_docs)]

use std::time::{Duration, Instant};

use bus_core::consumer::ConsumeOptions;
use bus_core::{BusError, Selector, StartAt};
use serde_json::json;

use super::{ConsumerCtx, WAIT, assert_idle, dead_letter_topic, open, publish_n, take};

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

/// A dead-letter topic outside the topic-name rule, or the consumed topic
/// itself, is refused naming `dead_letter`, and nothing is stored.
pub fn c22_dead_letter_topic_must_be_another_valid_topic(ctx: &mut ConsumerCtx) {
    let topic = ctx.simple_topic("dlqname", 1);
    for (dlq, why) in [
        ("a b", "outside the name rule"),
        ("", "empty"),
        (topic.as_str(), "the consumed topic"),
    ] {
        match ctx.bus().consume(
            &topic,
            "d",
            Selector::Topic,
            StartAt::Beginning,
            ConsumeOptions::default().dead_letter(dlq),
        ) {
            Err(BusError::InvalidArgument { field, .. }) => {
                assert_eq!(field, "dead_letter", "{why}")
            }
            other => panic!("{why}: expected InvalidArgument, got {other:?}"),
        }
    }
    assert!(
        ctx.bus().consumers(&topic).unwrap().is_empty(),
        "nothing stored"
    );
}
