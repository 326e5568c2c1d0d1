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
pub fn against(rows: &mut [crate::bench::Row], phase: &str, reference: &str, reference_per_s: f64) {
    for row in rows.iter_mut().filter(|row| row.phase == phase) {
        *row = row.clone().against(reference, reference_per_s);
    }
}

/// What `bus bench` prints beside a backend's figures, measured in the same
/// run. The command itself measures only what needs no second client (the
/// disk's bare `fdatasync` rate under the embedded log, see [`Disk`]); the
/// workspace's unpublished benchmarks member (`bus-bench`, example
/// `bench_side_by_side`) plugs in the raw async-nats, rdkafka and
/// tokio-postgres clients through this trait, so a published `bus` binary
/// builds none of them.
pub trait References {
    /// Measures `backend`'s references and attaches them to its `rows`.
    /// `bus` is the bus under test (for provisioning a reference topic),
    /// `url` how it was reached, `tag` names this run's topics and `dir` is
    /// a scratch directory on the embedded log's disk.
    #[allow(clippy::too_many_arguments)]
    fn attach(
        &self,
        bus: &dyn bus::EventBus,
        backend: &str,
        url: &str,
        tag: &str,
        dir: &std::path::Path,
        settings: crate::bench::Settings,
        rows: &mut [crate::bench::Row],
    ) -> Result<(), BusError>;
}

/// The references `bus bench` measures itself: for the embedded log, the
/// disk's bare write+`fdatasync` rate and the serial rate of this run (for
/// the threaded phase); nothing for the network backends.
#[derive(Debug, Clone, Copy, Default)]
pub struct Disk;

impl References for Disk {
    fn attach(
        &self,
        _bus: &dyn bus::EventBus,
        backend: &str,
        _url: &str,
        _tag: &str,
        dir: &std::path::Path,
        settings: crate::bench::Settings,
        rows: &mut [crate::bench::Row],
    ) -> Result<(), BusError> {
        if backend != "embedded" {
            return Ok(());
        }
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
        Ok(())
    }
}
