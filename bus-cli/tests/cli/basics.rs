//! The basic flow on the embedded backend: provision, publish, fetch, find.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

use crate::support::*;

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
    let (first, retry) = (&json_lines(&first)[0], &json_lines(&retry)[0]);
    assert_eq!(
        (first["status"].as_str(), retry["status"].as_str()),
        (Some("stored"), Some("duplicate")),
        "publish tells a new record from a duplicate"
    );
    let position = |ack: &Value| {
        (
            ack["topic"].clone(),
            ack["partition"].clone(),
            ack["offset"].clone(),
        )
    };
    assert_eq!(
        position(first),
        position(retry),
        "a retried UID returns the original ack"
    );
    let found = ok(
        &dir,
        &["find", "audit", "--key", "agent-1", "--uid", "evt-1"],
        None,
    );
    assert_eq!(position(&json_lines(&found)[0]), position(first));
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
