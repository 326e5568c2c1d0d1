//! `bus bench`'s subscription phases: delivery latency from the publish
//! call to the subscriber's receipt, fan-out to 64 subscribers, and the CPU
//! an idle subscription uses.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use bus::{
    BatchRecord, BusError, EventBus, Manifest, Selector, StartAt, SubscribeOptions, Subscription,
    SubscriptionItem, TopicSpec,
};

use super::bench::{Row, Settings, event};

/// Subscribers in the fan-out phase.
pub const FAN_OUT: usize = 64;

/// Runs the subscription phases on `bus` (topics named after `tag`).
pub fn run(
    bus: &dyn EventBus,
    backend: &str,
    tag: &str,
    settings: Settings,
    idle: Duration,
) -> Result<Vec<Row>, BusError> {
    let topic = |phase: &str| format!("bench-{tag}-sub-{phase}");
    bus.provision(&Manifest::new(["latency", "fanout", "idle"].map(|phase| {
        TopicSpec::new(topic(phase), 1).with_replication_factor(settings.replication)
    })))?;
    let mut rows = vec![delivery_latency(bus, backend, &topic("latency"), settings)?];
    rows.push(fan_out(bus, backend, &topic("fanout"), settings)?);
    if !idle.is_zero() {
        rows.push(idle_cpu(bus, backend, &topic("idle"), idle)?);
    }
    Ok(rows)
}

fn subscribe_now(bus: &dyn EventBus, topic: &str) -> Result<Subscription, BusError> {
    bus.subscribe(
        topic,
        Selector::Partition(0),
        StartAt::Now,
        SubscribeOptions::default(),
    )
}

/// One publisher publishes serially; a subscriber on another thread
/// receives. Each sample is publish call start → receipt, the next publish
/// waiting for the receipt; the reference is the publish ack latency of the
/// same samples.
fn delivery_latency(
    bus: &dyn EventBus,
    backend: &str,
    topic: &str,
    settings: Settings,
) -> Result<Row, BusError> {
    let samples = settings.samples.max(10);
    let mut subscription = subscribe_now(bus, topic)?;
    let (receipts, received) = mpsc::channel::<Result<Instant, BusError>>();
    let mut deliveries = Vec::with_capacity(samples);
    let mut acks = Vec::with_capacity(samples);
    std::thread::scope(|scope| -> Result<(), BusError> {
        scope.spawn(move || {
            for _ in 0..samples {
                let item = match subscription.recv_timeout(Duration::from_secs(30)) {
                    Ok(Some(SubscriptionItem::Record { .. })) => Ok(Instant::now()),
                    Ok(other) => Err(BusError::backend(
                        "bus",
                        format!("bench: expected a record, got {other:?}"),
                    )),
                    Err(error) => Err(error),
                };
                let failed = item.is_err();
                if receipts.send(item).is_err() || failed {
                    return;
                }
            }
        });
        for i in 0..samples {
            let start = Instant::now();
            bus.publish(topic, "k", &event(i, settings.event_bytes))?;
            acks.push(start.elapsed());
            let at = received
                .recv()
                .map_err(|_| BusError::backend("bus", "bench: subscriber stopped"))??;
            deliveries.push(at.duration_since(start));
        }
        Ok(())
    })?;
    let ack = Row::new(backend, "ack").latencies(&mut acks);
    Ok(Row::new(backend, "delivery latency (publish→subscriber)")
        .latencies(&mut deliveries)
        .against_latency("publish ack p50 (same run)", ack.p50_us.unwrap_or(0.0)))
}

/// 64 subscribers from "now"; the records are published in batches of
/// 1,000; the figure is records delivered per second over all subscribers,
/// from the first publish to the last receipt.
fn fan_out(
    bus: &dyn EventBus,
    backend: &str,
    topic: &str,
    settings: Settings,
) -> Result<Row, BusError> {
    let records = settings.records.max(1_000);
    let subscriptions = (0..FAN_OUT)
        .map(|_| subscribe_now(bus, topic))
        .collect::<Result<Vec<_>, _>>()?;
    let batch: Vec<BatchRecord> = (0..1_000)
        .map(|i| BatchRecord::new("k", event(i, settings.event_bytes)))
        .collect();
    let start = Instant::now();
    let took = std::thread::scope(|scope| -> Result<Duration, BusError> {
        let readers: Vec<_> = subscriptions
            .into_iter()
            .map(|mut subscription| {
                scope.spawn(move || -> Result<Instant, BusError> {
                    let mut seen = 0;
                    while seen < records {
                        match subscription.recv_timeout(Duration::from_secs(60))? {
                            Some(SubscriptionItem::Record { .. }) => seen += 1,
                            Some(other) => {
                                return Err(BusError::backend(
                                    "bus",
                                    format!("bench: unexpected {other:?}"),
                                ));
                            }
                            None => {
                                return Err(BusError::backend(
                                    "bus",
                                    format!("bench: a subscriber stalled after {seen} records"),
                                ));
                            }
                        }
                    }
                    Ok(Instant::now())
                })
            })
            .collect();
        for _ in 0..records / batch.len() {
            bus.publish_batch(topic, &batch)?;
        }
        let mut last = start;
        for reader in readers {
            let done = reader
                .join()
                .map_err(|_| BusError::backend("bus", "bench: subscriber panicked"))??;
            last = last.max(done);
        }
        Ok(last.duration_since(start))
    })?;
    let delivered = (records / batch.len()) * batch.len() * FAN_OUT;
    Ok(
        Row::new(backend, &format!("fan-out ({FAN_OUT} subscribers)")).throughput(
            delivered,
            settings.event_bytes,
            took,
            &mut [],
        ),
    )
}

/// CPU ticks (user + system) this process used, from `/proc/self/stat`.
fn cpu_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of stat(5), counted after the command name.
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// One subscription waits for `idle` with nothing published: the process's
/// CPU over that time, in percent of one core (clock ticks of 10 ms).
fn idle_cpu(
    bus: &dyn EventBus,
    backend: &str,
    topic: &str,
    idle: Duration,
) -> Result<Row, BusError> {
    let mut subscription = subscribe_now(bus, topic)?;
    let before = cpu_ticks();
    let start = Instant::now();
    if let Some(item) = subscription.recv_timeout(idle)? {
        return Err(BusError::backend(
            "bus",
            format!("bench: an idle subscription received {item:?}"),
        ));
    }
    let ticks = cpu_ticks()
        .zip(before)
        .map(|(after, before)| after - before);
    let mut row = Row::new(backend, &format!("idle subscription CPU % ({idle:?})"));
    row.records_per_s = ticks.map(|ticks| ticks as f64 / start.elapsed().as_secs_f64());
    Ok(row)
}
