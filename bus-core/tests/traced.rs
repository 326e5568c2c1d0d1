//! `Traced` writes the span schema once for every backend: each operation
//! of the sync and async surfaces runs in its span with the schema's
//! fields, and a bus used bare opens none.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::sync::{Arc, Mutex};

use bus_core::memory::MemoryBus;
use bus_core::{
    BatchRecord, EventBus, Manifest, Selector, StartAt, SubscribeOptions, TopicSpec, Traced,
};
use serde_json::json;
use tracing_subscriber::fmt::format::FmtSpan;

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

/// What `work` logged on this thread at INFO and above, with a line per
/// closed span.
fn spans_of(work: impl FnOnce()) -> String {
    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_span_events(FmtSpan::CLOSE)
        .finish();
    tracing::subscriber::with_default(subscriber, work);
    String::from_utf8(out.0.lock().unwrap().clone()).unwrap()
}

const TOPIC: &str = "traced";

/// Every traced operation once, through the sync surface.
fn every_operation(bus: &dyn EventBus) {
    bus.provision(&Manifest::new([TopicSpec::new(TOPIC, 1)]))
        .unwrap();
    let ack = bus.publish(TOPIC, "k", &json!({"n": 0})).unwrap();
    bus.publish_idempotent(TOPIC, "k", &json!({"n": 1}), "u1")
        .unwrap();
    bus.publish_batch(TOPIC, &[BatchRecord::new("k", json!({"n": 2}))])
        .unwrap();
    bus.fetch(TOPIC, ack.partition, 0, 5).unwrap();
    bus.find_event_by_uid(TOPIC, "k", "u1").unwrap();
    bus.offsets(TOPIC, 0).unwrap();
    bus.topic_spec(TOPIC).unwrap();
    bus.maintenance(0).unwrap();
    drop(
        bus.subscribe(
            TOPIC,
            Selector::Partition(0),
            StartAt::Beginning,
            SubscribeOptions::default(),
        )
        .unwrap(),
    );
}

/// The schema's span of each operation of `every_operation`, as the fmt
/// subscriber prints it.
fn schema(backend: &str) -> Vec<String> {
    let b = format!("backend=\"{backend}\"");
    vec![
        format!("bus.provision{{{b}}}"),
        format!("bus.publish{{{b} topic={TOPIC}}}"),
        format!("bus.publish_idempotent{{{b} topic={TOPIC} uid=u1}}"),
        format!("bus.publish_batch{{{b} topic={TOPIC} records=1}}"),
        format!("bus.fetch{{{b} topic={TOPIC} partition=0 offset=0 max=5}}"),
        format!("bus.find_event_by_uid{{{b} topic={TOPIC} uid=u1}}"),
        format!("bus.offsets{{{b} topic={TOPIC} partition=0}}"),
        format!("bus.topic_spec{{{b} topic={TOPIC}}}"),
        format!("bus.maintenance{{{b}}}"),
        format!("bus.subscribe{{{b} topic={TOPIC}}}"),
    ]
}

fn assert_closed_spans(log: &str, spans: &[String]) {
    for span in spans {
        assert!(
            log.lines()
                .any(|line| line.contains(span.as_str()) && line.contains("close")),
            "no closed span {span} in:\n{log}"
        );
    }
}

#[test]
fn every_sync_operation_runs_in_its_span() {
    // Once before the subscriber, so every callsite is registered and the
    // scoped subscriber's interest covers it (another test's thread could
    // otherwise register one while this subscriber is being made).
    every_operation(&Traced::new(MemoryBus::new()));
    let bus = Traced::new(MemoryBus::new());
    let log = spans_of(|| every_operation(&bus));
    assert_closed_spans(&log, &schema("memory"));
}

#[test]
fn a_bare_backend_opens_no_spans() {
    every_operation(&Traced::new(MemoryBus::new()));
    let bare = MemoryBus::new();
    let log = spans_of(|| every_operation(&bare));
    assert!(!log.contains("bus."), "a bare bus opened spans:\n{log}");
    // The same calls through the wrapper do (the check above can fail).
    let traced = Traced::new(MemoryBus::new());
    let log = spans_of(|| every_operation(&traced));
    assert!(log.contains("bus.publish{"), "{log}");
}

