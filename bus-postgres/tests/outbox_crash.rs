//! The outbox (issue #31) when the process dies between
//! `publish_in_transaction` and the commit: `kill -9` of a child that
//! published inside its own open transaction. Nothing of it is stored, the
//! partition's counter lock it held is released (PostgreSQL rolls back the
//! transaction of a connection that died), and the next publish takes the
//! same offset: no hole. Against `BUS_POSTGRES_URL`, in a schema of its own;
//! the child re-runs this binary and reports its publish as a protocol line
//! of the crash harness (`@@…`, found anywhere in a line: libtest's
//! `test child_outbox_process ... ` has no newline of its own, so the
//! child's first line shares its line).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};
use std::time::Duration;

use bus_conformance::brokers_required;
use bus_conformance::consumers::crash;
use bus_conformance::util::fetch_all;
use bus_core::{EventBus, Headers, Manifest, TopicSpec};
use bus_postgres::{PostgresBus, PostgresOptions, tokio_postgres};
use serde_json::json;

const CHILD_URL: &str = "BUS_POSTGRES_OUTBOX_CHILD_URL";
const CHILD_SCHEMA: &str = "BUS_POSTGRES_OUTBOX_CHILD_SCHEMA";
const KEY: [u8; 32] = [0x31; 32];
const TOPIC: &str = "orders";
/// Longest wait for the child's report: a connect and one publish, on a
/// busy machine.
const CHILD_REPORT: Duration = Duration::from_secs(60);

fn options(url: &str, schema: &str) -> PostgresOptions {
    PostgresOptions::from_url(url).unwrap().schema(schema)
}

/// The child: publishes one record inside an open transaction, says so,
/// and waits to be killed without committing.
#[test]
fn child_outbox_process() {
    let (Ok(url), Ok(schema)) = (std::env::var(CHILD_URL), std::env::var(CHILD_SCHEMA)) else {
        return;
    };
    let options = options(&url, &schema);
    let bus = PostgresBus::connect_with(options.clone()).unwrap();
    bus.set_control_key(KEY).unwrap();
    let runtime = bus_conformance::current_thread_runtime().unwrap();
    runtime.block_on(async {
        let (mut client, connection) = options.config.connect(tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        let mut tx = client.transaction().await.unwrap();
        let ack = bus
            .publish_in_transaction(
                &mut tx,
                TOPIC,
                "k",
                &json!({"n": 0}),
                Some("u-0"),
                &Headers::new(),
            )
            .await
            .unwrap();
        crash::say(&format!("published {}", ack.offset)).unwrap();
        // Held open until the parent kills this process.
        std::future::pending::<()>().await;
    });
}

#[test]
fn kill_9_between_publish_in_transaction_and_commit_stores_nothing() {
    let url = match bus_conformance::brokers::postgres_url() {
        Ok(url) => url,
        Err(why) if !brokers_required() => {
            eprintln!(
                "SKIPPED kill_9_between_publish_in_transaction_and_commit: {}",
                why.0
            );
            return;
        }
        Err(why) => panic!("BUS_REQUIRE_BROKERS=1 but {}", why.0),
    };
    let schema = format!("obxc_{}", bus_conformance::namespace_id(12));
    let bus = PostgresBus::connect_with(options(&url, &schema)).unwrap();
    bus.set_control_key(KEY).unwrap();
    bus.provision(&Manifest::new([TopicSpec::new(TOPIC, 1)]))
        .unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "child_outbox_process",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_URL, &url)
        .env(CHILD_SCHEMA, &schema)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    // A child that fails ends its stdout (the wait ends at once); one that
    // hangs is killed at the deadline, never waited on for ever.
    let report = crash::lines(&mut child).unwrap().recv_timeout(CHILD_REPORT);
    let published = report.ok().and_then(|line| {
        line.strip_prefix("published ")
            .map(|offset| offset.parse::<u64>().unwrap())
    });
    if published.is_none() {
        child.kill().unwrap();
        child.wait().unwrap();
    }
    assert_eq!(published, Some(0), "the child published in its transaction");
    // Mid-transaction: the record is not visible, and never will be.
    assert!(fetch_all(&bus, TOPIC, 0, 0).is_empty());
    child.kill().unwrap();
    child.wait().unwrap();
    // Waits on the counter lock until the server has rolled the dead
    // connection's transaction back, then takes offset 0 and the UID.
    let ack = bus
        .publish_idempotent(TOPIC, "k", &json!({"n": 1}), "u-0")
        .unwrap();
    assert_eq!(ack.offset, 0, "no hole where the unfinished record was");
    let stored = fetch_all(&bus, TOPIC, 0, 0);
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].value, json!({"n": 1}));
    assert_eq!(bus.offsets(TOPIC, 0).unwrap().next, 1);
}
