//! `bus consume`, `bus consumers` and `bus consumer reset|delete`: durable
//! consumers (C20–C23) from the command line.
//!
//! `consume` prints each record as `tail` does and acknowledges it once
//! the line is written and flushed: a crash between the two prints the
//! record again next time (at least once, C21), never skips it.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use bus::consumer::{ConsumeOptions, Consumer, ConsumerInfo, Delivery, OwnerPolicy};
use bus::{Bus, BusError, EventBus, Selector, StartAt, partition_for};

use super::commands::{record_line, require_existing_dir, with_lock_wait};
use super::exit::Failure;
use super::tail::TailFrom;

/// How long a `consume` without `--follow` waits for a record it knows is
/// stored (one at or below the head it saw at start) before deciding the
/// rest is gone (expired by retention while it read) and exiting.
const STALL: Duration = Duration::from_secs(2);

/// One wait of the delivery loop; also how often `--follow` notices that
/// the bus went away.
const SLICE: Duration = Duration::from_millis(200);

/// Where a consumer starts or is reset to: `--from`/`--to` and
/// `--from-time`/`--to-time`.
#[derive(Debug, Clone, Copy)]
pub struct Position {
    /// beginning, end, an offset (in each partition), or -N.
    pub from: TailFrom,
    /// The first record stored at or after this epoch-ms time (wins).
    pub time: Option<u64>,
}

/// What `consume` reads and how.
#[derive(Debug, Clone)]
pub struct ConsumeArgs {
    /// The consumer's name (`--as`).
    pub name: String,
    /// Only this partition.
    pub partition: Option<u32>,
    /// Only this key's records.
    pub key: Option<String>,
    /// Where a new consumer starts (an existing one goes on after its acks).
    pub start: Position,
    /// Stop after this many records.
    pub max: Option<u64>,
    /// Make acknowledgements durable every this many records.
    pub ack_every: u32,
    /// Dead-letter topic.
    pub dead_letter: Option<String>,
    /// Dead-letter a record after this many deliveries without an ack.
    pub max_deliver: Option<u32>,
    /// Take ownership from a running instance, fencing it (C23).
    pub take_over: bool,
    /// Keep consuming new records as they arrive.
    pub follow: bool,
    /// Print only each record's value.
    pub value_only: bool,
}

/// Opens `url` as a [`Bus`] that can consume. An embedded directory is
/// opened read-only when nothing needs the writer (no dead letters to
/// publish), so publishers are never kept out while a consumer runs: the
/// consumer's cursor files are its own, under the same per-consumer locks
/// (C23). Otherwise the writer's open, waiting for its lock as other
/// commands do.
pub fn connect_consumers(url: &str, needs_writer: bool) -> Result<Box<dyn Bus>, BusError> {
    require_existing_dir(url)?;
    if !needs_writer {
        match url.split_once("://") {
            Some(("file", rest)) if !rest.contains('?') => {
                return bus::connect_consumers(&format!("{url}?read_only=true"));
            }
            None => return bus::connect_consumers(&format!("file://{url}?read_only=true")),
            _ => {}
        }
    }
    with_lock_wait(|| bus::connect_consumers(url))
}

/// The [`StartAt`] `position` names over `partitions` of `topic`.
pub fn start_at(
    bus: &dyn EventBus,
    topic: &str,
    partitions: &[u32],
    position: Position,
) -> Result<StartAt, BusError> {
    if let Some(time) = position.time {
        return Ok(StartAt::Time(time));
    }
    let per_partition = |at: &dyn Fn(bus::PartitionOffsets) -> u64| {
        partitions
            .iter()
            .map(|&p| Ok((p, at(bus.offsets(topic, p)?))))
            .collect::<Result<Vec<_>, BusError>>()
            .map(StartAt::Positions)
    };
    match position.from {
        TailFrom::Beginning => Ok(StartAt::Beginning),
        TailFrom::End => Ok(StartAt::Now),
        // Past a partition's head is refused by the bus, naming the head.
        TailFrom::Offset(offset) => per_partition(&|o| offset.max(o.first)),
        TailFrom::Last(last) => per_partition(&|o| o.next.saturating_sub(last).max(o.first)),
    }
}

