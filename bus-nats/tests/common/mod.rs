//! A nats-server of the test's own, for the tests that stop it or give it
//! a configuration of their own; raw clients beside the bus; the
//! conformance suite's harness (`harness`).
#![allow(dead_code)]

pub mod harness;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// `BUS_NATS_SERVER_BIN`, else `nats-server` on PATH, else the scripts' cache.
pub fn server_binary() -> Option<PathBuf> {
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

// Not every test binary that shares this module starts a server.
#[allow(unused_imports)]
pub use bus_conformance::util::free_port;

/// Starts nats-server with JetStream on 127.0.0.1:`port`, storing in
/// `store`, with `extra` appended to its configuration file.
pub fn start(binary: &Path, port: u16, store: &Path, extra: &str) -> Child {
    // As scripts/nats.sh: the default 1MB max_payload cannot carry a 1 MiB
    // record plus headers, and bus-nats refuses to provision such topics;
    // sync_interval always makes JetStream fsync before it acks.
    let config = store.join("bus-nats.conf");
    std::fs::write(
        &config,
        format!("max_payload: 8MB\njetstream {{ sync_interval: always }}\n{extra}"),
    )
    .expect("write the server config");
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

/// The nats-server binary for a test that starts servers of its own, or
/// `None` after a loud skip (a failure under `BUS_REQUIRE_BROKERS=1`).
pub fn server_binary_or_skip(suite: &str) -> Option<PathBuf> {
    let binary = server_binary();
    if binary.is_none() {
        let why = "no nats-server (set BUS_NATS_SERVER_BIN, put it on PATH or run scripts/nats.sh install)";
        assert!(
            !bus_conformance::brokers_required(),
            "BUS_REQUIRE_BROKERS=1 but {why}"
        );
        bus_conformance::loud(&format!("SKIPPED nats::{suite}: {why}"));
    }
    binary
}

/// Kills the child on every exit path, so a failing test leaves no server.
pub struct Server(pub Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A bus with a prefix of its own on the shared server (`BUS_NATS_URL`),
/// or `None` after a loud skip (a failure under `BUS_REQUIRE_BROKERS=1`).
pub fn shared_bus(suite: &str, tag: &str) -> Option<bus_nats::NatsBus> {
    let Ok(url) = std::env::var("BUS_NATS_URL") else {
        let why = "BUS_NATS_URL is not set (scripts/nats.sh start)";
        assert!(
            !bus_conformance::brokers_required(),
            "BUS_REQUIRE_BROKERS=1 but {why}"
        );
        bus_conformance::loud(&format!("SKIPPED nats::{suite}: {why}"));
        return None;
    };
    let id = uuid::Uuid::new_v4().simple().to_string();
    let options = bus_nats::NatsOptions::from_url(&url)
        .expect("BUS_NATS_URL")
        .prefix(format!("{tag}-{}", &id[..12]));
    Some(bus_nats::NatsBus::connect_with(options).expect("connect"))
}

/// Another bus on `bus`'s prefix on the shared server (another process, or
/// one started after a change to the streams).
pub fn same_prefix(bus: &bus_nats::NatsBus) -> bus_nats::NatsBus {
    let url = std::env::var("BUS_NATS_URL").expect("BUS_NATS_URL");
    bus_nats::NatsBus::connect_with(
        bus_nats::NatsOptions::from_url(&url)
            .expect("BUS_NATS_URL")
            .prefix(bus.prefix().to_owned()),
    )
    .expect("connect")
}

/// Runs `work` with a raw JetStream context on the shared server.
pub fn raw<T>(work: impl AsyncFnOnce(async_nats::jetstream::Context) -> T) -> T {
    let url = std::env::var("BUS_NATS_URL").expect("BUS_NATS_URL");
    let servers = bus_nats::NatsOptions::from_url(&url).expect("url").servers;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let client = async_nats::connect(servers).await.expect("raw connect");
        work(async_nats::jetstream::new(client)).await
    })
}

/// Deletes the streams whose names start with `prefix` and `_`, and the
/// prefix's consumer bucket.
pub async fn delete_streams(js: &async_nats::jetstream::Context, prefix: &str) {
    use futures::StreamExt;
    let ours = format!("{prefix}_");
    let names: Vec<String> = js
        .stream_names()
        .filter_map(|name| async move { name.ok() })
        .collect()
        .await;
    // The consumer bucket's stream (`KV_{prefix}_consumers`) too.
    let bucket = format!("KV_{}", bus_nats::naming::consumer_bucket(prefix));
    for name in names
        .into_iter()
        .filter(|name| name.starts_with(&ours) || *name == bucket)
    {
        let _ = js.delete_stream(&name).await;
    }
}

/// Deletes the bus's streams (the bus has no delete; a raw client does).
pub fn cleanup(bus: &bus_nats::NatsBus) {
    raw(async |js| delete_streams(&js, bus.prefix()).await);
}
