//! What the embedded log tells an operator through `tracing`: a torn tail
//! truncated on open is a warning, a partition poisoned by a failed fsync
//! is an error, each naming the topic and partition.
#![allow(clippy::unwrap_used)]

mod support;

use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bus_core::{BatchRecord, BusError, EventBus, Traced};
use bus_embedded::testing::FileLayer;
use bus_embedded::{EmbeddedBus, Options};
use support::{Captured, TOPIC, captured, open, provision, recovery_point, segments, value_for};

fn lines_with<'a>(log: &'a str, level: &str, message: &str) -> Vec<&'a str> {
    log.lines()
        .filter(|line| line.contains(level) && line.contains(message))
        .collect()
}

#[test]
fn a_truncated_torn_tail_is_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    {
        let bus = open(dir.path());
        provision(&bus, 1);
        bus.publish(TOPIC, "k", &value_for("a", 0)).unwrap();
    }
    let point = std::fs::read(recovery_point(dir.path(), 0)).unwrap();
    {
        let bus = open(dir.path());
        let batch: Vec<BatchRecord> = (1..4)
            .map(|i| BatchRecord::new("k", value_for("b", i)))
            .collect();
        bus.publish_batch(TOPIC, &batch).unwrap();
    }
    // A crash before the batch's frame was known complete, cut in its middle.
    let log = segments(dir.path(), 0)[0].clone();
    let bytes = std::fs::read(&log).unwrap();
    std::fs::write(&log, &bytes[..bytes.len() - 10]).unwrap();
    std::fs::write(recovery_point(dir.path(), 0), &point).unwrap();

    let clean = captured(|| drop(open(dir.path())));
    assert!(
        lines_with(&clean, "WARN", "torn tail").len() == 1,
        "expected one torn-tail warning:\n{clean}"
    );
    let line = lines_with(&clean, "WARN", "torn tail")[0];
    assert!(line.contains(&format!("topic={TOPIC}")), "{line}");
    assert!(line.contains("partition=0"), "{line}");
    assert!(line.contains("offset=1"), "{line}");

    // Once truncated, the next open has nothing to say.
    let again = captured(|| drop(open(dir.path())));
    assert!(
        lines_with(&again, "WARN", "torn tail").is_empty(),
        "{again}"
    );
}

/// Fails the first fdatasync of a frame after `healthy` have succeeded.
#[derive(Debug)]
struct FailingSync {
    syncs: AtomicU64,
    healthy: u64,
}

impl FileLayer for FailingSync {
    fn write_all_at(&self, file: &File, buf: &[u8], pos: u64) -> std::io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(file, buf, pos)
    }

    fn sync_data(&self, file: &File) -> std::io::Result<()> {
        if self.syncs.fetch_add(1, Ordering::SeqCst) == self.healthy {
            return Err(std::io::Error::other("injected fsync failure"));
        }
        file.sync_data()
    }
}

#[test]
fn a_poisoned_partition_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    provision(&open(dir.path()), 1);
    let layer = Arc::new(FailingSync {
        syncs: AtomicU64::new(0),
        healthy: 0,
    });
    let options = Options::default().file_layer(layer);
    let bus = EmbeddedBus::open_with(dir.path(), options).unwrap();
    let mut outcome = None;
    let log = captured(|| outcome = Some(bus.publish(TOPIC, "k", &value_for("x", 0))));
    assert!(
        matches!(outcome, Some(Err(BusError::Poisoned { .. }))),
        "{outcome:?}"
    );
    let errors = lines_with(&log, "ERROR", "poisoned");
    assert_eq!(errors.len(), 1, "expected one poisoning error:\n{log}");
    assert!(
        errors[0].contains("injected fsync failure"),
        "{}",
        errors[0]
    );
    assert!(
        errors[0].contains(&format!("topic={TOPIC}")),
        "{}",
        errors[0]
    );

    // Later calls fail with the same cause but do not repeat the event.
    let later = captured(|| assert!(bus.publish(TOPIC, "k", &value_for("y", 1)).is_err()));
    assert!(
        lines_with(&later, "ERROR", "poisoned").is_empty(),
        "{later}"
    );
}

