//! `bus bench` with the raw clients beside the bus: the same flags and the
//! same table as the command, each network backend's serial, batch, replay,
//! delivery and fan-out figures next to plain async-nats, rdkafka or
//! tokio-postgres doing the same work in the same run.
//!
//! ```text
//! cargo run --release -p bus-bench --features nats,kafka,postgres \
//!     --example bench_side_by_side -- [--url URL] [bus bench flags]
//! ```
//!
//! The published `bus` binary measures the bus alone (it cannot depend on
//! this unpublished crate); this is the program the README's side-by-side
//! figures come from.

use std::process::ExitCode;

use bus_cli::args::{Cli, Command};
use clap::Parser;

fn main() -> ExitCode {
    // The command line of `bus bench FLAGS` (`--url` is global there, so it
    // may come after `bench`).
    let mut args: Vec<String> = std::env::args().collect();
    args.insert(1.min(args.len()), "bench".to_owned());
    let cli = Cli::parse_from(args);
    let Command::Bench {
        records,
        event_bytes,
        threads,
        samples,
        json,
        compare,
        only,
        idle_secs,
        replication_factor,
    } = cli.command
    else {
        eprintln!("bench_side_by_side: only `bus bench` flags are accepted");
        return ExitCode::from(2);
    };
    let settings = bus_cli::bench::Settings {
        records,
        event_bytes,
        threads,
        samples,
        replication: replication_factor,
    };
    let mut out = std::io::stdout().lock();
    match bus_cli::run_bench(
        cli.url.as_deref(),
        settings,
        std::time::Duration::from_secs(idle_secs),
        &only,
        json,
        compare.as_deref(),
        &bus_bench::side_by_side::RawClients,
        &mut out,
    ) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("bench_side_by_side: {error}");
            ExitCode::FAILURE
        }
    }
}
