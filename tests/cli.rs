//! The `bus` binary, driven as a user would, on the embedded backend.
#![cfg(feature = "embedded")]

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

struct Dir {
    _temp: tempfile::TempDir,
    url: String,
    manifest: std::path::PathBuf,
}

fn dir() -> Dir {
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

fn bus(dir: &Dir) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_bus"));
    command.env("BUS_URL", &dir.url).env_remove("RUST_LOG");
    command
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run(dir: &Dir, args: &[&str], stdin: Option<&str>) -> Run {
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

fn ok(dir: &Dir, args: &[&str], stdin: Option<&str>) -> String {
    let result = run(dir, args, stdin);
    assert_eq!(result.code, 0, "bus {args:?} failed: {}", result.stderr);
    result.stdout
}

fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}")))
        .collect()
}

fn provisioned() -> Dir {
    let dir = dir();
    let manifest = dir.manifest.display().to_string();
    let out = ok(&dir, &["provision", &manifest], None);
    assert!(out.contains("provisioned audit (4 partitions)"), "{out}");
    dir
}

#[test]
fn publish_then_fetch_round_trips() {
    let dir = provisioned();
    let ack = json_lines(&ok(
        &dir,
        &["publish", "one", "--key", "k", r#"{"a":[1,"ü"]}"#],
        None,
    ));
    assert_eq!(ack[0]["offset"], 0);
    let events = json_lines(&ok(&dir, &["fetch", "one", "--partition", "0"], None));
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["value"], serde_json::json!({"a": [1, "ü"]}));
    assert_eq!(events[0]["key"], "k");
}

#[test]
fn stdin_lines_are_published_in_order() {
    let dir = provisioned();
    let input: String = (0..2_500).map(|i| format!("{{\"i\":{i}}}\n")).collect();
    let acks = json_lines(&ok(&dir, &["publish", "one", "--key", "k"], Some(&input)));
    assert_eq!(acks.len(), 2_500);
    assert_eq!(acks[2_499]["offset"], 2_499);
    let events = json_lines(&ok(&dir, &["fetch", "one", "--from", "2498"], None));
    assert_eq!(
        events
            .iter()
            .map(|e| e["value"]["i"].clone())
            .collect::<Vec<_>>(),
        [2_498, 2_499]
    );
    let limited = json_lines(&ok(
        &dir,
        &["fetch", "one", "--from", "10", "--max", "3"],
        None,
    ));
    assert_eq!(limited.len(), 3);
    assert_eq!(limited[0]["offset"], 10);
}

#[test]
fn malformed_stdin_line_is_named_and_stores_nothing() {
    let dir = provisioned();
    let result = run(
        &dir,
        &["publish", "one", "--key", "k"],
        Some("{\"a\":1}\n{\"b\":2}\nnot json\n{\"c\":3}\n"),
    );
    assert_eq!(result.code, 2, "{}", result.stderr);
    assert!(result.stderr.contains("stdin line 3"), "{}", result.stderr);
    assert_eq!(
        result.stderr.lines().count(),
        1,
        "one error line: {}",
        result.stderr
    );
    assert!(
        ok(&dir, &["fetch", "one"], None).is_empty(),
        "nothing may be stored"
    );
}

#[test]
fn topics_reports_offsets_and_counts() {
    let dir = provisioned();
    ok(&dir, &["publish", "one", "--key", "k"], Some("1\n2\n3\n"));
    let rows = json_lines(&ok(&dir, &["topics", "--json"], None));
    assert_eq!(rows.len(), 5, "4 partitions of audit + 1 of one: {rows:?}");
    let one = rows
        .iter()
        .find(|row| row["topic"] == "one")
        .expect("topic one");
    assert_eq!(
        (
            one["first"].clone(),
            one["next"].clone(),
            one["records"].clone()
        ),
        (0.into(), 3.into(), 3.into())
    );
    let table = ok(&dir, &["topics"], None);
    assert!(
        table
            .lines()
            .next()
            .is_some_and(|header| header.contains("records")),
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|line| line.starts_with("one") && line.trim_end().ends_with('3')),
        "{table}"
    );
}

