//! Issue 19: a three-node Kafka cluster of each test's own
//! (scripts/kafka-cluster.sh on free ports, its data in a temp dir), a
//! topic at replication factor 3 (min.insync.replicas 2), nodes killed with
//! SIGKILL while publisher threads publish with UIDs:
//! - the partition leader killed: every acked record is stored exactly once
//!   at its acked offset, offsets are gap-free, the same bus resumes within
//!   the operation timeout, a retried publish returns the original ack, a
//!   bus with a short timeout whose calls time out in the failover (their
//!   acks lost) stores each of its UIDs once, and a live subscription sees
//!   every record once, in order;
//! - a follower killed and restarted: nothing lost, nothing duplicated;
//! - two of three killed: publishes fail within timeout + 1 s with a
//!   transient error (never an ack), and succeed once one node is back;
//! - the leader of the durable consumers' cursor topic killed mid-consume:
//!   the same consumer goes on, no record handled again after its ack.
//!
//! The tests take turns (one cluster at a time). Each prints one
//! `cluster-fault` line with its figures.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bus_conformance::faults::{
    Publisher, assert_refused_in_time, check_stored, drain_subscription, lock, report, retry_acked,
    wait_acks, with_publishers,
};
use bus_conformance::util::{assert_contiguous, fetch_all, poll_until};
use bus_core::{EventBus, Manifest, Selector, StartAt, SubscribeOptions, TopicSpec};
use bus_kafka::{KafkaBus, KafkaOptions, kafka_topic_name};
use rdkafka::ClientConfig;
use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(10);
/// The timeout of the leader-kill test's second bus: shorter than the
/// failover, so its calls in flight at the kill time out.
const SHORT_TIMEOUT: Duration = Duration::from_secs(2);
const WAIT: Duration = Duration::from_secs(120);
const THREADS: usize = 8;
const TOPIC: &str = "faults";

/// One cluster at a time: three JVMs per test on two cores are enough.
static SERIAL: Mutex<()> = Mutex::new(());

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/kafka-cluster.sh")
}

/// The cluster; wiped (every node stopped, data deleted) on drop.
struct Cluster {
    base: u16,
    run: tempfile::TempDir,
    brokers: String,
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

    fn start() -> Self {
        let mut cluster = Self {
            base: free_base(),
            run: tempfile::tempdir().expect("run dir"),
            brokers: String::new(),
        };
        let line = cluster.command(&["start"]);
        line.strip_prefix("BUS_KAFKA_BROKERS=")
            .expect("BUS_KAFKA_BROKERS line")
            .clone_into(&mut cluster.brokers);
        cluster
    }

    fn kill(&self, node: usize) {
        self.command(&["kill", &node.to_string()]);
    }

    fn restart(&self, node: usize) {
        self.command(&["restart", &node.to_string()]);
    }

    /// The node (0..2) leading partition 0 of `topic`, and the size of its
    /// in-sync replica set.
    fn partition(&self, topic: &str) -> Option<(usize, usize)> {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .create()
            .ok()?;
        let metadata = admin
            .inner()
            .fetch_metadata(Some(topic), Duration::from_secs(5))
            .ok()?;
        let partition = metadata.topics().first()?.partitions().first()?;
        let leader = usize::try_from(partition.leader() - 1)
            .ok()
            .filter(|node| *node < 3)?;
        Some((leader, partition.isr().len()))
    }

    fn wait_leader(&self, topic: &str) -> usize {
        poll_until("a partition leader", WAIT, || {
            self.partition(topic).map(|(leader, _)| leader)
        })
    }

    fn wait_all_in_sync(&self, topic: &str) {
        poll_until("three in-sync replicas", WAIT, || {
            self.partition(topic)
                .and_then(|(_, isr)| (isr == 3).then_some(()))
        });
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Its data goes anyway: no clean shutdown to wait for.
        let _ = Command::new(script())
            .args(["wipe", &self.base.to_string()])
            .env("BUS_BROKER_RUN", self.run.path())
            .env("BUS_KAFKA_STOP_TIMEOUT", "1")
            .output();
    }
}

/// A base port with base+0..2 and base+100..102 free.
fn free_base() -> u16 {
    bus_conformance::util::free_base(&[0, 1, 2, 100, 101, 102])
}

/// A bus on the cluster with `timeout`, its manifest topic `manifest`.
fn bus(cluster: &Cluster, manifest: &str, timeout: Duration) -> KafkaBus {
    let options = KafkaOptions::new([cluster.brokers.clone()])
        .manifest_topic(manifest)
        .timeout(timeout);
    poll_until("a bus on the cluster", WAIT, || {
        KafkaBus::connect_with(options.clone()).ok()
    })
}

