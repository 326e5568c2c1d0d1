//! The async surface against the sync one wrapped in `spawn_blocking`: 64
//! tasks publishing on a two-worker tokio runtime, in alternating rounds of
//! the same run, on the embedded log (`Durability::Sync`: every ack after
//! fdatasync) and, when `BUS_NATS_URL` / `BUS_KAFKA_BROKERS` /
//! `BUS_POSTGRES_URL` are set, on NATS, Kafka and PostgreSQL.
//!
//! ```sh
//! cargo run --release --example async_publish --features async
//! eval "$(scripts/brokers.sh up)"
//! cargo run --release --example async_publish --features async,nats,kafka,postgres
//! ```
//!
//! Environment: `TASKS` (64), `RECORDS` (records per task per round;
//! 200), `ROUNDS` (rounds of each surface; 3), `PARTITIONS` (4).
//!
//! Each task publishes its records one after another (key `task-N`), each
//! awaited before the next; latency is per publish, records/s is all
//! records of a round over its wall time; the table shows the median round
//! and the latency percentiles over all rounds of a surface.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use bus::{AsyncEventBus, BusError, EventBus, Manifest, TopicSpec};

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

#[derive(Clone, Copy)]
struct Shape {
    tasks: usize,
    records: usize,
    rounds: usize,
    partitions: u32,
}

/// One round's outcome: wall time and every publish's latency.
struct Round {
    wall: Duration,
    latencies: Vec<Duration>,
}

fn value(task: usize, n: usize) -> serde_json::Value {
    serde_json::json!({"task": task, "n": n, "event": "tool_call", "detail": "x".repeat(64)})
}

/// `shape.tasks` tasks, each awaiting `publish(task, n)` for its records
/// one after another; the round's wall time and every publish's latency.
async fn round<F, Fut>(shape: Shape, publish: F) -> Round
where
    F: Fn(usize, usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let started = Instant::now();
    let tasks: Vec<_> = (0..shape.tasks)
        .map(|task| {
            let publish = publish.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(shape.records);
                for n in 0..shape.records {
                    let at = Instant::now();
                    publish(task, n).await;
                    latencies.push(at.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.unwrap());
    }
    Round {
        wall: started.elapsed(),
        latencies,
    }
}

/// Each publish through the async surface.
async fn async_round(bus: Arc<dyn AsyncEventBus>, topic: &str, shape: Shape) -> Round {
    let topic: Arc<str> = topic.into();
    round(shape, move |task, n| {
        let (bus, topic) = (Arc::clone(&bus), Arc::clone(&topic));
        async move {
            let value = value(task, n);
            bus.publish(&topic, &format!("task-{task}"), &value)
                .await
                .unwrap();
        }
    })
    .await
}

/// Each publish through the sync surface, in `spawn_blocking`.
async fn sync_round(bus: Arc<dyn EventBus>, topic: &str, shape: Shape) -> Round {
    let topic: Arc<str> = topic.into();
    round(shape, move |task, n| {
        let (bus, topic) = (Arc::clone(&bus), Arc::clone(&topic));
        async move {
            tokio::task::spawn_blocking(move || {
                bus.publish(&topic, &format!("task-{task}"), &value(task, n))
                    .unwrap();
            })
            .await
            .unwrap();
        }
    })
    .await
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let index = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// Median records/s over rounds, p50 and p99 over all publishes.
struct Summary {
    rate: f64,
    p50: Duration,
    p99: Duration,
}

fn summarize(rounds: &[Round], shape: Shape) -> Summary {
    #[allow(clippy::cast_precision_loss)]
    let total = (shape.tasks * shape.records) as f64;
    let mut rates: Vec<f64> = rounds
        .iter()
        .map(|round| total / round.wall.as_secs_f64())
        .collect();
    rates.sort_by(f64::total_cmp);
    let mut all: Vec<Duration> = rounds
        .iter()
        .flat_map(|round| round.latencies.iter().copied())
        .collect();
    all.sort_unstable();
    Summary {
        rate: rates[rates.len() / 2],
        p50: percentile(&all, 0.50),
        p99: percentile(&all, 0.99),
    }
}

/// Alternating rounds (async first, then sync, ...) after one warm-up
/// round of each; prints two table rows.
async fn compare(
    backend: &str,
    asynchronous: Arc<dyn AsyncEventBus>,
    synchronous: Arc<dyn EventBus>,
    topic: &str,
    shape: Shape,
) {
    let warm = Shape {
        records: shape.records.min(20),
        ..shape
    };
    async_round(Arc::clone(&asynchronous), topic, warm).await;
    sync_round(Arc::clone(&synchronous), topic, warm).await;
    let (mut a, mut s) = (Vec::new(), Vec::new());
    for _ in 0..shape.rounds {
        a.push(async_round(Arc::clone(&asynchronous), topic, shape).await);
        s.push(sync_round(Arc::clone(&synchronous), topic, shape).await);
    }
    let (a, s) = (summarize(&a, shape), summarize(&s, shape));
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "| {backend} | async surface | {:.0} | {:.2} | {:.2} | {:.2} |",
        a.rate,
        ms(a.p50),
        ms(a.p99),
        a.rate / s.rate
    );
    println!(
        "| {backend} | sync in `spawn_blocking` | {:.0} | {:.2} | {:.2} | 1 |",
        s.rate,
        ms(s.p50),
        ms(s.p99)
    );
}

#[cfg(any(feature = "nats", feature = "kafka", feature = "postgres"))]
fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos());
    // Short: a NATS prefix is at most 32 characters.
    format!("{prefix}-{:x}", nanos % (1 << 40))
}

