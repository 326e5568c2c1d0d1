//! Durable consumers through the facade (C20–C23): `bus::open_consumers`
//! and `bus::connect_consumers` route URLs as `bus::open` does, return a
//! `Bus` usable as a plain `EventBus`, and trace the consumer calls.
#![allow(clippy::unwrap_used)]

use bus::consumer::ConsumeOptions;
use bus::{BusError, EventBus, Manifest, Selector, StartAt, TopicSpec};

/// Publishes `n` records to `topic`, opens consumer `name` and acks the
/// first `acked` deliveries; returns the offsets delivered.
fn consume_and_ack(bus: &dyn bus::Bus, topic: &str, name: &str, acked: usize) -> Vec<u64> {
    let mut consumer = bus
        .consume(
            topic,
            name,
            Selector::Topic,
            StartAt::Beginning,
            ConsumeOptions::default(),
        )
        .unwrap();
    let mut seen = Vec::new();
    for _ in 0..acked {
        let delivery = consumer
            .recv_timeout(std::time::Duration::from_secs(10))
            .unwrap()
            .expect("a delivery within 10 s");
        seen.push(delivery.offset);
        consumer.ack(&delivery).unwrap();
    }
    seen
}

#[test]
fn memory_url_consumes_and_is_a_plain_event_bus_too() {
    let manifest = Manifest::new([TopicSpec::new("jobs", 1)]);
    let bus = bus::open_consumers("memory://", &manifest).unwrap();
    // Upcasts: what takes the plain trait takes this bus.
    let plain: &dyn EventBus = bus.as_ref();
    for n in 0..4 {
        plain
            .publish("jobs", "k", &serde_json::json!({ "n": n }))
            .unwrap();
    }
    assert_eq!(consume_and_ack(bus.as_ref(), "jobs", "w", 2), [0, 1]);
    assert_eq!(consume_and_ack(bus.as_ref(), "jobs", "w", 2), [2, 3]);
    let listed = bus.consumers("jobs").unwrap();
    assert_eq!(listed[0].name, "w");
    assert_eq!(listed[0].partitions[0].cursor, 4);
    let boxed: Box<dyn EventBus> = bus;
    assert_eq!(boxed.capabilities().backend, "memory");
}

#[test]
fn a_bad_consumer_name_is_invalid_argument_on_consumer() {
    let bus =
        bus::open_consumers("memory://", &Manifest::new([TopicSpec::new("jobs", 1)])).unwrap();
    let bad = bus.consume(
        "jobs",
        "no spaces",
        Selector::Topic,
        StartAt::Beginning,
        ConsumeOptions::default(),
    );
    assert!(
        matches!(bad, Err(BusError::InvalidArgument { ref field, .. }) if field == "consumer"),
        "{bad:?}"
    );
}

#[test]
fn unknown_scheme_is_refused_as_by_open() {
    let result = bus::connect_consumers("carrier-pigeon://roof");
    assert!(
        matches!(result, Err(BusError::InvalidArgument { ref field, .. }) if field == "url"),
        "{:?}",
        result.err()
    );
}

/// The acks of one process hold for the next open of the directory (C20,
/// C21): nothing acknowledged is delivered again.
#[cfg(feature = "embedded")]
#[test]
fn file_url_consumer_resumes_after_its_acks_when_reopened() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let manifest = Manifest::new([TopicSpec::new("jobs", 1)]);
    {
        let bus = bus::open_consumers(&url, &manifest).unwrap();
        for n in 0..5 {
            bus.publish("jobs", "k", &serde_json::json!({ "n": n }))
                .unwrap();
        }
        assert_eq!(consume_and_ack(bus.as_ref(), "jobs", "w", 3), [0, 1, 2]);
    }
    let bus = bus::connect_consumers(&url).unwrap();
    assert_eq!(consume_and_ack(bus.as_ref(), "jobs", "w", 2), [3, 4]);
}