/// The cluster up, a bus on it, the topic provisioned at replication
/// factor 3 and fully in sync; the manifest topic's name; `None` (a loud
/// skip) without the Kafka jars.
fn setup(test: &str) -> Option<(Cluster, KafkaBus, String)> {
    if common::own::kafka_libs().is_none() {
        common::skip(test, "no Kafka jars (scripts/kafka.sh install)");
        return None;
    }
    let id = uuid::Uuid::new_v4().simple().to_string();
    let manifest = format!("bus-faults-manifest-{}", &id[..12]);
    let started = Instant::now();
    let cluster = Cluster::start();
    let bus = bus(&cluster, &manifest, TIMEOUT);
    bus.provision(&Manifest::new([
        TopicSpec::new(TOPIC, 1).with_replication_factor(3)
    ]))
    .expect("provision at replication factor 3");
    cluster.wait_all_in_sync(&kafka_topic_name(TOPIC));
    eprintln!("{test}: cluster up in {:?}", started.elapsed());
    Some((cluster, bus, manifest))
}

#[test]
fn leader_killed_under_load() {
    let _serial = lock(&SERIAL);
    let started = Instant::now();
    let Some((cluster, bus, manifest)) = setup("leader_killed_under_load") else {
        return;
    };
    let short = bus_with_short_timeout(&cluster, &manifest);
    let topic = kafka_topic_name(TOPIC);
    let leader = cluster.wait_leader(&topic);
    let mut subscription = bus
        .subscribe(
            TOPIC,
            Selector::Partition(0),
            StartAt::Beginning,
            SubscribeOptions::default(),
        )
        .expect("subscribe");
    let mut publishers = vec![
        Publisher {
            bus: &bus,
            timeout: TIMEOUT,
        };
        THREADS
    ];
    publishers.push(Publisher {
        bus: &short,
        timeout: SHORT_TIMEOUT,
    });
    let mut killed_at = None;
    let log = with_publishers(&publishers, TOPIC, WAIT, |log| {
        wait_acks(log, 200, "200 acks before the kill", WAIT);
        cluster.kill(leader);
        let at = Instant::now();
        killed_at = Some(at);
        let before = lock(log).acked.len();
        wait_acks(log, before + 200, "200 acks after the kill", WAIT);
    });
    let killed_at = killed_at.expect("killed");
    let resumed = log.resumed_after(killed_at).expect("acks after the kill");
    let new_leader = cluster.wait_leader(&topic);
    assert_ne!(new_leader, leader, "the killed node still leads");
    let retried = retry_acked(&bus, TOPIC, &log, 41);
    let tally = check_stored(&bus, TOPIC, &log);
    let errors = drain_subscription(&mut subscription, tally.stored, WAIT);
    let short_failures = log
        .failures
        .iter()
        .filter(|(took, _)| *took < TIMEOUT - Duration::from_secs(1))
        .count();
    report(
        "kafka",
        "leader_killed_under_load",
        &format!(
            "threads {} ({THREADS} at timeout {TIMEOUT:?}, 1 at {SHORT_TIMEOUT:?}), acked \
             checked {}, stored {}, lost {}, duplicated {}, failed calls {} ({short_failures} \
             short of {TIMEOUT:?}, slowest {:?}), time to resume {resumed:?}, longest ack gap \
             {:?}, retried {retried} (original ack each), subscription delivered {} (gap 0, \
             dup 0, transient errors {errors}), wall time {:?}",
            publishers.len(),
            tally.checked,
            tally.stored,
            tally.lost,
            tally.duplicated,
            log.failures.len(),
            log.slowest_failure(),
            log.longest_gap(),
            tally.stored,
            started.elapsed()
        ),
    );
    assert_eq!((tally.lost, tally.duplicated), (0, 0));
    assert!(
        resumed <= TIMEOUT,
        "publishing resumed {resumed:?} after the kill"
    );
}

/// A second bus on the same manifest, with [`SHORT_TIMEOUT`].
fn bus_with_short_timeout(cluster: &Cluster, manifest: &str) -> KafkaBus {
    bus(cluster, manifest, SHORT_TIMEOUT)
}

#[test]
fn follower_killed_and_restarted() {
    let _serial = lock(&SERIAL);
    let started = Instant::now();
    let Some((cluster, bus, _)) = setup("follower_killed_and_restarted") else {
        return;
    };
    let topic = kafka_topic_name(TOPIC);
    let leader = cluster.wait_leader(&topic);
    let follower = (leader + 1) % 3;
    let publishers = vec![
        Publisher {
            bus: &bus,
            timeout: TIMEOUT,
        };
        THREADS
    ];
    let mut restarted_in = Duration::ZERO;
    let log = with_publishers(&publishers, TOPIC, WAIT, |log| {
        wait_acks(log, 200, "200 acks before the kill", WAIT);
        cluster.kill(follower);
        let before = lock(log).acked.len();
        wait_acks(log, before + 200, "200 acks with a follower down", WAIT);
        let at = Instant::now();
        cluster.restart(follower);
        cluster.wait_all_in_sync(&topic);
        restarted_in = at.elapsed();
        let before = lock(log).acked.len();
        wait_acks(log, before + 200, "200 acks after the restart", WAIT);
    });
    let retried = retry_acked(&bus, TOPIC, &log, 41);
    let tally = check_stored(&bus, TOPIC, &log);
    report(
        "kafka",
        "follower_killed_and_restarted",
        &format!(
            "acked checked {}, stored {}, lost {}, duplicated {}, failed calls {}, longest ack \
             gap {:?}, follower restarted and in sync after {restarted_in:?}, retried {retried}, \
             wall time {:?}",
            tally.checked,
            tally.stored,
            tally.lost,
            tally.duplicated,
            log.failures.len(),
            log.longest_gap(),
            started.elapsed()
        ),
    );
    assert_eq!((tally.lost, tally.duplicated), (0, 0));
}

