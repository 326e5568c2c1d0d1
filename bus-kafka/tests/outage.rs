//! C10 against a broker of the test's own (a child JVM on its own port and
//! data directory, from the jars `scripts/kafka.sh install` cached): calls
//! fail within the timeout + 1 s while it is down, the same bus works again
//! once it is back, and no acknowledged record is missing.

mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bus_conformance::util::{fetch_all, poll_until};
use bus_core::{EventBus, Manifest, PublishAck, TopicSpec};
use bus_kafka::{KafkaBus, KafkaOptions};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(3);

/// The cached Kafka jars (`$BUS_BROKER_HOME/kafka-libs-*` with the
/// installer's `.complete` marker).
fn kafka_libs() -> Option<PathBuf> {
    let home = std::env::var("BUS_BROKER_HOME").map_or_else(
        |_| {
            PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
                .join(".cache/bus-brokers")
        },
        PathBuf::from,
    );
    let version = std::env::var("BUS_KAFKA_VERSION").unwrap_or_else(|_| "4.4.0".into());
    let libs = home.join(format!("kafka-libs-{version}"));
    libs.join(".complete").exists().then_some(libs)
}

fn java() -> PathBuf {
    std::env::var("JAVA_HOME").map_or_else(
        |_| PathBuf::from("java"),
        |home| Path::new(&home).join("bin/java"),
    )
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .unwrap_or_else(|e| panic!("no free port: {e}"))
}

/// A Kafka cluster id: 16 random bytes, URL-safe base64 without padding.
fn cluster_id() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let bytes = uuid::Uuid::new_v4().into_bytes();
    let mut bits = 0u32;
    let mut count = 0;
    let mut out = String::new();
    for byte in bytes {
        bits = (bits << 8) | u32::from(byte);
        count += 8;
        while count >= 6 {
            count -= 6;
            out.push(char::from(ALPHABET[((bits >> count) & 63) as usize]));
        }
    }
    out.push(char::from(ALPHABET[((bits << (6 - count)) & 63) as usize]));
    // Kafka refuses ids starting with '-'.
    out.replacen('-', "A", usize::from(out.starts_with('-')))
}

struct Broker {
    libs: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
}

impl Broker {
    fn new(libs: PathBuf) -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let (port, controller) = (free_port(), free_port());
        let data = dir.path().join("data");
        let props = format!(
            "process.roles=broker,controller\nnode.id=1\ncontroller.quorum.voters=1@127.0.0.1:{controller}\n\
             listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}\n\
             advertised.listeners=PLAINTEXT://127.0.0.1:{port}\ncontroller.listener.names=CONTROLLER\n\
             inter.broker.listener.name=PLAINTEXT\nlistener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT\n\
             log.dirs={}\noffsets.topic.replication.factor=1\noffsets.topic.num.partitions=1\n\
             transaction.state.log.replication.factor=1\ntransaction.state.log.min.isr=1\n\
             share.coordinator.state.topic.replication.factor=1\nshare.coordinator.state.topic.min.isr=1\n\
             group.initial.rebalance.delay.ms=0\nnum.network.threads=2\nnum.io.threads=2\n",
            data.display()
        );
        std::fs::write(dir.path().join("server.properties"), props)
            .unwrap_or_else(|e| panic!("props: {e}"));
        let broker = Self {
            libs,
            dir,
            port,
            child: None,
        };
        let status = broker
            .java("kafka.tools.StorageTool")
            .args(["format", "--ignore-formatted", "-t", &cluster_id(), "-c"])
            .arg(broker.dir.path().join("server.properties"))
            .status()
            .unwrap_or_else(|e| panic!("format: {e}"));
        assert!(status.success(), "kafka storage format failed");
        broker
    }

    fn java(&self, main: &str) -> Command {
        let mut command = Command::new(java());
        command
            .args([
                "-Xms256m",
                "-Xmx512m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
            ])
            .arg(format!(
                "-Dkafka.logs.dir={}",
                self.dir.path().join("logs").display()
            ))
            .arg("-cp")
            .arg(format!("{}/*", self.libs.display()))
            .arg(main)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        command
    }

    fn start(&mut self) {
        let child = self
            .java("kafka.Kafka")
            .arg(self.dir.path().join("server.properties"))
            .spawn()
            .unwrap_or_else(|e| panic!("start kafka: {e}"));
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
    }
}

