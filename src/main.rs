//! The `bus` command: provision, feed, read and inspect a bus.
//!
//! Data goes to stdout as JSON lines; errors are one line on stderr with an
//! exit code that tells bad usage (2), an unknown topic or partition (3), a
//! record not found (4) and a backend failure (1) apart.

use std::io::Write;
use std::process::ExitCode;

use bus::BusError;
use clap::{Parser, Subcommand};

mod cli;

use cli::commands;

/// Look at, feed and measure a bus, the way kcat and the nats CLI are used
/// for their brokers.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Bus URL: file://DIR (or a bare path), memory://, nats://HOST:PORT, kafka://HOST:PORT, postgres://USER:PASSWORD@HOST:PORT/DB.
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
    #[command(after_help = "Example: bus provision examples/topics.toml")]
    Provision {
        /// Manifest file.
        manifest: std::path::PathBuf,
    },
    /// Topics with partitions, first and next offset and record counts.
    #[command(after_help = "Example: bus topics --json")]
    Topics {
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Publish a JSON value, or one value per stdin line (batched; a bad line stores nothing).
    #[command(
        after_help = "Examples:\n  bus publish audit --key agent-1 '{\"event\":\"start\"}'\n  cat events.jsonl | bus publish audit --key agent-1"
    )]
    Publish {
        /// Topic.
        topic: String,
        /// Partition key.
        #[arg(long)]
        key: String,
        /// Event UID for deduplication (with a single value).
        #[arg(long)]
        uid: Option<String>,
        /// The JSON value; `-` or nothing reads stdin.
        json: Option<String>,
    },
    /// Print records of one partition as JSON lines.
    #[command(after_help = "Example: bus fetch audit --key agent-1 --from 0 --max 10")]
    Fetch {
        /// Topic.
        topic: String,
        /// Partition (default 0).
        #[arg(long, conflicts_with = "key")]
        partition: Option<u32>,
        /// Read the partition this key lands on.
        #[arg(long)]
        key: Option<String>,
        /// First offset.
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Most records to print (all when omitted).
        #[arg(long)]
        max: Option<usize>,
    },
    /// Print a topic's records as JSON lines through a live subscription; --follow keeps going.
    #[command(
        after_help = "Examples: bus tail audit --follow\n          bus tail audit --key agent-1 --from -10\n          bus tail audit --from end --follow --max-lag 1000"
    )]
    Tail {
        /// Topic.
        topic: String,
        /// Only this partition.
        #[arg(long, conflicts_with = "key")]
        partition: Option<u32>,
        /// Only this key's records (read from its partition).
        #[arg(long)]
        key: Option<String>,
        /// Start: beginning, end, an offset, or -N (the last N of one partition).
        #[arg(long, default_value = "beginning", allow_hyphen_values = true)]
        from: commands::TailFrom,
        /// Start at the first record stored at or after this time (epoch ms).
        #[arg(long, conflicts_with = "from")]
        from_time: Option<u64>,
        /// Stop after this many records.
        #[arg(long)]
        count: Option<u64>,
        /// When more than this many records behind, skip ahead and print a lag line.
        #[arg(long)]
        max_lag: Option<u64>,
        /// Keep printing new records as they arrive (a live subscription).
        #[arg(long, short)]
        follow: bool,
    },
    /// Find a record by its UID (exit 4 when not stored).
    #[command(after_help = "Example: bus find audit --key agent-1 --uid evt-42")]
    Find {
        /// Topic.
        topic: String,
        /// Partition key the record was published with.
        #[arg(long)]
        key: String,
        /// Event UID.
        #[arg(long)]
        uid: String,
    },
    /// Measure every compiled-in backend whose broker is reachable, side by side.
    #[command(
        after_help = "Example: bus bench --records 20000 --json > run.json; bus bench --compare run.json"
    )]
    Bench {
        /// Records per throughput phase.
        #[arg(long, default_value_t = 20_000)]
        records: usize,
        /// Approximate size of each JSON event in bytes.
        #[arg(long, default_value_t = 200)]
        event_bytes: usize,
        /// Publisher threads in the concurrent phase.
        #[arg(long, default_value_t = 16)]
        threads: usize,
        /// Samples per latency phase.
        #[arg(long, default_value_t = 1_000)]
        samples: usize,
        /// Write the rows as JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Print the change against an earlier `--json` run.
        #[arg(long)]
        compare: Option<std::path::PathBuf>,
        /// Only these backends (embedded, memory, nats, kafka); all reachable when omitted.
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        /// Seconds an idle subscription is watched for CPU use (0 skips it).
        #[arg(long, default_value_t = 10)]
        idle_secs: u64,
    },
    /// Run retention (embedded and memory; brokers expire natively).
    #[command(after_help = "Example: bus maintenance --now 1767225600000")]
    Maintenance {
        /// Clock to expire against, epoch ms (default: now).
        #[arg(long)]
        now: Option<u64>,
    },
}

