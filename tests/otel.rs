//! W3C trace context through the bus (feature `otel`, contract C25): one
//! trace from publish to delivery on every backend, with the SDK's
//! in-memory exporter. Each test owns its topic and finds its spans by its
//! own trace id, so they share the process's one global provider.

#![allow(clippy::unwrap_used)]

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bus::otel::TRACEPARENT;
use bus::{
    EventBus, Headers, Manifest, Selector, StartAt, SubscribeOptions, SubscriptionItem, TopicSpec,
};
use opentelemetry::trace::{SpanKind, TraceContextExt as _, TraceId, Tracer as _};
use opentelemetry::{Context, KeyValue, Value, global};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};

/// The exporter behind the global provider, installed once.
fn exporter() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<InMemorySpanExporter> = OnceLock::new();
    EXPORTER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        global::set_tracer_provider(provider);
        exporter
    })
}

/// The finished spans of `trace`, waiting until `count` of them are there.
fn spans_of(trace: TraceId, count: usize) -> Vec<SpanData> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let spans: Vec<SpanData> = exporter()
            .get_finished_spans()
            .unwrap()
            .into_iter()
            .filter(|span| span.span_context.trace_id() == trace)
            .collect();
        if spans.len() >= count || Instant::now() > deadline {
            return spans;
        }
        std::thread::yield_now();
    }
}

fn attribute<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|KeyValue { key: k, .. }| k.as_str() == key)
        .map(|kv| &kv.value)
}

fn topic(label: &str) -> String {
    format!("otel-{label}-{}-{}", std::process::id(), bus::now_ms())
}

/// The next record of `subscription`, polling until a deadline.
fn next_record(subscription: &mut bus::Subscription) -> SubscriptionItem {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Some(item @ SubscriptionItem::Record { .. }) = subscription
            .recv_timeout(Duration::from_millis(200))
            .unwrap()
        {
            return item;
        }
    }
    panic!("no record delivered within 20 s");
}

/// Publishes inside a root span and receives through a subscription: the
/// record's `traceparent`, the send span, the process span (its child) and
/// the delivery context all carry the root's trace id.
fn one_trace_from_publish_to_delivery(url: &str, label: &str, system: &str) {
    exporter();
    let topic = topic(label);
    let bus = bus::open(url, &Manifest::new([TopicSpec::new(topic.as_str(), 2)])).unwrap();
    let mut subscription = bus
        .subscribe(
            &topic,
            Selector::Topic,
            StartAt::Beginning,
            SubscribeOptions::default(),
        )
        .unwrap();

    let root = global::tracer("otel-test").start("agent action");
    let cx = Context::current_with_span(root);
    let trace = cx.span().span_context().trace_id();
    let ack = {
        let _attached = cx.clone().attach();
        bus.publish_idempotent(&topic, "agent-1", &serde_json::json!({"step": 1}), "evt-1")
            .unwrap()
    };

    let stored = bus
        .fetch_with_headers(&topic, ack.partition, ack.offset, 1)
        .unwrap();
    let traceparent = stored[0]
        .headers
        .get(TRACEPARENT)
        .expect("traceparent written");
    assert!(
        traceparent.contains(&format!("{trace}")),
        "{traceparent} names {trace}"
    );

    let item = next_record(&mut subscription);
    assert_eq!(item.event().unwrap().offset, ack.offset);
    let delivery = subscription
        .delivery_context()
        .expect("a delivery span")
        .clone();
    assert_eq!(delivery.span().span_context().trace_id(), trace);
    drop(subscription);
    cx.span().end();

    let spans = spans_of(trace, 4);
    let named = |name: String| {
        spans
            .iter()
            .find(|span| span.name == name)
            .unwrap_or_else(|| {
                panic!(
                    "no span {name:?} in {:?}",
                    spans.iter().map(|s| &s.name).collect::<Vec<_>>()
                )
            })
    };
    let send = named(format!("send {topic}"));
    let process = named(format!("process {topic}"));
    assert_eq!(send.span_kind, SpanKind::Producer);
    assert_eq!(process.span_kind, SpanKind::Consumer);
    assert_eq!(
        process.parent_span_id,
        send.span_context.span_id(),
        "process is the send span's child"
    );
    assert!(
        process
            .links
            .links
            .iter()
            .any(|link| link.span_context.span_id() == send.span_context.span_id())
    );
    assert_eq!(
        traceparent,
        format!("00-{trace}-{}-01", send.span_context.span_id())
    );
    for span in [send, process] {
        assert_eq!(
            attribute(span, "messaging.system"),
            Some(&Value::from(system.to_owned()))
        );
        assert_eq!(
            attribute(span, "messaging.destination.name"),
            Some(&Value::from(topic.clone()))
        );
        assert_eq!(
            attribute(span, "messaging.destination.partition.id"),
            Some(&Value::from(ack.partition.to_string()))
        );
        let offset = i64::try_from(ack.offset).unwrap();
        assert_eq!(attribute(span, "bus.offset"), Some(&Value::I64(offset)));
        if system == "kafka" {
            assert_eq!(
                attribute(span, "messaging.kafka.offset"),
                Some(&Value::I64(offset))
            );
        }
    }
    assert_eq!(
        attribute(send, "messaging.message.id"),
        Some(&Value::from("evt-1"))
    );
    assert_eq!(
        attribute(send, "messaging.operation.type"),
        Some(&Value::from("send"))
    );
    assert_eq!(
        attribute(process, "messaging.operation.type"),
        Some(&Value::from("process"))
    );
    println!(
        "otel {label}: trace {trace}: send {} -> process {} (parent {})",
        send.span_context.span_id(),
        process.span_context.span_id(),
        process.parent_span_id
    );
}