/// `consume TOPIC --as NAME`.
pub fn consume(
    url: &str,
    topic: &str,
    args: &ConsumeArgs,
    out: &mut impl Write,
) -> Result<(), Failure> {
    let bus = connect_consumers(url, args.dead_letter.is_some())?;
    let count = bus.partitions(topic)?;
    let (selector, partitions) = match (&args.key, args.partition) {
        (Some(key), _) => (Selector::Key(key.clone()), vec![partition_for(key, count)]),
        (None, Some(partition)) => {
            bus_core::backend::check_partition(topic, partition, count)?;
            (Selector::Partition(partition), vec![partition])
        }
        (None, None) => (Selector::Topic, (0..count).collect()),
    };
    let start = start_at(bus.as_ref(), topic, &partitions, args.start)?;
    let mut options = ConsumeOptions::default().ack_every(args.ack_every);
    if let Some(topic) = &args.dead_letter {
        options = options.dead_letter(topic.as_str());
    }
    if let Some(deliveries) = args.max_deliver {
        options = options.max_deliver(deliveries);
    }
    if args.take_over {
        options = options.owner(OwnerPolicy::TakeOver);
    }
    // Heads before the consumer opens: without --follow, what it must
    // have seen to be done.
    let mut heads = BTreeMap::new();
    for &partition in &partitions {
        heads.insert(partition, bus.offsets(topic, partition)?.next);
    }
    let mut consumer = bus.consume(topic, &args.name, selector, start, options)?;
    let result = deliver(&mut consumer, topic, args, &heads, out);
    // Acks not yet durable (--ack-every) are written before exiting, also
    // after a failure: what was printed and acked stays acked.
    let flushed = consumer.flush();
    result?;
    flushed?;
    Ok(())
}

/// Prints and acknowledges deliveries until `--max`, the end (no
/// `--follow`) or the bus going away.
fn deliver(
    consumer: &mut Consumer,
    topic: &str,
    args: &ConsumeArgs,
    heads: &BTreeMap<u32, u64>,
    out: &mut impl Write,
) -> Result<(), Failure> {
    let mut printed = 0u64;
    // Per partition, the first offset not yet seen by this run or acked.
    let mut reached: BTreeMap<u32, u64> = consumer.cursor().into_iter().collect();
    let mut idle_since = Instant::now();
    while args.max.is_none_or(|max| printed < max) {
        let caught_up = heads
            .iter()
            .all(|(p, &head)| reached.get(p).is_some_and(|&at| at >= head));
        if !args.follow && (caught_up || idle_since.elapsed() >= STALL) {
            break;
        }
        let Some(delivery) = consumer.recv_timeout(SLICE)? else {
            if consumer.is_closed() {
                break;
            }
            continue;
        };
        idle_since = Instant::now();
        print(&delivery, topic, args.value_only, out)?;
        out.flush()?;
        consumer.ack(&delivery)?;
        printed += 1;
        let at = reached.entry(delivery.partition).or_default();
        *at = (*at).max(delivery.offset + 1);
        for (partition, cursor) in consumer.cursor() {
            let at = reached.entry(partition).or_default();
            *at = (*at).max(cursor);
        }
    }
    Ok(())
}

/// One delivery as `tail` prints its record, with `delivery_count` added
/// when it is a redelivery (more than 1).
fn print(
    delivery: &Delivery,
    topic: &str,
    value_only: bool,
    out: &mut impl Write,
) -> Result<(), BusError> {
    if value_only {
        writeln!(out, "{}", delivery.event.value)?;
        return Ok(());
    }
    let mut line = record_line(topic, &delivery.event, &delivery.headers);
    if delivery.delivery_count > 1 {
        line["delivery_count"] = delivery.delivery_count.into();
    }
    writeln!(out, "{line}")?;
    Ok(())
}

/// A selector as the table shows it.
fn selector_text(selector: &Selector) -> String {
    match selector {
        Selector::Topic => "topic".to_owned(),
        Selector::Partition(partition) => format!("partition:{partition}"),
        Selector::Key(key) => format!("key:{key}"),
    }
}

