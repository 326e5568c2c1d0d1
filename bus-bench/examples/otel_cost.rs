//! What the `otel` feature costs on the serial publish path: publishes one
//! record at a time through `Traced` (what `bus::open` returns) on the
//! in-memory bus and on the embedded log with `Durability::Sync` (an fsync
//! per publish), without and with two headers of the caller's (`+hdrs`),
//! and prints nanoseconds per publish.
//!
//! One build without the feature measures `off`; one build with it
//! measures `no-provider` (the feature on, no tracer provider installed:
//! what a library user who never set up OpenTelemetry pays) and then
//! `exporter` (an SDK provider with the in-memory exporter and the simple
//! processor: every publish records and exports its `send` span, and its
//! `traceparent` is written into the record's headers, since each publish
//! runs inside a parent span). Run the two in turns on one machine:
//!
//! ```text
//! cargo build --release -p bus-bench --example otel_cost
//! cp target/release/examples/otel_cost /tmp/otel_cost_off
//! cargo build --release -p bus-bench --example otel_cost --features otel
//! for round in 1 2 3; do /tmp/otel_cost_off; target/release/examples/otel_cost; done
//! ```

use std::time::Instant;

use bus_core::memory::MemoryBus;
use bus_core::{EventBus, Headers, Manifest, TopicSpec, Traced};
use bus_embedded::{Durability, EmbeddedBus, Options};

const TOPIC: &str = "otel-cost";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: usize| -> Result<usize, std::num::ParseIntError> {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map_or(Ok(default), |n| n.parse())
    };
    let memory_records = arg("--records", 200_000)?;
    let sync_records = arg("--sync-records", 2_000)?;
    let manifest = Manifest::new([TopicSpec::new(TOPIC, 1)]);

    #[cfg(not(feature = "otel"))]
    run("off", &manifest, memory_records, sync_records, &|| ())?;
    #[cfg(feature = "otel")]
    {
        run(
            "no-provider",
            &manifest,
            memory_records,
            sync_records,
            &|| (),
        )?;
        let exporter = opentelemetry_sdk::trace::InMemorySpanExporter::default();
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        opentelemetry::global::set_tracer_provider(provider);
        use opentelemetry::trace::{TraceContextExt as _, Tracer as _};
        let parent = opentelemetry::global::tracer("otel_cost").start("run");
        let _attached = opentelemetry::Context::current_with_span(parent).attach();
        // The in-memory exporter keeps every span: emptied before each
        // timed loop so memory does not grow across them.
        run("exporter", &manifest, memory_records, sync_records, &|| {
            exporter.reset();
        })?;
        let exported = exporter.get_finished_spans()?.len();
        eprintln!("exporter: {exported} spans exported in the last round");
    }
    Ok(())
}

fn run(
    mode: &str,
    manifest: &Manifest,
    memory_records: usize,
    sync_records: usize,
    clear: &dyn Fn(),
) -> Result<(), Box<dyn std::error::Error>> {
    let value = serde_json::json!({"kind": "audit", "agent": "a-1", "step": 1});
    let headers = Headers::try_from_pairs([("source", "agent-1"), ("run", "r-77")])?;
    let memory = Traced::new(MemoryBus::new());
    memory.provision(manifest)?;
    let dir = tempfile::tempdir()?;
    let options = Options::default().durability(Durability::Sync);
    let embedded = Traced::new(EmbeddedBus::open_with(dir.path(), options)?);
    embedded.provision(manifest)?;
    for (name, bus, records) in [
        ("memory", &memory as &dyn EventBus, memory_records),
        ("embedded-sync", &embedded, sync_records),
    ] {
        for _ in 0..records / 10 {
            bus.publish(TOPIC, "k", &value)?;
        }
        clear();
        let started = Instant::now();
        for _ in 0..records {
            bus.publish(TOPIC, "k", &value)?;
        }
        let ns = started.elapsed().as_nanos() / records as u128;
        println!("{mode:<12} {name:<14} ns/publish {ns}");
        // The same publishes with two headers of the caller's own (C25).
        clear();
        let started = Instant::now();
        for _ in 0..records {
            bus.publish_with_headers(TOPIC, "k", &value, None, &headers)?;
        }
        let ns = started.elapsed().as_nanos() / records as u128;
        println!("{mode:<12} {:<14} ns/publish {ns}", format!("{name}+hdrs"));
    }
    Ok(())
}
