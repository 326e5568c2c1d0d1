//! A Kafka broker of the test's own: a child JVM on its own ports and data
//! directory, from the jars `scripts/kafka.sh install` cached, with a
//! plaintext listener or a SASL_SSL one (its own CA and certificate, made
//! with openssl, and users for PLAIN and SCRAM).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bus_conformance::outage::{self, Stop};
use bus_conformance::tls::Certificates;

/// The cached Kafka jars (`$BUS_BROKER_HOME/kafka-libs-*` with the
/// installer's `.complete` marker).
pub fn kafka_libs() -> Option<PathBuf> {
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

pub fn java() -> PathBuf {
    std::env::var("JAVA_HOME").map_or_else(
        |_| PathBuf::from("java"),
        |home| Path::new(&home).join("bin/java"),
    )
}

// Not every test binary that shares this module starts a server.
#[allow(unused_imports)]
pub use bus_conformance::util::free_port;

/// A broker of the test's own with `listener`, started; `None` after a loud
/// skip (a failure with `BUS_REQUIRE_BROKERS=1`) when the jars are not cached.
pub fn started(test: &str, listener: &Listener) -> Option<Broker> {
    let Some(libs) = kafka_libs() else {
        super::skip(
            test,
            "no cached Kafka jars (run: bash scripts/kafka.sh install)",
        );
        return None;
    };
    let mut broker = Broker::new(libs, listener);
    broker.start();
    Some(broker)
}

/// A bus on a broker just started, once it serves (a JVM on a busy machine
/// takes a while).
pub fn serving(options: &bus_kafka::KafkaOptions) -> bus_kafka::KafkaBus {
    bus_conformance::util::poll_until("the test broker to serve", Duration::from_secs(120), || {
        bus_kafka::KafkaBus::connect_with(options.clone()).ok()
    })
}

/// A Kafka cluster id: 16 random bytes, URL-safe base64 without padding.
pub fn cluster_id() -> String {
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

/// The listener clients connect to.
pub enum Listener {
    Plaintext,
    /// TLS with a certificate for 127.0.0.1 signed by a CA of the test's
    /// own, and SASL: PLAIN for `plain` and SCRAM-SHA-256 for `scram`
    /// (user, password).
    SaslSsl {
        plain: (String, String),
        scram: (String, String),
    },
    /// TLS that requires a client certificate signed by the test's CA
    /// (`ssl.client.auth=required`); no SASL.
    MutualTls,
}

pub struct Broker {
    libs: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
}

fn run(command: &mut Command, what: &str) {
    let status = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(status.success(), "{what} failed");
}

impl Broker {
    /// Formats a fresh broker (not started yet).
    pub fn new(libs: PathBuf, listener: &Listener) -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let (port, controller) = (free_port(), free_port());
        let data = dir.path().join("data");
        let common = format!(
            "process.roles=broker,controller\nnode.id=1\ncontroller.quorum.voters=1@127.0.0.1:{controller}\n\
             controller.listener.names=CONTROLLER\n\
             log.dirs={}\noffsets.topic.replication.factor=1\noffsets.topic.num.partitions=1\n\
             transaction.state.log.replication.factor=1\ntransaction.state.log.min.isr=1\n\
             share.coordinator.state.topic.replication.factor=1\nshare.coordinator.state.topic.min.isr=1\n\
             group.initial.rebalance.delay.ms=0\nnum.network.threads=2\nnum.io.threads=2\n",
            data.display()
        );
        let mut format_args = Vec::new();
        let listeners = match listener {
            Listener::Plaintext => format!(
                "listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}\n\
                 advertised.listeners=PLAINTEXT://127.0.0.1:{port}\n\
                 inter.broker.listener.name=PLAINTEXT\n\
                 listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT\n"
            ),
            Listener::SaslSsl { plain, scram } => {
                let certificates = Certificates::generate(dir.path());
                let internal = free_port();
                format_args.push("--add-scram".to_owned());
                format_args.push(format!(
                    "SCRAM-SHA-256=[name={},password={}]",
                    scram.0, scram.1
                ));
                format!(
                    "listeners=SASL_SSL://127.0.0.1:{port},INTERNAL://127.0.0.1:{internal},CONTROLLER://127.0.0.1:{controller}\n\
                     advertised.listeners=SASL_SSL://127.0.0.1:{port},INTERNAL://127.0.0.1:{internal}\n\
                     inter.broker.listener.name=INTERNAL\n\
                     listener.security.protocol.map=CONTROLLER:PLAINTEXT,INTERNAL:PLAINTEXT,SASL_SSL:SASL_SSL\n\
                     ssl.keystore.type=PEM\nssl.keystore.location={}\n\
                     sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256\n\
                     listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_{}=\"{}\";\n\
                     listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;\n",
                    certificates.server_bundle.display(),
                    plain.0,
                    plain.1,
                )
            }
            Listener::MutualTls => {
                let certificates = Certificates::generate(dir.path());
                let internal = free_port();
                format!(
                    "listeners=SSL://127.0.0.1:{port},INTERNAL://127.0.0.1:{internal},CONTROLLER://127.0.0.1:{controller}\n\
                     advertised.listeners=SSL://127.0.0.1:{port},INTERNAL://127.0.0.1:{internal}\n\
                     inter.broker.listener.name=INTERNAL\n\
                     listener.security.protocol.map=CONTROLLER:PLAINTEXT,INTERNAL:PLAINTEXT,SSL:SSL\n\
                     ssl.keystore.type=PEM\nssl.keystore.location={}\n\
                     ssl.truststore.type=PEM\nssl.truststore.location={}\n\
                     ssl.client.auth=required\n",
                    certificates.server_bundle.display(),
                    certificates.ca.display(),
                )
            }
        };
        std::fs::write(dir.path().join("server.properties"), common + &listeners)
            .unwrap_or_else(|e| panic!("props: {e}"));
        let broker = Self {
            libs,
            dir,
            port,
            child: None,
        };
        run(
            broker
                .java("kafka.tools.StorageTool")
                .args(["format", "--ignore-formatted", "-t", &cluster_id(), "-c"])
                .arg(broker.dir.path().join("server.properties"))
                .args(&format_args),
            "kafka storage format",
        );
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

    pub fn start(&mut self) {
        let child = self
            .java("kafka.Kafka")
            .arg(self.dir.path().join("server.properties"))
            .spawn()
            .unwrap_or_else(|e| panic!("start kafka: {e}"));
        self.child = Some(child);
    }

    /// Takes the broker down as `how` says and waits until it exited.
    pub fn stop(&mut self, how: Stop) {
        if let Some(mut child) = self.child.take() {
            outage::stop(&mut child, how, Duration::from_secs(60));
        }
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `127.0.0.1:port` of the client listener.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The port of the client listener.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The CA certificate clients verify a TLS broker with.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The client certificate and key the CA signed (for mutual TLS).
    pub fn client_cert(&self) -> (PathBuf, PathBuf) {
        (
            self.dir.path().join("client.crt"),
            self.dir.path().join("client.key"),
        )
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
    }
}
