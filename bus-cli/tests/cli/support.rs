//! Running the real `bus` binary against a temporary embedded directory.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::Value;

pub struct Dir {
    pub _temp: tempfile::TempDir,
    pub url: String,
    pub manifest: std::path::PathBuf,
}

pub fn dir() -> Dir {
    let temp = tempfile::tempdir().expect("tempdir");
    let url = format!("file://{}", temp.path().join("data").display());
    let manifest = temp.path().join("topics.toml");
    std::fs::write(
        &manifest,
        "[[topics]]\nname = \"audit\"\npartitions = 4\nretention_ms = 1000\n\n[[topics]]\nname = \"one\"\npartitions = 1\n",
    )
    .expect("manifest");
    Dir {
        _temp: temp,
        url,
        manifest,
    }
}

pub fn bus(dir: &Dir) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_bus"));
    command
        .env("BUS_URL", &dir.url)
        .env("BUS_CONFIG", dir._temp.path().join("profiles.toml"))
        .env_remove("BUS_PROFILE")
        .env_remove("RUST_LOG");
    command
}

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

pub fn run(dir: &Dir, args: &[&str], stdin: Option<&str>) -> Run {
    let mut child = bus(dir)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn bus");
    if let Some(text) = stdin {
        let mut pipe = child.stdin.take().expect("stdin");
        pipe.write_all(text.as_bytes()).expect("write stdin");
    }
    let output = child.wait_with_output().expect("wait bus");
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

pub fn ok(dir: &Dir, args: &[&str], stdin: Option<&str>) -> String {
    let result = run(dir, args, stdin);
    assert_eq!(result.code, 0, "bus {args:?} failed: {}", result.stderr);
    result.stdout
}

pub fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}")))
        .collect()
}

pub fn provisioned() -> Dir {
    let dir = dir();
    let manifest = dir.manifest.display().to_string();
    let out = ok(&dir, &["provision", &manifest], None);
    assert!(out.contains("provisioned audit (4 partitions)"), "{out}");
    dir
}

/// Polls `check` until it holds or `what` times out (20 s).
pub fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !check() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Writes a manifest file in `dir` and provisions it.
pub fn provision(dir: &Dir, name: &str, toml: &str) {
    let path = dir._temp.path().join(name);
    std::fs::write(&path, toml).expect("manifest");
    ok(dir, &["provision", &path.display().to_string()], None);
}

/// `run` with extra environment variables.
pub fn run_with(dir: &Dir, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut command = bus(dir);
    command.args(args).stdin(Stdio::null());
    for (name, value) in env {
        command.env(name, value);
    }
    let output = command.output().expect("run bus");
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}
