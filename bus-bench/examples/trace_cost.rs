//! What the operation spans cost on the serial publish path when nobody
//! listens: publishes one record at a time on the in-memory bus (where any
//! overhead shows most) and on the embedded log without an fsync per
//! record, and prints nanoseconds per publish. Each bus runs twice:
//! wrapped in `Traced` (what `bus::open` returns: the spans) and bare (no
//! spans), so the wrapper's own cost shows in one build.
//!
//! Build it twice and run the two side by side, in turns, on one machine:
//!
//! ```text
//! cargo build --release -p bus-bench --example trace_cost
//! CARGO_TARGET_DIR=target/trace-off cargo build --release -p bus-bench \
//!     --example trace_cost --features tracing/max_level_off
//! ```
//!
//! `--subscriber` installs a `fmt` subscriber at WARN (what the CLI has by
//! default): the spans are then disabled by level, not by absence.

use std::time::Instant;

use bus_core::memory::MemoryBus;
use bus_core::{EventBus, Manifest, TopicSpec, Traced};
use bus_embedded::{Durability, EmbeddedBus, Options};

const TOPIC: &str = "trace-cost";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let records: usize = args
        .iter()
        .position(|a| a == "--records")
        .and_then(|i| args.get(i + 1))
        .map_or(Ok(200_000), |n| n.parse())?;
    if args.iter().any(|a| a == "--subscriber") {
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_writer(std::io::stderr)
            .finish();
        tracing::subscriber::set_global_default(subscriber)?;
    }
    let manifest = Manifest::new([TopicSpec::new(TOPIC, 1)]);
    let value = serde_json::json!({"kind": "audit", "agent": "a-1", "step": 1});

    let memory = Traced::new(MemoryBus::new());
    memory.provision(&manifest)?;
    let dir = tempfile::tempdir()?;
    let options = Options::default().durability(Durability::Interval(1_000));
    let embedded = Traced::new(EmbeddedBus::open_with(dir.path(), options)?);
    embedded.provision(&manifest)?;

    for (name, bus) in [
        ("memory traced", &memory as &dyn EventBus),
        ("memory bare", memory.inner()),
        ("embedded traced", &embedded),
        ("embedded bare", embedded.inner()),
    ] {
        // Warm up, then time.
        for _ in 0..records / 10 {
            bus.publish(TOPIC, "k", &value)?;
        }
        let started = Instant::now();
        for _ in 0..records {
            bus.publish(TOPIC, "k", &value)?;
        }
        let ns = started.elapsed().as_nanos() / records as u128;
        println!("{name} ns/publish {ns}");
    }
    Ok(())
}
