//! The `bus` binary against the running NATS, Kafka and PostgreSQL
//! servers: the same pipes as on the embedded log. A missing broker is a
//! loud skip, and a failure with `BUS_REQUIRE_BROKERS=1`.
#![cfg(any(feature = "nats", feature = "kafka", feature = "postgres"))]

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::Value;

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run(url: &str, args: &[&str], stdin: Option<&str>) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_bus"))
        .env("BUS_URL", url)
        .env_remove("BUS_PROFILE")
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

fn ok(url: &str, args: &[&str], stdin: Option<&str>) -> Vec<Value> {
    let result = run(url, args, stdin);
    assert_eq!(result.code, 0, "bus {args:?} on {url}: {}", result.stderr);
    result
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}")))
        .collect()
}

/// The broker's URL, or `None` after a loud skip (a panic when required).
fn broker(found: Result<String, bus_conformance::Unavailable>, backend: &str) -> Option<String> {
    match found {
        Ok(url) => Some(url),
        Err(why) if bus_conformance::brokers_required() => {
            panic!("{backend} required (BUS_REQUIRE_BROKERS=1): {why}")
        }
        Err(why) => {
            bus_conformance::loud(&format!("SKIPPED cli_brokers {backend}: {why}"));
            None
        }
    }
}

#[cfg(any(feature = "nats", feature = "kafka"))]
fn flow(url: &str) {
    let topic = format!("cli-{}-{}", std::process::id(), bus::now_ms());
    let manifest = tempfile::NamedTempFile::new().expect("manifest");
    std::fs::write(
        manifest.path(),
        format!("[[topics]]\nname = \"{topic}\"\npartitions = 3\n"),
    )
    .expect("write manifest");
    let path = manifest.path().display().to_string();
    run(url, &["provision", &path], None);
    let input: String = (0..5).map(|i| format!("{{\"i\":{i}}}\n")).collect();
    let acks = ok(url, &["publish", &topic, "--key", "a"], Some(&input));
    assert_eq!(acks.len(), 5);
    assert!(acks.iter().all(|ack| ack["status"] == "stored"), "{acks:?}");
    // A key on another partition than "a", so "a"'s partition holds only its records.
    let other = ["b", "c", "d", "e", "f", "g"]
        .into_iter()
        .find(|key| bus::partition_for(key, 3) != bus::partition_for("a", 3))
        .expect("a key on another partition");
    let value = r#"{"metadata":{"uid":"u-1"}}"#;
    let first = ok(url, &["publish", &topic, "--key", other, value], None);
    let again = ok(url, &["publish", &topic, "--key", other, value], None);
    assert_eq!(
        (first[0]["status"].as_str(), again[0]["status"].as_str()),
        (Some("stored"), Some("duplicate"))
    );
    assert_eq!(first[0]["offset"], again[0]["offset"]);

    let all = ok(url, &["tail", &topic], None);
    assert_eq!(all.len(), 6, "{all:?}");
    assert!(
        all.windows(2)
            .all(|w| w[0]["stored_at"].as_u64() <= w[1]["stored_at"].as_u64())
    );
    assert!(all.iter().all(|line| line["topic"] == topic.as_str()));
    assert_eq!(all.iter().filter(|line| line["uid"] == "u-1").count(), 1);
    let last = ok(
        url,
        &["tail", &topic, "--key", "a", "--from", "-2", "--value-only"],
        None,
    );
    assert_eq!(
        last,
        [serde_json::json!({"i": 3}), serde_json::json!({"i": 4})]
    );

    let described = run(url, &["describe", &topic], None);
    assert_eq!(described.code, 0, "{}", described.stderr);
    let described: Value = serde_json::from_str(&described.stdout).expect("json");
    assert_eq!(
        (
            described["partitions"].as_u64(),
            described["records"].as_u64()
        ),
        (Some(3), Some(6))
    );
    // The spec as provisioned, not `null`.
    assert_eq!(described["spec"]["name"], topic.as_str(), "{described}");
    assert_eq!(described["spec"]["partitions"], 3, "{described}");

    let unknown = run(
        url,
        &["publish", &format!("{topic}-ghost"), "--key", "k", "{}"],
        None,
    );
    assert_eq!(unknown.code, 3, "{}", unknown.stderr);
}

#[cfg(feature = "nats")]
#[test]
fn the_cli_flow_on_nats() {
    if let Some(url) = broker(bus_conformance::brokers::nats_url(), "nats") {
        flow(&url);
    }
}

#[cfg(feature = "kafka")]
#[test]
fn the_cli_flow_on_kafka() {
    if let Some(brokers) = broker(bus_conformance::brokers::kafka_brokers(), "kafka") {
        flow(&format!("kafka://{brokers}"));
    }
}

