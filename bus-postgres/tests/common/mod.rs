//! A private PostgreSQL for fault tests, run by scripts/postgres.sh on its
//! own port and directory (never the shared one).

#![allow(dead_code)]

pub mod harness;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;

/// One private server; stopped (immediately) when dropped.
pub struct Server {
    pub port: u16,
    pub dir: tempfile::TempDir,
    pub url: String,
    /// More server settings (`-c name=value ...`), kept for restarts.
    pub server_opts: String,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/postgres.sh")
}

// Not every test binary that shares this module starts a server.
#[allow(unused_imports)]
pub use bus_conformance::util::free_port;

fn run(args: &[&str]) -> Result<String, String> {
    run_with(args, "")
}

fn run_with(args: &[&str], server_opts: &str) -> Result<String, String> {
    let output = Command::new("bash")
        .arg(script())
        .args(args)
        .env("BUS_POSTGRES_SERVER_OPTS", server_opts)
        .output()
        .map_err(|e| format!("scripts/postgres.sh: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "scripts/postgres.sh {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

impl Server {
    /// Starts a fresh server, or `None` (a loud skip) when PostgreSQL is not
    /// installed and brokers are not required.
    pub fn start_or_skip(test: &str) -> Option<Self> {
        Self::start_or_skip_with(test, |_| String::new())
    }

    /// As [`Server::start_or_skip`], with server settings that `setup` returns
    /// after it put what they need (certificates, say) in the server's directory.
    pub fn start_or_skip_with(
        test: &str,
        setup: impl FnOnce(&std::path::Path) -> String,
    ) -> Option<Self> {
        let dir = tempfile::tempdir().expect("temp dir");
        // Under root the server runs as the `postgres` user, which must reach it.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
            .expect("chmod");
        let port = free_port();
        let server_opts = setup(dir.path());
        let mut server = Self {
            port,
            dir,
            url: String::new(),
            server_opts,
        };
        match server.start() {
            Ok(()) => Some(server),
            Err(why) if !bus_conformance::brokers_required() => {
                bus_conformance::loud(&format!("SKIPPED {test}: {why}"));
                None
            }
            Err(why) => panic!("{test}: BUS_REQUIRE_BROKERS=1 but {why}"),
        }
    }

    fn dir_arg(&self) -> String {
        self.dir.path().display().to_string()
    }

    /// Starts (again) on the same port and data.
    pub fn start(&mut self) -> Result<(), String> {
        let out = run_with(
            &["start", &self.port.to_string(), &self.dir_arg()],
            &self.server_opts,
        )?;
        let url = out
            .lines()
            .find_map(|line| line.strip_prefix("BUS_POSTGRES_URL="))
            .ok_or_else(|| format!("no BUS_POSTGRES_URL in {out:?}"))?;
        self.url = url.to_owned();
        Ok(())
    }

    /// `pg_ctl stop -m fast` (clean) or `-m immediate` (a crash: no checkpoint).
    pub fn stop(&self, crash: bool) {
        let mode = if crash { "kill" } else { "stop" };
        run(&[mode, &self.port.to_string(), &self.dir_arg()]).unwrap_or_else(|e| panic!("{e}"));
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = run(&["kill", &self.port.to_string(), &self.dir_arg()]);
    }
}
