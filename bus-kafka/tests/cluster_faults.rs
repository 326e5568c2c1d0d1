//! Issue 19: a three-node Kafka cluster of the test's own
//! (scripts/kafka-cluster.sh on free ports, its data in a temp dir), a
//! topic at replication factor 3 (min.insync.replicas 2), and the partition
//! leader killed with SIGKILL while eight threads publish with UIDs through
//! one bus: every acked record is stored exactly once at its acked offset,
//! offsets are gap-free, the same bus goes on, and a retried publish returns
//! the original ack. Prints one `cluster-fault` line with its figures.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use bus_conformance::util::{assert_contiguous, fetch_all, poll_until};
use bus_core::{EventBus, Manifest, PublishAck, TopicSpec};
use bus_kafka::{KafkaBus, KafkaOptions, kafka_topic_name};
use rdkafka::ClientConfig;
use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(10);
const WAIT: Duration = Duration::from_secs(120);
const THREADS: usize = 8;
const TOPIC: &str = "faults";

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/kafka-cluster.sh")
}

/// The cluster; wiped (every node stopped, data deleted) on drop.
struct Cluster {
    base: u16,
    run: tempfile::TempDir,
}

impl Cluster {
    fn command(&self, args: &[&str]) -> String {
        let output = Command::new(script())
            .args(args)
            .arg(self.base.to_string())
            .env("BUS_BROKER_RUN", self.run.path())
            .output()
            .expect("run kafka-cluster.sh");
        assert!(
            output.status.success(),
            "kafka-cluster.sh {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    fn start() -> (Self, String) {
        let cluster = Self {
            base: free_base(),
            run: tempfile::tempdir().expect("run dir"),
        };
        let line = cluster.command(&["start"]);
        let brokers = line
            .strip_prefix("BUS_KAFKA_BROKERS=")
            .expect("BUS_KAFKA_BROKERS line")
            .to_owned();
        (cluster, brokers)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(script())
            .args(["wipe", &self.base.to_string()])
            .env("BUS_BROKER_RUN", self.run.path())
            .output();
    }
}

/// A base port with base+0..2 and base+100..102 free.
fn free_base() -> u16 {
    let seed = u16::try_from(std::process::id() % 2000).unwrap_or(0);
    (0..200)
        .map(|step| 31_000 + (seed * 7 + step * 13) % 8_000)
        .find(|&base| {
            [0, 1, 2, 100, 101, 102]
                .iter()
                .all(|offset| std::net::TcpListener::bind(("127.0.0.1", base + offset)).is_ok())
        })
        .expect("a free port range")
}

/// The node (0..2) leading partition 0 of `topic`.
fn leader(brokers: &str, topic: &str) -> Option<usize> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .ok()?;
    let metadata = admin
        .inner()
        .fetch_metadata(Some(topic), Duration::from_secs(5))
        .ok()?;
    let id = metadata.topics().first()?.partitions().first()?.leader();
    usize::try_from(id - 1).ok().filter(|node| *node < 3)
}

#[derive(Debug, Clone)]
struct Acked {
    thread: usize,
    seq: usize,
    ack: PublishAck,
    started: Instant,
    ended: Instant,
}

