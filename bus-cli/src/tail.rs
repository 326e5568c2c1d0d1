//! `bus tail`: a topic's records from a position, like kcat's `-C -o`.
//!
//! Without `--follow` it prints what is stored when it starts and exits;
//! with it, a live subscription goes on from exactly there. With no
//! partition or key named, the partitions are interleaved in `stored_at`
//! order.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::io::Write;
use std::time::Duration;

use bus::{
    BusError, EventBus, Headers, Selector, StartAt, StoredEvent, StoredRecord, SubscribeOptions,
    Subscription, SubscriptionItem, partition_for,
};

use super::commands::{connect_reader, record_line};
use super::exit::warn;

/// Records per fetch while replaying history.
const PAGE: usize = 512;

/// Where `tail` starts: `beginning`, `end` (alias `now`), an offset, or
/// `-N` (the last N offsets of each partition read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TailFrom {
    /// The oldest retained record.
    Beginning,
    /// Records acked from now on.
    End,
    /// This offset (in each partition read).
    Offset(u64),
    /// The last N offsets of each partition read.
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
    /// Print only each record's value.
    pub value_only: bool,
}

/// Prints records, counting them against `--count`.
struct Printer<'a, W: Write> {
    topic: &'a str,
    options: &'a TailOptions,
    printed: u64,
    out: &'a mut W,
}

impl<W: Write> Printer<'_, W> {
    fn done(&self) -> bool {
        self.options
            .count
            .is_some_and(|count| self.printed >= count)
    }

    fn print(&mut self, event: &StoredEvent, headers: &Headers) -> Result<(), BusError> {
        if self.done() {
            return Ok(());
        }
        if let Some(key) = &self.options.key
            && &event.key != key
        {
            return Ok(());
        }
        self.printed += 1;
        if self.options.value_only {
            writeln!(self.out, "{}", event.value)?;
        } else {
            writeln!(self.out, "{}", record_line(self.topic, event, headers))?;
        }
        Ok(())
    }
}

/// `tail`.
pub fn tail(
    url: &str,
    topic: &str,
    options: &TailOptions,
    out: &mut impl Write,
) -> Result<(), BusError> {
    let bus = connect_reader(url)?;
    let partitions = match (&options.key, options.partition) {
        (Some(key), _) => vec![partition_for(key, bus.partitions(topic)?)],
        (None, Some(partition)) => {
            bus_core::backend::check_partition(topic, partition, bus.partitions(topic)?)?;
            vec![partition]
        }
        (None, None) => (0..bus.partitions(topic)?).collect(),
    };
    let mut printer = Printer {
        topic,
        options,
        printed: 0,
        out,
    };
    let subscribe_options = match options.max_lag {
        Some(max_lag) => SubscribeOptions::default().max_lag(max_lag),
        None => SubscribeOptions::default(),
    };
    if !options.follow {
        let mut ranges = Vec::with_capacity(partitions.len());
        for &partition in &partitions {
            let start = start_offset(bus.as_ref(), topic, partition, options)?;
            ranges.push((partition, start, bus.offsets(topic, partition)?.next));
        }
        return merge(bus.as_ref(), &ranges, &mut printer);
    }
    let selector = match (&options.key, options.partition) {
        (Some(key), _) => Some(Selector::Key(key.clone())),
        (None, Some(partition)) => Some(Selector::Partition(partition)),
        (None, None) => None,
    };
    if let (Some(selector), [partition]) = (selector, partitions.as_slice()) {
        let start = start_offset(bus.as_ref(), topic, *partition, options)?;
        let subscription =
            bus.subscribe(topic, selector, StartAt::Offset(start), subscribe_options)?;
        return drain(subscription, &mut printer);
    }
    // The whole topic: subscribe at the head first, replay the history up to
    // that head interleaved by stored_at, then go on live with no seam.
    let subscription = bus.subscribe(topic, Selector::Topic, StartAt::Now, subscribe_options)?;
    let heads: BTreeMap<u32, u64> = subscription.positions().into_iter().collect();
    let mut ranges = Vec::with_capacity(partitions.len());
    for &partition in &partitions {
        let start = start_offset(bus.as_ref(), topic, partition, options)?;
        let head = match heads.get(&partition) {
            Some(&head) => head,
            None => bus.offsets(topic, partition)?.next,
        };
        ranges.push((partition, start, head));
    }
    merge(bus.as_ref(), &ranges, &mut printer)?;
    drain(subscription, &mut printer)
}

