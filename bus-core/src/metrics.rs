//! What the backends report to an operator's metrics system, through the
//! [`metrics`](https://docs.rs/metrics) facade (cargo feature `metrics`;
//! without it every function here is an empty inline call). Install any
//! recorder (Prometheus exporter, StatsD, ...) to collect them; with none
//! installed they cost a relaxed atomic load.
//!
//! Records and bytes stored come from every backend; dedup hits from
//! memory, embedded, NATS (a window duplicate) and PostgreSQL; fsync time
//! from embedded; group-commit sizes from embedded and PostgreSQL; the
//! subscription figures from every backend's subscriptions.
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `bus_records_stored_total` | counter | backend, topic | records newly stored (a deduplicated retry is not counted) |
//! | `bus_bytes_stored_total` | counter | backend, topic | their encoded bytes (embedded: the frames written) |
//! | `bus_dedup_hits_total` | counter | backend, topic | publishes answered with an earlier record of the same UID |
//! | `bus_fsync_seconds` | histogram | backend | one write's durability wait (embedded: the round's fdatasync) |
//! | `bus_commit_round_records` | histogram | backend | records written by one group-commit round |
//! | `bus_subscription_lagged_total` | counter | backend, topic | records a subscription reported as skipped (`Lagged`) |
//! | `bus_subscription_lag_records` | gauge | backend, topic, partition | records between a subscription's position and the partition's head, at its last read |

/// Records newly stored on `topic`, with their encoded bytes.
#[inline]
pub fn stored(backend: &'static str, topic: &str, records: u64, bytes: u64) {
    #[cfg(feature = "metrics")]
    {
        let topic = topic.to_owned();
        metrics::counter!("bus_records_stored_total", "backend" => backend, "topic" => topic.clone())
            .increment(records);
        metrics::counter!("bus_bytes_stored_total", "backend" => backend, "topic" => topic)
            .increment(bytes);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (backend, topic, records, bytes);
}

/// `hits` publishes on `topic` answered with an earlier record of their UID.
#[inline]
pub fn dedup_hits(backend: &'static str, topic: &str, hits: u64) {
    #[cfg(feature = "metrics")]
    if hits > 0 {
        metrics::counter!("bus_dedup_hits_total", "backend" => backend, "topic" => topic.to_owned())
            .increment(hits);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (backend, topic, hits);
}

/// One write's durability wait.
#[inline]
pub fn fsync(backend: &'static str, took: std::time::Duration) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("bus_fsync_seconds", "backend" => backend).record(took.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (backend, took);
}

/// Records written by one group-commit round.
#[inline]
pub fn commit_round(backend: &'static str, records: usize) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("bus_commit_round_records", "backend" => backend).record(records as f64);
    #[cfg(not(feature = "metrics"))]
    let _ = (backend, records);
}

/// A subscription on `topic` reported `skipped` records as lost.
#[inline]
pub fn lagged(topic: &str, skipped: u64) {
    #[cfg(feature = "metrics")]
    metrics::counter!("bus_subscription_lagged_total", "topic" => topic.to_owned())
        .increment(skipped);
    #[cfg(not(feature = "metrics"))]
    let _ = (topic, skipped);
}

/// A subscription's distance from the head of `topic`/`partition`.
#[inline]
pub fn lag(topic: &str, partition: u32, records: u64) {
    #[cfg(feature = "metrics")]
    metrics::gauge!(
        "bus_subscription_lag_records",
        "topic" => topic.to_owned(),
        "partition" => partition.to_string()
    )
    .set(records as f64);
    #[cfg(not(feature = "metrics"))]
    let _ = (topic, partition, records);
}
