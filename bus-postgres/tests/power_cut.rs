//! Power cuts, for real (#29): a private PostgreSQL cluster (started by
//! scripts/postgres.sh, as the `postgres` user under root) whose data
//! directory is on `bus-testfs` (a FUSE filesystem that keeps what was not
//! fsynced in memory), cut many times while `PostgresBus` publishers with
//! UIDs run in several threads; `bus_testfs::rounds` has the loop and the
//! check. A cut is `kill -9` of the postmaster and every backend, then the
//! unsynced pages dropped; the restart goes through scripts/postgres.sh,
//! which removes the `postmaster.pid` a power loss leaves behind (the one
//! place that logic lives).
//!
//! - the defaults (`fsync = on`, `synchronous_commit = on`): no ack may be
//!   lost;
//! - `fsync = off` is the control: it must lose, or the filesystem is not
//!   doing its job.
//!
//! Short by default (CI); `BUS_POWER_ROUNDS=200 cargo test -p bus-postgres
//! --test power_cut -- --nocapture` is the long run. Needs root,
//! `/dev/fuse` and PostgreSQL's binaries (skips loudly without; fails with
//! `BUS_REQUIRE_BROKERS=1`).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bus_core::{BusError, EventBus};
use bus_postgres::{PostgresBus, PostgresOptions};
use bus_testfs::rounds::{self, Config, HEADER, Tally};

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/postgres.sh")
}

use bus_conformance::util::free_port;

/// A cluster with its data directory on the mount.
struct Cluster {
    port: u16,
    home: PathBuf,
    /// The Unix socket's directory, off the mount (FUSE here has no sockets).
    sockets: PathBuf,
    url: String,
    server_opts: String,
    /// initdb ran and its cluster was put on disk.
    installed: bool,
}

impl Cluster {
    fn script(&self, command: &str) -> Result<String, String> {
        let output = Command::new("bash")
            .arg(script())
            .args([command, &self.port.to_string()])
            .arg(&self.home)
            .env("BUS_POSTGRES_SERVER_OPTS", &self.server_opts)
            .env("BUS_POSTGRES_SOCKET_DIR", &self.sockets)
            .output()
            .map_err(|e| format!("scripts/postgres.sh: {e}"))?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(format!(
                "scripts/postgres.sh {command} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    }

    /// The postmaster and every process it started.
    fn processes(&self) -> Vec<i32> {
        let pidfile = self.home.join("data/postmaster.pid");
        let Some(postmaster) = std::fs::read_to_string(pidfile)
            .ok()
            .and_then(|text| text.lines().next()?.trim().parse::<i32>().ok())
        else {
            return Vec::new();
        };
        let mut pids = vec![postmaster];
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<i32>().ok())
            else {
                continue;
            };
            // /proc/PID/stat: "pid (comm) state ppid ..."; comm may hold spaces.
            let parent = std::fs::read_to_string(entry.path().join("stat"))
                .ok()
                .and_then(|stat| {
                    let after = stat.rsplit_once(')')?.1.to_owned();
                    after.split_whitespace().nth(1)?.parse::<i32>().ok()
                });
            if parent == Some(postmaster) {
                pids.push(pid);
            }
        }
        pids
    }
}

impl rounds::Server for Cluster {
    fn start(&mut self) -> Result<(), String> {
        let out = self.script("start")?;
        out.lines()
            .find_map(|line| line.strip_prefix("BUS_POSTGRES_URL="))
            .ok_or_else(|| format!("no BUS_POSTGRES_URL in {out:?}"))?
            .clone_into(&mut self.url);
        if !self.installed {
            // The cluster is installed before the machine's story starts:
            // the directory the script made for it on the mount (which
            // initdb does not fsync in its parent) and the cluster reach
            // the disk as a writeback would. Everything later is strict.
            let mount = self.home.parent().ok_or("no mount")?;
            rounds::writeback(mount).map_err(|e| format!("writeback: {e}"))?;
            self.installed = true;
        }
        Ok(())
    }

