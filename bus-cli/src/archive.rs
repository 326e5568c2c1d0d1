//! `bus archive` (feature `cold`, contract C24): a topic's history copied
//! into a cold tier, idempotently, and with `--trim` dropped from the hot
//! log once the tier holds it.
//!
//! On the embedded log this is the log's own archiver
//! (`bus::embedded::cold`: stored bytes, tags and UIDs kept exactly), and
//! the topic keeps the tier in its `cold.json`, so every later reader of
//! the directory reads below the hot log from it. On the other backends it
//! is [`bus::ColdBus`] over the bus the URL names: the trimmed history is
//! then read through a `ColdBus`, which is a library call.

use std::io::Write;
use std::sync::Arc;

use bus::{BusError, ColdBus, ColdBusOptions, ColdLocation, ColdTier, EventBus};

use crate::commands;

/// `archive TOPIC [--to LOCATION] [--trim]`: one JSON line per partition
/// (the tier's end, the hot log's first offset), then one with the records
/// archived by this run.
pub fn archive(
    url: &str,
    topic: &str,
    to: Option<&str>,
    trim: bool,
    out: &mut impl Write,
) -> Result<(), BusError> {
    commands::require_existing_dir(url)?;
    let (archived, lines) = match commands::embedded_dir(url) {
        Some(dir) => embedded(dir, topic, to, trim)?,
        None => {
            let to = to.ok_or_else(|| {
                BusError::invalid(
                    "--to",
                    "name the cold tier: file:///DIR or s3://BUCKET/PREFIX?endpoint=URL",
                )
            })?;
            any_backend(url, topic, to, trim)?
        }
    };
    for line in lines {
        writeln!(out, "{line}")?;
    }
    writeln!(
        out,
        "{}",
        serde_json::json!({ "topic": topic, "archived": archived })
    )?;
    Ok(())
}

/// Where one partition stands after the archive.
fn line(topic: &str, partition: u32, tier_end: u64, hot_first: u64) -> String {
    serde_json::json!({
        "topic": topic,
        "partition": partition,
        "tier_end": tier_end,
        "hot_first": hot_first,
    })
    .to_string()
}

/// Records archived now, and one [`line`] per partition.
type Report = (u64, Vec<String>);

/// The embedded log: attach `to` (when given), archive through the head
/// (this process holds the writer lock, so the head stays put), trim.
#[cfg(feature = "embedded")]
fn embedded(dir: &str, topic: &str, to: Option<&str>, trim: bool) -> Result<Report, BusError> {
    use bus::embedded::cold;

    let bus = bus::EmbeddedBus::open(dir)?;
    // An unknown topic is named as such before anything else.
    bus.partitions(topic)?;
    if let Some(location) = to {
        cold::attach(&bus, topic, location)?;
    }
    let heads: Vec<u64> = (0..bus.partitions(topic)?)
        .map(|partition| bus.offsets(topic, partition).map(|o| o.next))
        .collect::<Result<_, _>>()?;
    let archived = cold::archive_all(&bus, topic).map_err(|error| match (to, error) {
        (None, BusError::InvalidArgument { .. }) => BusError::invalid(
            "--to",
            format!("topic {topic:?} has no cold tier yet: name one with --to LOCATION"),
        ),
        (_, error) => error,
    })?;
    let mut lines = Vec::new();
    for (partition, &head) in (0..).zip(&heads) {
        if trim && head > 0 {
            bus.delete_below(topic, partition, head)?;
        }
        let hot_first = cold::hot_offsets(&bus, topic, partition)?.first;
        lines.push(line(topic, partition, head, hot_first));
    }
    Ok((archived, lines))
}

#[cfg(not(feature = "embedded"))]
fn embedded(_: &str, _: &str, _: Option<&str>, _: bool) -> Result<Report, BusError> {
    Err(BusError::invalid(
        "url",
        "this `bus` was built without the embedded log (feature `embedded`)",
    ))
}

/// Any other backend: [`ColdBus`] over the bus `url` names.
fn any_backend(url: &str, topic: &str, to: &str, trim: bool) -> Result<Report, BusError> {
    let tier = ColdTier::open(&ColdLocation::parse(to)?)?;
    tier.check()?;
    let cold = ColdBus::new(
        commands::connect_existing(url)?,
        Arc::new(tier),
        ColdBusOptions::default(),
    );
    let inner = cold.inner();
    let (mut archived, mut lines) = (0, Vec::new());
    for partition in 0..inner.partitions(topic)? {
        let head = inner.offsets(topic, partition)?.next;
        archived += cold.archive(topic, partition, head)?;
        if trim {
            cold.archive_and_trim(topic, partition, head)?;
        }
        let tier_end = cold.tier().manifest(topic, partition)?.end();
        let hot_first = inner.offsets(topic, partition)?.first;
        lines.push(line(topic, partition, tier_end, hot_first));
    }
    Ok((archived, lines))
}
