//! Live subscriptions on the shared server (`BUS_NATS_URL`), beyond the
//! conformance suite: retention expiring unread history (JetStream's own
//! `max_age`), more live records than a partition's push buffer holds,
//! a forged record arriving on the live tail, a subscription ending with
//! the bus handle it came from, and a push consumer deleted under a
//! subscription, re-created under a new name. Each test owns its stream
//! prefix.

use crate::common;

use std::time::{Duration, Instant};

use bus_conformance::util::{poll_until, publish_n};
use bus_core::auth::{RecordAuth, RecordParts, to_hex};
use bus_core::{
    BatchRecord, BusError, EventBus, Manifest, Selector, StartAt, SubscribeOptions, Subscription,
    SubscriptionItem, TopicSpec,
};
use bus_nats::naming::{KEY_HEADER, TAG_HEADER, encode_header_text, record_subject, stream_name};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

/// The next item within [`WAIT`] (error items included).
fn next(sub: &mut Subscription) -> Result<SubscriptionItem, BusError> {
    let deadline = Instant::now() + WAIT;
    loop {
        assert!(Instant::now() < deadline, "no item within {WAIT:?}");
        match sub.recv_timeout(Duration::from_millis(500)) {
            Ok(Some(item)) => return Ok(item),
            Ok(None) => {}
            Err(error) => return Err(error),
        }
    }
}

fn offset_of(item: Result<SubscriptionItem, BusError>) -> u64 {
    match item {
        Ok(SubscriptionItem::Record { event, .. }) => event.offset,
        other => panic!("expected a record, got {other:?}"),
    }
}

#[test]
fn retention_expiring_unread_history_is_reported_exactly() {
    let Some(bus) = common::shared_bus("subscribe", "sub-ret") else {
        return;
    };
    let topic = "ret";
    bus.provision(&Manifest::new([
        TopicSpec::new(topic, 1).with_retention_ms(1_000)
    ]))
    .expect("provision");
    publish_n(&bus, topic, "k", 5);
    let mut sub = bus
        .subscribe(
            topic,
            Selector::Partition(0),
            StartAt::Beginning,
            SubscribeOptions::default(),
        )
        .expect("subscribe");
    poll_until("JetStream to expire the five records", WAIT, || {
        let offsets = bus.offsets(topic, 0).expect("offsets");
        (offsets.first == 5).then_some(())
    });
    bus.publish(topic, "k", &json!({"n": 5})).expect("publish");
    assert_eq!(
        next(&mut sub).expect("lag"),
        SubscriptionItem::Lagged {
            partition: 0,
            skipped: 5,
            next_offset: 5
        }
    );
    assert_eq!(offset_of(next(&mut sub)), 5);
    common::cleanup(&bus);
}

#[test]
fn more_live_records_than_the_push_buffer_arrive_once_in_order() {
    let Some(bus) = common::shared_bus("subscribe", "sub-many") else {
        return;
    };
    let topic = "many";
    bus.provision(&Manifest::new([TopicSpec::new(topic, 1)]))
        .expect("provision");
    let mut sub = bus
        .subscribe(
            topic,
            Selector::Topic,
            StartAt::Now,
            SubscribeOptions::default(),
        )
        .expect("subscribe");
    const COUNT: u64 = 5_000;
    // Published before the first read: the push buffer (1024) overflows
    // and the rest is read back from the stream.
    for chunk in 0..COUNT / 500 {
        let records: Vec<BatchRecord> = (0..500)
            .map(|i| BatchRecord::new("k", json!({ "n": chunk * 500 + i })))
            .collect();
        bus.publish_batch(topic, &records).expect("publish_batch");
    }
    for expected in 0..COUNT {
        match next(&mut sub) {
            Ok(SubscriptionItem::Record { event, .. }) => {
                assert_eq!(event.offset, expected);
                assert_eq!(event.value["n"], expected);
            }
            other => panic!("record {expected}: {other:?}"),
        }
    }
    assert!(
        sub.recv_timeout(Duration::from_millis(300))
            .expect("quiet")
            .is_none()
    );
    common::cleanup(&bus);
}

#[test]
fn a_forged_record_on_the_live_tail_is_an_error_item_then_goes_on() {
    let Some(bus) = common::shared_bus("subscribe", "sub-forged") else {
        return;
    };
    const KEY: [u8; 32] = [3; 32];
    bus.set_control_key(KEY).expect("control key");
    let topic = "forged";
    bus.provision(&Manifest::new([TopicSpec::new(topic, 1)]))
        .expect("provision");
    let mut sub = bus
        .subscribe(
            topic,
            Selector::Partition(0),
            StartAt::Now,
            SubscribeOptions::default(),
        )
        .expect("subscribe");
    bus.publish(topic, "k", &json!({"n": 0})).expect("publish");
    assert_eq!(offset_of(next(&mut sub)), 0);
    // A foreign client appends a record tagged with the wrong key.
    let value = br#"{"n":1}"#.to_vec();
    let tag = RecordAuth::new(&[9; 32]).tag(RecordParts {
        topic,
        partition: 0,
        key: "k",
        uid: None,
        value: &value,
    });
    let stream = stream_name(bus.prefix(), topic, 0);
    common::raw(async move |js| {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(KEY_HEADER, encode_header_text("k"));
        headers.insert(TAG_HEADER, to_hex(&tag));
        js.publish_with_headers(record_subject(&stream, None), headers, value.into())
            .await
            .expect("raw publish")
            .await
            .expect("raw ack");
    });
    bus.publish(topic, "k", &json!({"n": 2})).expect("publish");
    match next(&mut sub) {
        Err(BusError::Integrity { offset: 1, .. }) => {}
        other => panic!("expected Integrity at offset 1, got {other:?}"),
    }
    assert_eq!(offset_of(next(&mut sub)), 2);
    bus.publish(topic, "k", &json!({"n": 3})).expect("publish");
    assert_eq!(offset_of(next(&mut sub)), 3);
    common::cleanup(&bus);
}

