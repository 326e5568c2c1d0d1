//! The data subcommands: JSON lines out, one clear error line on failure.

use std::io::{BufRead, Write};
use std::time::Duration;

use bus::{BatchRecord, BusError, EventBus, Manifest, partition_for};

use super::progress;

/// Records per publish batch read from stdin.
const STDIN_BATCH: usize = 1_000;
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
    for topic in bus.topics() {
        let partitions = bus.partitions(&topic)?;
        for partition in 0..partitions {
            let offsets = bus.offsets(&topic, partition)?;
            if json {
                let line = serde_json::json!({
                    "topic": topic, "partition": partition, "partitions": partitions,
                    "first": offsets.first, "next": offsets.next, "records": offsets.retained(),
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
    Ok(())
}

/// Parses one JSON value; `line` names the stdin line in the error.
pub fn parse_json(text: &str, line: Option<usize>) -> Result<serde_json::Value, BusError> {
    serde_json::from_str(text).map_err(|error| {
        let field = line.map_or_else(|| "json".to_owned(), |n| format!("stdin line {n}"));
        BusError::invalid(field, format!("not valid JSON: {error}"))
    })
}

/// `publish` of one value.
pub fn publish_one(
    bus: &dyn EventBus,
    topic: &str,
    key: &str,
    uid: Option<&str>,
    text: &str,
    out: &mut impl Write,
) -> Result<(), BusError> {
    let value = parse_json(text, None)?;
    let ack = match uid {
        Some(uid) => bus.publish_idempotent(topic, key, &value, uid)?,
        None => bus.publish(topic, key, &value)?,
    };
    writeln!(out, "{}", serde_json::to_string(&ack)?)?;
    Ok(())
}

/// `publish` from stdin: every line is read and parsed first, so a
/// malformed line (named by number) stores nothing.
pub fn publish_lines(
    bus: &dyn EventBus,
    topic: &str,
    key: &str,
    input: impl BufRead,
    out: &mut impl Write,
) -> Result<(), BusError> {
    bus.partitions(topic)?;
    let mut records = Vec::new();
    for (index, line) in input.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        records.push(BatchRecord::new(key, parse_json(&line, Some(index + 1))?));
    }
    let bar = progress::bar("publish", Some(records.len() as u64));
    for chunk in records.chunks(STDIN_BATCH) {
        for ack in bus.publish_batch(topic, chunk)? {
            writeln!(out, "{}", serde_json::to_string(&ack)?)?;
        }
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    Ok(())
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
    out: &mut impl Write,
) -> Result<(), BusError> {
    let mut offset = from;
    let mut left = max.unwrap_or(usize::MAX);
    let bar = progress::bar("replay", None);
    while left > 0 {
        let page = bus.fetch(topic, partition, offset, left.min(PAGE))?;
        let Some(last) = page.last() else { break };
        offset = last.offset + 1;
        left -= page.len();
        bar.inc(page.len() as u64);
        for event in &page {
            writeln!(out, "{}", serde_json::to_string(event)?)?;
        }
    }
    bar.finish_and_clear();
    Ok(())
}

/// Opens `url`, waiting up to 10 s while another process holds an
/// embedded directory's lock (a `tail --follow` holds it only between polls).
pub fn connect(url: &str) -> Result<Box<dyn EventBus>, BusError> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut pause = Duration::from_millis(2);
    loop {
        match bus::connect(url) {
            Err(BusError::Locked { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

/// `tail`: every record of the named partition (all partitions when none),
/// then, with `follow`, new records as they arrive until interrupted.
pub fn tail(
    url: &str,
    topic: &str,
    partition: Option<u32>,
    follow: bool,
    out: &mut impl Write,
) -> Result<(), BusError> {
    let first = connect(url)?;
    let partitions: Vec<u32> = match partition {
        Some(partition) => vec![partition],
        None => (0..first.partitions(topic)?).collect(),
    };
    let exclusive = first.capabilities().exclusive_open;
    let mut bus = Some(first);
    let mut next: Vec<u64> = vec![0; partitions.len()];
    let mut idle = Duration::from_millis(5);
    loop {
        let current = match bus.take() {
            Some(current) => current,
            None => connect(url)?,
        };
        let mut any = false;
        for (slot, &partition) in partitions.iter().enumerate() {
            loop {
                let page = current.fetch(topic, partition, next[slot], PAGE)?;
                let Some(last) = page.last() else { break };
                next[slot] = last.offset + 1;
                any = true;
                for event in &page {
                    writeln!(out, "{}", serde_json::to_string(event)?)?;
                }
            }
        }
        out.flush()?;
        if !follow {
            return Ok(());
        }
        // An embedded directory admits one process at a time: let go of it
        // between polls so publishers can get in.
        if exclusive {
            drop(current);
        } else {
            bus = Some(current);
        }
        // The trait has no push subscription, so followers poll, backing off
        // to 200 ms while idle.
        idle = if any {
            Duration::from_millis(5)
        } else {
            (idle * 2).min(Duration::from_millis(200))
        };
        std::thread::sleep(idle);
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