#[test]
fn broker_outage_fails_fast_and_recovers_without_rebuild() {
    let test = "broker_outage_fails_fast_and_recovers_without_rebuild";
    let Some(libs) = kafka_libs() else {
        return common::skip(
            test,
            "no cached Kafka jars (run: bash scripts/kafka.sh install)",
        );
    };
    let mut broker = Broker::new(libs);
    broker.start();
    let options = KafkaOptions::new([broker.address()]).timeout(TIMEOUT);
    let bus = poll_until("the test broker to serve", Duration::from_secs(120), || {
        KafkaBus::connect_with(options.clone()).ok()
    });
    let topic = "outage";
    bus.provision(&Manifest::new([TopicSpec::new(topic, 1)]))
        .unwrap_or_else(|e| panic!("provision: {e}"));
    let mut acked: Vec<(PublishAck, serde_json::Value)> = Vec::new();
    for n in 0..50 {
        let value = json!({ "n": n, "phase": "before" });
        let ack = bus
            .publish(topic, "k", &value)
            .unwrap_or_else(|e| panic!("publish: {e}"));
        acked.push((ack, value));
    }

    // Kill the broker while a thread keeps publishing.
    let outcomes = std::thread::scope(|scope| {
        let publisher = scope.spawn(|| {
            let mut outcomes = Vec::new();
            let mut failures = 0;
            for n in 0.. {
                let value = json!({ "n": n, "phase": "during" });
                let started = Instant::now();
                let result = bus.publish(topic, "k", &value);
                outcomes.push((result.map(|ack| (ack, value)), started.elapsed()));
                if outcomes.last().is_some_and(|(r, _)| r.is_err()) {
                    failures += 1;
                    if failures == 3 {
                        break;
                    }
                }
            }
            outcomes
        });
        poll_until("some publishes to land", Duration::from_secs(30), || {
            (bus.fetch(topic, 0, 60, 1)
                .map(|got| !got.is_empty())
                .unwrap_or(false))
            .then_some(())
        });
        broker.kill();
        publisher
            .join()
            .unwrap_or_else(|_| panic!("publisher panicked"))
    });
    let limit = TIMEOUT + Duration::from_secs(1);
    for (result, took) in outcomes {
        match result {
            Ok(ack) => acked.push(ack),
            Err(error) => {
                assert!(error.is_transient(), "{error:?}");
                assert!(
                    took <= limit,
                    "a failing publish took {took:?} (> {limit:?}): {error}"
                );
            }
        }
    }
    for call in 0..2 {
        let started = Instant::now();
        let result = bus.fetch(topic, 0, 0, 10);
        let took = started.elapsed();
        assert!(
            result.is_err(),
            "fetch #{call} with the broker down: {result:?}"
        );
        assert!(took <= limit, "a failing fetch took {took:?}");
    }

    // Back on the same port and data: the same bus recovers.
    broker.start();
    let recovered = poll_until(
        "the same bus to publish again",
        Duration::from_secs(120),
        || bus.publish(topic, "k", &json!({"phase": "after"})).ok(),
    );
    assert!(recovered.offset >= 50);
    let stored = fetch_all(&bus, topic, 0, 0);
    for (ack, value) in &acked {
        let found = stored.iter().find(|event| event.offset == ack.offset);
        assert_eq!(
            found.map(|event| &event.value),
            Some(value),
            "acked record at {}",
            ack.offset
        );
    }
    broker.kill();
}
