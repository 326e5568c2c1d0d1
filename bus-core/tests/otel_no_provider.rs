//! Feature `otel` with no tracer provider installed (this test binary
//! installs none): nothing is written when there is no context, and a
//! context the caller attached still travels (propagation without
//! recording, as the OpenTelemetry API's no-op tracer does).

#![allow(clippy::unwrap_used)]

use bus_core::memory::MemoryBus;
use bus_core::otel::{TRACEPARENT, creation_context};
use bus_core::{EventBus, Manifest, Selector, StartAt, SubscribeOptions, TopicSpec, Traced};
use opentelemetry::Context;
use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
};

fn bus() -> Traced<MemoryBus> {
    let bus = Traced::new(MemoryBus::new());
    bus.provision(&Manifest::new([TopicSpec::new("audit", 1)]))
        .unwrap();
    bus
}

#[test]
fn without_a_context_nothing_is_written() {
    let bus = bus();
    bus.publish("audit", "k", &serde_json::json!({"n": 1}))
        .unwrap();
    let stored = bus.fetch_with_headers("audit", 0, 0, 10).unwrap();
    assert!(stored[0].headers.is_empty(), "{:?}", stored[0].headers);
    let mut subscription = bus
        .subscribe(
            "audit",
            Selector::Topic,
            StartAt::Beginning,
            SubscribeOptions::default(),
        )
        .unwrap();
    assert!(subscription.try_recv().unwrap().is_some());
    assert!(
        subscription.delivery_context().is_none(),
        "nothing records, nothing to carry"
    );
}

#[test]
fn an_attached_context_travels_without_a_provider() {
    let bus = bus();
    let remote = SpanContext::new(
        TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
        SpanId::from_hex("00f067aa0ba902b7").unwrap(),
        TraceFlags::SAMPLED,
        true,
        TraceState::NONE,
    );
    {
        let _attached = Context::new()
            .with_remote_span_context(remote.clone())
            .attach();
        bus.publish("audit", "k", &serde_json::json!({"n": 1}))
            .unwrap();
    }
    let stored = bus.fetch_with_headers("audit", 0, 0, 10).unwrap();
    assert_eq!(
        stored[0].headers.get(TRACEPARENT),
        Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    );
    assert_eq!(creation_context(&stored[0].headers), Some(remote.clone()));
    let mut subscription = bus
        .subscribe(
            "audit",
            Selector::Topic,
            StartAt::Beginning,
            SubscribeOptions::default(),
        )
        .unwrap();
    assert!(subscription.try_recv().unwrap().is_some());
    let delivery = subscription
        .delivery_context()
        .expect("the record's context");
    assert_eq!(delivery.span().span_context().trace_id(), remote.trace_id());
}