#[test]
fn memory_one_trace_from_publish_to_delivery() {
    one_trace_from_publish_to_delivery("memory://", "memory", "memory");
}

#[cfg(feature = "embedded")]
#[test]
fn embedded_one_trace_from_publish_to_delivery() {
    let dir = tempfile::tempdir().unwrap();
    one_trace_from_publish_to_delivery(
        &format!("file://{}", dir.path().display()),
        "embedded",
        "embedded",
    );
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

#[cfg(feature = "nats")]
#[test]
fn nats_one_trace_from_publish_to_delivery() {
    if let Some(url) = broker(
        bus_conformance::brokers::nats_url(),
        "nats_one_trace_from_publish_to_delivery",
    ) {
        one_trace_from_publish_to_delivery(&url, "nats", "nats");
    }
}

#[cfg(feature = "kafka")]
#[test]
fn kafka_one_trace_from_publish_to_delivery() {
    if let Some(brokers) = broker(
        bus_conformance::brokers::kafka_brokers(),
        "kafka_one_trace_from_publish_to_delivery",
    ) {
        one_trace_from_publish_to_delivery(&format!("kafka://{brokers}"), "kafka", "kafka");
    }
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_one_trace_from_publish_to_delivery() {
    if let Some(url) = broker(
        bus_conformance::brokers::postgres_url(),
        "postgres_one_trace_from_publish_to_delivery",
    ) {
        one_trace_from_publish_to_delivery(&url, "postgres", "postgresql");
    }
}

/// A record whose `traceparent` another producer wrote badly is delivered,
/// its context ignored with a warning: the process span starts a trace of
/// its own.
#[test]
fn a_malformed_traceparent_from_another_producer_is_ignored_with_a_warning() {
    exporter();
    let topic = topic("malformed");
    let bus = bus::Traced::new(bus::memory::MemoryBus::new());
    bus.provision(&Manifest::new([TopicSpec::new(topic.as_str(), 1)]))
        .unwrap();
    let bad = Headers::try_from_pairs([(TRACEPARENT, "00-not-a-trace-context-01")]).unwrap();
    // Another producer: the bare bus writes what it is given.
    bus.inner()
        .publish_with_headers(&topic, "k", &serde_json::json!({"n": 1}), None, &bad)
        .unwrap();
    let mut subscription = bus
        .subscribe(
            &topic,
            Selector::Topic,
            StartAt::Beginning,
            SubscribeOptions::default(),
        )
        .unwrap();
    let logs = captured(|| {
        let item = next_record(&mut subscription);
        assert_eq!(item.headers(), Some(&bad), "delivered as stored");
    });
    assert!(
        logs.contains("WARN") && logs.contains("not a W3C trace context"),
        "{logs}"
    );
    let delivery = subscription
        .delivery_context()
        .expect("a delivery span")
        .clone();
    let trace = delivery.span().span_context().trace_id();
    drop(subscription);
    let spans = spans_of(trace, 1);
    assert_eq!(spans.len(), 1);
    assert_eq!(spans[0].name, format!("process {topic}"));
    assert!(spans[0].links.links.is_empty());
}

/// A `traceparent` the caller set is kept as it is (the send span links
/// to it); one that is not W3C is refused, nothing stored.
#[test]
fn the_callers_traceparent_is_kept_and_a_bad_one_refused() {
    exporter();
    let topic = topic("caller");
    let bus = bus::open(
        "memory://",
        &Manifest::new([TopicSpec::new(topic.as_str(), 1)]),
    )
    .unwrap();
    let own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let headers = Headers::try_from_pairs([(TRACEPARENT, own)]).unwrap();
    let root = global::tracer("otel-test").start("caller");
    let cx = Context::current_with_span(root);
    {
        let _attached = cx.clone().attach();
        bus.publish_with_headers(&topic, "k", &serde_json::json!({"n": 1}), None, &headers)
            .unwrap();
    }
    let stored = bus.fetch_with_headers(&topic, 0, 0, 10).unwrap();
    assert_eq!(stored[0].headers.get(TRACEPARENT), Some(own));

    let bad = Headers::try_from_pairs([(TRACEPARENT, "01-zz")]).unwrap();
    let refused = bus
        .publish_with_headers(&topic, "k", &serde_json::json!({"n": 2}), None, &bad)
        .unwrap_err();
    assert!(
        matches!(&refused, bus::BusError::InvalidArgument { field, .. } if field == "headers.traceparent"),
        "{refused:?}"
    );
    assert_eq!(
        bus.fetch(&topic, 0, 0, 10).unwrap().len(),
        1,
        "nothing stored"
    );
    cx.span().end();
    let trace = cx.span().span_context().trace_id();
    let spans = spans_of(trace, 2);
    let send = spans
        .iter()
        .find(|span| span.name == format!("send {topic}"))
        .unwrap();
    assert!(
        send.links
            .links
            .iter()
            .any(|link| format!("{}", link.span_context.trace_id())
                == "0af7651916cd43dd8448eb211c80319c")
    );
}

/// A batch carries the context too, in every record: `publish_batch`
/// writes the batch's send span into each record's headers;
/// `publish_batch_with_headers` into each record without a `traceparent`
/// of its own (a record's own stays); a bad one refuses the whole batch,
/// naming the record, nothing stored.
#[test]
fn every_record_of_a_batch_carries_the_trace() {
    exporter();
    #[cfg_attr(not(feature = "embedded"), allow(unused_variables))]
    let dir = tempfile::tempdir().unwrap();
    #[cfg_attr(not(feature = "embedded"), allow(unused_mut))]
    let mut urls = vec!["memory://".to_owned()];
    #[cfg(feature = "embedded")]
    urls.push(format!("file://{}", dir.path().display()));
    for url in urls {
        let topic = topic("batch");
        let bus = bus::open(&url, &Manifest::new([TopicSpec::new(topic.as_str(), 1)])).unwrap();
        let root = global::tracer("otel-test").start("batch producer");
        let cx = Context::current_with_span(root);
        let trace = format!("{}", cx.span().span_context().trace_id());
        let own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let plain: Vec<bus::BatchRecord> = (0..3)
            .map(|n| bus::BatchRecord::new("k", serde_json::json!({"n": n})))
            .collect();
        let with_headers: Vec<bus::BatchRecordWithHeaders> = (3..6)
            .map(|n| {
                let headers = if n == 4 {
                    Headers::try_from_pairs([(TRACEPARENT, own)]).unwrap()
                } else {
                    Headers::new()
                };
                bus::BatchRecord::new("k", serde_json::json!({"n": n})).with_headers(headers)
            })
            .collect();
        let mut bad = with_headers.clone();
        bad[1].headers = Headers::try_from_pairs([(TRACEPARENT, "01-zz")]).unwrap();
        let refused = {
            let _attached = cx.clone().attach();
            bus.publish_batch(&topic, &plain).unwrap();
            bus.publish_batch_with_headers(&topic, &with_headers)
                .unwrap();
            bus.publish_batch_with_headers(&topic, &bad).unwrap_err()
        };
        cx.span().end();
        assert!(
            matches!(&refused, bus::BusError::InvalidArgument { field, .. } if field == "records[1].headers.traceparent"),
            "{url}: {refused:?}"
        );
        let stored = bus.fetch_with_headers(&topic, 0, 0, 100).unwrap();
        assert_eq!(stored.len(), 6, "{url}: the bad batch stored nothing");
        for (n, record) in stored.iter().enumerate() {
            let traceparent = record.headers.get(TRACEPARENT).unwrap_or_else(|| {
                panic!("{url}: record {n} has no traceparent: {:?}", record.headers)
            });
            if n == 4 {
                assert_eq!(traceparent, own, "{url}: the record's own context stays");
            } else {
                assert!(
                    traceparent.contains(&trace),
                    "{url}: record {n}: {traceparent} names {trace}"
                );
            }
        }
    }
}

/// Durable consumer deliveries get the same span: a child of the record's
/// creation context.
#[test]
fn a_consumer_delivery_continues_the_trace() {
    use bus::consumer::{ConsumeOptions, DurableConsumers as _};
    exporter();
    let topic = topic("consumer");
    let bus = bus::open_consumers(
        "memory://",
        &Manifest::new([TopicSpec::new(topic.as_str(), 1)]),
    )
    .unwrap();
    let root = global::tracer("otel-test").start("producer");
    let cx = Context::current_with_span(root);
    let trace = cx.span().span_context().trace_id();
    {
        let _attached = cx.clone().attach();
        bus.publish(&topic, "k", &serde_json::json!({"n": 1}))
            .unwrap();
    }
    cx.span().end();
    let mut consumer = bus
        .consume(
            &topic,
            "worker",
            Selector::Topic,
            StartAt::Beginning,
            ConsumeOptions::default(),
        )
        .unwrap();
    let delivery = consumer
        .recv_timeout(Duration::from_secs(10))
        .unwrap()
        .expect("a delivery");
    let context = consumer
        .delivery_context()
        .expect("a delivery span")
        .clone();
    assert_eq!(context.span().span_context().trace_id(), trace);
    consumer.ack(&delivery).unwrap();
    drop(consumer);
    let spans = spans_of(trace, 3);
    assert!(spans.iter().any(
        |span| span.name == format!("process {topic}") && span.span_kind == SpanKind::Consumer
    ));
}

/// The async surface writes the context of the call's current span and
/// its stream opens the delivery span.
#[cfg(feature = "async")]
#[test]
fn the_async_surface_carries_the_trace() {
    use futures::StreamExt as _;
    exporter();
    let topic = topic("async");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let bus = bus::open_async(
            "memory://",
            &Manifest::new([TopicSpec::new(topic.as_str(), 1)]),
        )
        .await
        .unwrap();
        let root = global::tracer("otel-test").start("async producer");
        let cx = Context::current_with_span(root);
        let trace = cx.span().span_context().trace_id();
        let value = serde_json::json!({"n": 1});
        let batch = [bus::BatchRecord::new("k", serde_json::json!({"n": 2}))];
        let (publish, publish_batch) = {
            let _attached = cx.clone().attach();
            (
                bus.publish(&topic, "k", &value),
                bus.publish_batch(&topic, &batch),
            )
        };
        publish.await.unwrap();
        let batched = publish_batch.await.unwrap()[0].offset;
        cx.span().end();
        let stored = bus.fetch_with_headers(&topic, 0, batched, 1).await.unwrap();
        let traceparent = stored[0]
            .headers
            .get(TRACEPARENT)
            .expect("the batch record's traceparent");
        assert!(
            traceparent.contains(&format!("{trace}")),
            "{traceparent} names {trace}"
        );
        let mut stream = bus
            .subscribe(
                &topic,
                Selector::Topic,
                StartAt::Beginning,
                SubscribeOptions::default(),
            )
            .await
            .unwrap();
        let item = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(item.headers().unwrap().get(TRACEPARENT).is_some());
        let context = stream.delivery_context().expect("a delivery span").clone();
        assert_eq!(context.span().span_context().trace_id(), trace);
        drop(stream);
        let spans = spans_of(trace, 3);
        assert!(
            spans
                .iter()
                .any(|span| span.name == format!("process {topic}"))
        );
    });
}

/// What `work` logs at WARN and above.
fn captured(work: impl FnOnce()) -> String {
    use std::sync::{Arc, Mutex};
    #[derive(Clone, Default)]
    struct Out(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Out {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let out = Out::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .finish();
    tracing::subscriber::with_default(subscriber, work);
    String::from_utf8_lossy(&out.0.lock().unwrap()).into_owned()
}
