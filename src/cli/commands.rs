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

/// Opens `url`, waiting up to 10 s while another writer holds an embedded
/// directory's lock (`tail` takes none: it opens read-only).
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

/// Where `tail` starts: `beginning`, `end` (alias `now`), an offset, or
/// `-N` (the last N records of each partition read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TailFrom {
    /// The oldest retained record.
    Beginning,
    /// Records acked from now on.
    End,
    /// This offset (one partition or key).
    Offset(u64),
    /// The last N records of each partition.
    Last(u64),
}

impl std::str::FromStr for TailFrom {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "beginning" | "start" => Ok(Self::Beginning),
            "end" | "now" => Ok(Self::End),
            _ => if let Some(last) = text.strip_prefix('-') {
                last.parse().map(Self::Last)
            } else {
                text.parse().map(Self::Offset)
            }
            .map_err(|_| {
                format!("{text:?} is not beginning, end, an offset or -N (the last N records)")
            }),
        }
    }
}

/// What `tail` reads and how.
#[derive(Debug, Clone)]
pub struct TailOptions {
    /// Only this partition.
    pub partition: Option<u32>,
    /// Only this key's records (read from its partition).
    pub key: Option<String>,
    /// Where to start.
    pub from: TailFrom,
    /// Start at the first record stored at or after this epoch-ms time.
    pub from_time: Option<u64>,
    /// Stop after this many records.
    pub count: Option<u64>,
    /// Skip ahead (with a lag line) when more than this many records behind.
    pub max_lag: Option<u64>,
    /// Keep following the live tail.
    pub follow: bool,
}

/// `tail`: the records of a topic (one partition or key when named) from a
/// position, through a live subscription: to the end of what is stored when
/// it starts, or on with `follow`. One JSON line per record and one per lag
/// notice; an integrity failure is reported on stderr and skipped.
pub fn tail(
    url: &str,
    topic: &str,
    options: &TailOptions,
    out: &mut impl Write,
) -> Result<(), BusError> {
    use bus::{Selector, StartAt, SubscribeOptions};

    let bus = connect_reader(url)?;
    let selector = match (&options.key, options.partition) {
        (Some(key), _) => Selector::Key(key.clone()),
        (None, Some(partition)) => Selector::Partition(partition),
        (None, None) => Selector::Topic,
    };
    let start = match (options.from_time, options.from) {
        (Some(time), _) => StartAt::Time(time),
        (None, TailFrom::Beginning) => StartAt::Beginning,
        (None, TailFrom::End) => StartAt::Now,
        (None, TailFrom::Offset(offset)) => StartAt::Offset(offset),
        (None, TailFrom::Last(last)) => {
            return tail_last(bus.as_ref(), topic, &selector, last, options, out);
        }
    };
    let mut subscription_options = SubscribeOptions::default();
    if let Some(max_lag) = options.max_lag {
        subscription_options = subscription_options.max_lag(max_lag);
    }
    let subscription = bus.subscribe(topic, selector, start, subscription_options)?;
    drain(bus.as_ref(), topic, subscription, options, out)
}

fn tail_last(
    bus: &dyn EventBus,
    topic: &str,
    selector: &bus::Selector,
    last: u64,
    options: &TailOptions,
    out: &mut impl Write,
) -> Result<(), BusError> {
    use bus::{Selector, StartAt, SubscribeOptions};

    let partition = match selector {
        Selector::Partition(partition) => *partition,
        Selector::Key(key) => partition_for(key, bus.partitions(topic)?),
        Selector::Topic => {
            return Err(BusError::invalid(
                "--from",
                "-N needs --partition or --key (the last N of one partition)",
            ));
        }
    };
    let offsets = bus.offsets(topic, partition)?;
    let start = offsets.next.saturating_sub(last).max(offsets.first);
    let mut subscription_options = SubscribeOptions::default();
    if let Some(max_lag) = options.max_lag {
        subscription_options = subscription_options.max_lag(max_lag);
    }
    let subscription = bus.subscribe(
        topic,
        selector.clone(),
        StartAt::Offset(start),
        subscription_options,
    )?;
    drain(bus, topic, subscription, options, out)
}

/// Prints a subscription's items until the end of what was stored when it
/// began (or forever with `follow`), at most `count` records.
fn drain(
    bus: &dyn EventBus,
    topic: &str,
    mut subscription: bus::Subscription,
    options: &TailOptions,
    out: &mut impl Write,
) -> Result<(), BusError> {
    use bus::SubscriptionItem;

    let ends: Vec<(u32, u64)> = subscription
        .positions()
        .iter()
        .map(|&(partition, _)| Ok((partition, bus.offsets(topic, partition)?.next)))
        .collect::<Result<_, BusError>>()?;
    let at_end = |subscription: &bus::Subscription| {
        subscription
            .positions()
            .iter()
            .zip(&ends)
            .all(|(&(_, position), &(_, end))| position >= end)
    };
    let mut printed = 0u64;
    loop {
        if options.count.is_some_and(|count| printed >= count) {
            break;
        }
        if !options.follow && at_end(&subscription) {
            break;
        }
        match subscription.recv_timeout(Duration::from_millis(500)) {
            Ok(Some(SubscriptionItem::Record { topic, event })) => {
                printed += 1;
                writeln!(out, "{}", record_line(&topic, &event))?;
                out.flush()?;
            }
            Ok(Some(SubscriptionItem::Lagged {
                partition,
                skipped,
                next_offset,
            })) => {
                let line = serde_json::json!({"lagged": {
                    "topic": topic, "partition": partition,
                    "skipped": skipped, "next_offset": next_offset,
                }});
                writeln!(out, "{line}")?;
                out.flush()?;
            }
            Ok(None) => {
                if subscription.is_closed() {
                    break;
                }
            }
            Err(error @ BusError::Integrity { .. }) => {
                eprintln!("bus: {error}");
            }
            Err(error) if error.is_transient() && options.follow => {
                eprintln!("bus: {error} (retrying)");
            }
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// One record as a JSON line: topic, partition, offset, key, UID (when the
/// value carries one), stored_at and value.
pub fn record_line(topic: &str, event: &bus::StoredEvent) -> serde_json::Value {
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
    line
}

/// Opens `url` for reading beside a writer: an embedded directory is opened
/// read-only (no lock taken, so publishers are never kept out).
pub fn connect_reader(url: &str) -> Result<Box<dyn EventBus>, BusError> {
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
