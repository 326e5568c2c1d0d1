//! The `bus` command: provision, publish, fetch and inspect a bus.

use std::io::{BufRead, Write};
use std::process::ExitCode;

use bus::{BatchRecord, BusError, EventBus, EventBusExt, Manifest};
use clap::{Parser, Subcommand};

/// Look at, feed and measure a bus (embedded by default).
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Bus URL: file://DIR (or a bare path), memory://, nats://HOST:PORT, kafka://HOST:PORT.
    #[arg(
        long,
        env = "BUS_URL",
        default_value = "file://./bus-data",
        global = true
    )]
    url: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Provision the topics of a manifest (TOML or JSON).
    ///
    /// Example: bus provision topics.toml
    Provision {
        /// Manifest file.
        manifest: std::path::PathBuf,
    },
    /// List topics with their partition counts.
    Topics,
    /// Publish JSON values: the argument, or one value per stdin line (batched).
    ///
    /// Example: bus publish audit --key agent-1 '{"event":"start"}'
    Publish {
        /// Topic.
        topic: String,
        /// Partition key.
        #[arg(long)]
        key: String,
        /// Event UID for deduplication (single value only).
        #[arg(long)]
        uid: Option<String>,
        /// The JSON value, or `-` (or nothing) for stdin.
        json: Option<String>,
    },
    /// Print records of one partition as JSON lines.
    ///
    /// Example: bus fetch audit --partition 0 --from 0 --max 10
    Fetch {
        /// Topic.
        topic: String,
        /// Partition.
        #[arg(long, default_value_t = 0, conflicts_with = "key")]
        partition: u32,
        /// Read the partition this key lands on instead.
        #[arg(long)]
        key: Option<String>,
        /// First offset.
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Most records to print (all when omitted).
        #[arg(long)]
        max: Option<usize>,
    },
    /// Find a record by its UID.
    ///
    /// Example: bus find audit --key agent-1 --uid evt-7
    Find {
        /// Topic.
        topic: String,
        /// Partition key.
        #[arg(long)]
        key: String,
        /// Event UID.
        #[arg(long)]
        uid: String,
    },
    /// Run retention (embedded and memory backends).
    Maintenance {
        /// Clock to expire against, epoch ms (default: now).
        #[arg(long)]
        now: Option<u64>,
    },
}

/// Exit codes: 2 bad usage, 3 unknown topic or partition, 1 anything else.
fn exit_code(error: &BusError) -> u8 {
    match error {
        BusError::InvalidArgument { .. } | BusError::FeatureDisabled { .. } => 2,
        BusError::UnknownTopic(_) | BusError::UnknownPartition { .. } => 3,
        _ => 1,
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("bus: {error}");
            ExitCode::from(exit_code(&error))
        }
    }
}

fn run(cli: Cli) -> Result<(), BusError> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    match cli.command {
        Command::Provision { manifest } => {
            let text = std::fs::read_to_string(&manifest)?;
            let manifest = Manifest::parse(&text)?;
            bus::open(&cli.url, &manifest)?;
            for topic in &manifest.topics {
                writeln!(
                    out,
                    "provisioned {} ({} partitions)",
                    topic.name, topic.partitions
                )?;
            }
        }
        Command::Topics => {
            let bus = bus::connect(&cli.url)?;
            for topic in bus.topics() {
                writeln!(out, "{topic}\t{}", bus.partitions(&topic)?)?;
            }
        }
        Command::Publish {
            topic,
            key,
            uid,
            json,
        } => {
            let bus = bus::connect(&cli.url)?;
            match json.as_deref() {
                Some(text) if text != "-" => {
                    let value = parse_json(text, None)?;
                    let ack = match uid {
                        Some(uid) => bus.publish_idempotent(&topic, &key, &value, &uid)?,
                        None => bus.publish(&topic, &key, &value)?,
                    };
                    writeln!(out, "{}", serde_json::to_string(&ack)?)?;
                }
                _ => publish_stdin(bus.as_ref(), &topic, &key, uid.is_some(), &mut out)?,
            }
        }
        Command::Fetch {
            topic,
            partition,
            key,
            from,
            max,
        } => {
            let bus = bus::connect(&cli.url)?;
            let partition = match key {
                Some(key) => bus::partition_for(&key, bus.partitions(&topic)?),
                None => partition,
            };
            let events = match max {
                Some(max) => bus.fetch(&topic, partition, from, max)?,
                None => bus.fetch_all(&topic, partition, from, 1_000)?,
            };
            for event in events {
                writeln!(out, "{}", serde_json::to_string(&event)?)?;
            }
        }
        Command::Find { topic, key, uid } => {
            let bus = bus::connect(&cli.url)?;
            match bus.find_event_by_uid(&topic, &key, &uid)? {
                Some(ack) => writeln!(out, "{}", serde_json::to_string(&ack)?)?,
                None => {
                    return Err(BusError::invalid(
                        "uid",
                        format!("{uid:?} is not stored in {topic:?}"),
                    ));
                }
            }
        }
        Command::Maintenance { now } => {
            let bus = bus::connect(&cli.url)?;
            let expired = bus.maintenance(now.unwrap_or_else(bus::now_ms))?;
            writeln!(out, "expired {expired} records")?;
        }
    }
    out.flush()?;
    Ok(())
}

fn parse_json(text: &str, line: Option<usize>) -> Result<serde_json::Value, BusError> {
    serde_json::from_str(text).map_err(|error| {
        let field = line.map_or_else(|| "json".to_owned(), |n| format!("stdin line {n}"));
        BusError::invalid(field, format!("not valid JSON: {error}"))
    })
}

/// Reads every line first, so a malformed line stores nothing.
fn publish_stdin(
    bus: &dyn EventBus,
    topic: &str,
    key: &str,
    with_uid: bool,
    out: &mut impl Write,
) -> Result<(), BusError> {
    if with_uid {
        return Err(BusError::invalid(
            "uid",
            "--uid applies to one value; put metadata.uid in each stdin value instead",
        ));
    }
    let mut records = Vec::new();
    for (index, line) in std::io::stdin().lock().lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        records.push(BatchRecord::new(key, parse_json(&line, Some(index + 1))?));
    }
    for chunk in records.chunks(1_000) {
        for ack in bus.publish_batch(topic, chunk)? {
            writeln!(out, "{}", serde_json::to_string(&ack)?)?;
        }
    }
    Ok(())
}