/// The consumer calls of a bus opened by URL run in the schema's spans.
#[test]
fn consumer_calls_run_in_spans() {
    let bus =
        bus::open_consumers("memory://", &Manifest::new([TopicSpec::new("jobs", 1)])).unwrap();
    bus.publish("jobs", "k", &serde_json::json!({"n": 0}))
        .unwrap();
    let every = || {
        consume_and_ack(bus.as_ref(), "jobs", "w", 1);
        bus.consumers("jobs").unwrap();
        bus.reset_consumer("jobs", "w", StartAt::Beginning).unwrap();
        bus.delete_consumer("jobs", "w").unwrap();
    };
    // Once before the subscriber, so the callsites are registered.
    every();
    let log = closed_spans(every);
    for span in [
        "bus.consume{backend=\"memory\" topic=jobs consumer=w}",
        "bus.consumers{backend=\"memory\" topic=jobs}",
        "bus.consumer.reset{backend=\"memory\" topic=jobs consumer=w}",
        "bus.consumer.delete{backend=\"memory\" topic=jobs consumer=w}",
    ] {
        assert!(
            log.lines()
                .any(|line| line.contains(span) && line.contains("close")),
            "no closed span {span} in:\n{log}"
        );
    }
}

/// What the operations `work` runs on this thread log at INFO, with a line
/// per closed span.
fn closed_spans(work: impl FnOnce()) -> String {
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

    let out = Captured::default();
    let writer = out.clone();
    let guard = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing_subscriber::filter::LevelFilter::INFO)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .finish()
        .set_default();
    work();
    drop(guard);
    String::from_utf8_lossy(&out.0.lock().unwrap()).into_owned()
}

/// The broker's URL, or `None` after a loud skip (a failure when brokers
/// are required).
#[cfg(any(feature = "nats", feature = "kafka", feature = "postgres"))]
fn broker(found: Result<String, bus_conformance::Unavailable>, test: &str) -> Option<String> {
    match found {
        Ok(url) => Some(url),
        Err(why) => {
            assert!(
                !bus_conformance::brokers_required(),
                "BUS_REQUIRE_BROKERS=1 but {why}"
            );
            bus_conformance::loud(&format!("SKIPPED {test}: {why}"));
            None
        }
    }
}

/// A broker URL consumes through the facade, with its acks kept by the
/// broker for the next connection (C20, C21).
#[cfg(any(feature = "nats", feature = "kafka", feature = "postgres"))]
fn url_consumes_and_resumes(url: &str) {
    let topic = format!("facade-consume-{}-{}", std::process::id(), bus::now_ms());
    let manifest = Manifest::new([TopicSpec::new(topic.as_str(), 1)]);
    {
        let bus = bus::open_consumers(url, &manifest).unwrap();
        for n in 0..4 {
            bus.publish(&topic, "k", &serde_json::json!({ "n": n }))
                .unwrap();
        }
        assert_eq!(consume_and_ack(bus.as_ref(), &topic, "w", 2), [0, 1]);
    }
    let bus = bus::connect_consumers(url).unwrap();
    assert_eq!(consume_and_ack(bus.as_ref(), &topic, "w", 2), [2, 3]);
    assert!(bus.delete_consumer(&topic, "w").unwrap());
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_url_consumes_and_resumes() {
    if let Some(url) = broker(
        bus_conformance::brokers::postgres_url(),
        "postgres_url_consumes_and_resumes",
    ) {
        url_consumes_and_resumes(&url);
    }
}

#[cfg(feature = "nats")]
#[test]
fn nats_url_consumes_and_resumes() {
    if let Some(url) = broker(
        bus_conformance::brokers::nats_url(),
        "nats_url_consumes_and_resumes",
    ) {
        url_consumes_and_resumes(&url);
    }
}

#[cfg(feature = "kafka")]
#[test]
fn kafka_url_consumes_and_resumes() {
    if let Some(brokers) = broker(
        bus_conformance::brokers::kafka_brokers(),
        "kafka_url_consumes_and_resumes",
    ) {
        url_consumes_and_resumes(&format!("kafka://{brokers}"));
    }
}
