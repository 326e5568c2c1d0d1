//! The `bus` command's arguments: one definition for parsing, `--help`,
//! shell completions and the man page.

use clap::{Parser, Subcommand};

use super::tail::TailFrom;

/// The URL used when neither `--url`, a profile nor `BUS_URL` names one.
pub const DEFAULT_URL: &str = "file://./bus-data";

/// Look at, feed and measure a bus, the way kcat and the nats CLI are used
/// for their brokers.
#[derive(Parser)]
#[command(name = "bus", version, about, after_help = super::exit::EXIT_CODES)]
pub struct Cli {
    /// Bus URL: file://DIR (or a bare path), memory://, nats://HOST:PORT, tls://HOST:PORT,
    /// kafka://HOST:PORT, kafkas://HOST:PORT, postgres://USER:PASSWORD@HOST:PORT/DB
    /// [default: file://./bus-data].
    #[arg(long, env = "BUS_URL", hide_env_values = true, global = true)]
    pub url: Option<String>,
    /// Named profile (see `bus profile`); --url given on the command line wins over it.
    #[arg(long, env = "BUS_PROFILE", hide_env_values = true, global = true)]
    pub profile: Option<String>,
    /// Log what the bus does to stderr: -v info, -vv debug, -vvv trace
    /// (warnings and errors are always shown); RUST_LOG, when set, wins.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand)]
pub enum Command {
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
    /// A topic: partitions, the backend's capabilities, offsets and counts per partition.
    #[command(after_help = "Example: bus describe audit")]
    Describe {
        /// Topic.
        topic: String,
    },
    /// Publish a JSON value, or stream stdin lines (one JSON value each) in atomic batches.
    #[command(
        after_help = "Examples:\n  bus publish audit --key agent-1 '{\"event\":\"start\"}'\n  bus publish audit --key agent-1 --header ce_type=agent.started --header ce_source=/harness '{}'\n  tail -f events.jsonl | bus publish audit --key agent-1 --batch-lines 100 --batch-ms 50\n\nEach record prints its ack with \"status\": \"stored\" or \"duplicate\" (an earlier record with its UID).\nA bad stdin line (invalid UTF-8 or JSON, too large) stops the stream with exit 2: nothing of its\nbatch is stored, and the error line says which lines were stored (last offset per partition)."
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
        /// A header NAME=VALUE (repeatable), stored with the record, or with every stdin line (C25).
        #[arg(long = "header", value_name = "NAME=VALUE")]
        headers: Vec<String>,
        /// A stdin batch closes at this many lines...
        #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..))]
        batch_lines: u32,
        /// ...or this many milliseconds after its first line.
        #[arg(long, default_value_t = 100)]
        batch_ms: u64,
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
        /// Print only each record's value.
        #[arg(long)]
        value_only: bool,
    },
    /// Print a topic's records as JSON lines from a position; exits at the end unless --follow.
    #[command(
        after_help = "Examples: bus tail audit                                  all partitions, interleaved by stored_at\n          bus tail audit --key agent-1 --from -10    the last 10 offsets of the key's partition, its records\n          bus tail audit --from-time 1767225600000 --count 5\n          bus tail audit --from end --follow --max-lag 1000\n\nEach line: topic, partition, offset, key, uid (when the value has metadata.uid), stored_at, value."
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
        /// Start: beginning, end, an offset, or -N (the last N offsets of each partition read).
        #[arg(long, default_value = "beginning", allow_hyphen_values = true)]
        from: TailFrom,
        /// Start at the first record stored at or after this time (epoch ms).
        #[arg(long, conflicts_with = "from")]
        from_time: Option<u64>,
        /// Stop after this many records.
        #[arg(long)]
        count: Option<u64>,
        /// When more than this many records behind, skip ahead and print a lag line (with --follow).
        #[arg(long, requires = "follow")]
        max_lag: Option<u64>,
        /// Keep printing new records as they arrive (a live subscription).
        #[arg(long, short)]
        follow: bool,
        /// Print only each record's value.
        #[arg(long)]
        value_only: bool,
    },
    /// Consume a topic as a durable consumer: print records as `tail` does and acknowledge each
    /// once printed; the next run goes on after the last acknowledgement.
    #[command(
        after_help = "Examples: bus consume audit --as mailer --max 100\n          bus consume audit --as mailer --follow --ack-every 100\n          bus consume audit --as mailer --dead-letter audit-dead --max-deliver 5\n\nEach line is tail's (topic, partition, offset, key, uid, stored_at, value), with\n\"delivery_count\" added when a record is delivered again (it was printed and not acknowledged\nbefore a crash). Without --follow it exits once it has read what was stored when it started.\nAnother running instance of the same consumer: exit 6 (or --take-over)."
    )]
    Consume {
        /// Topic.
        topic: String,
        /// The consumer's name (the topic-name rule: letters, digits, `.`, `_`, `-`).
        #[arg(long = "as", value_name = "NAME")]
        name: String,
        /// Only this partition.
        #[arg(long, conflicts_with = "key")]
        partition: Option<u32>,
        /// Only this key's records (read from its partition).
        #[arg(long)]
        key: Option<String>,
        /// Where a new consumer starts: beginning, end, an offset (in each partition), or -N
        /// (the last N of each partition). An existing consumer goes on after its acks.
        #[arg(long, default_value = "beginning", allow_hyphen_values = true)]
        from: TailFrom,
        /// A new consumer starts at the first record stored at or after this time (epoch ms).
        #[arg(long, conflicts_with = "from")]
        from_time: Option<u64>,
        /// Stop after this many records.
        #[arg(long)]
        max: Option<u64>,
        /// Make acknowledgements durable every N records (1: each before the next is printed);
        /// what is pending is written at exit, and a crash prints it again.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        ack_every: u32,
        /// Dead-letter topic (provisioned) for records delivered --max-deliver times unacknowledged.
        #[arg(long)]
        dead_letter: Option<String>,
        /// Deliveries without an acknowledgement before a record is dead-lettered (needs --dead-letter).
        #[arg(long, requires = "dead_letter", value_parser = clap::value_parser!(u32).range(1..))]
        max_deliver: Option<u32>,
        /// Take the consumer over from a running instance (which is fenced: its next ack fails
        /// and it exits 6) instead of exiting 6 because it is owned.
        #[arg(long)]
        take_over: bool,
        /// Keep consuming new records as they arrive.
        #[arg(long, short)]
        follow: bool,
        /// Print only each record's value.
        #[arg(long)]
        value_only: bool,
    },
    /// The durable consumers of a topic: cursor, lag in records and lag in time per partition.
    #[command(after_help = "Example: bus consumers audit --json")]
    Consumers {
        /// Topic.
        topic: String,
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Reset or delete a durable consumer (a running instance of it is fenced).
    #[command(
        subcommand,
        after_help = "Examples: bus consumer reset audit mailer --to beginning\n          bus consumer delete audit mailer"
    )]
    Consumer(ConsumerCommand),
    /// Copy a topic's history into a cold tier (object storage, contract C24): what the tier holds
    /// already is not written again; with --trim, then drop from the hot log what the tier holds.
    #[cfg(feature = "cold")]
    #[command(
        after_help = "Examples:\n  bus archive audit --to file:///var/lib/bus-cold\n  AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... bus archive audit --trim \\\n    --to 's3://bucket/bus?endpoint=https://s3.example.com&region=eu-west-1'\n\nOne JSON line per partition: records archived now, the tier's end, the hot log's first offset.\nOn the embedded log the topic keeps the tier (its cold.json): fetch, tail and subscribe read\nbelow the hot log from it, and --to may be left out once attached. On the other backends the\ntrimmed history is read through bus::ColdBus (a library call), not through `bus fetch`."
    )]
    Archive {
        /// Topic.
        topic: String,
        /// The tier: file:///DIR or s3://BUCKET/PREFIX?endpoint=URL&region=R (credentials from
        /// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, never in the location).
        #[arg(long, value_name = "LOCATION")]
        to: Option<String>,
        /// Then drop from the hot log every record the tier holds.
        #[arg(long)]
        trim: bool,
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
    /// Measure the backend --url names, or every compiled-in backend that is reachable.
    #[command(
        after_help = "Examples: bus bench --records 20000 --json > run.json; bus bench --compare run.json\n          bus --url nats://127.0.0.1:4222 bench      only NATS"
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
        /// Replication factor of the bench topics (and, in bus-bench's
        /// bench_side_by_side, of the raw clients' streams/topics beside them): 3 on a 3-node cluster shows what
        /// replication costs.
        #[arg(long, default_value_t = 1)]
        replication_factor: u16,
    },
    /// Run retention (embedded and memory; brokers expire natively).
    #[command(after_help = "Example: bus maintenance --now 1767225600000")]
    Maintenance {
        /// Clock to expire against, epoch ms (default: now).
        #[arg(long)]
        now: Option<u64>,
    },
    /// Named profiles: a URL and where its secret comes from, in the user's config directory.
    #[command(
        subcommand,
        after_help = "Example: bus profile add prod 'kafkas://bob@kafka.example:9093?ca=/etc/bus/ca.pem' --password-env PROD_KAFKA_PASSWORD\n         bus --profile prod topics      (or BUS_PROFILE=prod)"
    )]
    Profile(ProfileCommand),
    /// Print a shell completion script.
    #[command(
        after_help = "Example: bus completions bash > ~/.local/share/bash-completion/completions/bus"
    )]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff).
    #[command(after_help = "Example: bus man > ~/.local/share/man/man1/bus.1")]
    Man,
}