#[test]
fn find_reports_the_ack_or_exits_4() {
    let dir = provisioned();
    let first = ok(
        &dir,
        &[
            "publish", "audit", "--key", "agent-1", "--uid", "evt-1", "{}",
        ],
        None,
    );
    let retry = ok(
        &dir,
        &[
            "publish", "audit", "--key", "agent-1", "--uid", "evt-1", "{}",
        ],
        None,
    );
    assert_eq!(first, retry, "a retried UID returns the original ack");
    let found = ok(
        &dir,
        &["find", "audit", "--key", "agent-1", "--uid", "evt-1"],
        None,
    );
    assert_eq!(json_lines(&found), json_lines(&first));
    let missing = run(
        &dir,
        &["find", "audit", "--key", "agent-1", "--uid", "nope"],
        None,
    );
    assert_eq!(missing.code, 4, "{}", missing.stderr);
}

#[test]
fn errors_have_distinct_exit_codes() {
    let dir = provisioned();
    let unknown = run(&dir, &["publish", "ghost", "--key", "k", "{}"], None);
    assert_eq!(unknown.code, 3, "{}", unknown.stderr);
    assert!(unknown.stderr.contains("ghost"), "{}", unknown.stderr);
    let partition = run(&dir, &["fetch", "audit", "--partition", "9"], None);
    assert_eq!(partition.code, 3, "{}", partition.stderr);
    let usage = run(&dir, &["publish", "one", "{}"], None);
    assert_eq!(
        usage.code, 2,
        "missing --key is bad usage: {}",
        usage.stderr
    );
    let json = run(&dir, &["publish", "one", "--key", "k", "{oops"], None);
    assert_eq!(json.code, 2, "{}", json.stderr);
    let bad = dir._temp.path().join("bad.toml");
    std::fs::write(&bad, "[[topics]]\nname = \"x\"\npartitions = 0\n").expect("write");
    let manifest = run(&dir, &["provision", &bad.display().to_string()], None);
    assert_eq!(manifest.code, 2, "{}", manifest.stderr);
    assert!(
        manifest.stderr.contains("topics[0].partitions"),
        "{}",
        manifest.stderr
    );
}

#[test]
fn every_subcommand_has_help_with_an_example() {
    let dir = dir();
    for sub in [
        "provision",
        "topics",
        "publish",
        "fetch",
        "tail",
        "find",
        "maintenance",
    ] {
        let help = ok(&dir, &[sub, "--help"], None);
        assert!(
            help.contains("Example"),
            "{sub} --help lacks an example:\n{help}"
        );
    }
}

#[test]
fn maintenance_expires_by_retention() {
    let dir = provisioned();
    ok(&dir, &["publish", "audit", "--key", "k"], Some("1\n2\n"));
    let far = (bus::now_ms() + 3_600_000).to_string();
    let out = ok(&dir, &["maintenance", "--now", &far], None);
    assert_eq!(out.trim(), "expired 2 records");
}

#[test]
fn tail_follow_sees_a_record_published_after_it_started() {
    let dir = provisioned();
    ok(
        &dir,
        &["publish", "audit", "--key", "early"],
        Some("{\"n\":1}\n"),
    );
    let mut child = bus(&dir)
        .args(["tail", "audit", "--follow"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn tail");
    let stdout = child.stdout.take().expect("stdout");
    let (lines, receive) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let wait = |what: &str| -> Value {
        let line = receive
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("tail printed no {what}"));
        serde_json::from_str(&line).expect("json line")
    };
    assert_eq!(wait("existing record")["value"]["n"], 1);
    ok(
        &dir,
        &["publish", "audit", "--key", "late"],
        Some("{\"n\":2}\n"),
    );
    let late = wait("record published after start");
    assert_eq!(
        (late["value"]["n"].clone(), late["key"].clone()),
        (2.into(), "late".into())
    );
    child.kill().expect("kill tail");
    child.wait().expect("reap tail");
    reader.join().expect("reader");
}
