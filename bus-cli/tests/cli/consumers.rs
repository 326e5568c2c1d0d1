//! `bus consume`, `bus consumers` and `bus consumer reset|delete` (C20–C23)
//! on an embedded directory, one process per command as a user runs them.

use serde_json::Value;

use crate::support::*;

/// A directory with `jobs` (2 partitions), its dead-letter topic and `n`
/// records published to `jobs` (values `{"i": 0..n}`, keys spread).
fn jobs(n: usize) -> Dir {
    let dir = dir();
    provision(
        &dir,
        "jobs.toml",
        "[[topics]]\nname = \"jobs\"\npartitions = 2\n\n[[topics]]\nname = \"jobs-dead\"\npartitions = 1\n",
    );
    let input: String = (0..n).map(|i| format!("{{\"i\":{i}}}\n")).collect();
    for (i, line) in input.lines().enumerate() {
        ok(
            &dir,
            &["publish", "jobs", "--key", &format!("k{i}"), line],
            None,
        );
    }
    dir
}

fn values(lines: &[Value]) -> Vec<i64> {
    let mut values: Vec<i64> = lines
        .iter()
        .map(|l| l["value"]["i"].as_i64().unwrap_or(-1))
        .collect();
    values.sort_unstable();
    values
}

#[test]
fn a_second_run_starts_after_the_first_runs_acks() {
    let dir = jobs(7);
    let first = json_lines(&ok(
        &dir,
        &["consume", "jobs", "--as", "mailer", "--max", "3"],
        None,
    ));
    assert_eq!(first.len(), 3, "{first:?}");
    assert!(
        first
            .iter()
            .all(|l| l["topic"] == "jobs" && l["delivery_count"].is_null())
    );
    let second = json_lines(&ok(
        &dir,
        &["consume", "jobs", "--as", "mailer", "--max", "3"],
        None,
    ));
    assert_eq!(second.len(), 3, "{second:?}");
    let mut seen = values(&first);
    for value in values(&second) {
        assert!(!seen.contains(&value), "{value} acked, then printed again");
        seen.push(value);
    }
    // Without --max it prints what is left and exits at the end.
    let rest = json_lines(&ok(&dir, &["consume", "jobs", "--as", "mailer"], None));
    seen.extend(values(&rest));
    seen.sort_unstable();
    assert_eq!(seen, (0..7).collect::<Vec<_>>());
    assert!(ok(&dir, &["consume", "jobs", "--as", "mailer"], None).is_empty());
    // Another consumer name has its own cursor.
    let other = json_lines(&ok(&dir, &["consume", "jobs", "--as", "audit-copy"], None));
    assert_eq!(values(&other), (0..7).collect::<Vec<_>>());
}

#[test]
fn consumers_shows_the_cursor_and_the_lag() {
    let dir = jobs(5);
    ok(
        &dir,
        &[
            "consume",
            "jobs",
            "--as",
            "mailer",
            "--max",
            "2",
            "--ack-every",
            "2",
        ],
        None,
    );
    let rows = json_lines(&ok(&dir, &["consumers", "jobs", "--json"], None));
    assert_eq!(rows.len(), 2, "one row per partition: {rows:?}");
    let lag: u64 = rows.iter().filter_map(|r| r["lag_records"].as_u64()).sum();
    assert_eq!(lag, 3, "{rows:?}");
    assert!(
        rows.iter()
            .all(|r| r["consumer"] == "mailer" && r["selector"] == "topic")
    );
    // A partition with records waiting reports how old the oldest is.
    assert!(
        rows.iter()
            .any(|r| r["lag_records"].as_u64() > Some(0) && r["lag_ms"].is_u64()),
        "{rows:?}"
    );
    let table = ok(&dir, &["consumers", "jobs"], None);
    let header = table.lines().next().unwrap_or_default();
    for column in [
        "consumer",
        "selector",
        "partition",
        "cursor",
        "lag",
        "lag_time",
    ] {
        assert!(header.contains(column), "{table}");
    }
    assert_eq!(
        table.lines().filter(|l| l.starts_with("mailer")).count(),
        2,
        "{table}"
    );
}

