//! `tail` positions (`--from`, `--from-time`, `--count`, `--key`) and the
//! record lines it prints.

use serde_json::Value;

use crate::support::*;

/// Publishes `n` records, one process each (so `stored_at` grows), cycling
/// over keys that land on different partitions of `audit`.
fn publish_spread(dir: &Dir, n: usize) -> Vec<Value> {
    let keys = ["a", "b", "c", "d", "e", "f"];
    (0..n)
        .map(|i| {
            let value = format!("{{\"i\":{i},\"metadata\":{{\"uid\":\"u-{i}\"}}}}");
            let ack = json_lines(&ok(
                dir,
                &["publish", "audit", "--key", keys[i % keys.len()], &value],
                None,
            ));
            ack[0].clone()
        })
        .collect()
}

fn values(lines: &[Value]) -> Vec<i64> {
    lines
        .iter()
        .map(|l| l["value"]["i"].as_i64().unwrap_or(-1))
        .collect()
}

#[test]
fn all_partitions_are_interleaved_by_stored_at_and_the_tail_exits_at_the_end() {
    let dir = provisioned();
    publish_spread(&dir, 8);
    let lines = json_lines(&ok(&dir, &["tail", "audit"], None));
    assert_eq!(values(&lines), (0..8).collect::<Vec<_>>(), "{lines:?}");
    let line = &lines[3];
    assert_eq!(line["topic"], "audit");
    assert_eq!(line["uid"], "u-3");
    for field in ["partition", "offset", "key", "stored_at", "value"] {
        assert!(!line[field].is_null(), "{field} missing: {line}");
    }
}

#[test]
fn from_minus_n_takes_the_last_n_of_each_partition() {
    let dir = provisioned();
    let acks = publish_spread(&dir, 12);
    let lines = json_lines(&ok(&dir, &["tail", "audit", "--from", "-1"], None));
    let partitions: std::collections::BTreeSet<u64> = acks
        .iter()
        .filter_map(|a| a["partition"].as_u64())
        .collect();
    assert_eq!(
        lines.len(),
        partitions.len(),
        "one per partition: {lines:?}"
    );
    // Each is its partition's newest record.
    for line in &lines {
        let newest = acks
            .iter()
            .filter(|a| a["partition"] == line["partition"])
            .map(|a| a["offset"].as_u64().unwrap_or(0))
            .max();
        assert_eq!(line["offset"].as_u64(), newest, "{line}");
    }
}

#[test]
fn offset_count_key_time_end_and_value_only() {
    let dir = provisioned();
    let acks = publish_spread(&dir, 12);
    let partition = acks[0]["partition"].to_string();
    let from_one = json_lines(&ok(
        &dir,
        &[
            "tail",
            "audit",
            "--partition",
            &partition,
            "--from",
            "1",
            "--count",
            "1",
        ],
        None,
    ));
    assert_eq!(from_one.len(), 1);
    assert_eq!(from_one[0]["offset"], 1);

    let key_a = json_lines(&ok(&dir, &["tail", "audit", "--key", "a"], None));
    assert_eq!(values(&key_a), [0, 6], "only key a's records");

    let all = json_lines(&ok(&dir, &["tail", "audit"], None));
    let time = all[5]["stored_at"].as_u64().unwrap_or(0);
    let since = json_lines(&ok(
        &dir,
        &[
            "tail",
            "audit",
            "--from-time",
            &time.to_string(),
            "--count",
            "3",
        ],
        None,
    ));
    assert_eq!(since.len(), 3);
    assert!(
        since.iter().all(|l| l["stored_at"].as_u64() >= Some(time)),
        "{since:?}"
    );

    assert!(ok(&dir, &["tail", "audit", "--from", "end"], None).is_empty());

    let bare = ok(&dir, &["tail", "audit", "--key", "b", "--value-only"], None);
    assert_eq!(
        json_lines(&bare)[0],
        serde_json::json!({"i": 1, "metadata": {"uid": "u-1"}})
    );
}

#[test]
fn fetch_lines_carry_topic_and_uid() {
    let dir = provisioned();
    ok(
        &dir,
        &[
            "publish",
            "one",
            "--key",
            "k",
            r#"{"metadata":{"uid":"x-1"}}"#,
        ],
        None,
    );
    let lines = json_lines(&ok(&dir, &["fetch", "one"], None));
    assert_eq!(
        (lines[0]["topic"].clone(), lines[0]["uid"].clone()),
        ("one".into(), "x-1".into())
    );
}

#[test]
fn describe_reports_capabilities_offsets_and_counts() {
    let dir = provisioned();
    publish_spread(&dir, 3);
    let text = ok(&dir, &["describe", "audit"], None);
    let description: Value = serde_json::from_str(&text).expect("one JSON object");
    assert_eq!(description["partitions"], 4);
    assert_eq!(description["spec"]["name"], "audit");
    assert_eq!(description["spec"]["retention_ms"], 1000);
    assert_eq!(description["records"], 3);
    assert_eq!(description["capabilities"]["backend"], "embedded");
    assert_eq!(
        description["partition_offsets"].as_array().map(Vec::len),
        Some(4)
    );
    let missing = run(&dir, &["describe", "ghost"], None);
    assert_eq!(missing.code, 3, "{}", missing.stderr);
}
