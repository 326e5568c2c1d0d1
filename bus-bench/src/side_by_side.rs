//! `bus bench` with the raw clients beside the bus: the command's own
//! phases and table (`bus_cli::bench`), with each network backend's figures
//! next to plain async-nats, rdkafka or tokio-postgres doing the same work in
//! the same run. The published `bus` binary cannot depend on this
//! unpublished crate, so it measures the bus alone (plus the disk's bare
//! `fdatasync` under the embedded log); this is the side-by-side, run as
//! `cargo run --release -p bus-bench --features nats,kafka,postgres
//! --example bench_side_by_side -- [bus bench flags]`.

#[cfg(any(feature = "nats", feature = "kafka", feature = "postgres"))]
use std::time::Instant;

use bus_cli::references::{self, References};
use bus_core::{BusError, EventBus};

/// The raw-client references of every backend compiled into this crate, and
/// the disk reference of `bus bench` for the embedded log.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawClients;

impl References for RawClients {
    fn attach(
        &self,
        bus: &dyn EventBus,
        backend: &str,
        url: &str,
        tag: &str,
        dir: &std::path::Path,
        settings: bus_cli::bench::Settings,
        rows: &mut [bus_cli::bench::Row],
    ) -> Result<(), BusError> {
        let _ = (bus, url, tag);
        #[cfg(feature = "nats")]
        if backend == "nats" {
            nats_reference(url, tag, settings, rows)?;
        }
        #[cfg(feature = "kafka")]
        if backend == "kafka" {
            kafka_reference(bus, url, tag, settings, rows)?;
        }
        #[cfg(feature = "postgres")]
        if backend == "postgres" {
            postgres_reference(bus, url, tag, settings, rows)?;
        }
        references::Disk.attach(bus, backend, url, tag, dir, settings, rows)
    }
}

/// Raw rdkafka doing the same serial, batch and replay work on a topic
/// the bus provisioned.
#[cfg(feature = "kafka")]
fn kafka_reference(
    bus: &dyn EventBus,
    url: &str,
    tag: &str,
    settings: bus_cli::bench::Settings,
    rows: &mut [bus_cli::bench::Row],
) -> Result<(), BusError> {
    use bus_cli::bench::event;
    let brokers = url.trim_start_matches("kafka://");
    let brokers = brokers.split('?').next().unwrap_or(brokers);
    let topic = format!("bench-{tag}-raw");
    bus.provision(&bus_core::Manifest::new([bus_core::TopicSpec::new(
        topic.clone(),
        1,
    )
    .with_replication_factor(settings.replication)]))?;
    let raw = crate::kafka::RawKafka::new(brokers, &topic)?;
    let serial: Vec<serde_json::Value> = (0..settings.records)
        .map(|i| event(i, settings.event_bytes))
        .collect();
    let start = Instant::now();
    raw.serial(&serial)?;
    let serial_rate = serial.len() as f64 / start.elapsed().as_secs_f64().max(1e-9);
    let start = Instant::now();
    for chunk in serial.chunks(1_000) {
        raw.batch(chunk)?;
    }
    let batch_rate = serial.len() as f64 / start.elapsed().as_secs_f64().max(1e-9);
    let start = Instant::now();
    let seen = raw.replay()?;
    let replay_rate = seen as f64 / start.elapsed().as_secs_f64().max(1e-9);
    references::against(rows, "serial publish", "raw rdkafka", serial_rate);
    references::against(rows, "batch publish (1000/call)", "raw rdkafka", batch_rate);
    references::against(
        rows,
        "sequential replay (1000/fetch)",
        "raw rdkafka",
        replay_rate,
    );
    Ok(())
}

/// A raw tokio-postgres client running the bus's own SQL for the same
/// serial, batch and replay work, on a topic the bus provisioned.
#[cfg(feature = "postgres")]
fn postgres_reference(
    bus: &dyn EventBus,
    url: &str,
    tag: &str,
    settings: bus_cli::bench::Settings,
    rows: &mut [bus_cli::bench::Row],
) -> Result<(), BusError> {
    use bus_cli::bench::event;
    let events: Vec<serde_json::Value> = (0..settings.records)
        .map(|i| event(i, settings.event_bytes))
        .collect();
    let topic = format!("bench-{tag}-raw");
    bus.provision(&bus_core::Manifest::new([bus_core::TopicSpec::new(
        topic.clone(),
        1,
    )
    .with_replication_factor(settings.replication)]))?;
    let mut raw = crate::postgres::RawPostgres::new(url, &topic)?;
    let start = Instant::now();
    raw.serial(&events)?;
    let serial_rate = events.len() as f64 / start.elapsed().as_secs_f64().max(1e-9);
    let start = Instant::now();
    for chunk in events.chunks(1_000) {
        raw.batch(chunk)?;
    }
    let batch_rate = events.len() as f64 / start.elapsed().as_secs_f64().max(1e-9);
    let start = Instant::now();
    let seen = raw.replay(1_000)?;
    let replay_rate = seen as f64 / start.elapsed().as_secs_f64().max(1e-9);
    references::against(rows, "serial publish", "raw tokio-postgres", serial_rate);
    references::against(
        rows,
        "batch publish (1000/call)",
        "raw tokio-postgres",
        batch_rate,
    );
    references::against(
        rows,
        "sequential replay (1000/fetch)",
        "raw tokio-postgres",
        replay_rate,
    );
    Ok(())
}

