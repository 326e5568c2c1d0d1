//! The data subcommands: JSON lines out, one clear error line on failure.

use std::io::Write;
use std::time::Duration;

use bus::{BusError, EventBus, Manifest, partition_for};

use super::progress;

/// Records per fetch while replaying.
const PAGE: usize = 1_000;

/// `provision MANIFEST`.
pub fn provision(url: &str, path: &std::path::Path, out: &mut impl Write) -> Result<(), BusError> {
    let text = std::fs::read_to_string(path).map_err(|error| {
        BusError::invalid(
            "manifest",
            format!("cannot read {}: {error}", path.display()),
        )
    })?;
    let manifest = Manifest::parse(&text)?;
    bus::open(url, &manifest)?;
    for topic in &manifest.topics {
        writeln!(
            out,
            "provisioned {} ({} partitions)",
            topic.name, topic.partitions
        )?;
    }
    Ok(())
}

/// `topics`: a table, or JSON lines with `--json`.
pub fn topics(bus: &dyn EventBus, json: bool, out: &mut impl Write) -> Result<(), BusError> {
    if !json {
        writeln!(
            out,
            "{:<32} {:>9} {:>12} {:>12} {:>10}",
            "topic", "partition", "first", "next", "records"
        )?;
    }
    let acks = ack_durability(bus.capabilities().ack_durability);
    for topic in bus.topics() {
        let partitions = bus.partitions(&topic)?;
        for partition in 0..partitions {
            let offsets = bus.offsets(&topic, partition)?;
            if json {
                let line = serde_json::json!({
                    "topic": topic, "partition": partition, "partitions": partitions,
                    "first": offsets.first, "next": offsets.next, "records": offsets.retained(),
                    "ack_durability": acks,
                });
                writeln!(out, "{line}")?;
            } else {
                writeln!(
                    out,
                    "{:<32} {:>9} {:>12} {:>12} {:>10}",
                    topic,
                    partition,
                    offsets.first,
                    offsets.next,
                    offsets.retained()
                )?;
            }
        }
    }
    if !json {
        writeln!(out, "acks: {acks} (README \"Clusters and durability\")")?;
    }
    Ok(())
}

/// What an ack guarantees, in the words of README "Clusters and durability".
fn ack_durability(durability: bus::AckDurability) -> String {
    match durability {
        bus::AckDurability::Disk => "disk (fsynced before the ack)".to_owned(),
        bus::AckDurability::Replicated { min_insync } => format!(
            "replicated (on {min_insync} replicas before the ack, topics at replication_factor >= 3)"
        ),
        bus::AckDurability::None => "none (not durable beyond the process / page cache)".to_owned(),
        _ => "unknown (set by the server's configuration, e.g. NATS sync_interval)".to_owned(),
    }
}

/// Parses one JSON value; `line` names the stdin line in the error.
pub fn parse_json(text: &str, line: Option<usize>) -> Result<serde_json::Value, BusError> {
    serde_json::from_str(text).map_err(|error| {
        let field = line.map_or_else(|| "json".to_owned(), |n| format!("stdin line {n}"));
        BusError::invalid(field, format!("not valid JSON: {error}"))
    })
}

/// Which partition a `--partition`/`--key` pair names.
pub fn resolve_partition(
    bus: &dyn EventBus,
    topic: &str,
    partition: Option<u32>,
    key: Option<&str>,
) -> Result<Option<u32>, BusError> {
    Ok(match (partition, key) {
        (Some(partition), _) => Some(partition),
        (None, Some(key)) => Some(partition_for(key, bus.partitions(topic)?)),
        (None, None) => None,
    })
}

/// `fetch`: up to `max` records (all when `None`) from `from`.
pub fn fetch(
    bus: &dyn EventBus,
    topic: &str,
    partition: u32,
    from: u64,
    max: Option<usize>,
    value_only: bool,
    out: &mut impl Write,
) -> Result<(), BusError> {
    let mut offset = from;
    let mut left = max.unwrap_or(usize::MAX);
    let bar = progress::bar("replay", None);
    while left > 0 {
        let page = bus.fetch_with_headers(topic, partition, offset, left.min(PAGE))?;
        let Some(last) = page.last() else { break };
        offset = last.event.offset + 1;
        left -= page.len();
        bar.inc(page.len() as u64);
        for record in &page {
            if value_only {
                writeln!(out, "{}", record.event.value)?;
            } else {
                writeln!(
                    out,
                    "{}",
                    record_line(topic, &record.event, &record.headers)
                )?;
            }
        }
    }
    bar.finish_and_clear();
    Ok(())
}

/// Opens `url`, waiting while another writer holds an embedded directory's
/// lock: 10 s, or `BUS_LOCK_WAIT_MS` (readers take no lock: they open
/// read-only).
pub fn connect(url: &str) -> Result<Box<dyn EventBus>, BusError> {
    with_lock_wait(|| bus::connect(url))
}