/// Durable consumers through the URL (C20, C21): a second `consume` goes
/// on after the first's acks, `consumers` shows the lag, reset and delete.
#[cfg(feature = "postgres")]
#[test]
fn consumers_through_the_cli_on_postgres() {
    let Some(url) = broker(bus_conformance::brokers::postgres_url(), "postgres") else {
        return;
    };
    let topic = format!("cli-consume-{}-{}", std::process::id(), bus::now_ms());
    let manifest = tempfile::NamedTempFile::new().expect("manifest");
    std::fs::write(
        manifest.path(),
        format!("[[topics]]\nname = \"{topic}\"\npartitions = 2\n"),
    )
    .expect("write manifest");
    let path = manifest.path().display().to_string();
    let provisioned = run(&url, &["provision", &path], None);
    assert_eq!(provisioned.code, 0, "{}", provisioned.stderr);
    for i in 0..5 {
        ok(
            &url,
            &[
                "publish",
                &topic,
                "--key",
                &format!("k{i}"),
                &format!("{{\"i\":{i}}}"),
            ],
            None,
        );
    }
    let values = |lines: &[Value]| {
        let mut values: Vec<i64> = lines
            .iter()
            .filter_map(|l| l["value"]["i"].as_i64())
            .collect();
        values.sort_unstable();
        values
    };
    let first = ok(
        &url,
        &["consume", &topic, "--as", "mailer", "--max", "3"],
        None,
    );
    assert_eq!(first.len(), 3, "{first:?}");
    let lag: u64 = ok(&url, &["consumers", &topic, "--json"], None)
        .iter()
        .filter_map(|row| row["lag_records"].as_u64())
        .sum();
    assert_eq!(lag, 2);
    let rest = ok(&url, &["consume", &topic, "--as", "mailer"], None);
    let mut all = values(&first);
    all.extend(values(&rest));
    all.sort_unstable();
    assert_eq!(all, [0, 1, 2, 3, 4], "each record once: {first:?} {rest:?}");
    let reset = run(
        &url,
        &["consumer", "reset", &topic, "mailer", "--to", "beginning"],
        None,
    );
    assert_eq!(reset.code, 0, "{}", reset.stderr);
    assert_eq!(
        values(&ok(&url, &["consume", &topic, "--as", "mailer"], None)),
        [0, 1, 2, 3, 4]
    );
    let bad = run(&url, &["consume", &topic, "--as", "bad name"], None);
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    let deleted = run(&url, &["consumer", "delete", &topic, "mailer"], None);
    assert_eq!(deleted.code, 0, "{}", deleted.stderr);
    assert!(ok(&url, &["consumers", &topic, "--json"], None).is_empty());
}

/// `bus archive --trim` on a broker (C24): the tier holds every record, the
/// hot log starts at the head, and a `ColdBus` over the same broker reads
/// the whole history back from offset 0.
#[cfg(all(feature = "nats", feature = "cold"))]
#[test]
fn archive_through_the_cli_on_nats() {
    use bus::EventBus as _;

    let Some(url) = broker(bus_conformance::brokers::nats_url(), "nats") else {
        return;
    };
    let topic = format!("cli-archive-{}-{}", std::process::id(), bus::now_ms());
    let dir = tempfile::tempdir().expect("temp dir");
    let manifest = dir.path().join("topics.toml");
    std::fs::write(
        &manifest,
        format!("[[topics]]\nname = \"{topic}\"\npartitions = 2\n"),
    )
    .expect("write manifest");
    let provisioned = run(&url, &["provision", &manifest.display().to_string()], None);
    assert_eq!(provisioned.code, 0, "{}", provisioned.stderr);
    let input: String = (0..20).map(|i| format!("{{\"i\":{i}}}\n")).collect();
    ok(&url, &["publish", &topic, "--key", "a"], Some(&input));
    ok(&url, &["publish", &topic, "--key", "b"], Some(&input));
    let tier = format!("file://{}", dir.path().join("tier").display());
    let lines = ok(&url, &["archive", &topic, "--to", &tier, "--trim"], None);
    assert_eq!(lines.len(), 3, "{lines:?}");
    for line in &lines[..2] {
        assert_eq!(line["tier_end"], line["hot_first"], "{line}");
    }
    assert_eq!(lines[2]["archived"], 40, "{lines:?}");
    let again = ok(&url, &["archive", &topic, "--to", &tier], None);
    assert_eq!(again[2]["archived"], 0, "idempotent: {again:?}");
    // The whole history, through a ColdBus on the same broker and tier.
    let location = bus::ColdLocation::parse(&tier).expect("location");
    let cold = bus::ColdBus::new(
        bus::NatsBus::connect(&url).expect("connect"),
        std::sync::Arc::new(bus::ColdTier::open(&location).expect("tier")),
        bus::ColdBusOptions::default(),
    );
    let mut values = Vec::new();
    for partition in 0..2 {
        let records = cold.fetch(&topic, partition, 0, 100).expect("fetch");
        assert!(
            records.iter().zip(0..).all(|(r, n)| r.offset == n),
            "gap-free from 0"
        );
        values.extend(records.into_iter().map(|r| r.value));
    }
    assert_eq!(values.len(), 40);
}
