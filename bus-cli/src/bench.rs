//! `bus bench`: the same workloads through the trait on every reachable
//! backend, side by side, each next to a reference measured in the same run.

use std::time::{Duration, Instant};

use bus::{BatchRecord, BusError, EventBus, Manifest, TopicSpec};
use serde::{Deserialize, Serialize};

use super::progress;

/// Workload sizes.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Records per throughput phase.
    pub records: usize,
    /// Approximate JSON size of each event, in bytes.
    pub event_bytes: usize,
    /// Publisher threads in the concurrent phase.
    pub threads: usize,
    /// Samples per latency phase.
    pub samples: usize,
    /// Replication factor of the bench topics (and of the raw references'
    /// streams and topics), for measuring a cluster's cost of replication.
    pub replication: u16,
}

/// One measured figure.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Row {
    /// Backend (`embedded`, `nats`, ...).
    pub backend: String,
    /// Phase (`serial publish`, ...).
    pub phase: String,
    /// Records per second, for throughput phases.
    pub records_per_s: Option<f64>,
    /// Payload megabytes per second, for throughput phases.
    pub mb_per_s: Option<f64>,
    /// Median latency of one operation, microseconds.
    pub p50_us: Option<f64>,
    /// 99th percentile latency, microseconds.
    pub p99_us: Option<f64>,
    /// What the figure is compared with (measured in the same run).
    pub reference: Option<String>,
    /// The reference's records per second (or latency for latency phases).
    pub reference_value: Option<f64>,
    /// Figure divided by reference (higher is better for throughput).
    pub ratio: Option<f64>,
}

impl Row {
    /// An empty row of `backend`'s `phase`.
    pub fn new(backend: &str, phase: &str) -> Self {
        Self {
            backend: backend.to_owned(),
            phase: phase.to_owned(),
            records_per_s: None,
            mb_per_s: None,
            p50_us: None,
            p99_us: None,
            reference: None,
            reference_value: None,
            ratio: None,
        }
    }

    /// Fills the rate of `records` of `bytes` each in `took`, and the
    /// percentiles of `latencies`.
    pub fn throughput(
        mut self,
        records: usize,
        bytes: usize,
        took: Duration,
        latencies: &mut [Duration],
    ) -> Self {
        let secs = took.as_secs_f64().max(1e-9);
        self.records_per_s = Some(records as f64 / secs);
        self.mb_per_s = Some((records * bytes) as f64 / secs / 1e6);
        self.latencies(latencies)
    }

    /// Fills the p50 and p99 of `latencies` (sorted in place).
    pub fn latencies(mut self, latencies: &mut [Duration]) -> Self {
        if !latencies.is_empty() {
            latencies.sort_unstable();
            // Nearest-rank percentiles: index = ceil(n * pct / 100) - 1.
            let at = |pct: usize| {
                let index = (latencies.len() * pct).div_ceil(100).saturating_sub(1);
                latencies[index].as_secs_f64() * 1e6
            };
            self.p50_us = Some(at(50));
            self.p99_us = Some(at(99));
        }
        self
    }

    /// Attaches a latency reference (`ratio` = p50 / reference p50: lower
    /// is better).
    pub fn against_latency(mut self, reference: &str, reference_p50_us: f64) -> Self {
        self.reference = Some(reference.to_owned());
        self.reference_value = Some(reference_p50_us);
        self.ratio = self.p50_us.map(|p50| p50 / reference_p50_us.max(1e-9));
        self
    }

    /// Attaches a throughput reference (`ratio` = figure / reference).
    pub fn against(mut self, reference: &str, reference_per_s: f64) -> Self {
        self.reference = Some(reference.to_owned());
        self.reference_value = Some(reference_per_s);
        self.ratio = self
            .records_per_s
            .map(|rate| rate / reference_per_s.max(1e-9));
        self
    }
}

/// A ~`bytes`-long JSON event numbered `i`.
pub fn event(i: usize, bytes: usize) -> serde_json::Value {
    let base = serde_json::json!({"kind": "audit", "agent": "agent-7", "seq": i, "pad": ""});
    let used = base.to_string().len();
    serde_json::json!({"kind": "audit", "agent": "agent-7", "seq": i, "pad": "x".repeat(bytes.saturating_sub(used))})
}