async fn embedded(shape: Shape) -> Result<(), BusError> {
    let dir = tempfile::tempdir()?;
    let bus = Arc::new(bus::EmbeddedBus::open(dir.path())?);
    let manifest = Manifest::new([TopicSpec::new("bench", shape.partitions)]);
    AsyncEventBus::provision(&*bus, &manifest).await?;
    compare(
        "embedded (Sync)",
        Arc::clone(&bus) as Arc<dyn AsyncEventBus>,
        bus as Arc<dyn EventBus>,
        "bench",
        shape,
    )
    .await;
    Ok(())
}

#[cfg(feature = "nats")]
async fn nats(shape: Shape) -> Result<(), BusError> {
    let Ok(url) = std::env::var("BUS_NATS_URL") else {
        eprintln!("BUS_NATS_URL is not set: no NATS rows");
        return Ok(());
    };
    let options = bus::NatsOptions::from_url(&url)?.prefix(unique("ba"));
    let asynchronous = Arc::new(bus::NatsBus::connect_async_with(options.clone()).await?);
    let opened = options.clone();
    let synchronous = Arc::new(
        tokio::task::spawn_blocking(move || bus::NatsBus::connect_with(opened))
            .await
            .unwrap()?,
    );
    let manifest = Manifest::new([TopicSpec::new("bench", shape.partitions)]);
    AsyncEventBus::provision(&*asynchronous, &manifest).await?;
    compare(
        "NATS",
        Arc::clone(&asynchronous) as Arc<dyn AsyncEventBus>,
        Arc::clone(&synchronous) as Arc<dyn EventBus>,
        "bench",
        shape,
    )
    .await;
    assert!(
        !asynchronous.connector_started(),
        "the async NATS bus started a connector thread"
    );
    // The same, with the async bus's connection task on a one-worker
    // runtime of its own (as `NatsBus::from_client` with a client
    // connected there would have it), not among the 64 publishing tasks.
    let side = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let apart = Arc::new(
        side.spawn(bus::NatsBus::connect_async_with(options))
            .await
            .unwrap()?,
    );
    compare(
        "NATS, connection on its own runtime",
        apart as Arc<dyn AsyncEventBus>,
        Arc::clone(&synchronous) as Arc<dyn EventBus>,
        "bench",
        shape,
    )
    .await;
    side.shutdown_background();
    Ok(())
}