enum Failure {
    Bus(BusError),
    NotFound(String),
}

impl From<BusError> for Failure {
    fn from(error: BusError) -> Self {
        Self::Bus(error)
    }
}

impl From<std::io::Error> for Failure {
    fn from(error: std::io::Error) -> Self {
        Self::Bus(BusError::Io(error))
    }
}

fn exit_code(error: &BusError) -> u8 {
    match error {
        BusError::InvalidArgument { .. }
        | BusError::FeatureDisabled { .. }
        | BusError::TooLarge { .. }
        | BusError::TooDeep { .. } => 2,
        BusError::UnknownTopic(_) | BusError::UnknownPartition { .. } => 3,
        _ => 1,
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::NotFound(what)) => {
            eprintln!("bus: {what}");
            ExitCode::from(4)
        }
        Err(Failure::Bus(BusError::Io(error)))
            if error.kind() == std::io::ErrorKind::BrokenPipe =>
        {
            ExitCode::SUCCESS
        }
        Err(Failure::Bus(error)) => {
            eprintln!("bus: {error}");
            ExitCode::from(exit_code(&error))
        }
    }
}

fn run(cli: Cli) -> Result<(), Failure> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let url = cli.url;
    match cli.command {
        Command::Provision { manifest } => commands::provision(&url, &manifest, &mut out)?,
        Command::Topics { json } => {
            commands::topics(commands::connect(&url)?.as_ref(), json, &mut out)?
        }
        Command::Publish {
            topic,
            key,
            uid,
            json,
        } => {
            let bus = commands::connect(&url)?;
            match json.as_deref() {
                Some(text) if text != "-" => {
                    commands::publish_one(
                        bus.as_ref(),
                        &topic,
                        &key,
                        uid.as_deref(),
                        text,
                        &mut out,
                    )?;
                }
                _ if uid.is_some() => {
                    return Err(BusError::invalid(
                        "uid",
                        "--uid goes with one value; put metadata.uid in each stdin value instead",
                    )
                    .into());
                }
                _ => commands::publish_lines(
                    bus.as_ref(),
                    &topic,
                    &key,
                    std::io::stdin().lock(),
                    &mut out,
                )?,
            }
        }
        Command::Fetch {
            topic,
            partition,
            key,
            from,
            max,
        } => {
            let bus = commands::connect(&url)?;
            let partition =
                commands::resolve_partition(bus.as_ref(), &topic, partition, key.as_deref())?;
            commands::fetch(
                bus.as_ref(),
                &topic,
                partition.unwrap_or(0),
                from,
                max,
                &mut out,
            )?;
        }
        Command::Tail {
            topic,
            partition,
            key,
            from,
            from_time,
            count,
            max_lag,
            follow,
        } => {
            let options = commands::TailOptions {
                partition,
                key,
                from,
                from_time,
                count,
                max_lag,
                follow,
            };
            commands::tail(&url, &topic, &options, &mut out)?;
        }
        Command::Find { topic, key, uid } => {
            if !commands::find(
                commands::connect(&url)?.as_ref(),
                &topic,
                &key,
                &uid,
                &mut out,
            )? {
                return Err(Failure::NotFound(format!(
                    "no record with uid {uid:?} in topic {topic:?} for key {key:?}"
                )));
            }
        }
        Command::Bench {
            records,
            event_bytes,
            threads,
            samples,
            json,
            compare,
            only,
            idle_secs,
        } => {
            let settings = cli::bench::Settings {
                records,
                event_bytes,
                threads,
                samples,
            };
            cli::run_bench(
                settings,
                std::time::Duration::from_secs(idle_secs),
                &only,
                json,
                compare.as_deref(),
                &mut out,
            )?;
        }
        Command::Maintenance { now } => {
            let expired = commands::connect(&url)?.maintenance(now.unwrap_or_else(bus::now_ms))?;
            writeln!(out, "expired {expired} records")?;
        }
    }
    out.flush()?;
    Ok(())
}
