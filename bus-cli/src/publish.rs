//! `bus publish`: one value, or a stream of stdin lines stored in batches as
//! they arrive (like `kcat -P`).
//!
//! A batch closes at `batch_lines` lines or `batch_ms` after its first line,
//! and is stored with one atomic `publish_batch_with_headers` (every line
//! with the `--header`s given, checked before stdin is read). A bad line (invalid UTF-8,
//! invalid JSON, too large, too deep) stops the stream: nothing of its batch
//! is stored, and the error line says exactly what was stored before it.
//! An embedded bus is opened for a batch and closed when stdin goes quiet,
//! so its directory's lock is held only while records are being written.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::{Duration, Instant};

use bus::{
    BatchRecord, BatchRecordWithHeaders, BusError, EventBus, Headers, PublishAck, partition_for,
};

use super::commands::connect;
use super::exit::Failure;
use super::progress;

/// When a stdin batch closes.
#[derive(Debug, Clone, Copy)]
pub struct Batching {
    /// At most this many lines per batch.
    pub lines: usize,
    /// A batch closes this long after its first line arrived.
    pub linger: Duration,
}

/// One ack line: the ack's fields, the stdin line (when streaming) and
/// whether the record was stored now or was a duplicate of an earlier one.
fn ack_line(ack: &PublishAck, line: Option<usize>, duplicate: bool) -> serde_json::Value {
    let mut value = serde_json::json!({
        "topic": ack.topic,
        "partition": ack.partition,
        "offset": ack.offset,
        "status": if duplicate { "duplicate" } else { "stored" },
    });
    if let Some(line) = line {
        value["line"] = line.into();
    }
    value
}

/// `publish TOPIC --key K VALUE`.
pub fn publish_one(
    url: &str,
    topic: &str,
    key: &str,
    uid: Option<&str>,
    headers: &[String],
    text: &str,
    out: &mut impl Write,
) -> Result<(), Failure> {
    let value = super::commands::parse_json(text, None)?;
    let headers = parse_headers(headers)?;
    let bus = connect(url)?;
    let head = head_of(bus.as_ref(), topic, key)?;
    let ack = bus.publish_with_headers(topic, key, &value, uid, &headers)?;
    writeln!(out, "{}", ack_line(&ack, None, ack.offset < head))?;
    Ok(())
}

/// `--header NAME=VALUE` arguments as headers (C25), checked as a publish
/// checks them: a bad one is exit 2 before anything is stored.
pub fn parse_headers(arguments: &[String]) -> Result<bus::Headers, BusError> {
    let mut headers = bus::Headers::new();
    for argument in arguments {
        let Some((name, value)) = argument.split_once('=') else {
            return Err(BusError::invalid(
                "header",
                format!("{argument:?} has no '='; write --header NAME=VALUE"),
            ));
        };
        headers.insert(name, value)?;
    }
    Ok(headers)
}

/// The next offset of the partition `key` lands on: an ack below it is a
/// duplicate of a record stored before.
fn head_of(bus: &dyn EventBus, topic: &str, key: &str) -> Result<u64, BusError> {
    let partition = partition_for(key, bus.partitions(topic)?);
    Ok(bus.offsets(topic, partition)?.next)
}

/// A stdin line as read: its number and bytes (without the newline).
type Line = (usize, std::io::Result<Vec<u8>>);

fn read_lines(mut input: impl BufRead, lines: std::sync::mpsc::SyncSender<Line>) {
    let mut number = 0;
    loop {
        number += 1;
        let mut bytes = Vec::new();
        match input.read_until(b'\n', &mut bytes) {
            Ok(0) => return,
            Ok(_) => {
                if bytes.last() == Some(&b'\n') {
                    bytes.pop();
                    if bytes.last() == Some(&b'\r') {
                        bytes.pop();
                    }
                }
                if lines.send((number, Ok(bytes))).is_err() {
                    return;
                }
            }
            Err(error) => {
                let _ = lines.send((number, Err(error)));
                return;
            }
        }
    }
}

/// What has been stored so far, for the message when the stream stops.
#[derive(Default)]
struct Stored {
    lines: usize,
    last_line: usize,
    last_offset: BTreeMap<u32, u64>,
}

impl Stored {
    fn summary(&self) -> String {
        if self.lines == 0 {
            return "nothing was stored".to_owned();
        }
        let offsets: Vec<String> = self
            .last_offset
            .iter()
            .map(|(partition, offset)| format!("partition {partition} up to offset {offset}"))
            .collect();
        format!(
            "{} line(s) up to stdin line {} were stored ({})",
            self.lines,
            self.last_line,
            offsets.join(", ")
        )
    }
}

/// A line that stops the stream: its number and why.
struct BadLine {
    line: usize,
    reason: String,
}

fn parse_line(line: usize, bytes: &[u8]) -> Result<Option<serde_json::Value>, BadLine> {
    let text = std::str::from_utf8(bytes).map_err(|error| BadLine {
        line,
        reason: format!("not valid UTF-8 ({error})"),
    })?;
    if text.trim().is_empty() {
        return Ok(None);
    }
    serde_json::from_str(text)
        .map(Some)
        .map_err(|error| BadLine {
            line,
            reason: format!("not valid JSON: {error}"),
        })
}

/// What a stdin stream publishes: where, and the headers of every line.
#[derive(Debug)]
pub struct Stream<'a> {
    /// Topic.
    pub topic: &'a str,
    /// Every line's partition key.
    pub key: &'a str,
    /// Every line's headers (C25), already checked.
    pub headers: Headers,
    /// When a batch closes.
    pub batching: Batching,
}