#[cfg(feature = "kafka")]
async fn kafka(shape: Shape) -> Result<(), BusError> {
    let Ok(brokers) = std::env::var("BUS_KAFKA_BROKERS") else {
        eprintln!("BUS_KAFKA_BROKERS is not set: no Kafka rows");
        return Ok(());
    };
    let options = bus::KafkaOptions::from_url(&format!("kafka://{brokers}"))?;
    let asynchronous = Arc::new(bus::KafkaBus::connect_async_with(options.clone()).await?);
    let synchronous = Arc::new(
        tokio::task::spawn_blocking(move || bus::KafkaBus::connect_with(options))
            .await
            .unwrap()?,
    );
    let topic = unique("ba");
    let manifest = Manifest::new([TopicSpec::new(topic.clone(), shape.partitions)]);
    AsyncEventBus::provision(&*asynchronous, &manifest).await?;
    compare(
        "Kafka",
        Arc::clone(&asynchronous) as Arc<dyn AsyncEventBus>,
        Arc::clone(&synchronous) as Arc<dyn EventBus>,
        &topic,
        shape,
    )
    .await;
    assert!(
        !asynchronous.connector_started(),
        "the async Kafka bus started a connector thread"
    );
    tokio::task::spawn_blocking(move || synchronous.delete_topics(&[topic]))
        .await
        .unwrap()?;
    Ok(())
}

#[cfg(feature = "postgres")]
async fn postgres(shape: Shape) -> Result<(), BusError> {
    let Ok(url) = std::env::var("BUS_POSTGRES_URL") else {
        eprintln!("BUS_POSTGRES_URL is not set: no PostgreSQL rows");
        return Ok(());
    };
    // A schema of its own (lower case: PostgreSQL folds unquoted names).
    let options = bus::PostgresOptions::from_url(&url)?.schema(unique("ba").replace('-', "_"));
    let asynchronous = Arc::new(bus::PostgresBus::connect_async_with(options.clone()).await?);
    let synchronous = Arc::new(
        tokio::task::spawn_blocking(move || bus::PostgresBus::connect_with(options))
            .await
            .unwrap()?,
    );
    let manifest = Manifest::new([TopicSpec::new("bench", shape.partitions)]);
    AsyncEventBus::provision(&*asynchronous, &manifest).await?;
    compare(
        "PostgreSQL",
        Arc::clone(&asynchronous) as Arc<dyn AsyncEventBus>,
        synchronous as Arc<dyn EventBus>,
        "bench",
        shape,
    )
    .await;
    assert!(
        !asynchronous.connector_started(),
        "the async PostgreSQL bus started a connector thread"
    );
    Ok(())
}

fn main() -> Result<(), BusError> {
    let shape = Shape {
        tasks: env_or("TASKS", 64),
        records: env_or("RECORDS", 200),
        rounds: env_or("ROUNDS", 3).max(1),
        partitions: u32::try_from(env_or("PARTITIONS", 4)).unwrap_or(4),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    println!(
        "{} tasks x {} records per round, {} rounds of each surface alternating, {} partitions, 2 worker threads",
        shape.tasks, shape.records, shape.rounds, shape.partitions
    );
    println!();
    println!("| backend | surface | records/s | p50 ms | p99 ms | async / sync |");
    println!("|---|---|---:|---:|---:|---:|");
    runtime.block_on(async {
        embedded(shape).await?;
        #[cfg(feature = "nats")]
        nats(shape).await?;
        #[cfg(feature = "kafka")]
        kafka(shape).await?;
        #[cfg(feature = "postgres")]
        postgres(shape).await?;
        Ok::<_, BusError>(())
    })
}
