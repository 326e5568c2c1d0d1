//! `publish` streams stdin in atomic batches and tells exactly what it stored.

use std::io::Write;
use std::process::Stdio;

use crate::support::*;

#[test]
fn records_are_stored_while_the_pipe_is_open_and_the_lock_is_free_between_batches() {
    let dir = provisioned();
    let mut producer = bus(&dir)
        .args(["publish", "one", "--key", "k", "--batch-ms", "20"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn publish");
    let mut pipe = producer.stdin.take().expect("stdin");
    writeln!(pipe, "{{\"n\":1}}").expect("write");
    pipe.flush().expect("flush");
    eventually("the first line to be stored while stdin is open", || {
        json_lines(&ok(&dir, &["fetch", "one"], None)).len() == 1
    });
    // The producer is idle: another writer gets the directory at once.
    let other = run_with(
        &dir,
        &["publish", "one", "--key", "other", "{\"n\":2}"],
        &[("BUS_LOCK_WAIT_MS", "5000")],
    );
    assert_eq!(other.code, 0, "{}", other.stderr);
    writeln!(pipe, "{{\"n\":3}}").expect("write");
    drop(pipe);
    let output = producer.wait_with_output().expect("wait publish");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let acks = json_lines(&String::from_utf8_lossy(&output.stdout));
    assert_eq!(acks.len(), 2);
    assert_eq!(
        acks[1]["offset"], 2,
        "after the other writer's record: {acks:?}"
    );
    assert_eq!(acks[1]["line"], 2);
}

#[test]
fn a_too_large_line_stores_nothing_of_its_batch_and_the_message_is_true() {
    let dir = dir();
    provision(
        &dir,
        "small.toml",
        "[[topics]]\nname = \"small\"\npartitions = 1\nmax_record_bytes = 100\n",
    );
    let input: String = (1..=1_500)
        .map(|i| {
            if i == 1_200 {
                format!("{{\"pad\":\"{}\"}}\n", "x".repeat(200))
            } else {
                format!("{{\"i\":{i}}}\n")
            }
        })
        .collect();
    let result = run(
        &dir,
        &[
            "publish",
            "small",
            "--key",
            "k",
            "--batch-lines",
            "1000",
            "--batch-ms",
            "60000",
        ],
        Some(&input),
    );
    assert_eq!(result.code, 2, "{}", result.stderr);
    assert_eq!(result.stderr.lines().count(), 1, "{}", result.stderr);
    assert!(
        result.stderr.contains("stdin line 1200"),
        "{}",
        result.stderr
    );
    assert!(
        result
            .stderr
            .contains("1000 line(s) up to stdin line 1000 were stored")
            && result.stderr.contains("partition 0 up to offset 999"),
        "{}",
        result.stderr
    );
    let stored = json_lines(&ok(&dir, &["fetch", "small"], None));
    assert_eq!(stored.len(), 1_000, "exactly what the message says");
    assert_eq!(
        json_lines(&result.stdout).len(),
        1_000,
        "one ack per stored line"
    );
}

#[test]
fn invalid_utf8_exits_2_with_its_line_number() {
    let dir = provisioned();
    let mut child = bus(&dir)
        .args(["publish", "one", "--key", "k", "--batch-lines", "1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut pipe = child.stdin.take().expect("stdin");
    pipe.write_all(b"{\"a\":1}\n{\"b\":2}\n\"\xff\"\n{\"c\":3}\n")
        .expect("write");
    drop(pipe);
    let output = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("stdin line 3") && stderr.contains("UTF-8"),
        "{stderr}"
    );
    assert!(
        stderr.contains("2 line(s) up to stdin line 2 were stored"),
        "{stderr}"
    );
    assert_eq!(json_lines(&ok(&dir, &["fetch", "one"], None)).len(), 2);
}

#[test]
fn each_record_says_stored_or_duplicate() {
    let dir = provisioned();
    let input = "{\"metadata\":{\"uid\":\"u-1\"}}\n{\"metadata\":{\"uid\":\"u-2\"}}\n{\"metadata\":{\"uid\":\"u-1\"}}\n";
    let acks = json_lines(&ok(&dir, &["publish", "one", "--key", "k"], Some(input)));
    let status: Vec<_> = acks
        .iter()
        .map(|a| a["status"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(status, ["stored", "stored", "duplicate"]);
    let again = json_lines(&ok(&dir, &["publish", "one", "--key", "k"], Some(input)));
    assert!(
        again.iter().all(|a| a["status"] == "duplicate"),
        "{again:?}"
    );
}

#[test]
fn a_failure_mid_stream_keeps_its_exit_code_and_says_what_was_stored() {
    let dir = provisioned();
    let mut producer = bus(&dir)
        .args(["publish", "one", "--key", "k", "--batch-ms", "20"])
        .env("BUS_LOCK_WAIT_MS", "200")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn publish");
    let mut pipe = producer.stdin.take().expect("stdin");
    writeln!(pipe, "{{\"n\":1}}").expect("write");
    pipe.flush().expect("flush");
    eventually("the first line to be stored", || {
        json_lines(&ok(&dir, &["fetch", "one"], None)).len() == 1
    });
    // Another writer takes the directory while the producer is idle.
    let writer = bus::connect(&dir.url).expect("writer");
    writeln!(pipe, "{{\"n\":2}}").expect("write");
    drop(pipe);
    let output = producer.wait_with_output().expect("wait publish");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(6), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("1 line(s) up to stdin line 1 were stored (partition 0 up to offset 0)"),
        "{stderr}"
    );
    drop(writer);
    assert_eq!(json_lines(&ok(&dir, &["fetch", "one"], None)).len(), 1);
}