fn timed<T>(op: impl FnOnce() -> Result<T, BusError>) -> Result<(T, Duration), BusError> {
    let start = Instant::now();
    let value = op()?;
    Ok((value, start.elapsed()))
}

/// Runs every trait-level phase on `bus` (topics named after `tag`).
pub fn run_trait_phases(
    bus: &dyn EventBus,
    backend: &str,
    tag: &str,
    settings: Settings,
) -> Result<Vec<Row>, BusError> {
    let Settings {
        records,
        event_bytes,
        threads,
        samples,
        replication,
    } = settings;
    let topic = |phase: &str| format!("bench-{tag}-{phase}");
    bus.provision(&Manifest::new(["serial", "threads", "batch"].map(
        |phase| TopicSpec::new(topic(phase), 1).with_replication_factor(replication),
    )))?;
    let mut rows = Vec::new();

    let bar = progress::bar(&format!("{backend}: serial publish"), Some(records as u64));
    let mut latencies = Vec::with_capacity(records);
    let (_, took) = timed(|| {
        for i in 0..records {
            let start = Instant::now();
            bus.publish(&topic("serial"), "k", &event(i, event_bytes))?;
            latencies.push(start.elapsed());
            bar.inc(1);
        }
        Ok(())
    })?;
    bar.finish_and_clear();
    rows.push(Row::new(backend, "serial publish").throughput(
        records,
        event_bytes,
        took,
        &mut latencies,
    ));

    let per_thread = records / threads.max(1);
    let (mut latencies, took) = timed(|| {
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let name = topic("threads");
                    scope.spawn(move || -> Result<Vec<Duration>, BusError> {
                        let mut own = Vec::with_capacity(per_thread);
                        for i in 0..per_thread {
                            let start = Instant::now();
                            bus.publish(&name, "k", &event(t * per_thread + i, event_bytes))?;
                            own.push(start.elapsed());
                        }
                        Ok(own)
                    })
                })
                .collect();
            let mut all = Vec::new();
            for handle in handles {
                all.extend(
                    handle
                        .join()
                        .map_err(|_| BusError::backend("bus", "bench thread panicked"))??,
                );
            }
            Ok(all)
        })
    })?;
    rows.push(
        Row::new(backend, &format!("{threads}-thread publish")).throughput(
            per_thread * threads,
            event_bytes,
            took,
            &mut latencies,
        ),
    );

    let batch: Vec<BatchRecord> = (0..1_000)
        .map(|i| BatchRecord::new("k", event(i, event_bytes)))
        .collect();
    let rounds = (records / batch.len()).max(1);
    let mut latencies = Vec::with_capacity(rounds);
    let (_, took) = timed(|| {
        for _ in 0..rounds {
            let start = Instant::now();
            bus.publish_batch(&topic("batch"), &batch)?;
            latencies.push(start.elapsed());
        }
        Ok(())
    })?;
    rows.push(Row::new(backend, "batch publish (1000/call)").throughput(
        rounds * batch.len(),
        event_bytes,
        took,
        &mut latencies,
    ));

    let stored = (rounds * batch.len()) as u64;
    let mut latencies = Vec::new();
    let (count, took) = timed(|| {
        let mut offset = 0;
        let mut count = 0;
        loop {
            let start = Instant::now();
            let page = bus.fetch(&topic("batch"), 0, offset, 1_000)?;
            latencies.push(start.elapsed());
            let Some(last) = page.last() else {
                return Ok(count);
            };
            offset = last.offset + 1;
            count += page.len();
        }
    })?;
    rows.push(
        Row::new(backend, "sequential replay (1000/fetch)").throughput(
            count,
            event_bytes,
            took,
            &mut latencies,
        ),
    );

    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next_random = move |bound: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % bound.max(1)
    };
    let mut latencies = Vec::with_capacity(samples);
    for _ in 0..samples {
        let offset = next_random(stored);
        let start = Instant::now();
        let got = bus.fetch(&topic("batch"), 0, offset, 1)?;
        latencies.push(start.elapsed());
        if got.first().map(|e| e.offset) != Some(offset) {
            return Err(BusError::backend(
                "bus",
                format!("bench: fetch({offset}) returned the wrong record"),
            ));
        }
    }
    rows.push(Row::new(backend, "random fetch(offset, 1)").latencies(&mut latencies));

    let uids: Vec<String> = (0..samples.min(records))
        .map(|i| format!("bench-uid-{tag}-{i}"))
        .collect();
    let with_uid: Vec<BatchRecord> = uids
        .iter()
        .enumerate()
        .map(|(i, uid)| BatchRecord::new("k", event(i, event_bytes)).with_uid(uid.clone()))
        .collect();
    for chunk in with_uid.chunks(1_000) {
        bus.publish_batch(&topic("serial"), chunk)?;
    }
    let mut latencies = Vec::with_capacity(uids.len());
    for _ in 0..samples {
        let uid = &uids[usize::try_from(next_random(uids.len() as u64)).unwrap_or(0)];
        let start = Instant::now();
        let found = bus.find_event_by_uid(&topic("serial"), "k", uid)?;
        latencies.push(start.elapsed());
        if found.is_none() {
            return Err(BusError::backend(
                "bus",
                format!("bench: uid {uid} not found"),
            ));
        }
    }
    rows.push(Row::new(backend, "find_event_by_uid").latencies(&mut latencies));

    let start_end = stored;
    let mut latencies = Vec::with_capacity(samples);
    for _ in 0..samples.min(200) {
        let start = Instant::now();
        let got = bus.fetch(&topic("batch"), 0, start_end, 100)?;
        latencies.push(start.elapsed());
        if !got.is_empty() {
            return Err(BusError::backend(
                "bus",
                "bench: fetch at the end returned records".to_owned(),
            ));
        }
    }
    rows.push(Row::new(backend, "fetch at end").latencies(&mut latencies));
    Ok(rows)
}

