//! What the embedded log reports to an operator's metrics recorder
//! (cargo feature `metrics`): records and bytes stored, dedup hits, fsync
//! time, group-commit sizes and subscription lag.
#![cfg(feature = "metrics")]
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use bus_core::{EventBus, Selector, StartAt, SubscribeOptions, SubscriptionItem};
use metrics::{SharedString, Unit};
use metrics_util::CompositeKey;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use support::{TOPIC, open, provision, value_for};

type Metrics = Vec<(CompositeKey, Option<Unit>, Option<SharedString>, DebugValue)>;

/// The value of metric `name` (summed over its label sets, histograms as
/// the number of samples and their sum).
fn read(metrics: &Metrics, name: &str) -> (f64, usize) {
    let mut total = 0.0;
    let mut samples = 0;
    for (key, _, _, value) in metrics {
        if key.key().name() != name {
            continue;
        }
        match value {
            DebugValue::Counter(n) => total += *n as f64,
            DebugValue::Gauge(g) => total += g.into_inner(),
            DebugValue::Histogram(h) => {
                samples += h.len();
                total += h.iter().map(|v| v.into_inner()).sum::<f64>();
            }
        }
    }
    (total, samples)
}

#[test]
fn stores_dedup_hits_fsyncs_rounds_and_lag_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // A lone publisher leads its own rounds and a subscription reads on the
    // caller's thread, so a recorder local to this thread sees everything.
    metrics::with_local_recorder(&recorder, || {
        let bus = open(dir.path());
        provision(&bus, 1);
        for i in 0..5 {
            bus.publish_idempotent(TOPIC, "k", &value_for("u", i), &format!("uid-{i}"))
                .unwrap();
        }
        // Two retries answered with the stored records.
        bus.publish_idempotent(TOPIC, "k", &value_for("u", 0), "uid-0")
            .unwrap();
        bus.publish_idempotent(TOPIC, "k", &value_for("u", 3), "uid-3")
            .unwrap();
        let mut sub = bus
            .subscribe(
                TOPIC,
                Selector::Partition(0),
                StartAt::Beginning,
                SubscribeOptions::default().max_lag(2),
            )
            .unwrap();
        let first = sub.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(
            first,
            Some(SubscriptionItem::Lagged {
                partition: 0,
                skipped: 3,
                next_offset: 3
            })
        );
    });
    // One snapshot: taking one drains the histograms.
    let snapshot = snapshotter.snapshot().into_vec();
    let (stored, _) = read(&snapshot, "bus_records_stored_total");
    assert_eq!(stored, 5.0, "five records stored, retries not counted");
    let (bytes, _) = read(&snapshot, "bus_bytes_stored_total");
    let values: usize = (0..5)
        .map(|i| serde_json::to_vec(&value_for("u", i)).unwrap().len())
        .sum();
    assert!(
        bytes > values as f64,
        "bytes stored count the frames, values and headers: {bytes} vs {values}"
    );
    assert_eq!(read(&snapshot, "bus_dedup_hits_total").0, 2.0);
    let (fsync_total, fsyncs) = read(&snapshot, "bus_fsync_seconds");
    assert_eq!(fsyncs, 5, "one fsync per round that wrote");
    assert!(fsync_total > 0.0);
    let (round_records, rounds) = read(&snapshot, "bus_commit_round_records");
    assert_eq!((round_records, rounds), (5.0, 5));
    assert_eq!(read(&snapshot, "bus_subscription_lagged_total").0, 3.0);
    assert_eq!(read(&snapshot, "bus_subscription_lag_records").0, 5.0);
}