/// `bus profile ...`.
#[derive(Subcommand)]
pub enum ProfileCommand {
    /// Save a profile (the URL holds no secret; name where the secret comes from).
    #[command(
        after_help = "Example: bus profile add prod 'nats://nats.example:4222' --token-file ~/.config/bus/prod.token"
    )]
    Add {
        /// Profile name.
        name: String,
        /// The bus URL, without password or token (USER@ is fine).
        profile_url: String,
        /// Environment variable holding the password.
        #[arg(long)]
        password_env: Option<String>,
        /// File whose first line is the password.
        #[arg(long)]
        password_file: Option<std::path::PathBuf>,
        /// Environment variable holding a token.
        #[arg(long)]
        token_env: Option<String>,
        /// File whose first line is a token.
        #[arg(long)]
        token_file: Option<std::path::PathBuf>,
    },
    /// List the profiles (name and URL).
    #[command(after_help = "Example: bus profile ls")]
    Ls,
    /// Show one profile, its secrets redacted.
    #[command(after_help = "Example: bus profile show prod")]
    Show {
        /// Profile name.
        name: String,
    },
}

/// `bus consumer ...`.
#[derive(Subcommand)]
pub enum ConsumerCommand {
    /// Move a consumer's cursor: it next delivers from there.
    #[command(
        after_help = "Examples: bus consumer reset audit mailer --to beginning\n          bus consumer reset audit mailer --to -10\n          bus consumer reset audit mailer --to-time 1767225600000"
    )]
    Reset {
        /// Topic.
        topic: String,
        /// Consumer name.
        name: String,
        /// beginning, end, an offset (in each of its partitions), or -N (the last N of each).
        #[arg(long, allow_hyphen_values = true, required_unless_present = "to_time")]
        to: Option<TailFrom>,
        /// The first record stored at or after this time (epoch ms).
        #[arg(long, conflicts_with = "to")]
        to_time: Option<u64>,
    },
    /// Delete a consumer and its cursor (exit 4 when there is none).
    #[command(after_help = "Example: bus consumer delete audit mailer")]
    Delete {
        /// Topic.
        topic: String,
        /// Consumer name.
        name: String,
    },
}