/// C17: a subscription ends with the bus it came from (it used to go on
/// reading through the connector its feed held): after the drop, `recv`
/// answers `None` at once, even while another bus publishes to the topic.
#[test]
fn a_subscription_ends_with_its_bus_handle() {
    let Some(bus) = common::shared_bus("subscribe", "sub-outlive") else {
        return;
    };
    let topic = "outlive";
    bus.provision(&Manifest::new([TopicSpec::new(topic, 1)]))
        .expect("provision");
    let mut sub = bus
        .subscribe(
            topic,
            Selector::Topic,
            StartAt::Now,
            SubscribeOptions::default(),
        )
        .expect("subscribe");
    let prefix = bus.prefix().to_owned();
    drop(bus);
    let url = std::env::var("BUS_NATS_URL").expect("BUS_NATS_URL");
    let options = bus_nats::NatsOptions::from_url(&url)
        .expect("url")
        .prefix(prefix);
    let writer = bus_nats::NatsBus::connect_with(options).expect("connect");
    writer
        .publish(topic, "k", &json!({"n": 0}))
        .expect("publish");
    let started = Instant::now();
    assert!(matches!(sub.recv_timeout(WAIT), Ok(None)));
    assert!(started.elapsed() < WAIT, "ended, not timed out");
    assert!(sub.is_closed());
    drop(sub);
    common::cleanup(&writer);
}

/// Issue 25: after a leader kill async-nats' ordered consumer re-created
/// its consumer under one name, never answered, and retried that name
/// forever without a word: the subscription stopped. Here the
/// subscription's push consumer is deleted and the name its first
/// re-creation takes is already held by a pull consumer, so that creation
/// fails: the records published meanwhile arrive, and so does one
/// published afterwards, which only a working push consumer brings.
#[test]
fn a_deleted_push_consumer_is_recreated_under_a_new_name() {
    let Some(bus) = common::shared_bus("subscribe", "sub-recreate") else {
        return;
    };
    let topic = "recreate";
    bus.provision(&Manifest::new([TopicSpec::new(topic, 1)]))
        .expect("provision");
    let mut sub = bus
        .subscribe(
            topic,
            Selector::Partition(0),
            StartAt::Now,
            SubscribeOptions::default(),
        )
        .expect("subscribe");
    bus.publish(topic, "k", &json!({"n": 0})).expect("publish");
    assert_eq!(offset_of(next(&mut sub)), 0);
    let stream = stream_name(bus.prefix(), topic, 0);
    let push = common::raw({
        let stream = stream.clone();
        async move |js| {
            use futures::StreamExt;
            let handle = js.get_stream(&stream).await.expect("stream");
            let names: Vec<String> = handle
                .consumer_names()
                .filter_map(|name| async move { name.ok() })
                .collect()
                .await;
            let push = names
                .into_iter()
                .find(|name| name.starts_with("bus-sub-"))
                .expect("the subscription's push consumer");
            handle
                .create_consumer(async_nats::jetstream::consumer::pull::Config {
                    name: Some(format!("{push}_1")),
                    inactive_threshold: Duration::from_secs(60),
                    ..Default::default()
                })
                .await
                .expect("a pull consumer holding the next name");
            handle.delete_consumer(&push).await.expect("delete");
            push
        }
    });
    bus.publish(topic, "k", &json!({"n": 1})).expect("publish");
    bus.publish(topic, "k", &json!({"n": 2})).expect("publish");
    assert_eq!(offset_of(next(&mut sub)), 1);
    assert_eq!(offset_of(next(&mut sub)), 2);
    let recreated = format!("{push}_2");
    poll_until("the push consumer re-created as _2", WAIT, || {
        common::raw({
            let (stream, recreated) = (stream.clone(), recreated.clone());
            async move |js| {
                let handle = js.get_stream(&stream).await.expect("stream");
                handle.consumer_info(&recreated).await.ok().map(|_| ())
            }
        })
    });
    // A read at the end: the server says nothing more, so the partition is
    // no longer stale and the next record can only come by the push.
    assert_eq!(sub.try_recv().expect("a read at the end"), None);
    bus.publish(topic, "k", &json!({"n": 3})).expect("publish");
    assert_eq!(offset_of(next(&mut sub)), 3);
    drop(sub);
    common::cleanup(&bus);
}
