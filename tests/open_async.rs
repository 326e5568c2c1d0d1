//! `bus::open_async` / `bus::connect_async` route URLs like `bus::open`,
//! to each backend's async constructor.
#![allow(clippy::unwrap_used)]

use bus::{AsyncEventBus, BusError, Manifest, TopicSpec};
use serde_json::json;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn round_trip(bus: &dyn AsyncEventBus) {
    let ack = bus
        .publish_idempotent("audit", "agent-1", &json!({"event": "start"}), "evt-1")
        .await
        .unwrap();
    assert_eq!(
        bus.find_event_by_uid("audit", "agent-1", "evt-1")
            .await
            .unwrap(),
        Some(ack.clone())
    );
    let events = bus.fetch("audit", ack.partition, 0, 10).await.unwrap();
    assert_eq!(events[0].value["event"], "start");
}

#[test]
fn memory_file_and_bare_paths_open_through_the_async_surface() {
    let manifest = Manifest::new([TopicSpec::new("audit", 2)]);
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let memory = bus::open_async("memory://", &manifest).await.unwrap();
        round_trip(&*memory).await;
        let file = format!("file://{}", dir.path().join("a").display());
        round_trip(&*bus::open_async(&file, &manifest).await.unwrap()).await;
        let bare = dir.path().join("b").display().to_string();
        round_trip(&*bus::open_async(&bare, &manifest).await.unwrap()).await;
        // A read-only open of what the writer above left.
        let read_only = format!("file://{}?read_only=true", dir.path().join("a").display());
        let reader = bus::connect_async(&read_only).await.unwrap();
        assert_eq!(reader.partitions("audit").await.unwrap(), 2);
        assert!(matches!(
            reader.publish("audit", "k", &json!({})).await,
            Err(BusError::ReadOnly { .. })
        ));
    });
}

#[test]
fn bad_and_unsupported_urls_are_refused() {
    runtime().block_on(async {
        assert!(matches!(
            bus::connect_async("bogus://x").await,
            Err(BusError::InvalidArgument { .. })
        ));
        assert!(matches!(
            bus::connect_async("file://").await,
            Err(BusError::InvalidArgument { .. })
        ));
        // Nothing listens on port 1: unavailable (or not compiled in).
        assert!(matches!(
            bus::connect_async("postgres://u:p@127.0.0.1:1/db?timeout_ms=2000").await,
            Err(BusError::Unavailable { .. } | BusError::FeatureDisabled { .. })
        ));
    });
}

#[cfg(feature = "nats")]
#[test]
fn a_nats_url_opens_through_the_async_constructor() {
    let Ok(url) = bus_conformance::brokers::nats_url() else {
        assert!(
            !bus_conformance::brokers_required(),
            "BUS_NATS_URL is not set"
        );
        bus_conformance::loud("SKIPPED open_async::nats: BUS_NATS_URL is not set");
        return;
    };
    let id = uuid::Uuid::new_v4().simple().to_string();
    let prefix = format!("oa-{}", &id[..12]);
    let bus_url = format!("{url}?prefix={prefix}");
    let manifest = Manifest::new([TopicSpec::new("audit", 2)]);
    runtime().block_on(async {
        let bus = bus::open_async(&bus_url, &manifest).await.unwrap();
        round_trip(&*bus).await;
        drop(bus);
        // The test's streams (`<prefix>_...`), deleted by a raw client.
        use futures::StreamExt as _;
        let js = async_nats::jetstream::new(async_nats::connect(url.as_str()).await.unwrap());
        let ours: Vec<String> = js
            .stream_names()
            .filter_map(|name| async move { name.ok() })
            .filter(|name| std::future::ready(name.starts_with(&format!("{prefix}_"))))
            .collect()
            .await;
        assert!(!ours.is_empty(), "no streams named {prefix}_*");
        for name in ours {
            js.delete_stream(&name).await.unwrap();
        }
    });
}

#[cfg(feature = "kafka")]
#[test]
fn a_kafka_url_opens_through_the_async_constructor() {
    let Ok(brokers) = bus_conformance::brokers::kafka_brokers() else {
        assert!(
            !bus_conformance::brokers_required(),
            "BUS_KAFKA_BROKERS is not set"
        );
        bus_conformance::loud("SKIPPED open_async::kafka: BUS_KAFKA_BROKERS is not set");
        return;
    };
    runtime().block_on(async {
        let bus = bus::connect_async(&format!("kafka://{}", brokers.trim()))
            .await
            .unwrap();
        let missing = format!("oa-{}", uuid::Uuid::new_v4().simple());
        assert!(matches!(
            bus.partitions(&missing).await,
            Err(BusError::UnknownTopic(_))
        ));
    });
}

#[cfg(feature = "postgres")]
#[test]
fn a_postgres_url_opens_through_the_async_constructor() {
    let Ok(url) = bus_conformance::brokers::postgres_url() else {
        assert!(
            !bus_conformance::brokers_required(),
            "BUS_POSTGRES_URL is not set"
        );
        bus_conformance::loud("SKIPPED open_async::postgres: BUS_POSTGRES_URL is not set");
        return;
    };
    let id = uuid::Uuid::new_v4().simple().to_string();
    let separator = if url.contains('?') { '&' } else { '?' };
    let schema = format!("oa_{}", &id[..12]);
    let bus_url = format!("{url}{separator}schema={schema}");
    let manifest = Manifest::new([TopicSpec::new("audit", 2)]);
    runtime().block_on(async {
        let bus = bus::open_async(&bus_url, &manifest).await.unwrap();
        round_trip(&*bus).await;
        drop(bus);
        // The test's schema, dropped by a raw client.
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        let connection = tokio::spawn(connection);
        client
            .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
            .await
            .unwrap();
        drop(client);
        let _ = connection.await;
    });
}

/// `bus::open_async` wraps the bus in `Traced` too: its futures run in the
/// spans of the schema.
#[test]
fn open_async_returns_a_bus_whose_futures_run_in_spans() {
    use std::io::Write;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::util::SubscriberInitExt as _;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);
    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    let dir = tempfile::tempdir().unwrap();
    let file_url = format!("file://{}", dir.path().display());
    let manifest = Manifest::new([TopicSpec::new("spans", 1)]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for (url, backend) in [("memory://", "memory"), (file_url.as_str(), "embedded")] {
        let bus = runtime.block_on(bus::open_async(url, &manifest)).unwrap();
        let run = || {
            runtime.block_on(async {
                let ack = bus.publish("spans", "k", &json!({"n": 1})).await.unwrap();
                bus.fetch("spans", ack.partition, 0, 3).await.unwrap();
            });
        };
        // Once before the subscriber, so the callsites are registered.
        run();
        let out = Captured::default();
        let writer = out.clone();
        let guard = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing_subscriber::filter::LevelFilter::INFO)
            .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
            .finish()
            .set_default();
        run();
        drop(guard);
        let log = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        for span in [
            format!("bus.publish{{backend=\"{backend}\" topic=spans}}"),
            format!("bus.fetch{{backend=\"{backend}\" topic=spans partition=0 offset=0 max=3}}"),
        ] {
            assert!(
                log.lines()
                    .any(|line| line.contains(&span) && line.contains("close")),
                "no closed span {span} in:\n{log}"
            );
        }
    }
}