/// A lag in time, short: `850ms`, `12.5s`, `7m`, `3h`, or `-` for none.
fn lag_text(lag: Option<Duration>) -> String {
    let Some(lag) = lag else {
        return "-".to_owned();
    };
    let ms = lag.as_millis();
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..120_000 => format!("{:.1}s", lag.as_secs_f64()),
        120_000..7_200_000 => format!("{}m", lag.as_secs() / 60),
        _ => format!("{}h", lag.as_secs() / 3600),
    }
}

/// `consumers TOPIC`: a row per consumer and partition, or JSON lines.
pub fn consumers(
    bus: &dyn Bus,
    topic: &str,
    json: bool,
    out: &mut impl Write,
) -> Result<(), BusError> {
    let listed: Vec<ConsumerInfo> = bus.consumers(topic)?;
    if !json {
        writeln!(
            out,
            "{:<24} {:<16} {:>9} {:>12} {:>12} {:>9}",
            "consumer", "selector", "partition", "cursor", "lag", "lag_time"
        )?;
    }
    for info in &listed {
        for part in &info.partitions {
            if json {
                let lag_ms = part
                    .lag_time
                    .map(|lag| u64::try_from(lag.as_millis()).unwrap_or(u64::MAX));
                let line = serde_json::json!({
                    "topic": topic, "consumer": info.name,
                    "selector": selector_text(&info.selector), "partition": part.partition,
                    "cursor": part.cursor, "acked_above": part.acked_above,
                    "lag_records": part.lag_records, "lag_ms": lag_ms,
                });
                writeln!(out, "{line}")?;
            } else {
                writeln!(
                    out,
                    "{:<24} {:<16} {:>9} {:>12} {:>12} {:>9}",
                    info.name,
                    selector_text(&info.selector),
                    part.partition,
                    part.cursor,
                    part.lag_records,
                    lag_text(part.lag_time)
                )?;
            }
        }
    }
    if !json && listed.is_empty() {
        writeln!(out, "(topic {topic} has no durable consumers)")?;
    }
    Ok(())
}

/// `consumer reset TOPIC NAME --to POS`: moves the cursor, resolved on the
/// consumer's own selector; a running instance is fenced (C23).
pub fn reset(
    bus: &dyn Bus,
    topic: &str,
    name: &str,
    to: Position,
    out: &mut impl Write,
) -> Result<(), BusError> {
    bus::consumer::validate_consumer_name(name)?;
    let Some(info) = bus.consumers(topic)?.into_iter().find(|c| c.name == name) else {
        return Err(BusError::invalid(
            "consumer",
            format!("topic {topic:?} has no consumer {name:?}"),
        ));
    };
    let partitions: Vec<u32> = info.partitions.iter().map(|p| p.partition).collect();
    let start = start_at(bus, topic, &partitions, to)?;
    bus.reset_consumer(topic, name, start)?;
    let moved = bus
        .consumers(topic)?
        .into_iter()
        .find(|c| c.name == name)
        .map(|c| {
            c.partitions
                .iter()
                .map(|p| format!("{}:{}", p.partition, p.cursor))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    writeln!(
        out,
        "reset consumer {name} of {topic}; cursor (partition:offset) {moved}"
    )?;
    Ok(())
}

/// `consumer delete TOPIC NAME` (exit 4 when there is none).
pub fn delete(bus: &dyn Bus, topic: &str, name: &str, out: &mut impl Write) -> Result<(), Failure> {
    if !bus.delete_consumer(topic, name)? {
        return Err(Failure::NotFound(format!(
            "topic {topic:?} has no consumer {name:?}"
        )));
    }
    writeln!(out, "deleted consumer {name} of {topic}")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_text_is_short_and_says_none() {
        assert_eq!(lag_text(None), "-");
        assert_eq!(lag_text(Some(Duration::from_millis(850))), "850ms");
        assert_eq!(lag_text(Some(Duration::from_millis(12_500))), "12.5s");
        assert_eq!(lag_text(Some(Duration::from_secs(420))), "7m");
        assert_eq!(lag_text(Some(Duration::from_secs(3 * 3600 + 5))), "3h");
    }
}
