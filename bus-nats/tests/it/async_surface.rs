//! The async surface of the NATS backend (feature `async`): a round trip
//! on the caller's runtime, and no connector thread for a bus made by
//! `connect_async` or over the application's own client.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::sync::Arc;

use bus_core::{
    AsyncEventBus, BatchRecord, BusError, EventBus, Manifest, Selector, StartAt, SubscribeOptions,
    SubscriptionItem, TopicSpec,
};
use bus_nats::{NatsBus, NatsOptions};
use futures::StreamExt as _;
use serde_json::json;

/// Options on the shared server with a prefix of the test's own, or a
/// loud skip.
fn options(test: &str) -> Option<NatsOptions> {
    let url = match bus_conformance::brokers::nats_url() {
        Ok(url) => url,
        Err(why) => {
            assert!(
                !bus_conformance::brokers_required(),
                "BUS_REQUIRE_BROKERS=1 but {why}"
            );
            bus_conformance::loud(&format!("SKIPPED nats::async_surface::{test}: {why}"));
            return None;
        }
    };
    let id = uuid::Uuid::new_v4().simple().to_string();
    Some(
        NatsOptions::from_url(&url)
            .unwrap()
            .prefix(format!("async-{}", &id[..12])),
    )
}

async fn round_trip(bus: &NatsBus) {
    let manifest = Manifest::new([TopicSpec::new("t", 2)]);
    AsyncEventBus::provision(bus, &manifest).await.unwrap();
    AsyncEventBus::provision(bus, &manifest).await.unwrap();
    let bus: &dyn AsyncEventBus = bus;
    assert_eq!(bus.partitions("t").await.unwrap(), 2);
    let ack = bus
        .publish_idempotent("t", "k", &json!({"n": 1}), "u1")
        .await
        .unwrap();
    assert_eq!(ack.offset, 0);
    let again = bus
        .publish_idempotent("t", "k", &json!({"n": 1}), "u1")
        .await
        .unwrap();
    assert_eq!(again, ack);
    let plain = bus.publish("t", "k", &json!({"n": 2})).await.unwrap();
    assert_eq!((plain.partition, plain.offset), (ack.partition, 1));
    let acks = bus
        .publish_batch(
            "t",
            &[
                BatchRecord::new("k", json!({"n": 3})),
                BatchRecord::new("k", json!({"n": 4})).with_uid("u4"),
            ],
        )
        .await
        .unwrap();
    assert_eq!(acks[1].offset, 3);
    let events = bus.fetch("t", ack.partition, 0, 10).await.unwrap();
    let ns: Vec<_> = events.iter().map(|e| e.value["n"].clone()).collect();
    assert_eq!(ns, [json!(1), json!(2), json!(3), json!(4)]);
    assert!(
        bus.fetch("t", ack.partition, 4, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        bus.find_event_by_uid("t", "k", "u4").await.unwrap(),
        Some(acks[1].clone())
    );
    assert_eq!(bus.find_event_by_uid("t", "k", "nope").await.unwrap(), None);
    assert_eq!(bus.offsets("t", ack.partition).await.unwrap().next, 4);
    assert!(matches!(
        bus.publish("missing", "k", &json!({})).await,
        Err(BusError::UnknownTopic(_))
    ));
    assert!(matches!(
        bus.fetch("t", 7, 0, 1).await,
        Err(BusError::UnknownPartition { .. })
    ));
}

#[test]
fn a_bus_connected_async_round_trips_without_a_connector_thread() {
    let Some(options) = options("connect_async") else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let bus = runtime.block_on(async {
        let bus = NatsBus::connect_async_with(options).await.unwrap();
        round_trip(&bus).await;
        assert!(
            !bus.connector_started(),
            "an async operation started the connector"
        );
        // A subscription runs its futures on this runtime too.
        let bus = Arc::new(bus);
        let mut stream = AsyncEventBus::subscribe(
            &*bus,
            "t",
            Selector::Key("k".to_owned()),
            StartAt::Offset(3),
            SubscribeOptions::default(),
        )
        .await
        .unwrap();
        let first = stream.next().await.unwrap().unwrap();
        assert!(!bus.connector_started(), "subscribe started the connector");
        assert!(
            matches!(&first, SubscriptionItem::Record { event, .. } if event.offset == 3),
            "{first:?}"
        );
        AsyncEventBus::publish(&*bus, "t", "k", &json!({"n": 5}))
            .await
            .unwrap();
        let live = stream.next().await.unwrap().unwrap();
        assert!(
            matches!(&live, SubscriptionItem::Record { event, .. } if event.value["n"] == 5),
            "{live:?}"
        );
        // The sync surface of the same bus works too (it starts the connector).
        let sync_bus = Arc::clone(&bus);
        let count = tokio::task::spawn_blocking(move || {
            EventBus::fetch(&*sync_bus, "t", 0, 0, 100).unwrap().len()
                + EventBus::fetch(&*sync_bus, "t", 1, 0, 100).unwrap().len()
        })
        .await
        .unwrap();
        assert_eq!(count, 5);
        assert!(bus.connector_started());
        drop(stream);
        bus
    });
    common::cleanup(&bus);
}

/// Over the application's own client, on a current-thread runtime: every
/// operation runs on the caller's one thread, no connector is started.
#[test]
fn a_bus_over_the_applications_client_runs_on_its_runtime() {
    let Some(options) = options("from_client") else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let bus = runtime.block_on(async {
        let client = async_nats::connect(options.servers.clone()).await.unwrap();
        let bus = NatsBus::from_client(client.clone(), &options)
            .await
            .unwrap();
        round_trip(&bus).await;
        assert!(!bus.connector_started());
        // Over a JetStream context of the application's own.
        let js = async_nats::jetstream::new(client);
        let over_js = NatsBus::from_jetstream(js, &options);
        let events = AsyncEventBus::fetch(&over_js, "t", 0, 0, 10).await.unwrap();
        let more = AsyncEventBus::fetch(&over_js, "t", 1, 0, 10).await.unwrap();
        assert_eq!(events.len() + more.len(), 4);
        assert!(!over_js.connector_started());
        bus
    });
    common::cleanup(&bus);
}

/// Dropping a subscription's stream from the one thread of a current-thread
/// runtime while its history read is in flight (the read's future needs
/// that very thread) returns at once instead of waiting out the timeout.
#[test]
fn dropping_a_stream_mid_read_on_a_current_thread_runtime_does_not_wait() {
    let Some(options) = options("drop_mid_read") else {
        return;
    };
    let options = options.timeout(std::time::Duration::from_secs(8));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let bus = runtime.block_on(async {
        let bus = NatsBus::connect_async_with(options).await.unwrap();
        let surface: &dyn AsyncEventBus = &bus;
        surface
            .provision(&Manifest::new([TopicSpec::new("t", 1)]))
            .await
            .unwrap();
        let records: Vec<_> = (0..2_000)
            .map(|i| BatchRecord::new("k", json!({"i": i})))
            .collect();
        for chunk in records.chunks(500) {
            surface.publish_batch("t", chunk).await.unwrap();
        }
        // The subscription reads pages of 512: after a page's last items
        // the stream's thread is reading the next page, whose future needs
        // this runtime's one thread.
        for taken in [512, 1024] {
            let mut stream = surface
                .subscribe(
                    "t",
                    Selector::Partition(0),
                    StartAt::Beginning,
                    SubscribeOptions::default(),
                )
                .await
                .unwrap();
            stream.next().await.unwrap().unwrap();
            // Tasks alive while the stream's thread is not reading.
            let metrics = tokio::runtime::Handle::current().metrics();
            let idle = metrics.num_alive_tasks();
            for _ in 1..taken {
                stream.next().await.unwrap().unwrap();
            }
            // Hold this thread until the thread's next read has been
            // spawned onto it (bounded: at some counts it reads none).
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
            while metrics.num_alive_tasks() <= idle && std::time::Instant::now() < deadline {
                std::hint::spin_loop();
            }
            let started = std::time::Instant::now();
            drop(stream);
            assert!(
                started.elapsed() < std::time::Duration::from_secs(4),
                "dropping the stream after {taken} items waited {:?}",
                started.elapsed()
            );
        }
        bus
    });
    common::cleanup(&bus);
}
