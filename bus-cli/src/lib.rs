//! The `bus` command's pieces, as a library so the workspace's benchmarks
//! member (`bus-bench`) can run `bus bench`'s phases with raw-client
//! references beside them ([`references::References`]). The binary
//! (`src/main.rs`) is the product; this library is not a stable API.

#[cfg(feature = "cold")]
pub mod archive;
pub mod args;
pub mod bench;
pub mod bench_subscribe;
pub mod commands;
pub mod consume;
pub mod exit;
pub mod logging;
pub mod profile;
pub mod progress;
pub mod publish;
pub mod redact;
pub mod references;
pub mod tail;

use std::io::Write;

use bus::BusError;

/// Backends `bus bench` measures, with the URL it reaches each by: the one
/// `url` names, or every compiled-in backend.
fn bench_targets(url: Option<&str>) -> Result<Vec<(&'static str, String)>, BusError> {
    if let Some(url) = url {
        let backend = bus::backend_of(url)?;
        return Ok(vec![(backend.name, url.to_owned())]);
    }
    let mut targets = vec![("memory", "memory://".to_owned())];
    if cfg!(feature = "embedded") {
        targets.push(("embedded", String::new()));
    }
    if cfg!(feature = "nats") {
        let url =
            std::env::var("BUS_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
        targets.push(("nats", url));
    }
    if cfg!(feature = "kafka") {
        let brokers =
            std::env::var("BUS_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".to_owned());
        targets.push(("kafka", format!("kafka://{brokers}")));
    }
    if cfg!(feature = "postgres") {
        let url = std::env::var("BUS_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://bus:bus@127.0.0.1:5433/bus".to_owned());
        targets.push(("postgres", url));
    }
    Ok(targets)
}

/// `bus bench`: the backend `url` names, or every reachable one; one table,
/// each backend's rows next to what `references` measures in the same run.
#[allow(clippy::too_many_arguments)]
pub fn run_bench(
    url: Option<&str>,
    settings: bench::Settings,
    idle: std::time::Duration,
    only: &[String],
    json: bool,
    compare: Option<&std::path::Path>,
    references: &dyn references::References,
    out: &mut impl Write,
) -> Result<(), BusError> {
    let tag = format!("{:x}", bus::now_ms());
    let mut rows = Vec::new();
    let named = url.is_some();
    for (backend, url) in bench_targets(url)? {
        if !only.is_empty() && !only.iter().any(|name| name == backend) {
            continue;
        }
        // The embedded bench writes into a fresh directory, never into the
        // user's data: beside the named one (same disk), else in the temp dir.
        let temp = match embedded_dir(backend, &url) {
            Some(named) => bench_dir_beside(&named)?,
            None => tempdir_for(backend)?,
        };
        let url = if backend == "embedded" {
            format!("file://{}", temp.join("data").display())
        } else {
            url
        };
        let bus = match bus::connect(&url) {
            Ok(bus) => bus,
            Err(error) if named => return Err(error),
            Err(error) => {
                exit::warn(&format!("bench: skipping {backend} ({url}): {error}"));
                continue;
            }
        };
        let mut measured = bench::run_trait_phases(bus.as_ref(), backend, &tag, settings)?;
        measured.extend(bench_subscribe::run(
            bus.as_ref(),
            backend,
            &tag,
            settings,
            idle,
        )?);
        references.attach(
            bus.as_ref(),
            backend,
            &url,
            &tag,
            &temp,
            settings,
            &mut measured,
        )?;
        rows.extend(measured);
        drop(bus);
        let _ = std::fs::remove_dir_all(&temp);
    }
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&rows)?)?;
    } else {
        write!(out, "{}", bench::table(&rows))?;
    }
    if let Some(path) = compare {
        let earlier: Vec<bench::Row> = serde_json::from_str(&std::fs::read_to_string(path)?)?;
        write!(out, "\n{}", bench::compare(&rows, &earlier))?;
    }
    Ok(())
}

/// The directory an embedded `--url` names, if any.
fn embedded_dir(backend: &str, url: &str) -> Option<std::path::PathBuf> {
    if backend != "embedded" || url.is_empty() {
        return None;
    }
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let path = rest.split_once('?').map_or(rest, |(path, _)| path);
    (!path.is_empty()).then(|| std::path::PathBuf::from(path))
}

/// A fresh directory beside `named` (on its disk), reported on stderr.
fn bench_dir_beside(named: &std::path::Path) -> Result<std::path::PathBuf, BusError> {
    let parent = match named.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let name = named
        .file_name()
        .map_or_else(|| "bus".into(), |name| name.to_string_lossy().into_owned());
    let dir = parent.join(format!(".{name}.bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    exit::warn(&format!(
        "bench: embedded runs in {} (beside {}, removed afterwards; your data is not touched)",
        dir.display(),
        named.display()
    ));
    Ok(dir)
}

fn tempdir_for(backend: &str) -> Result<std::path::PathBuf, BusError> {
    let dir = std::env::temp_dir().join(format!("bus-bench-{backend}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
