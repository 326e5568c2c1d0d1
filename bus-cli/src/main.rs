//! The `bus` command: provision, feed, read and inspect a bus.
//!
//! Data goes to stdout as JSON lines; errors are one line on stderr, secrets
//! redacted, with an exit code per class of failure (see `bus --help`).

use std::io::Write;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};

use bus_cli::args::{Cli, Command, ConsumerCommand, DEFAULT_URL, ProfileCommand};
use bus_cli::exit::Failure;
use bus_cli::{commands, consume, profile, publish, tail};

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let url_from_command_line =
        matches.value_source("url") == Some(clap::parser::ValueSource::CommandLine);
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(error) => error.exit(),
    };
    bus_cli::logging::install(cli.verbose);
    match run(cli, url_from_command_line) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) if failure.is_broken_pipe() => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("{}", failure.line());
            ExitCode::from(failure.code())
        }
    }
}

/// The URL to use: `--url` on the command line, else the profile's, else
/// `BUS_URL`, else the default. `None` when none was given (for `bench`).
fn chosen_url(cli: &Cli, from_command_line: bool) -> Result<Option<String>, Failure> {
    match (&cli.url, &cli.profile) {
        (Some(url), _) if from_command_line => Ok(Some(url.clone())),
        (_, Some(name)) => profile::url_of(name).map(Some),
        (url, None) => Ok(url.clone()),
    }
}

fn run(cli: Cli, url_from_command_line: bool) -> Result<(), Failure> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let named_url = match &cli.command {
        // These never open a bus: a broken profile must not stop them.
        Command::Profile(_) | Command::Completions { .. } | Command::Man => None,
        _ => chosen_url(&cli, url_from_command_line)?,
    };
    let url = named_url.clone().unwrap_or_else(|| DEFAULT_URL.to_owned());
    match cli.command {
        Command::Provision { manifest } => commands::provision(&url, &manifest, &mut out)?,
        Command::Topics { json } => {
            commands::topics(commands::connect_existing(&url)?.as_ref(), json, &mut out)?;
        }
        Command::Describe { topic } => {
            commands::describe(commands::connect_existing(&url)?.as_ref(), &topic, &mut out)?;
        }
        Command::Publish {
            topic,
            key,
            uid,
            headers,
            batch_lines,
            batch_ms,
            json,
        } => match json.as_deref() {
            Some(text) if text != "-" => {
                publish::publish_one(&url, &topic, &key, uid.as_deref(), &headers, text, &mut out)?;
            }
            _ if uid.is_some() => {
                return Err(bus::BusError::invalid(
                    "uid",
                    "--uid goes with one value; put metadata.uid in each stdin value instead",
                )
                .into());
            }
            _ => {
                let batching = publish::Batching {
                    lines: usize::try_from(batch_lines).unwrap_or(usize::MAX),
                    linger: std::time::Duration::from_millis(batch_ms),
                };
                let stdin = std::io::BufReader::new(std::io::stdin());
                let stream = publish::Stream {
                    topic: &topic,
                    key: &key,
                    headers: publish::parse_headers(&headers)?,
                    batching,
                };
                publish::publish_stream(&url, &stream, stdin, &mut out)?;
            }
        },
        Command::Fetch {
            topic,
            partition,
            key,
            from,
            max,
            value_only,
        } => {
            // The writer's open: it reports damage a read-only open cannot tell
            // from a frame still being written.
            let bus = commands::connect_existing(&url)?;
            let partition =
                commands::resolve_partition(bus.as_ref(), &topic, partition, key.as_deref())?;
            commands::fetch(
                bus.as_ref(),
                &topic,
                partition.unwrap_or(0),
                from,
                max,
                value_only,
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
            value_only,
        } => {
            let options = tail::TailOptions {
                partition,
                key,
                from,
                from_time,
                count,
                max_lag,
                follow,
                value_only,
            };
            tail::tail(&url, &topic, &options, &mut out)?;
        }
        Command::Consume {
            topic,
            name,
            partition,
            key,
            from,
            from_time,
            max,
            ack_every,
            dead_letter,
            max_deliver,
            take_over,
            follow,
            value_only,
        } => {
            let args = consume::ConsumeArgs {
                name,
                partition,
                key,
                start: consume::Position {
                    from,
                    time: from_time,
                },
                max,
                ack_every,
                dead_letter,
                max_deliver,
                take_over,
                follow,
                value_only,
            };
            consume::consume(&url, &topic, &args, &mut out)?;
        }
        Command::Consumers { topic, json } => {
            let bus = consume::connect_consumers(&url, false)?;
            consume::consumers(bus.as_ref(), &topic, json, &mut out)?;
        }
        Command::Consumer(command) => match command {
            ConsumerCommand::Reset {
                topic,
                name,
                to,
                to_time,
            } => {
                let bus = consume::connect_consumers(&url, false)?;
                let to = consume::Position {
                    from: to.unwrap_or(tail::TailFrom::Beginning),
                    time: to_time,
                };
                consume::reset(bus.as_ref(), &topic, &name, to, &mut out)?;
            }
            ConsumerCommand::Delete { topic, name } => {
                let bus = consume::connect_consumers(&url, false)?;
                consume::delete(bus.as_ref(), &topic, &name, &mut out)?;
            }
        },
        #[cfg(feature = "cold")]
        Command::Archive { topic, to, trim } => {
            bus_cli::archive::archive(&url, &topic, to.as_deref(), trim, &mut out)?;
        }
        Command::Find { topic, key, uid } => {
            let bus = commands::connect_existing(&url)?;
            if !commands::find(bus.as_ref(), &topic, &key, &uid, &mut out)? {
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
            replication_factor,
        } => {
            let settings = bus_cli::bench::Settings {
                records,
                event_bytes,
                threads,
                samples,
                replication: replication_factor,
            };
            // The bus alone, beside the disk's bare fdatasync for the
            // embedded log: the raw-client side-by-side lives in the
            // unpublished bus-bench member (example bench_side_by_side).
            bus_cli::run_bench(
                named_url.as_deref(),
                settings,
                std::time::Duration::from_secs(idle_secs),
                &only,
                json,
                compare.as_deref(),
                &bus_cli::references::Disk,
                &mut out,
            )?;
        }
        Command::Maintenance { now } => {
            let expired =
                commands::connect_existing(&url)?.maintenance(now.unwrap_or_else(bus::now_ms))?;
            writeln!(out, "expired {expired} records")?;
        }
        Command::Profile(command) => match command {
            ProfileCommand::Add {
                name,
                profile_url,
                password_env,
                password_file,
                token_env,
                token_file,
            } => profile::add(
                &name,
                profile::Profile {
                    url: profile_url,
                    password_env,
                    password_file,
                    token_env,
                    token_file,
                },
                &mut out,
            )?,
            ProfileCommand::Ls => profile::list(&mut out)?,
            ProfileCommand::Show { name } => profile::show(&name, &mut out)?,
        },
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "bus", &mut out);
        }
        Command::Man => clap_mangen::Man::new(Cli::command()).render(&mut out)?,
    }
    out.flush()?;
    Ok(())
}