/// Each operation of a bus wrapped in `Traced` (as `bus::open` returns it)
/// runs in a span naming the backend, the topic and (where the call has
/// one) the partition and offset.
#[test]
fn operations_run_in_spans_naming_backend_and_topic() {
    use tracing_subscriber::fmt::format::FmtSpan;
    let dir = tempfile::tempdir().unwrap();
    let bus = Traced::new(open(dir.path()));
    provision(&bus, 1);
    // Each operation once before the subscriber: its span's callsite is
    // then registered, and making the subscriber rebuilds its interest. A
    // callsite first registered by another test's thread while this
    // subscriber is being made could otherwise miss it.
    let warm = bus.publish(TOPIC, "k", &value_for("w", 0)).unwrap();
    bus.fetch(TOPIC, warm.partition, warm.offset, 1).unwrap();
    bus.find_event_by_uid(TOPIC, "k", "w").unwrap();
    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_span_events(FmtSpan::CLOSE)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let ack = bus.publish(TOPIC, "k", &value_for("a", 0)).unwrap();
        bus.fetch(TOPIC, ack.partition, 0, 5).unwrap();
        bus.find_event_by_uid(TOPIC, "k", "a").unwrap();
    });
    let log = out.text();
    for span in [
        format!("bus.publish{{backend=\"embedded\" topic={TOPIC}}}"),
        format!("bus.fetch{{backend=\"embedded\" topic={TOPIC} partition=0 offset=0 max=5}}"),
        format!("bus.find_event_by_uid{{backend=\"embedded\" topic={TOPIC} uid=a}}"),
    ] {
        assert!(
            log.lines()
                .any(|line| line.contains(&span) && line.contains("close")),
            "no closed span {span} in:\n{log}"
        );
    }
}

/// The async surface's futures run in the same spans as the sync calls.
#[cfg(feature = "async")]
#[test]
fn async_operations_run_in_the_same_spans() {
    use bus_core::AsyncEventBus;
    use tracing_subscriber::fmt::format::FmtSpan;
    let dir = tempfile::tempdir().unwrap();
    let bus = Traced::new(open(dir.path()));
    provision(&bus, 1);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let batch = [BatchRecord::new("k", value_for("b", 1))];
    let run = || {
        runtime.block_on(async {
            AsyncEventBus::publish(&bus, TOPIC, "k", &value_for("a", 0))
                .await
                .unwrap();
            AsyncEventBus::publish_idempotent(&bus, TOPIC, "k", &value_for("u", 0), "u7")
                .await
                .unwrap();
            AsyncEventBus::publish_batch(&bus, TOPIC, &batch)
                .await
                .unwrap();
            AsyncEventBus::fetch(&bus, TOPIC, 0, 0, 5).await.unwrap();
        });
    };
    // Once before the subscriber, to register the callsites (see above).
    run();
    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_span_events(FmtSpan::CLOSE)
        .finish();
    tracing::subscriber::with_default(subscriber, run);
    let log = out.text();
    for span in [
        format!("bus.publish{{backend=\"embedded\" topic={TOPIC}}}"),
        format!("bus.publish_idempotent{{backend=\"embedded\" topic={TOPIC} uid=u7}}"),
        format!("bus.publish_batch{{backend=\"embedded\" topic={TOPIC} records=1}}"),
        // A read, which runs on the blocking pool, is traced too.
        format!("bus.fetch{{backend=\"embedded\" topic={TOPIC} partition=0 offset=0 max=5}}"),
    ] {
        assert!(
            log.lines()
                .any(|line| line.contains(&span) && line.contains("close")),
            "no closed span {span} in:\n{log}"
        );
    }
}