/// The first offset `options` names in `partition`.
fn start_offset(
    bus: &dyn EventBus,
    topic: &str,
    partition: u32,
    options: &TailOptions,
) -> Result<u64, BusError> {
    if let Some(time) = options.from_time {
        return bus_core::backend::resolve_start(bus, topic, partition, StartAt::Time(time));
    }
    let offsets = bus.offsets(topic, partition)?;
    Ok(match options.from {
        TailFrom::Beginning => offsets.first,
        TailFrom::End => offsets.next,
        TailFrom::Offset(offset) => offset.max(offsets.first),
        TailFrom::Last(last) => offsets.next.saturating_sub(last).max(offsets.first),
    })
}

/// One partition's history still to print.
struct Cursor {
    partition: u32,
    next: u64,
    end: u64,
    page: VecDeque<StoredRecord>,
}

impl Cursor {
    /// The next record, fetching a page when the buffer is empty; an
    /// integrity failure is reported and stepped over.
    fn head(&mut self, bus: &dyn EventBus, topic: &str) -> Result<Option<&StoredEvent>, BusError> {
        while self.page.is_empty() && self.next < self.end {
            let want = usize::try_from(self.end - self.next)
                .unwrap_or(PAGE)
                .min(PAGE);
            match bus.fetch_with_headers(topic, self.partition, self.next, want) {
                Ok(records) => {
                    let Some(last) = records.last() else {
                        self.next = self.end;
                        break;
                    };
                    self.next = last.event.offset + 1;
                    let end = self.end;
                    self.page
                        .extend(records.into_iter().filter(|r| r.event.offset < end));
                }
                Err(error @ BusError::Integrity { offset, .. }) if offset >= self.next => {
                    warn(&error.to_string());
                    self.next = offset + 1;
                }
                Err(error) => return Err(error),
            }
        }
        Ok(self.page.front().map(|record| &record.event))
    }
}

/// Prints the records of `ranges` (partition, from, to) in `stored_at`
/// order across partitions (offset order within one).
fn merge<W: Write>(
    bus: &dyn EventBus,
    ranges: &[(u32, u64, u64)],
    printer: &mut Printer<'_, W>,
) -> Result<(), BusError> {
    let topic = printer.topic;
    let mut cursors: Vec<Cursor> = ranges
        .iter()
        .map(|&(partition, next, end)| Cursor {
            partition,
            next,
            end,
            page: VecDeque::new(),
        })
        .collect();
    let mut heap = BinaryHeap::new();
    for (index, cursor) in cursors.iter_mut().enumerate() {
        let partition = cursor.partition;
        if let Some(event) = cursor.head(bus, topic)? {
            heap.push(Reverse((event.stored_at, partition, event.offset, index)));
        }
    }
    while let Some(Reverse((_, _, _, index))) = heap.pop() {
        if printer.done() {
            break;
        }
        let cursor = &mut cursors[index];
        let partition = cursor.partition;
        if let Some(record) = cursor.page.pop_front() {
            printer.print(&record.event, &record.headers)?;
        }
        if let Some(event) = cursor.head(bus, topic)? {
            heap.push(Reverse((event.stored_at, partition, event.offset, index)));
        }
    }
    printer.out.flush()?;
    Ok(())
}

/// Prints a live subscription's items until `--count` is reached (or the
/// reader goes away). One JSON line per record and per lag notice; an
/// integrity failure is reported on stderr and skipped.
fn drain<W: Write>(
    mut subscription: Subscription,
    printer: &mut Printer<'_, W>,
) -> Result<(), BusError> {
    while !printer.done() {
        match subscription.recv_timeout(Duration::from_millis(500)) {
            Ok(Some(SubscriptionItem::Record { event, headers, .. })) => {
                printer.print(&event, &headers)?;
                printer.out.flush()?;
            }
            Ok(Some(SubscriptionItem::Lagged {
                partition,
                skipped,
                next_offset,
            })) => {
                let line = serde_json::json!({"lagged": {
                    "topic": printer.topic, "partition": partition,
                    "skipped": skipped, "next_offset": next_offset,
                }});
                if printer.options.value_only {
                    warn(&line.to_string());
                } else {
                    writeln!(printer.out, "{line}")?;
                    printer.out.flush()?;
                }
            }
            Ok(None) => {
                if subscription.is_closed() {
                    break;
                }
            }
            Err(error @ BusError::Integrity { .. }) => warn(&error.to_string()),
            Err(error) if error.is_transient() => warn(&format!("{error} (retrying)")),
            Err(error) => return Err(error),
        }
    }
    Ok(())
}
