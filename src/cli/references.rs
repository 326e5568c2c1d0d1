//! What each backend's figures are compared with, measured in the same run.

use std::io::Write;
use std::time::Instant;

use bus::BusError;

/// Bare durable-append rate of the disk under `dir`: `bytes`-long appends,
/// each followed by `fdatasync`, for `count` rounds. Records per second.
pub fn fsync_rate(dir: &std::path::Path, bytes: usize, count: usize) -> Result<f64, BusError> {
    let path = dir.join("fsync-probe");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)?;
    let line = vec![b'x'; bytes];
    let start = Instant::now();
    for _ in 0..count {
        file.write_all(&line)?;
        file.sync_data()?;
    }
    let rate = count as f64 / start.elapsed().as_secs_f64().max(1e-9);
    drop(file);
    std::fs::remove_file(&path)?;
    Ok(rate)
}

/// Attaches `reference_per_s` to the row of `phase`.
fn against(rows: &mut [super::bench::Row], phase: &str, reference: &str, reference_per_s: f64) {
    for row in rows.iter_mut().filter(|row| row.phase == phase) {
        *row = row.clone().against(reference, reference_per_s);
    }
}

/// Raw rdkafka doing the same serial, batch and replay work on a topic
/// the bus provisioned.
#[cfg(feature = "kafka")]
fn kafka_reference(
    bus: &dyn bus::EventBus,
    url: &str,
    tag: &str,
    settings: super::bench::Settings,
    rows: &mut [super::bench::Row],
) -> Result<(), BusError> {
    use super::bench::event;
    let brokers = url.trim_start_matches("kafka://");
    let brokers = brokers.split('?').next().unwrap_or(brokers);
    let topic = format!("bench-{tag}-raw");
    bus.provision(&bus::Manifest::new([
        bus::TopicSpec::new(topic.clone(), 1).with_replication_factor(settings.replication)
    ]))?;
    let raw = bus_reference::kafka::RawKafka::new(brokers, &topic)?;
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
    against(rows, "serial publish", "raw rdkafka", serial_rate);
    against(rows, "batch publish (1000/call)", "raw rdkafka", batch_rate);
    against(
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
    bus: &dyn bus::EventBus,
    url: &str,
    tag: &str,
    settings: super::bench::Settings,
    rows: &mut [super::bench::Row],
) -> Result<(), BusError> {
    use super::bench::event;
    let events: Vec<serde_json::Value> = (0..settings.records)
        .map(|i| event(i, settings.event_bytes))
        .collect();
    let topic = format!("bench-{tag}-raw");
    bus.provision(&bus::Manifest::new([
        bus::TopicSpec::new(topic.clone(), 1).with_replication_factor(settings.replication)
    ]))?;
    let mut raw = bus_reference::postgres::RawPostgres::new(url, &topic)?;
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
    against(rows, "serial publish", "raw tokio-postgres", serial_rate);
    against(
        rows,
        "batch publish (1000/call)",
        "raw tokio-postgres",
        batch_rate,
    );
    against(
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
    settings: super::bench::Settings,
    rows: &mut [super::bench::Row],
) -> Result<(), BusError> {
    use super::bench::event;
    let servers = bus_nats::NatsOptions::from_url(url)?.servers;
    let events: Vec<serde_json::Value> = (0..settings.records)
        .map(|i| event(i, settings.event_bytes))
        .collect();
    let serial = bus_reference::nats::RawNats::replicated(
        &servers,
        &format!("bench-{tag}-raw-serial"),
        settings.replication,
    )?;
    let start = Instant::now();
    serial.serial(&events)?;
    let serial_rate = events.len() as f64 / start.elapsed().as_secs_f64().max(1e-9);
    drop(serial);
    let batch = bus_reference::nats::RawNats::replicated(
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
    against(rows, "serial publish", "raw async-nats", serial_rate);
    against(
        rows,
        "batch publish (1000/call)",
        "raw async-nats",
        batch_rate,
    );
    against(
        rows,
        "sequential replay (1000/fetch)",
        "raw async-nats",
        replay_rate,
    );
    nats_subscription_reference(&servers, tag, settings, rows)
}

/// Raw async-nats ordered push consumers doing the subscription phases'
/// work: delivery latency (serial publisher, each publish waiting for the
/// receipt) and fan-out to [`super::bench_subscribe::FAN_OUT`] consumers.
#[cfg(feature = "nats")]
fn nats_subscription_reference(
    servers: &[String],
    tag: &str,
    settings: super::bench::Settings,
    rows: &mut [super::bench::Row],
) -> Result<(), BusError> {
    use std::sync::{Arc, Mutex, mpsc};

    use super::bench::event;
    use super::bench_subscribe::FAN_OUT;
    use bus_reference::nats::{RawNats, spawn_push_readers};

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
    let delivery = super::bench::Row::new("nats", "raw").latencies(&mut deliveries);

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
    against(
        rows,
        &format!("fan-out ({FAN_OUT} subscribers)"),
        "raw async-nats push",
        fanout_rate,
    );
    Ok(())
}

/// Measures `backend`'s references and attaches them to its rows.
pub fn attach(
    bus: &dyn bus::EventBus,
    backend: &str,
    url: &str,
    tag: &str,
    dir: &std::path::Path,
    settings: super::bench::Settings,
    rows: &mut [super::bench::Row],
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
    if backend == "embedded" {
        let rate = fsync_rate(
            dir,
            settings.event_bytes,
            settings.records.clamp(200, 2_000),
        )?;
        let serial = rows
            .iter()
            .find(|row| row.phase == "serial publish")
            .and_then(|row| row.records_per_s);
        against(rows, "serial publish", "bare write+fdatasync", rate);
        if let Some(serial) = serial {
            let phase = format!("{}-thread publish", settings.threads);
            against(rows, &phase, "serial publish (this run)", serial);
        }
    }
    Ok(())
}
