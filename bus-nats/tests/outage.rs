//! C10 against a real outage: a private nats-server is killed while a bus
//! publishes, and started again on the same port and store. Calls fail
//! within timeout + 1 s, the same bus recovers without being rebuilt, and
//! no acknowledged record is lost.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bus_conformance::util::{fetch_all, poll_until};
use bus_conformance::{brokers_required, loud};
use bus_core::{EventBus, Manifest, PublishAck, TopicSpec};
use bus_nats::{NatsBus, NatsOptions};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(2);
const BOUND: Duration = Duration::from_secs(3);

/// `BUS_NATS_SERVER_BIN`, else `nats-server` on PATH, else the scripts' cache.
fn server_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("BUS_NATS_SERVER_BIN") {
        return Some(PathBuf::from(path));
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("nats-server"))
            .find(|candidate| candidate.is_file())
    });
    if on_path.is_some() {
        return on_path;
    }
    let home = std::env::var_os("BUS_BROKER_HOME")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache/bus-brokers"))
        })?;
    let mut cached: Vec<PathBuf> = std::fs::read_dir(home)
        .ok()?
        .filter_map(Result::ok)
        .map(|entry| entry.path().join("nats-server"))
        .filter(|candidate| candidate.is_file())
        .collect();
    cached.sort();
    cached.pop()
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}

fn start(binary: &Path, port: u16, store: &Path) -> Child {
    // As scripts/nats.sh: the default 1MB max_payload cannot carry a 1 MiB
    // record plus headers, and bus-nats refuses to provision such topics.
    let config = store.join("bus-nats.conf");
    std::fs::write(&config, "max_payload: 8MB\n").expect("write the server config");
    Command::new(binary)
        .arg("-c")
        .arg(&config)
        .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
        .arg(store)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start nats-server")
}

fn connect(url: &str) -> NatsBus {
    let options = NatsOptions::from_url(url)
        .expect("url")
        .prefix("outage")
        .timeout(TIMEOUT)
        .connect_timeout(TIMEOUT);
    poll_until(
        "the server to accept a bus",
        Duration::from_secs(30),
        || NatsBus::connect_with(options.clone()).ok(),
    )
}

/// Kills the child on every exit path, so a failing test leaves no server.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn outage_fails_fast_and_recovers_without_rebuild() {
    let Some(binary) = server_binary() else {
        let why = "no nats-server (set BUS_NATS_SERVER_BIN, put it on PATH or run scripts/nats.sh install)";
        assert!(!brokers_required(), "BUS_REQUIRE_BROKERS=1 but {why}");
        loud(&format!("SKIPPED nats::outage: {why}"));
        return;
    };
    let store = tempfile::tempdir().expect("store dir");
    let port = free_port();
    let url = format!("nats://127.0.0.1:{port}");
    let mut server = Server(start(&binary, port, store.path()));
    let bus = connect(&url);
    bus.provision(&Manifest::new([TopicSpec::new("t", 1)]))
        .expect("provision");

    let mut acked: BTreeMap<String, PublishAck> = BTreeMap::new();
    let mut publish = |bus: &NatsBus, i: usize| {
        let uid = format!("u{i}");
        let started = Instant::now();
        let result = bus.publish_idempotent("t", "k", &json!({ "i": i }), &uid);
        let took = started.elapsed();
        assert!(took < BOUND, "publish #{i} took {took:?}");
        if let Ok(ack) = &result {
            acked.insert(uid, ack.clone());
        }
        result
    };
    for i in 0..50 {
        publish(&bus, i).expect("publish before the outage");
    }

    // Kill the server while publishing: every call returns an error in time.
    let _ = server.0.kill();
    let _ = server.0.wait();
    let mut failures = 0;
    let mut i = 50;
    while failures < 3 {
        if publish(&bus, i).is_err() {
            failures += 1;
        }
        i += 1;
        assert!(
            i < 1_000,
            "publishes kept succeeding with the server killed"
        );
    }
    let started = Instant::now();
    assert!(bus.fetch("t", 0, 0, 10).is_err(), "fetch during the outage");
    assert!(
        bus.find_event_by_uid("t", "k", "u1").is_err(),
        "find during the outage"
    );
    assert!(
        started.elapsed() < BOUND * 2,
        "reads took {:?}",
        started.elapsed()
    );

    // Back on the same port and store: the same bus works again.
    server = Server(start(&binary, port, store.path()));
    let recovered = poll_until("the bus to publish again", Duration::from_secs(60), || {
        let result = publish(&bus, i);
        i += 1;
        result.ok()
    });
    for _ in 0..20 {
        publish(&bus, i).expect("publish after recovery");
        i += 1;
    }
    poll_until("fetch to work again", Duration::from_secs(30), || {
        bus.fetch("t", 0, 0, 100).ok()
    });
    let stored = fetch_all(&bus, "t", 0, 0);
    let by_offset: BTreeMap<u64, &serde_json::Value> = stored
        .iter()
        .map(|event| (event.offset, &event.value))
        .collect();
    for (uid, ack) in &acked {
        let n: usize = uid[1..].parse().expect("uid number");
        assert_eq!(
            by_offset.get(&ack.offset).copied(),
            Some(&json!({ "i": n })),
            "acked {uid} at offset {} is missing",
            ack.offset
        );
        let again = bus
            .publish_idempotent("t", "k", &json!({ "i": n }), uid)
            .expect("retry after recovery");
        assert_eq!(&again, ack, "{uid} must still deduplicate");
    }
    assert!(acked.contains_key(&format!("u{}", i - 1)));
    assert!(recovered.offset >= 50);
    drop(server);
}