fn show(value: Option<f64>, digits: usize) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.digits$}"))
}

/// The human table.
pub fn table(rows: &[Row]) -> String {
    let mut out = format!(
        "{:<10} {:<32} {:>12} {:>9} {:>10} {:>10}  {:<28} {:>12} {:>7}\n",
        "backend",
        "phase",
        "records/s",
        "MB/s",
        "p50 µs",
        "p99 µs",
        "reference",
        "ref value",
        "ratio"
    );
    for row in rows {
        out.push_str(&format!(
            "{:<10} {:<32} {:>12} {:>9} {:>10} {:>10}  {:<28} {:>12} {:>7}\n",
            row.backend,
            row.phase,
            show(row.records_per_s, 0),
            show(row.mb_per_s, 1),
            show(row.p50_us, 1),
            show(row.p99_us, 1),
            row.reference.as_deref().unwrap_or("-"),
            show(row.reference_value, 0),
            show(row.ratio, 2),
        ));
    }
    out
}

/// Changes against an earlier run's rows.
pub fn compare(rows: &[Row], earlier: &[Row]) -> String {
    let mut out = format!(
        "{:<10} {:<32} {:>14} {:>14} {:>9}\n",
        "backend", "phase", "before", "now", "change"
    );
    for row in rows {
        let Some(old) = earlier
            .iter()
            .find(|old| old.backend == row.backend && old.phase == row.phase)
        else {
            continue;
        };
        let (before, now) = match (old.records_per_s, row.records_per_s) {
            (Some(before), Some(now)) => (before, now),
            _ => match (old.p50_us, row.p50_us) {
                (Some(before), Some(now)) => (before, now),
                _ => continue,
            },
        };
        let change = (now / before.max(1e-9) - 1.0) * 100.0;
        out.push_str(&format!(
            "{:<10} {:<32} {:>14.1} {:>14.1} {:>+8.1}%\n",
            row.backend, row.phase, before, now, change
        ));
    }
    out
}
