//! What a stored UID costs a NATS server's resident memory, by subject
//! layout (issue #32): each layout runs on a nats-server of its own, started
//! here on a fresh store, and the table prints its VmRSS before and after
//! `--records` UID records, per record.
//!
//! ```sh
//! cargo run --release -p bus-bench --features nats --example nats_uid_memory -- \
//!     --server-bin ~/.cache/bus-brokers/nats-server-2.15.1/nats-server [--records 1000000] [--port 34310]
//! ```
//!
//! Layouts: `one` (every record on one subject: no per-UID state, the
//! floor), `hex64+msgid` (one subject per UID named by the SHA-256 hex of the
//! UID, `Nats-Msg-Id` set: the bus's layout), `hex64` (the same without
//! `Nats-Msg-Id`), `hex32` (a 128-bit hex token, no `Nats-Msg-Id`).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};

const PAYLOAD: usize = 205;

struct Args {
    server_bin: String,
    records: usize,
    port: u16,
    layouts: Vec<String>,
    settle: u64,
}

fn args() -> Args {
    let mut parsed = Args {
        server_bin: "nats-server".to_owned(),
        records: 1_000_000,
        port: 34_310,
        layouts: ["one", "hex64+msgid", "hex64", "hex32"]
            .map(str::to_owned)
            .to_vec(),
        settle: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} wants a value"));
        match flag.as_str() {
            "--server-bin" => parsed.server_bin = value,
            "--records" => parsed.records = value.parse().expect("--records N"),
            "--port" => parsed.port = value.parse().expect("--port N"),
            "--settle" => parsed.settle = value.parse().expect("--settle SECONDS"),
            "--layouts" => parsed.layouts = value.split(',').map(str::to_owned).collect(),
            other => panic!("unknown flag {other}"),
        }
    }
    parsed
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .expect("VmRSS")
}

struct Server {
    child: Child,
    _store: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(bin: &str, port: u16) -> Server {
    let dir = tempfile::tempdir().expect("tempdir");
    let child = Command::new(bin)
        .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nats-server starts");
    Server { child, _store: dir }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn subject(layout: &str, i: usize) -> String {
    use sha2::{Digest, Sha256};
    let uid = format!("uid-{i:012}");
    let digest = Sha256::digest(uid.as_bytes());
    match layout {
        "one" => "m.r".to_owned(),
        "hex64+msgid" | "hex64" => format!("m.u.{}", hex(&digest)),
        "hex32" => format!("m.u.{}", hex(&digest[..16])),
        other => panic!("unknown layout {other}"),
    }
}

/// A JetStream context on the server at `port`, once it answers.
async fn connect(port: u16) -> jetstream::Context {
    let url = format!("nats://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match async_nats::connect(&url).await {
            Ok(client) => return jetstream::new(client),
            Err(error) if Instant::now() > deadline => panic!("connect: {error}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

async fn fill(js: &jetstream::Context, layout: &str, records: usize) -> Duration {
    js.create_stream(stream::Config {
        name: "m".to_owned(),
        subjects: vec!["m.>".to_owned()],
        storage: stream::StorageType::File,
        allow_direct: true,
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await
    .expect("stream");
    let payload = vec![b'x'; PAYLOAD];
    let started = Instant::now();
    for chunk in (0..records).collect::<Vec<_>>().chunks(1_000) {
        let mut acks = Vec::with_capacity(chunk.len());
        for &i in chunk {
            let subject = subject(layout, i);
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Bus-Key", "k");
            headers.insert("Bus-Uid", format!("uid-{i:012}").as_str());
            if layout != "one" {
                headers.insert("Nats-Expected-Last-Subject-Sequence", "0");
            }
            if layout == "hex64+msgid" {
                headers.insert("Nats-Msg-Id", subject.rsplit('.').next().unwrap_or(""));
            }
            acks.push(
                js.publish_with_headers(subject, headers, payload.clone().into())
                    .await
                    .expect("publish"),
            );
        }
        for ack in acks {
            ack.await.expect("ack");
        }
    }
    started.elapsed()
}

fn main() {
    let args = args();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "{:<14} {:>10} {:>12} {:>12} {:>12} {:>12}",
        "layout", "records", "rec/s", "RSS before", "RSS after", "B/record"
    );
    for layout in &args.layouts {
        let server = start(&args.server_bin, args.port);
        let pid = server.child.id();
        let js = runtime.block_on(connect(args.port));
        let before = rss_kib(pid);
        let took = runtime.block_on(fill(&js, layout, args.records));
        let mut after = rss_kib(pid);
        let mut label = layout.clone();
        if args.settle > 0 {
            // Idle past the duplicate window and the block caches' expiry:
            // what stays is what the server keeps per stored UID.
            std::thread::sleep(Duration::from_secs(args.settle));
            after = rss_kib(pid);
            label = format!("{layout}@{}s", args.settle);
        }
        println!(
            "{:<14} {:>10} {:>12.0} {:>8} MiB {:>8} MiB {:>12.0}",
            label,
            args.records,
            args.records as f64 / took.as_secs_f64(),
            before / 1024,
            after / 1024,
            (after.saturating_sub(before) * 1024) as f64 / args.records as f64
        );
        drop(server);
    }
}
