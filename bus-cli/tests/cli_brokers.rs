//! The `bus` binary against the running NATS and Kafka brokers: the same
//! pipes as on the embedded log. A missing broker is a loud skip, and a
//! failure with `BUS_REQUIRE_BROKERS=1`.
#![cfg(any(feature = "nats", feature = "kafka"))]

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