/// Raw async-nats doing the same serial, batch and replay work.
#[cfg(feature = "nats")]
fn nats_reference(
    url: &str,
    tag: &str,
    settings: bus_cli::bench::Settings,
    rows: &mut [bus_cli::bench::Row],
) -> Result<(), BusError> {
    use bus_cli::bench::event;
    let servers = bus_nats::NatsOptions::from_url(url)?.servers;
    let events: Vec<serde_json::Value> = (0..settings.records)
        .map(|i| event(i, settings.event_bytes))
        .collect();
    let serial = crate::nats::RawNats::replicated(
        &servers,
        &format!("bench-{tag}-raw-serial"),
        settings.replication,
    )?;
    let start = Instant::now();
    serial.serial(&events)?;
    let serial_rate = events.len() as f64 / start.elapsed().as_secs_f64().max(1e-9);
    drop(serial);
    let batch = crate::nats::RawNats::replicated(
        &servers,
        &format!("bench-{tag}-raw-batch"),
        settings.replication,
    )?;
    let start = Instant::now();
    batch.batch(&events)?;
    let batch_rate = events.len() as f64 / start.elapsed().as_secs_f64().max(1e-9);
    let start = Instant::now();
    let seen = batch.replay()?;
    let replay_rate = seen as f64 / start.elapsed().as_secs_f64().max(1e-9);
    references::against(rows, "serial publish", "raw async-nats", serial_rate);
    references::against(
        rows,
        "batch publish (1000/call)",
        "raw async-nats",
        batch_rate,
    );
    references::against(
        rows,
        "sequential replay (1000/fetch)",
        "raw async-nats",
        replay_rate,
    );
    nats_subscription_reference(&servers, tag, settings, rows)
}

/// Raw async-nats ordered push consumers doing the subscription phases'
/// work: delivery latency (serial publisher, each publish waiting for the
/// receipt) and fan-out to [`bus_cli::bench_subscribe::FAN_OUT`] consumers.
#[cfg(feature = "nats")]
fn nats_subscription_reference(
    servers: &[String],
    tag: &str,
    settings: bus_cli::bench::Settings,
    rows: &mut [bus_cli::bench::Row],
) -> Result<(), BusError> {
    use std::sync::{Arc, Mutex, mpsc};

    use crate::nats::{RawNats, spawn_push_readers};
    use bus_cli::bench::event;
    use bus_cli::bench_subscribe::FAN_OUT;

    let samples = settings.samples.max(10);
    let raw = RawNats::replicated(
        servers,
        &format!("bench-{tag}-raw-delivery"),
        settings.replication,
    )?;
    let (receipts, received) = mpsc::channel::<Instant>();
    let receipts = Mutex::new(receipts);
    let reader = spawn_push_readers(
        servers,
        raw.name(),
        1,
        1,
        samples,
        Arc::new(move |_, _: &[u8]| {
            let _ = receipts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .send(Instant::now());
        }),
    )?;
    let mut deliveries = Vec::with_capacity(samples);
    for i in 0..samples {
        let start = Instant::now();
        raw.serial(&[event(i, settings.event_bytes)])?;
        let at = received
            .recv()
            .map_err(|_| BusError::backend("bus", "bench: raw push reader stopped"))?;
        deliveries.push(at.duration_since(start));
    }
    reader
        .join()
        .map_err(|_| BusError::backend("bus", "bench: raw push reader panicked"))??;
    drop(raw);
    let delivery = bus_cli::bench::Row::new("nats", "raw").latencies(&mut deliveries);

    let records = settings.records.max(1_000) / 1_000 * 1_000;
    let raw = RawNats::replicated(
        servers,
        &format!("bench-{tag}-raw-fanout"),
        settings.replication,
    )?;
    let readers = spawn_push_readers(
        servers,
        raw.name(),
        1,
        FAN_OUT,
        records,
        Arc::new(|_, payload: &[u8]| {
            let value: serde_json::Value =
                serde_json::from_slice(payload).unwrap_or(serde_json::Value::Null);
            std::hint::black_box(value);
        }),
    )?;
    let events: Vec<serde_json::Value> =
        (0..1_000).map(|i| event(i, settings.event_bytes)).collect();
    let start = Instant::now();
    for _ in 0..records / 1_000 {
        raw.batch(&events)?;
    }
    let done = readers
        .join()
        .map_err(|_| BusError::backend("bus", "bench: raw push readers panicked"))??;
    let last = done.into_iter().max().unwrap_or(start);
    let fanout_rate = (records * FAN_OUT) as f64 / last.duration_since(start).as_secs_f64();

    for row in rows.iter_mut() {
        if row.phase == "delivery latency (publish→subscriber)" {
            *row = row
                .clone()
                .against_latency("raw async-nats push p50", delivery.p50_us.unwrap_or(0.0));
        }
    }
    references::against(
        rows,
        &format!("fan-out ({FAN_OUT} subscribers)"),
        "raw async-nats push",
        fanout_rate,
    );
    Ok(())
}