#[test]
fn the_backend_field_is_the_capabilities_name_or_the_given_one() {
    assert_eq!(Traced::new(MemoryBus::new()).backend(), "memory");
    let named = Traced::named(MemoryBus::new(), "custom");
    assert_eq!(named.backend(), "custom");
    every_operation(&Traced::named(MemoryBus::new(), "custom"));
    let log = spans_of(|| every_operation(&named));
    assert_closed_spans(&log, &schema("custom"));
}

#[cfg(feature = "async")]
#[test]
fn every_async_operation_runs_in_the_same_span() {
    use bus_core::AsyncEventBus;

    async fn every_async_operation(bus: &dyn AsyncEventBus) {
        bus.provision(&Manifest::new([TopicSpec::new(TOPIC, 1)]))
            .await
            .unwrap();
        let ack = bus.publish(TOPIC, "k", &json!({"n": 0})).await.unwrap();
        bus.publish_idempotent(TOPIC, "k", &json!({"n": 1}), "u1")
            .await
            .unwrap();
        bus.publish_batch(TOPIC, &[BatchRecord::new("k", json!({"n": 2}))])
            .await
            .unwrap();
        bus.fetch(TOPIC, ack.partition, 0, 5).await.unwrap();
        bus.find_event_by_uid(TOPIC, "k", "u1").await.unwrap();
        bus.offsets(TOPIC, 0).await.unwrap();
        bus.topic_spec(TOPIC).await.unwrap();
        bus.maintenance(0).await.unwrap();
        drop(
            bus.subscribe(
                TOPIC,
                Selector::Partition(0),
                StartAt::Beginning,
                SubscribeOptions::default(),
            )
            .await
            .unwrap(),
        );
    }

    futures::executor::block_on(every_async_operation(&Traced::new(MemoryBus::new())));
    let bus = Traced::new(MemoryBus::new());
    let log = spans_of(|| futures::executor::block_on(every_async_operation(&bus)));
    assert_closed_spans(&log, &schema("memory"));
}

/// Every durable-consumer operation once (C20): open, list, reset, delete.
fn every_consumer_operation<B: EventBus + bus_core::consumer::DurableConsumers>(bus: &B) {
    use bus_core::consumer::ConsumeOptions;

    bus.provision(&Manifest::new([TopicSpec::new(TOPIC, 1)]))
        .unwrap();
    bus.publish(TOPIC, "k", &json!({"n": 0})).unwrap();
    let mut consumer = bus
        .consume(
            TOPIC,
            "mailer",
            Selector::Topic,
            StartAt::Beginning,
            ConsumeOptions::default(),
        )
        .unwrap();
    let delivery = consumer.try_recv().unwrap().unwrap();
    consumer.ack(&delivery).unwrap();
    drop(consumer);
    assert_eq!(bus.consumers(TOPIC).unwrap().len(), 1);
    bus.reset_consumer(TOPIC, "mailer", StartAt::Beginning)
        .unwrap();
    assert!(bus.delete_consumer(TOPIC, "mailer").unwrap());
}

#[test]
fn every_consumer_operation_runs_in_its_span() {
    every_consumer_operation(&Traced::new(MemoryBus::new()));
    let bus = Traced::new(MemoryBus::new());
    let log = spans_of(|| every_consumer_operation(&bus));
    let b = "backend=\"memory\"";
    assert_closed_spans(
        &log,
        &[
            format!("bus.consume{{{b} topic={TOPIC} consumer=mailer}}"),
            format!("bus.consumers{{{b} topic={TOPIC}}}"),
            format!("bus.consumer.reset{{{b} topic={TOPIC} consumer=mailer}}"),
            format!("bus.consumer.delete{{{b} topic={TOPIC} consumer=mailer}}"),
        ],
    );
    // A bare bus's consumer calls open none (the check above can fail).
    let bare = MemoryBus::new();
    let log = spans_of(|| every_consumer_operation(&bare));
    assert!(
        !log.contains("bus.consum"),
        "a bare bus opened spans:\n{log}"
    );
}