#[test]
fn reset_then_consume_sees_the_records_again_and_delete_forgets_the_consumer() {
    let dir = jobs(4);
    assert_eq!(
        json_lines(&ok(&dir, &["consume", "jobs", "--as", "mailer"], None)).len(),
        4
    );
    let reset = ok(
        &dir,
        &["consumer", "reset", "jobs", "mailer", "--to", "beginning"],
        None,
    );
    assert!(reset.contains("reset consumer mailer of jobs"), "{reset}");
    let again = json_lines(&ok(&dir, &["consume", "jobs", "--as", "mailer"], None));
    assert_eq!(values(&again), [0, 1, 2, 3]);
    // --to end: nothing left to print.
    ok(
        &dir,
        &["consumer", "reset", "jobs", "mailer", "--to", "end"],
        None,
    );
    let rows = json_lines(&ok(&dir, &["consumers", "jobs", "--json"], None));
    assert!(rows.iter().all(|r| r["lag_records"] == 0), "{rows:?}");

    let deleted = ok(&dir, &["consumer", "delete", "jobs", "mailer"], None);
    assert!(
        deleted.contains("deleted consumer mailer of jobs"),
        "{deleted}"
    );
    assert!(json_lines(&ok(&dir, &["consumers", "jobs", "--json"], None)).is_empty());
    let missing = run(&dir, &["consumer", "delete", "jobs", "mailer"], None);
    assert_eq!(missing.code, 4, "{}", missing.stderr);
    assert!(
        missing.stderr.contains("no consumer \"mailer\""),
        "{}",
        missing.stderr
    );
    let unknown = run(
        &dir,
        &["consumer", "reset", "jobs", "mailer", "--to", "beginning"],
        None,
    );
    assert_eq!(unknown.code, 2, "{}", unknown.stderr);
    // Deleted: the name starts afresh where --from says.
    let fresh = json_lines(&ok(
        &dir,
        &["consume", "jobs", "--as", "mailer", "--from", "end"],
        None,
    ));
    assert!(fresh.is_empty(), "{fresh:?}");
}

#[test]
fn from_and_partition_choose_where_a_new_consumer_starts() {
    let dir = jobs(6);
    let last = json_lines(&ok(
        &dir,
        &["consume", "jobs", "--as", "tail1", "--from", "-1"],
        None,
    ));
    assert_eq!(last.len(), 2, "the newest of each partition: {last:?}");
    let one = json_lines(&ok(
        &dir,
        &[
            "consume",
            "jobs",
            "--as",
            "p0",
            "--partition",
            "0",
            "--value-only",
        ],
        None,
    ));
    let tail = json_lines(&ok(
        &dir,
        &["tail", "jobs", "--partition", "0", "--value-only"],
        None,
    ));
    assert_eq!(one, tail);
}

#[test]
fn bad_input_exits_2_with_a_clear_message_and_changes_nothing() {
    let dir = jobs(2);
    let bad = run(&dir, &["consume", "jobs", "--as", "no spaces"], None);
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(
        bad.stderr.starts_with("bus: ") && bad.stderr.contains("consumer"),
        "{}",
        bad.stderr
    );
    assert!(bad.stdout.is_empty(), "{}", bad.stdout);
    let dead = run(
        &dir,
        &[
            "consume",
            "jobs",
            "--as",
            "w",
            "--dead-letter",
            "nowhere",
            "--max-deliver",
            "3",
        ],
        None,
    );
    assert_eq!(dead.code, 2, "{}", dead.stderr);
    assert!(dead.stderr.contains("nowhere"), "{}", dead.stderr);
    let unknown = run(&dir, &["consume", "ghost", "--as", "w"], None);
    assert_eq!(unknown.code, 3, "{}", unknown.stderr);
    // None of the refusals created a consumer.
    assert!(json_lines(&ok(&dir, &["consumers", "jobs", "--json"], None)).is_empty());
    // --max-deliver without --dead-letter is refused by the parser.
    let alone = run(
        &dir,
        &["consume", "jobs", "--as", "w", "--max-deliver", "3"],
        None,
    );
    assert_eq!(alone.code, 2, "{}", alone.stderr);
}

#[test]
fn a_dead_letter_consumer_runs_and_prints() {
    let dir = jobs(3);
    let lines = json_lines(&ok(
        &dir,
        &[
            "consume",
            "jobs",
            "--as",
            "w",
            "--dead-letter",
            "jobs-dead",
            "--max-deliver",
            "2",
        ],
        None,
    ));
    assert_eq!(values(&lines), [0, 1, 2]);
    // Everything was acknowledged: nothing went to the dead-letter topic.
    assert!(ok(&dir, &["tail", "jobs-dead"], None).is_empty());
}

/// A second instance exits 6 while one runs; `--take-over` takes the
/// consumer, and the running one is fenced: its next ack fails and it exits
/// 6 (C23).
#[test]
fn take_over_fences_the_running_instance() {
    let dir = jobs(2);
    let mut first = bus(&dir)
        .args(["consume", "jobs", "--as", "w", "--follow"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the first instance");
    // Listed once the first instance has opened it (and owns it while it runs).
    eventually("the first instance to open w", || {
        !json_lines(&ok(&dir, &["consumers", "jobs", "--json"], None)).is_empty()
    });
    let busy = run(&dir, &["consume", "jobs", "--as", "w"], None);
    assert_eq!(busy.code, 6, "{}", busy.stderr);
    assert!(busy.stderr.contains("owned by another"), "{}", busy.stderr);
    ok(&dir, &["consume", "jobs", "--as", "w", "--take-over"], None);
    ok(
        &dir,
        &["publish", "jobs", "--key", "k9", r#"{"i":9}"#],
        None,
    );
    eventually("the fenced instance to exit", || {
        first.try_wait().expect("try_wait").is_some()
    });
    let output = first.wait_with_output().expect("first instance");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(6), "{stderr}");
    assert!(
        stderr.contains("fenced") || stderr.contains("ownership"),
        "{stderr}"
    );
}
