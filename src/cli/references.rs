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

/// Measures `backend`'s references and attaches them to its rows.
pub fn attach(
    backend: &str,
    _url: &str,
    dir: &std::path::Path,
    settings: super::bench::Settings,
    rows: &mut [super::bench::Row],
) -> Result<(), BusError> {
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
        for row in rows.iter_mut() {
            match row.phase.as_str() {
                "serial publish" => *row = row.clone().against("bare write+fdatasync", rate),
                phase if phase.ends_with("-thread publish") => {
                    if let Some(serial) = serial {
                        *row = row.clone().against("serial publish (this run)", serial);
                    }
                }
                _ => {}
            }
        }
    }
    Ok(())
}
