//! The async surface of the Kafka backend (feature `async`): a round trip
//! from a runtime, with no connector thread for a bus made by
//! `connect_async`.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::sync::Arc;

use bus_core::{
    AsyncEventBus, BatchRecord, BusError, Manifest, Selector, StartAt, SubscribeOptions,
    SubscriptionItem, TopicSpec,
};
use bus_kafka::{KafkaBus, KafkaOptions};
use futures::StreamExt as _;
use serde_json::json;

#[test]
fn a_bus_connected_async_round_trips_without_a_connector_thread() {
    let brokers = match common::brokers() {
        Ok(brokers) => brokers,
        Err(why) => return common::skip("async_surface", &why),
    };
    let options = KafkaOptions::from_url(&format!("kafka://{brokers}"))
        .unwrap()
        // An extra librdkafka setting travels through.
        .rdkafka("client.id", "bus-async-test")
        .rdkafka("socket.keepalive.enable", "true");
    let topic = format!("async-{}", uuid::Uuid::new_v4().simple());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let bus = runtime.block_on(async {
        let bus = Arc::new(KafkaBus::connect_async_with(options).await.unwrap());
        let manifest = Manifest::new([TopicSpec::new(topic.clone(), 2)]);
        let surface: &dyn AsyncEventBus = &*bus;
        surface.provision(&manifest).await.unwrap();
        surface.provision(&manifest).await.unwrap();
        assert_eq!(surface.partitions(&topic).await.unwrap(), 2);
        let ack = surface
            .publish_idempotent(&topic, "k", &json!({"n": 1}), "u1")
            .await
            .unwrap();
        assert_eq!(ack.offset, 0);
        let again = surface
            .publish_idempotent(&topic, "k", &json!({"n": 1}), "u1")
            .await
            .unwrap();
        assert_eq!(again, ack);
        let plain = surface
            .publish(&topic, "k", &json!({"n": 2}))
            .await
            .unwrap();
        assert_eq!((plain.partition, plain.offset), (ack.partition, 1));
        let acks = surface
            .publish_batch(
                &topic,
                &[
                    BatchRecord::new("k", json!({"n": 3})),
                    BatchRecord::new("k", json!({"n": 4})),
                ],
            )
            .await
            .unwrap();
        assert_eq!(acks[1].offset, 3);
        let events = surface.fetch(&topic, ack.partition, 0, 10).await.unwrap();
        let ns: Vec<_> = events.iter().map(|e| e.value["n"].clone()).collect();
        assert_eq!(ns, [json!(1), json!(2), json!(3), json!(4)]);
        assert_eq!(
            surface.find_event_by_uid(&topic, "k", "u1").await.unwrap(),
            Some(ack.clone())
        );
        assert_eq!(
            surface
                .find_event_by_uid(&topic, "k", "nope")
                .await
                .unwrap(),
            None
        );
        assert_eq!(
            surface.offsets(&topic, ack.partition).await.unwrap().next,
            4
        );
        assert!(matches!(
            surface.publish("missing-topic", "k", &json!({})).await,
            Err(BusError::UnknownTopic(_))
        ));
        // 64 tasks at once, each awaiting its own delivery reports.
        let tasks: Vec<_> = (0..64)
            .map(|task| {
                let (bus, topic) = (Arc::clone(&bus), topic.clone());
                tokio::spawn(async move {
                    AsyncEventBus::publish(&*bus, &topic, &format!("t{task}"), &json!({"t": task}))
                        .await
                        .unwrap()
                })
            })
            .collect();
        let mut stored = 0;
        for task in tasks {
            task.await.unwrap();
            stored += 1;
        }
        assert_eq!(stored, 64);
        assert!(
            !bus.connector_started(),
            "an async operation started the connector"
        );
        let mut stream = surface
            .subscribe(
                &topic,
                Selector::Key("k".to_owned()),
                StartAt::Offset(3),
                SubscribeOptions::default(),
            )
            .await
            .unwrap();
        let first = stream.next().await.unwrap().unwrap();
        assert!(
            matches!(&first, SubscriptionItem::Record { event, .. } if event.offset == 3),
            "{first:?}"
        );
        drop(stream);
        assert!(!bus.connector_started());
        bus
    });
    bus.delete_topics(&[topic]).unwrap();
}