/// Runs `open` again while it fails with [`BusError::Locked`] (another
/// writer holds an embedded directory), for up to 10 s or
/// `BUS_LOCK_WAIT_MS`.
pub fn with_lock_wait<T>(open: impl Fn() -> Result<T, BusError>) -> Result<T, BusError> {
    let wait = std::env::var("BUS_LOCK_WAIT_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map_or(Duration::from_secs(10), Duration::from_millis);
    let deadline = std::time::Instant::now() + wait;
    let mut pause = Duration::from_millis(2);
    loop {
        match open() {
            Err(BusError::Locked { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

/// One record as a JSON line: topic, partition, offset, key, UID (when the
/// value carries one), stored_at, value, and its headers (C25) when it has
/// any.
pub fn record_line(
    topic: &str,
    event: &bus::StoredEvent,
    headers: &bus::Headers,
) -> serde_json::Value {
    let mut line = serde_json::json!({
        "topic": topic,
        "partition": event.partition,
        "offset": event.offset,
        "key": event.key,
        "stored_at": event.stored_at,
        "value": event.value,
    });
    if let Some(uid) = bus::embedded_uid(&event.value) {
        line["uid"] = uid.into();
    }
    if !headers.is_empty() {
        line["headers"] = serde_json::json!(headers);
    }
    line
}

/// Opens `url` for a command that only reads: like [`connect`], but an
/// embedded directory that does not exist is an error rather than a new,
/// empty bus created as a side effect of looking.
pub fn connect_existing(url: &str) -> Result<Box<dyn EventBus>, BusError> {
    require_existing_dir(url)?;
    connect(url)
}

/// Fails (exit 2, a bad `--url`) when `url` names an embedded directory
/// that does not exist.
pub fn require_existing_dir(url: &str) -> Result<(), BusError> {
    let Some(path) = embedded_dir(url) else {
        return Ok(());
    };
    if path.is_empty() || std::path::Path::new(path).is_dir() {
        return Ok(());
    }
    Err(BusError::invalid(
        "url",
        format!(
            "no bus at {path}: the directory does not exist (check --url, or create the bus \
             with `bus --url {path} provision MANIFEST`)"
        ),
    ))
}

/// The directory `url` names when it is an embedded log's (`file://DIR`,
/// or a bare path), without its query.
pub fn embedded_dir(url: &str) -> Option<&str> {
    if !bus::backend_of(url).is_ok_and(|backend| backend.name == "embedded") {
        return None;
    }
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    Some(rest.split_once('?').map_or(rest, |(path, _)| path))
}

/// Opens `url` for reading beside a writer: an embedded directory is opened
/// read-only (no lock taken, so publishers are never kept out).
pub fn connect_reader(url: &str) -> Result<Box<dyn EventBus>, BusError> {
    require_existing_dir(url)?;
    match url.split_once("://") {
        Some(("file", rest)) if !rest.contains('?') => {
            bus::connect(&format!("{url}?read_only=true"))
        }
        None => bus::connect(&format!("file://{url}?read_only=true")),
        _ => connect(url),
    }
}

/// `find`: the ack of the record with `uid`.
pub fn find(
    bus: &dyn EventBus,
    topic: &str,
    key: &str,
    uid: &str,
    out: &mut impl Write,
) -> Result<bool, BusError> {
    match bus.find_event_by_uid(topic, key, uid)? {
        Some(ack) => {
            writeln!(out, "{}", serde_json::to_string(&ack)?)?;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// `describe TOPIC`: its spec (where the backend reports it), the
/// backend's capabilities, and offsets and record counts per partition, as
/// one JSON object.
pub fn describe(bus: &dyn EventBus, topic: &str, out: &mut impl Write) -> Result<(), BusError> {
    let partitions = bus.partitions(topic)?;
    let capabilities = bus.capabilities();
    let mut rows = Vec::new();
    let mut records = 0u64;
    for partition in 0..partitions {
        let offsets = bus.offsets(topic, partition)?;
        records += offsets.retained();
        rows.push(serde_json::json!({
            "partition": partition, "first": offsets.first, "next": offsets.next,
            "records": offsets.retained(),
        }));
    }
    let dedup = match capabilities.dedup_horizon {
        bus::DedupHorizon::Retained => "as long as the record is retained",
        _ => "at least the topic's dedup_window_ms",
    };
    let ack = if capabilities.durable {
        "an acked record survives a restart of the bus (see the README: what an ack guarantees)"
    } else {
        "not durable: records live as long as the process"
    };
    let retention = match (
        capabilities.native_retention,
        capabilities.maintenance_retention,
    ) {
        (true, _) => "enforced by the broker",
        (false, true) => "enforced by `bus maintenance`",
        (false, false) => "none",
    };
    let spec = bus.topic_spec(topic)?;
    let line = serde_json::json!({
        "topic": topic,
        "partitions": partitions,
        "spec": spec,
        "records": records,
        "capabilities": {
            "backend": capabilities.backend,
            "durable": capabilities.durable,
            "ack": ack,
            "dedup_horizon": dedup,
            "retention": retention,
            "exclusive_open": capabilities.exclusive_open,
            "native_batch": capabilities.native_batch,
        },
        "partition_offsets": rows,
    });
    writeln!(out, "{}", serde_json::to_string_pretty(&line)?)?;
    Ok(())
}