    fn kill(&mut self) {
        let pids = self.processes();
        if pids.is_empty() {
            return;
        }
        // One kill(1) for all: none of them runs on after another died.
        let _ = Command::new("kill")
            .arg("-KILL")
            .args(pids.iter().map(ToString::to_string))
            .output();
        // This process is their subreaper (see `run`): reap them, or a
        // zombie postmaster keeps its PID and `pg_ctl status` calls it
        // running. Polled until none is left.
        let _ = rounds::poll("postgres processes gone", Duration::from_secs(30), || {
            for &pid in &pids {
                let _ = nix::sys::wait::waitpid(
                    nix::unistd::Pid::from_raw(pid),
                    Some(nix::sys::wait::WaitPidFlag::WNOHANG),
                );
            }
            let left = pids
                .iter()
                .filter(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
                .count();
            if left == 0 {
                Ok(())
            } else {
                Err(format!("{left} left"))
            }
        });
    }

    fn connect(&self) -> Result<Box<dyn EventBus>, BusError> {
        let options = PostgresOptions::from_url(&self.url)?.timeout(Duration::from_secs(5));
        Ok(Box::new(PostgresBus::connect_with(options)?))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        rounds::Server::kill(self);
    }
}

fn installed() -> bool {
    Command::new("bash")
        .arg("-c")
        .arg("ls /usr/lib/postgresql/*/bin/initdb || command -v initdb")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn run(test: &str, server_opts: &str, rounds: usize) -> Option<Tally> {
    if !installed() {
        let why = "PostgreSQL is not installed (scripts/postgres.sh install)";
        assert!(
            std::env::var("BUS_REQUIRE_BROKERS").as_deref() != Ok("1"),
            "{test}: BUS_REQUIRE_BROKERS=1 but {why}"
        );
        eprintln!("SKIPPED {test}: {why}");
        return None;
    }
    // The postmaster outlives pg_ctl: as its subreaper this process can
    // reap it after a kill -9 (a zombie's PID looks alive to pg_ctl).
    nix::sys::prctl::set_child_subreaper(true).expect("prctl");
    let root = tempfile::tempdir().expect("temp dir");
    // The server runs as `postgres` and must reach the mount.
    let open = |dir: &Path| {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    };
    let (backing, mnt) = (root.path().join("backing"), root.path().join("mnt"));
    std::fs::create_dir(&backing).expect("backing");
    std::fs::create_dir(&mnt).expect("mountpoint");
    open(root.path());
    open(&backing);
    std::fs::create_dir(root.path().join("sockets")).expect("socket dir");
    std::fs::set_permissions(
        root.path().join("sockets"),
        std::fs::Permissions::from_mode(0o777),
    )
    .expect("chmod");
    let fs = bus_testfs::mount_or_skip(test, &backing, &mnt).unwrap_or_else(|e| panic!("{e}"))?;
    let mut cluster = Cluster {
        port: free_port(),
        home: fs.path().join("pg"),
        sockets: root.path().join("sockets"),
        url: String::new(),
        server_opts: server_opts.to_owned(),
        installed: false,
    };
    let config = Config {
        rounds,
        threads: 4,
        partitions: 2,
        replication_factor: 1,
        acks_per_round: 150,
        torn: true,
        topic: test.to_owned(),
        // Strict: PostgreSQL fsyncs what a commit needs (WAL; initdb syncs
        // the data directory; replay recreates relation files), so no
        // writeback helps it.
        writeback_after_provision: false,
    };
    let tally = rounds::run(&fs, &mut cluster, &config).unwrap_or_else(|e| panic!("{test}: {e}"));
    drop(cluster);
    Some(tally)
}

#[test]
fn the_defaults_lose_no_ack_in_power_cuts_and_fsync_off_does() {
    let Some(defaults) = run("pg_defaults", "", rounds::rounds_from_env(4)) else {
        return;
    };
    let Some(off) = run(
        "pg_fsync_off",
        "-c fsync=off",
        rounds::rounds_from_env(4).min(20),
    ) else {
        return;
    };
    println!(
        "{HEADER}\n{}\n{}",
        defaults.row("PostgreSQL defaults (fsync on, synchronous_commit on)"),
        off.row("control: PostgreSQL `fsync = off`")
    );
    assert!(defaults.acked > 0);
    assert!(defaults.lossless(), "the defaults lost: {defaults:?}");
    assert!(
        off.lost > 0,
        "the control lost nothing: the filesystem is not doing its job: {off:?}"
    );
}