#[derive(Default)]
struct Log {
    acked: Vec<Acked>,
    failures: Vec<(Duration, String)>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn uid(thread: usize, seq: usize) -> String {
    format!("t{thread}-{seq}")
}

fn publish_until_acked(bus: &KafkaBus, thread: usize, seq: usize, log: &Mutex<Log>) {
    let value = json!({ "t": thread, "i": seq });
    let first = Instant::now();
    loop {
        let started = Instant::now();
        match bus.publish_idempotent(TOPIC, &format!("k{thread}"), &value, &uid(thread, seq)) {
            Ok(ack) => {
                let ended = Instant::now();
                lock(log).acked.push(Acked {
                    thread,
                    seq,
                    ack,
                    started,
                    ended,
                });
                return;
            }
            Err(error) => {
                let took = started.elapsed();
                eprintln!(
                    "cluster-fault kafka: {} failed after {took:?}: {error}",
                    uid(thread, seq)
                );
                assert!(error.is_transient(), "{}: {error}", uid(thread, seq));
                lock(log).failures.push((took, error.to_string()));
                assert!(first.elapsed() < WAIT, "{} never acked", uid(thread, seq));
            }
        }
    }
}

#[test]
#[ignore = "fails: after a partition leader is killed a UID publish can take 3x the \
            operation timeout (bus-kafka's dedup watermark reads are each bounded by the \
            timeout, not by the call's deadline); run by scripts/test-clusters.sh"]
fn leader_killed_under_load() {
    if common::own::kafka_libs().is_none() {
        return common::skip("cluster_faults", "no Kafka jars (scripts/kafka.sh install)");
    }
    let cluster_started = Instant::now();
    let (cluster, brokers) = Cluster::start();
    let cluster_start = cluster_started.elapsed();
    let id = uuid::Uuid::new_v4().simple().to_string();
    let options = KafkaOptions::new([brokers.clone()])
        .manifest_topic(format!("bus-faults-manifest-{}", &id[..12]))
        .timeout(TIMEOUT);
    let bus = poll_until("a bus on the cluster", WAIT, || {
        KafkaBus::connect_with(options.clone()).ok()
    });
    bus.provision(&Manifest::new([
        TopicSpec::new(TOPIC, 1).with_replication_factor(3)
    ]))
    .expect("provision at replication factor 3");
    let kafka_topic = kafka_topic_name(TOPIC);
    let leader = poll_until("a partition leader", WAIT, || {
        leader(&brokers, &kafka_topic)
    });

    let log = Mutex::new(Log::default());
    let stop = AtomicBool::new(false);
    let mut killed_at = None;
    thread::scope(|scope| {
        for thread in 0..THREADS {
            let (log, stop, bus) = (&log, &stop, &bus);
            scope.spawn(move || {
                let mut seq = 0;
                while !stop.load(Ordering::Relaxed) {
                    publish_until_acked(bus, thread, seq, log);
                    seq += 1;
                }
            });
        }
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            poll_until("200 acks before the kill", WAIT, || {
                (lock(&log).acked.len() > 200).then_some(())
            });
            cluster.command(&["kill", &leader.to_string()]);
            killed_at = Some(Instant::now());
            let before = lock(&log).acked.len();
            poll_until("200 acks after the kill", WAIT, || {
                (lock(&log).acked.len() > before + 200).then_some(())
            });
        }));
        stop.store(true, Ordering::Relaxed);
        if let Err(panic) = result {
            std::panic::resume_unwind(panic);
        }
    });
    let log = log.into_inner().expect("log");
    let killed_at = killed_at.expect("killed");
    let resumed = log
        .acked
        .iter()
        .filter(|acked| acked.started >= killed_at)
        .map(|acked| acked.ended - killed_at)
        .min()
        .expect("acks after the kill");
    for acked in log.acked.iter().step_by(41) {
        let again = bus
            .publish_idempotent(
                TOPIC,
                &format!("k{}", acked.thread),
                &json!({ "t": acked.thread, "i": acked.seq }),
                &uid(acked.thread, acked.seq),
            )
            .expect("retry");
        assert_eq!(again, acked.ack, "a retry after the failover");
    }
    let events = fetch_all(&bus, TOPIC, 0, 0);
    assert_contiguous(&events);
    let mut seen: HashMap<(u64, u64), Vec<u64>> = HashMap::new();
    for event in &events {
        let key = (
            event.value["t"].as_u64().expect("t"),
            event.value["i"].as_u64().expect("i"),
        );
        seen.entry(key).or_default().push(event.offset);
    }
    let duplicated = seen.values().filter(|offsets| offsets.len() > 1).count();
    let lost = log
        .acked
        .iter()
        .filter(|acked| {
            seen.get(&(acked.thread as u64, acked.seq as u64))
                .is_none_or(|offsets| offsets[0] != acked.ack.offset)
        })
        .count();
    eprintln!(
        "cluster-fault kafka leader_killed_under_load: cluster start {cluster_start:?}, threads \
         {THREADS}, acked checked {}, stored {}, lost {lost}, duplicated {duplicated}, failed \
         calls {}, time to resume {resumed:?}",
        log.acked.len(),
        events.len(),
        log.failures.len()
    );
    assert_eq!((lost, duplicated), (0, 0));
    let mut failures = log.failures.clone();
    failures.sort_by_key(|(took, _)| std::cmp::Reverse(*took));
    for (took, error) in failures.iter().take(10) {
        eprintln!("cluster-fault kafka: failed publish after {took:?}: {error}");
    }
    let slowest = failures.first().map(|(took, _)| *took).unwrap_or_default();
    assert!(
        slowest <= TIMEOUT + Duration::from_secs(1),
        "a failed publish took {slowest:?} (> timeout + 1 s)"
    );
    assert!(
        resumed <= TIMEOUT * 2,
        "publishing resumed {resumed:?} after the kill"
    );
}