/// `publish TOPIC --key K [--header NAME=VALUE ...]` reading stdin.
pub fn publish_stream(
    url: &str,
    stream: &Stream<'_>,
    input: impl BufRead + Send + 'static,
    out: &mut impl Write,
) -> Result<(), Failure> {
    let Stream {
        topic,
        key,
        batching,
        ..
    } = *stream;
    let batch_lines = batching.lines.max(1);
    // Check the topic before reading anything: a typo fails at once.
    let mut bus = Some(connect(url)?);
    if let Some(bus) = &bus {
        bus.partitions(topic)?;
    }
    let (sender, lines) = std::sync::mpsc::sync_channel(batch_lines.saturating_mul(2));
    std::thread::spawn(move || read_lines(input, sender));
    let bar = progress::bar("publish", None);
    let mut stored = Stored::default();
    loop {
        // Stdin is quiet: let go of an exclusive bus (an embedded directory's
        // lock) while waiting; a network connection is kept.
        let first = match lines.try_recv() {
            Ok(line) => Some(line),
            Err(TryRecvError::Empty) => {
                if bus
                    .as_ref()
                    .is_some_and(|b| b.capabilities().exclusive_open)
                {
                    bus = None;
                }
                lines.recv().ok()
            }
            Err(TryRecvError::Disconnected) => None,
        };
        let Some(first) = first else { break };
        let (batch, bad) = collect_batch(first, &lines, batch_lines, batching.linger, key)?;
        if let Some(bad) = bad {
            return Err(bad_line(&stored, &bad, batch.first().map(|(n, _)| *n)));
        }
        if batch.is_empty() {
            continue;
        }
        if bus.is_none() {
            bus = Some(connect(url).map_err(|error| stopped(error, &stored))?);
        }
        let Some(open) = bus.as_deref() else { break };
        let head = head_of(open, topic, key).map_err(|error| stopped(error, &stored))?;
        let records: Vec<BatchRecordWithHeaders> = batch
            .iter()
            .map(|(_, record)| record.clone().with_headers(stream.headers.clone()))
            .collect();
        let acks = match open.publish_batch_with_headers(topic, &records) {
            Ok(acks) => acks,
            Err(error) => return Err(batch_failed(topic, &stored, &batch, error)),
        };
        let mut seen = std::collections::HashSet::new();
        for ((line, _), ack) in batch.iter().zip(&acks) {
            let duplicate = ack.offset < head || !seen.insert((ack.partition, ack.offset));
            writeln!(out, "{}", ack_line(ack, Some(*line), duplicate))?;
            stored.lines += 1;
            stored.last_line = *line;
            stored.last_offset.insert(ack.partition, ack.offset);
        }
        out.flush()?;
        bar.inc(acks.len() as u64);
    }
    bar.finish_and_clear();
    Ok(())
}

type Batch = Vec<(usize, BatchRecord)>;

/// Lines from `first` on until the batch is full or its time is up.
fn collect_batch(
    first: Line,
    lines: &Receiver<Line>,
    batch_lines: usize,
    linger: Duration,
    key: &str,
) -> Result<(Batch, Option<BadLine>), Failure> {
    let deadline = Instant::now() + linger;
    let mut batch = Batch::new();
    let mut next = Some(first);
    while let Some((number, bytes)) = next.take() {
        match parse_line(number, &bytes.map_err(BusError::Io)?) {
            Ok(Some(value)) => batch.push((number, BatchRecord::new(key, value))),
            Ok(None) => {}
            Err(bad) => return Ok((batch, Some(bad))),
        }
        if batch.len() >= batch_lines {
            break;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        // Timed out (the batch closes) or stdin ended.
        next = lines.recv_timeout(left).ok();
    }
    Ok((batch, None))
}

/// A failure after the stream began: with what was stored, when anything was.
fn stopped(error: BusError, stored: &Stored) -> Failure {
    if stored.lines == 0 {
        return Failure::Bus(error);
    }
    Failure::Stopped {
        error: Box::new(error),
        done: stored.summary(),
    }
}

fn bad_line(stored: &Stored, bad: &BadLine, batch_start: Option<usize>) -> Failure {
    let unstored = match batch_start {
        Some(start) if start < bad.line => {
            format!(
                "; lines {start}..={} (its batch) were not stored",
                bad.line - 1
            )
        }
        _ => String::new(),
    };
    Failure::BadInput(format!(
        "stdin line {}: {}; stopped there: {}{unstored}",
        bad.line,
        bad.reason,
        stored.summary()
    ))
}

/// A batch `publish_batch` refused: a record's own fault names its line
/// (exit 2); anything else keeps its class, with what was stored before.
fn batch_failed(topic: &str, stored: &Stored, batch: &Batch, error: BusError) -> Failure {
    let culprit = batch.iter().find(|(_, record)| match &error {
        BusError::TooLarge { limit, .. } => {
            bus_core::backend::encode_value(topic, &record.value, *limit).is_err()
        }
        BusError::TooDeep { limit, .. } => bus_core::backend::json_depth(&record.value) > *limit,
        _ => false,
    });
    let first = batch.first().map(|(n, _)| *n);
    match culprit {
        Some((line, _)) => bad_line(
            stored,
            &BadLine {
                line: *line,
                reason: error.to_string(),
            },
            first,
        ),
        None if matches!(super::exit::exit_code(&error), 2) => {
            let last = batch.last().map_or(0, |(n, _)| *n);
            Failure::BadInput(format!(
                "stdin lines {}..={last} refused: {error}; stopped there: {}",
                first.unwrap_or(0),
                stored.summary()
            ))
        }
        None => stopped(error, stored),
    }
}