#[test]
fn two_of_three_killed() {
    let _serial = lock(&SERIAL);
    let started = Instant::now();
    let Some((cluster, bus, _)) = setup("two_of_three_killed") else {
        return;
    };
    let topic = kafka_topic_name(TOPIC);
    let leader = cluster.wait_leader(&topic);
    bus.publish_idempotent(TOPIC, "k", &json!({ "t": 99, "i": 0 }), "before")
        .expect("publish before");
    cluster.kill(leader);
    cluster.kill((leader + 1) % 3);
    let refused = json!({ "t": 99, "i": 1 });
    let slowest = assert_refused_in_time(&bus, TOPIC, &refused, "during-outage", TIMEOUT);
    let back = Instant::now();
    cluster.restart(leader);
    let node_up = back.elapsed();
    let ack = poll_until("a publish once one node is back", WAIT, || {
        bus.publish_idempotent(TOPIC, "k", &refused, "during-outage")
            .ok()
    });
    let recovered = back.elapsed();
    let events = fetch_all(&bus, TOPIC, 0, 0);
    assert_contiguous(&events);
    let stored = events.iter().filter(|event| event.value == refused).count();
    assert_eq!(stored, 1, "the refused UID is stored once after recovery");
    assert_eq!(
        events
            .iter()
            .find(|event| event.value == refused)
            .map(|event| event.offset),
        Some(ack.offset)
    );
    report(
        "kafka",
        "two_of_three_killed",
        &format!(
            "2 publishes refused (slowest {slowest:?}, limit {:?}), node answering {node_up:?} \
             after its restart began, acked again {recovered:?} after it, stored {} (lost 0, \
             duplicated 0), wall time {:?}",
            TIMEOUT + Duration::from_secs(1),
            events.len(),
            started.elapsed()
        ),
    );
}

/// A durable consumer (C20/C21) while the leader of its cursor topic is
/// killed: the same consumer goes on (acks that failed in the failover are
/// made durable by `flush`), every record is handled, none again after its
/// durable ack, and a consumer opened afterwards gets nothing back.
#[test]
fn consumer_survives_the_cursor_leader_kill() {
    use bus_core::consumer::{ConsumeOptions, DurableConsumers};
    let _serial = lock(&SERIAL);
    let started = Instant::now();
    let Some((cluster, bus, _manifest)) = setup("consumer_survives_the_cursor_leader_kill") else {
        return;
    };
    const RECORDS: usize = 60;
    for i in 0..RECORDS {
        bus.publish(TOPIC, &format!("k{i}"), &json!({ "i": i }))
            .expect("publish");
    }
    let open = || {
        bus.consume(
            TOPIC,
            "c",
            Selector::Topic,
            StartAt::Beginning,
            ConsumeOptions::default().ack_wait(Duration::from_secs(5)),
        )
    };
    let mut consumer = open().expect("consume");
    let mut tally = common::Tally::default();
    let deadline = Instant::now() + WAIT;
    while tally.handled.len() < 20 {
        assert!(Instant::now() < deadline, "20 records before the kill");
        tally
            .step(&mut consumer)
            .unwrap_or_else(|e| panic!("before the kill: {e}"));
    }
    let leader = cluster.wait_leader(&bus.cursor_topic());
    cluster.kill(leader);
    let killed = Instant::now();
    let mut failures = 0u64;
    let mut resumed = None;
    while tally.handled.len() < RECORDS || !tally.pending.is_empty() {
        assert!(
            killed.elapsed() < WAIT,
            "all records after the kill ({} handled)",
            tally.handled.len()
        );
        let durable = tally.durable.len();
        match tally.step(&mut consumer) {
            Err(error @ bus_core::BusError::Fenced { .. }) => {
                panic!("fenced by a failover: {error}")
            }
            Err(_) => failures += 1,
            Ok(()) if resumed.is_none() && tally.durable.len() > durable => {
                resumed = Some(killed.elapsed());
            }
            Ok(()) => {}
        }
    }
    drop(consumer);
    let mut again = open().expect("consume again");
    let back = again
        .recv_timeout(Duration::from_secs(3))
        .expect("recv after reopening");
    eprintln!(
        "cluster-fault consumer: records {RECORDS}, handled {}, handled twice after a durable ack {}, \
         redelivered without an ack {}, failed calls {failures}, first durable ack {resumed:?} after the kill, \
         test {:?}",
        tally.handled.len(),
        tally.after_ack,
        tally
            .handled
            .values()
            .map(|n| u64::from(n - 1))
            .sum::<u64>(),
        started.elapsed()
    );
    assert!(back.is_none(), "an acked record came back: {back:?}");
    assert_eq!(
        tally.after_ack, 0,
        "a durably acked record was handled again"
    );
    assert_eq!(tally.handled.len(), RECORDS);
}
