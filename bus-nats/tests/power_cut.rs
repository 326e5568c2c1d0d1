//! Power cuts, for real (#29): a private nats-server whose JetStream store
//! is on `bus-testfs` (a FUSE filesystem that keeps what was not fsynced in
//! memory), cut many times while `NatsBus` publishers with UIDs run in
//! several threads; `bus_testfs::rounds` has the loop and the check.
//!
//! - `sync_interval: always` (what scripts/nats.sh runs): JetStream
//!   fsyncs before it acks, so no ack may be lost;
//! - the default (fsync every 2 minutes) is the control: it must lose, or
//!   the filesystem is not doing its job. It loses more than the README's
//!   "up to 2 min of acks": a stream created in the same run comes back
//!   unknown (its `meta.inf` is never fsynced), and then every ack of the
//!   topic counts as lost (the table's "topic gone" column).
//!
//! Short by default (CI); `BUS_POWER_ROUNDS=200 cargo test -p bus-nats
//! --test power_cut -- --nocapture` is the long run. Needs root,
//! `/dev/fuse` and a nats-server binary (skips loudly without; fails with
//! `BUS_REQUIRE_BROKERS=1`).

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bus_core::{BusError, EventBus};
use bus_nats::{NatsBus, NatsOptions};
use bus_testfs::rounds::{self, Config, HEADER, Tally};
use common::{free_port, server_binary_or_skip};

/// A nats-server with its store on the mount.
struct Nats {
    binary: PathBuf,
    config: PathBuf,
    store: PathBuf,
    port: u16,
    monitor: u16,
    child: Option<Child>,
}

impl Nats {
    fn new(binary: PathBuf, scratch: &Path, store: PathBuf, sync_always: bool) -> Self {
        // Outside the mount: the configuration is not what is tested.
        let config = scratch.join("nats.conf");
        let jetstream = if sync_always {
            "jetstream { sync_interval: always }"
        } else {
            // The server's default: fsync every 2 minutes.
            "jetstream {}"
        };
        std::fs::write(&config, format!("max_payload: 8MB\n{jetstream}\n")).expect("config");
        Self {
            binary,
            config,
            store,
            port: free_port(),
            monitor: free_port(),
            child: None,
        }
    }

    /// JetStream is up (it recovers the streams of the store before).
    fn healthy(&self) -> Result<(), String> {
        let mut stream =
            std::net::TcpStream::connect(("127.0.0.1", self.monitor)).map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(|e| e.to_string())?;
        write!(
            stream,
            "GET /healthz?js-enabled-only=true HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"
        )
        .map_err(|e| e.to_string())?;
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        if answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200") {
            Ok(())
        } else {
            Err(answer.lines().next().unwrap_or("no answer").to_owned())
        }
    }
}

impl rounds::Server for Nats {
    fn start(&mut self) -> Result<(), String> {
        let child = Command::new(&self.binary)
            .arg("-c")
            .arg(&self.config)
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-m", &self.monitor.to_string(), "-js", "-sd"])
            .arg(&self.store)
            .stdin(Stdio::null())
            .arg("-l")
            .arg(self.config.with_file_name("nats.log"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("start nats-server: {e}"))?;
        self.child = Some(child);
        rounds::poll("nats-server healthy", Duration::from_secs(60), || {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Ok(Err(format!("nats-server exited: {status}")));
            }
            self.healthy().map(Ok)
        })?
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn connect(&self) -> Result<Box<dyn EventBus>, BusError> {
        let options = NatsOptions::from_url(&format!("nats://127.0.0.1:{}", self.port))?
            .prefix("power")
            .timeout(Duration::from_secs(2))
            .connect_timeout(Duration::from_secs(2));
        Ok(Box::new(NatsBus::connect_with(options)?))
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        rounds::Server::kill(self);
    }
}

fn run(
    test: &str,
    sync_always: bool,
    rounds: usize,
    writeback_after_provision: bool,
) -> Option<Tally> {
    let binary = server_binary_or_skip(test)?;
    let root = tempfile::tempdir().expect("temp dir");
    let (backing, mnt) = (root.path().join("backing"), root.path().join("mnt"));
    std::fs::create_dir(&backing).expect("backing");
    std::fs::create_dir(&mnt).expect("mountpoint");
    let fs = bus_testfs::mount_or_skip(test, &backing, &mnt).unwrap_or_else(|e| panic!("{e}"))?;
    let mut server = Nats::new(binary, root.path(), fs.path().join("store"), sync_always);
    let config = Config {
        rounds,
        threads: 4,
        partitions: 2,
        replication_factor: 1,
        acks_per_round: 300,
        torn: true,
        topic: test.to_owned(),
        writeback_after_provision,
    };
    let tally = rounds::run(&fs, &mut server, &config).unwrap_or_else(|e| {
        let log = std::fs::read_to_string(root.path().join("nats.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(25).collect();
        panic!("{test}: {e}\nnats.log, newest first:\n{}", tail.join("\n"))
    });
    drop(server);
    Some(tally)
}

#[test]
fn sync_always_loses_no_ack_in_power_cuts_and_the_default_does() {
    let Some(always) = run("nats_sync_always", true, rounds::rounds_from_env(6), true) else {
        return;
    };
    let Some(default) = run(
        "nats_default",
        false,
        rounds::rounds_from_env(6).min(20),
        true,
    ) else {
        return;
    };
    // Without the kernel's writeback between provisioning and the cut:
    // nats-server fsyncs neither a stream's `meta.inf` nor the directories
    // it creates, so a stream created in the same boot comes back empty and
    // unknown, with `sync_interval: always` too. Measured and shown, not
    // asserted: it is the server's behaviour, not the bus's.
    let Some(strict) = run("nats_always_strict", true, 2, false) else {
        return;
    };
    println!(
        "{HEADER}\n{}\n{}\n{}",
        always.row("NATS `sync_interval: always`"),
        default.row("control: NATS default (fsync every 2 min)"),
        strict.row("NATS `always`, stream created in the same boot (no writeback before the cut)")
    );
    assert!(always.acked > 0);
    assert!(always.lossless(), "sync_interval always lost: {always:?}");
    assert!(
        default.lost > 0,
        "the control lost nothing: the filesystem is not doing its job: {default:?}"
    );
}
