//! The async surface on a real PostgreSQL (`BUS_POSTGRES_URL`): a bus made
//! by `connect_async` serves every operation on the caller's runtime and
//! starts no connector thread; a subscription starts it (its feed reads
//! through the synchronous path) and still delivers.
#![cfg(feature = "async")]

use std::time::Duration;

use bus_core::{
    AsyncEventBus, BatchRecord, BusError, Manifest, Selector, StartAt, SubscribeOptions,
    SubscriptionItem, TopicSpec,
};
use bus_postgres::{PostgresBus, PostgresOptions};
use futures::StreamExt as _;
use serde_json::json;

#[test]
fn operations_run_on_the_callers_runtime_without_a_connector_thread() {
    let url = match bus_conformance::brokers::postgres_url() {
        Ok(url) => url,
        Err(why) => {
            assert!(!bus_conformance::brokers_required(), "{why}");
            bus_conformance::loud(&format!("SKIPPED postgres async_surface: {why}"));
            return;
        }
    };
    let id = uuid::Uuid::new_v4().simple().to_string();
    let options = PostgresOptions::from_url(&url)
        .expect("BUS_POSTGRES_URL")
        .schema(format!("as_{}", &id[..12]));
    let schema = options.schema.clone();
    // One thread: a call that blocked the runtime's only worker would hang.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let bus = PostgresBus::connect_async_with(options)
            .await
            .expect("connect");
        let bus: &dyn AsyncEventBus = &bus;
        bus.provision(&Manifest::new([TopicSpec::new("audit", 2)]))
            .await
            .expect("provision");
        let ack = bus
            .publish_idempotent("audit", "k", &json!({"n": 1}), "u-1")
            .await
            .expect("publish");
        let again = bus
            .publish_idempotent("audit", "k", &json!({"n": 1}), "u-1")
            .await
            .expect("retry");
        assert_eq!(again, ack, "a retry answers with the stored record");
        let batch = bus
            .publish_batch(
                "audit",
                &[
                    BatchRecord::new("k", json!({"n": 2})),
                    BatchRecord::new("k", json!({"n": 3})),
                ],
            )
            .await
            .expect("batch");
        assert_eq!(batch[1].offset, ack.offset + 2);
        let events = bus
            .fetch("audit", ack.partition, 0, 10)
            .await
            .expect("fetch");
        assert_eq!(events.len(), 3);
        assert_eq!(
            bus.find_event_by_uid("audit", "k", "u-1")
                .await
                .expect("find"),
            Some(ack.clone())
        );
        assert_eq!(
            bus.offsets("audit", ack.partition)
                .await
                .expect("offsets")
                .next,
            3
        );
        assert!(matches!(
            bus.partitions("ghost").await,
            Err(BusError::UnknownTopic(_))
        ));
    });
    // The same bus, now from a multi-thread runtime, for the subscription.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let options = PostgresOptions::from_url(&url)
            .expect("url")
            .schema(schema.clone());
        let config = options.config.clone();
        let bus = PostgresBus::connect_async_with(options)
            .await
            .expect("connect");
        assert!(
            !bus.connector_started(),
            "connect started a connector thread"
        );
        let handle: &dyn AsyncEventBus = &bus;
        handle.fetch("audit", 0, 0, 1).await.expect("fetch");
        assert!(
            !bus.connector_started(),
            "a fetch started a connector thread"
        );
        let mut stream = handle
            .subscribe(
                "audit",
                Selector::Key("k".into()),
                StartAt::Beginning,
                SubscribeOptions::default(),
            )
            .await
            .expect("subscribe");
        let mut seen = Vec::new();
        while seen.len() < 3 {
            match tokio::time::timeout(Duration::from_secs(10), stream.next()).await {
                Ok(Some(Ok(SubscriptionItem::Record { event, .. }))) => {
                    seen.push(event.value["n"].clone())
                }
                other => panic!("expected a record, got {other:?}"),
            }
        }
        assert_eq!(seen, [json!(1), json!(2), json!(3)]);
        drop(stream);
        drop(bus);
        // The test's schema, dropped by a raw client.
        let (client, connection) = config.connect(tokio_postgres::NoTls).await.expect("raw");
        let connection = tokio::spawn(connection);
        client
            .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
            .await
            .expect("drop the test's schema");
        drop(client);
        let _ = connection.await;
    });
}
