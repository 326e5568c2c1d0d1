//! `bus archive` (feature `cold`, C24): history into a cold tier once,
//! `--trim` drops the hot copy and the embedded directory still reads it
//! all; a tier that cannot be used is a clear error with nothing changed.

use serde_json::{Value, json};

use crate::support::*;

/// `one` with `n` records (values `{"n": i}`).
fn published(n: usize) -> Dir {
    let dir = provisioned();
    let lines: String = (0..n).map(|i| format!("{{\"n\":{i}}}\n")).collect();
    ok(&dir, &["publish", "one", "--key", "k"], Some(&lines));
    dir
}

fn values(dir: &Dir) -> Vec<Value> {
    json_lines(&ok(dir, &["fetch", "one", "--from", "0"], None))
        .into_iter()
        .map(|record| record["value"].clone())
        .collect()
}

fn want(n: usize) -> Vec<Value> {
    (0..n).map(|i| json!({ "n": i })).collect()
}

#[test]
fn archive_copies_history_once_and_a_trimmed_directory_still_reads_it() {
    let dir = published(30);
    let tier = format!("file://{}", dir._temp.path().join("tier").display());
    let first = json_lines(&ok(&dir, &["archive", "one", "--to", &tier], None));
    assert_eq!(
        first,
        vec![
            json!({"topic": "one", "partition": 0, "tier_end": 30, "hot_first": 0}),
            json!({"topic": "one", "archived": 30}),
        ]
    );
    // Idempotent: the tier holds it all, nothing is written again (and
    // --to may be left out once the topic has its tier).
    let again = json_lines(&ok(&dir, &["archive", "one"], None));
    assert_eq!(again[1], json!({"topic": "one", "archived": 0}));
    // Trimmed: the hot log starts at the head, the history reads from the tier.
    let trimmed = json_lines(&ok(&dir, &["archive", "one", "--trim"], None));
    assert_eq!(trimmed[0]["hot_first"], 30, "{trimmed:?}");
    assert_eq!(values(&dir), want(30));
    // Publishing goes on at the next offset; the next archive takes only it.
    let ack = ok(&dir, &["publish", "one", "--key", "k", "{\"n\":30}"], None);
    assert_eq!(json_lines(&ack)[0]["offset"], 30);
    let last = json_lines(&ok(&dir, &["archive", "one", "--trim"], None));
    assert_eq!(last[1]["archived"], 1);
    assert_eq!(values(&dir), want(31));
}

#[test]
fn a_tier_that_cannot_be_used_is_a_clear_error_and_changes_nothing() {
    let dir = published(10);
    let fails = |args: &[&str], code: i32, says: &str| {
        let run = run(&dir, args, None);
        assert_eq!(run.code, code, "bus {args:?}: {}", run.stderr);
        assert!(run.stderr.contains(says), "bus {args:?}: {}", run.stderr);
        run.stderr
    };
    // No tier named, none attached.
    fails(&["archive", "one"], 2, "--to");
    fails(&["archive", "one", "--trim"], 2, "--to");
    // Not a location.
    fails(&["archive", "one", "--to", "ftp://host/x"], 2, "ftp");
    // Unknown topic.
    fails(&["archive", "nope", "--to", "memory:"], 3, "nope");
    // An endpoint nothing listens on: retryable (exit 6), no secret shown.
    let unreachable = "s3://bucket/p?endpoint=http://127.0.0.1:9";
    let stderr = {
        let mut command = bus(&dir);
        let output = command
            .args(["archive", "one", "--trim", "--to", unreachable])
            .env("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
            .env("AWS_SECRET_ACCESS_KEY", "sekrit-key-never-shown")
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(6), "{output:?}");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    assert!(stderr.contains("127.0.0.1:9"), "{stderr}");
    assert!(!stderr.contains("sekrit"), "{stderr}");
    // The hot log is as it was: every record, from offset 0.
    let topics = json_lines(&ok(&dir, &["topics", "--json"], None));
    let one = topics.iter().find(|t| t["topic"] == "one").unwrap();
    assert_eq!(
        (one["first"].clone(), one["next"].clone()),
        (json!(0), json!(10))
    );
    assert_eq!(values(&dir), want(10));
}
