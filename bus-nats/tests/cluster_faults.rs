//! Issue 19: a three-node NATS cluster of the test's own (routes,
//! JetStream on each node, `sync_interval: always`, fresh stores and ports),
//! topics at replication factor 3, nodes killed with SIGKILL while eight
//! threads publish with UIDs through one bus:
//! - the stream leader killed: every acked record is stored exactly once at
//!   its acked offset, offsets are gap-free, publishing resumes within the
//!   operation timeout on the same bus, a retried publish returns the
//!   original ack, and a live subscription sees every record once, in order;
//! - a follower killed and restarted: nothing lost, nothing duplicated;
//! - two of three killed: publishes fail within timeout + 1 s with a
//!   transient error (never an ack), and succeed once one node is back;
//! - durable consumers (issue #28): the leader of the consumer bucket (its
//!   KV stream, replicated like the topic) killed mid-consume: acks fail
//!   for the election and then go on, no acked record is handled again,
//!   and a new process finds nothing left.
//!
//! Each test prints one `cluster-fault` line with its figures. With
//! `RUST_LOG` set the bus logs through tracing; with
//! `BUS_FAULTS_SERVER_LOGS=<dir>` each node's own log goes to
//! `<dir>/n<node>.log`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bus_conformance::faults::{
    Publisher, assert_refused_in_time, check_stored, drain_subscription, lock, retry_acked,
    wait_acks, with_publishers,
};
use bus_conformance::util::{assert_contiguous, poll_until, try_fetch_all};
use bus_core::{BusError, EventBus, Manifest, Selector, StartAt, SubscribeOptions, TopicSpec};
use bus_nats::{NatsBus, NatsOptions};
use common::{free_port, server_binary_or_skip};
use serde_json::json;

/// Above the time nats-server takes to elect a new stream leader after a
/// SIGKILL (its Raft election timeout is 4 to 9 s).
const TIMEOUT: Duration = Duration::from_secs(10);
/// A UID publish in flight at the kill is sent again while the stream has
/// no leader ("no responders"), so it is acked as soon as a new leader is
/// elected: publishing resumes within one operation timeout.
const RESUME_LIMIT: Duration = TIMEOUT;
const WAIT: Duration = Duration::from_secs(60);
const THREADS: usize = 8;
const TOPIC: &str = "faults";
const PREFIX: &str = "cf";

/// Three nats-server processes; every one still running is killed on drop.
struct Cluster {
    binary: PathBuf,
    dir: tempfile::TempDir,
    client: [u16; 3],
    route: [u16; 3],
    nodes: [Option<Child>; 3],
}

impl Cluster {
    fn start(binary: PathBuf) -> Self {
        let mut cluster = Self {
            binary,
            dir: tempfile::tempdir().expect("cluster dir"),
            client: [free_port(), free_port(), free_port()],
            route: [free_port(), free_port(), free_port()],
            nodes: [None, None, None],
        };
        for node in 0..3 {
            cluster.spawn(node);
        }
        cluster
    }

    /// As scripts/nats-cluster.sh writes it.
    fn config(&self, node: usize) -> PathBuf {
        let store = self.dir.path().join(format!("n{node}"));
        std::fs::create_dir_all(&store).expect("store dir");
        let routes: String = (0..3)
            .filter(|&other| other != node)
            .map(|other| format!("nats-route://127.0.0.1:{}\n", self.route[other]))
            .collect();
        let text = format!(
            "server_name: n{node}\nlisten: 127.0.0.1:{}\nmax_payload: 8MB\n\
             jetstream {{\n store_dir: \"{}\"\n sync_interval: always\n}}\n\
             cluster {{\n name: bus-faults\n listen: 127.0.0.1:{}\n routes: [\n{routes}]\n}}\n",
            self.client[node],
            store.display(),
            self.route[node],
        );
        let path = self.dir.path().join(format!("n{node}.conf"));
        std::fs::write(&path, text).expect("write config");
        path
    }

    fn spawn(&mut self, node: usize) {
        let config = self.config(node);
        let log = std::env::var_os("BUS_FAULTS_SERVER_LOGS")
            .map(|dir| PathBuf::from(dir).join(format!("n{node}.log")));
        let child = spawn_server(&self.binary, &config, log.as_deref());
        self.nodes[node] = Some(child);
    }

    /// SIGKILL, then reap.
    fn kill(&mut self, node: usize) {
        let mut child = self.nodes[node].take().expect("node is running");
        child.kill().expect("kill -9");
        child.wait().expect("reap");
    }

    fn url(&self) -> String {
        self.client
            .iter()
            .map(|port| format!("nats://127.0.0.1:{port}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn node_named(name: &str) -> usize {
        name.trim_start_matches('n')
            .parse()
            .expect("node name n0..n2")
    }

    /// The stream's leader and whether every replica is current, asked of a
    /// running node.
    fn stream_state(&self) -> Option<(usize, bool)> {
        self.state_of(None)
    }

    /// [`Cluster::stream_state`] of the stream `name` (the topic's stream
    /// when `None`).
    fn state_of(&self, named: Option<&str>) -> Option<(usize, bool)> {
        let named = named.map(str::to_owned);
        let urls: Vec<String> = (0..3)
            .filter(|&node| self.nodes[node].is_some())
            .map(|node| format!("nats://127.0.0.1:{}", self.client[node]))
            .collect();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let client = async_nats::ConnectOptions::new()
                .connection_timeout(Duration::from_secs(2))
                .connect(urls)
                .await
                .ok()?;
            let js = async_nats::jetstream::new(client);
            let name = match named {
                Some(name) => name,
                None => stream_of(&js).await?,
            };
            let mut stream = js.get_stream(&name).await.ok()?;
            let info = stream.info().await.ok()?;
            let cluster = info.cluster.clone()?;
            let leader = Self::node_named(cluster.leader.as_deref()?);
            let current = cluster.replicas.len() == 2
                && cluster
                    .replicas
                    .iter()
                    .all(|replica| replica.current && !replica.offline);
            Some((leader, current))
        })
    }

    /// How many streams the cluster holds.
    fn stream_count(&self) -> usize {
        let url = format!("nats://127.0.0.1:{}", self.client[0]);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            use futures::StreamExt;
            let client = async_nats::connect(url).await.expect("raw connect");
            async_nats::jetstream::new(client)
                .stream_names()
                .filter_map(|name| async move { name.ok() })
                .count()
                .await
        })
    }

    fn wait_leader(&self) -> usize {
        poll_until("a stream leader", WAIT, || {
            self.stream_state().map(|(leader, _)| leader)
        })
    }

    fn wait_all_current(&self) {
        poll_until("every replica current", WAIT, || {
            self.stream_state()
                .and_then(|(_, current)| current.then_some(()))
        });
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in self.nodes.iter_mut().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A node's output goes to `log` (appended: a restarted node goes on in
/// the same file) when `BUS_FAULTS_SERVER_LOGS` names a directory.
fn spawn_server(binary: &Path, config: &Path, log: Option<&Path>) -> Child {
    let output = || match log {
        Some(path) => std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_or_else(|_| Stdio::null(), Stdio::from),
        None => Stdio::null(),
    };
    Command::new(binary)
        .arg("-c")
        .arg(config)
        .stdin(Stdio::null())
        .stdout(output())
        .stderr(output())
        .spawn()
        .expect("start nats-server")
}

async fn stream_of(js: &async_nats::jetstream::Context) -> Option<String> {
    use futures::StreamExt;
    let names: Vec<String> = js
        .stream_names()
        .filter_map(|name| async move { name.ok() })
        .collect()
        .await;
    names
        .into_iter()
        .find(|name| name.starts_with(&format!("{PREFIX}_")))
}

/// The cluster up, one bus on all three seeds, the topic provisioned at
/// replication factor 3 (retried until the meta group has a leader).
fn setup(suite: &str) -> Option<(Cluster, NatsBus)> {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
    let binary = server_binary_or_skip(suite)?;
    let cluster = Cluster::start(binary);
    let options = NatsOptions::from_url(&cluster.url())
        .expect("url")
        .prefix(PREFIX)
        .timeout(TIMEOUT)
        .connect_timeout(TIMEOUT);
    let bus = poll_until("the cluster to accept a bus", WAIT, || {
        NatsBus::connect_with(options.clone()).ok()
    });
    let manifest = Manifest::new([TopicSpec::new(TOPIC, 1).with_replication_factor(3)]);
    poll_until("provisioning at replication factor 3", WAIT, || {
        bus.provision(&manifest).ok()
    });
    cluster.wait_all_current();
    Some((cluster, bus))
}

/// [`THREADS`] publishers on `bus`.
fn publishers(bus: &NatsBus) -> Vec<Publisher<'_>> {
    vec![
        Publisher {
            bus,
            timeout: TIMEOUT,
        };
        THREADS
    ]
}

fn report(test: &str, fields: &str) {
    bus_conformance::faults::report("nats", test, fields);
}

#[test]
#[ignore = "run by scripts/test-clusters.sh (and CI): kills nodes under load, up to a minute"]
fn leader_killed_under_load() {
    let started = Instant::now();
    let Some((mut cluster, bus)) = setup("cluster_faults") else {
        return;
    };
    let leader = cluster.wait_leader();
    let mut subscription = bus
        .subscribe(
            TOPIC,
            Selector::Partition(0),
            StartAt::Beginning,
            SubscribeOptions::default(),
        )
        .expect("subscribe");
    let publishers = publishers(&bus);
    let mut killed_at = None;
    let log = with_publishers(&publishers, TOPIC, WAIT, |log| {
        wait_acks(log, 400, "400 acks before the kill", WAIT);
        cluster.kill(leader);
        let at = Instant::now();
        killed_at = Some(at);
        let before = lock(log).acked.len();
        wait_acks(log, before + 400, "400 acks after the kill", WAIT);
    });
    let killed_at = killed_at.expect("killed");
    let resumed = log.resumed_after(killed_at).expect("acks after the kill");
    let new_leader = cluster.wait_leader();
    assert_ne!(new_leader, leader, "the killed node still leads");
    let retried = retry_acked(&bus, TOPIC, &log, 37);
    let tally = check_stored(&bus, TOPIC, &log);
    let errors = drain_subscription(&mut subscription, tally.stored, WAIT);
    report(
        "leader_killed_under_load",
        &format!(
            "threads {THREADS}, acked checked {}, stored {}, lost {}, duplicated {}, failed \
             calls {} (slowest {:?}), time to resume {resumed:?}, longest ack gap {:?}, retried \
             {retried} (original ack each), subscription delivered {} (gap 0, dup 0, transient \
             errors {errors}), wall time {:?}",
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

    let (lost, duplicated) = (tally.lost, tally.duplicated);
    assert_eq!((lost, duplicated), (0, 0));
    assert!(
        resumed <= RESUME_LIMIT,
        "publishing resumed {resumed:?} after the kill"
    );
}

#[test]
fn follower_killed_and_restarted() {
    let started = Instant::now();
    let Some((mut cluster, bus)) = setup("cluster_faults") else {
        return;
    };
    let leader = cluster.wait_leader();
    let follower = (leader + 1) % 3;
    let publishers = publishers(&bus);
    let mut restarted_in = Duration::ZERO;
    let log = with_publishers(&publishers, TOPIC, WAIT, |log| {
        wait_acks(log, 200, "200 acks before the kill", WAIT);
        cluster.kill(follower);
        let before = lock(log).acked.len();
        wait_acks(log, before + 200, "200 acks with a follower down", WAIT);
        let at = Instant::now();
        cluster.spawn(follower);
        cluster.wait_all_current();
        restarted_in = at.elapsed();
        let before = lock(log).acked.len();
        wait_acks(log, before + 200, "200 acks after the restart", WAIT);
    });
    let tally = check_stored(&bus, TOPIC, &log);
    report(
        "follower_killed_and_restarted",
        &format!(
            "acked checked {}, stored {}, lost {}, duplicated {}, failed calls {}, follower \
             current again after {restarted_in:?}, wall time {:?}",
            tally.checked,
            tally.stored,
            tally.lost,
            tally.duplicated,
            log.failures.len(),
            started.elapsed()
        ),
    );
    assert_eq!((tally.lost, tally.duplicated), (0, 0));
}

#[test]
fn two_of_three_killed() {
    let started = Instant::now();
    let Some((mut cluster, bus)) = setup("cluster_faults") else {
        return;
    };
    let leader = cluster.wait_leader();
    let value = json!({ "t": 99, "i": 0 });
    bus.publish_idempotent(TOPIC, "k", &value, "before")
        .expect("publish before");
    cluster.kill(leader);
    cluster.kill((leader + 1) % 3);
    let slowest = assert_refused_in_time(
        &bus,
        TOPIC,
        &json!({ "t": 99, "i": 1 }),
        "during-outage",
        TIMEOUT,
    );
    let back = Instant::now();
    cluster.spawn(leader);
    let ack = poll_until("a publish once one node is back", WAIT, || {
        bus.publish_idempotent(TOPIC, "k", &json!({ "t": 99, "i": 1 }), "during-outage")
            .ok()
    });
    let recovered = back.elapsed();
    // The cluster may still answer "temporarily unavailable" (a transient
    // error) for a moment after the first ack; a reader retries those.
    let events = poll_until("the partition to read back", WAIT, || {
        try_fetch_all(&bus, TOPIC, 0, 0)
            .inspect_err(|error| assert!(error.is_transient(), "{error}"))
            .ok()
    });
    assert_contiguous(&events);
    let stored = events
        .iter()
        .filter(|event| event.value == json!({ "t": 99, "i": 1 }))
        .count();
    assert_eq!(stored, 1, "the refused UID is stored once after recovery");
    assert_eq!(events.last().map(|event| event.offset), Some(ack.offset));
    report(
        "two_of_three_killed",
        &format!(
            "2 publishes refused (slowest {slowest:?}, limit {:?}), acked again {recovered:?} \
             after one node restarted, stored {} (lost 0, duplicated 0), wall time {:?}",
            TIMEOUT + Duration::from_secs(1),
            events.len(),
            started.elapsed()
        ),
    );
}

#[test]
fn replication_factor_larger_than_the_cluster() {
    let Some((cluster, bus)) = setup("cluster_faults") else {
        return;
    };
    assert_eq!(
        bus.capabilities().ack_durability,
        bus_core::AckDurability::Unknown
    );
    let result = bus.provision(&Manifest::new([
        TopicSpec::new("rf-good", 2),
        TopicSpec::new("rf-big", 2).with_replication_factor(4),
    ]));
    assert!(
        matches!(&result, Err(BusError::InvalidArgument { field, .. })
            if field == "topics[1].replication_factor"),
        "{result:?}"
    );
    let topics = bus.topics();
    assert!(
        !topics.iter().any(|name| name.starts_with("rf-")),
        "created {topics:?}"
    );
    assert_eq!(cluster.stream_count(), 1, "only the setup's stream exists");
}

/// The consumer bucket's stream of the bus's prefix.
fn bucket_stream() -> String {
    format!("KV_{}", bus_nats::naming::consumer_bucket(PREFIX))
}

#[test]
#[ignore = "run by scripts/test-clusters.sh (and CI): kills the consumer bucket's leader mid-consume"]
fn consumer_bucket_leader_killed_mid_consume() {
    use bus_core::consumer::{ConsumeOptions, DurableConsumers};
    use std::collections::BTreeSet;

    let started = Instant::now();
    let Some((mut cluster, bus)) = setup("cluster_faults") else {
        return;
    };
    let total = 600u64;
    let records: Vec<bus_core::BatchRecord> = (0..total)
        .map(|i| bus_core::BatchRecord::new(format!("k{i}"), json!({ "i": i })))
        .collect();
    for chunk in records.chunks(100) {
        poll_until("publishing before the kill", WAIT, || {
            bus.publish_batch(TOPIC, chunk).ok()
        });
    }
    let open = |bus: &NatsBus| {
        poll_until("consume", WAIT, || {
            bus.consume(
                TOPIC,
                "worker",
                Selector::Topic,
                StartAt::Beginning,
                ConsumeOptions::default(),
            )
            .ok()
        })
    };
    // The bucket is made at replication factor 3 (the topic's) on the
    // first consume.
    let mut consumer = open(&bus);
    let bucket = bucket_stream();
    poll_until("every bucket replica current", WAIT, || {
        cluster
            .state_of(Some(&bucket))
            .and_then(|(_, current)| current.then_some(()))
    });
    let (mut handled, mut acked) = (BTreeSet::new(), BTreeSet::new());
    let (mut handled_after_ack, mut failed_acks, mut killed) = (0u64, 0u64, None);
    let mut longest_refusal = Duration::ZERO;
    let deadline = Instant::now() + WAIT * 2;
    while (acked.len() as u64) < total {
        assert!(
            Instant::now() < deadline,
            "{} of {total} acked",
            acked.len()
        );
        if killed.is_none() && acked.len() >= 200 {
            let leader = poll_until("the bucket's leader", WAIT, || {
                cluster.state_of(Some(&bucket)).map(|(leader, _)| leader)
            });
            cluster.kill(leader);
            killed = Some(leader);
        }
        let delivery = match consumer.recv_timeout(Duration::from_millis(200)) {
            Ok(Some(delivery)) => delivery,
            Ok(None) | Err(_) => continue,
        };
        let key = (delivery.partition, delivery.offset);
        if acked.contains(&key) {
            handled_after_ack += 1;
        }
        handled.insert(key);
        // A failed ack stays pending in the engine: `flush` until durable.
        let since = Instant::now();
        let mut outcome = consumer.ack(&delivery);
        while let Err(error) = outcome {
            assert!(
                !matches!(error, BusError::Fenced { .. }),
                "fenced without a second instance: {error}"
            );
            failed_acks += 1;
            assert!(Instant::now() < deadline, "acks kept failing: {error}");
            // Polls the election's end (refusals come back at once while
            // the bucket has no leader).
            std::thread::sleep(Duration::from_millis(20));
            outcome = consumer.flush();
        }
        longest_refusal = longest_refusal.max(since.elapsed());
        acked.insert(key);
    }
    drop(consumer);
    // A new process (a new connection) goes on from the stored cursor:
    // nothing is left, nothing comes back.
    // Seeded with the nodes still running (the killed one cannot answer).
    let live: Vec<String> = (0..3)
        .filter(|&node| cluster.nodes[node].is_some())
        .map(|node| format!("nats://127.0.0.1:{}", cluster.client[node]))
        .collect();
    let options = NatsOptions::from_url(&live.join(","))
        .expect("url")
        .prefix(PREFIX)
        .timeout(TIMEOUT)
        .connect_timeout(TIMEOUT);
    let mut last = None;
    let again = poll_until(
        "a bus after the kill",
        WAIT,
        || match NatsBus::connect_with(options.clone()) {
            Ok(bus) => Some(bus),
            Err(error) => {
                if last.as_ref() != Some(&error.to_string()) {
                    eprintln!("connecting after the kill: {error}");
                    last = Some(error.to_string());
                }
                None
            }
        },
    );
    let mut consumer = open(&again);
    let extra = consumer
        .recv_timeout(Duration::from_secs(1))
        .expect("recv after the kill");
    report(
        "consumer_bucket_leader_killed_mid_consume",
        &format!(
            "records {total}, handled {}, acked {}, handled again after an ack {handled_after_ack}, \
             killed node n{}, failed acks {failed_acks}, longest ack (retries included) \
             {longest_refusal:?}, left after a restart {}, wall time {:?}",
            handled.len(),
            acked.len(),
            killed.unwrap_or(99),
            usize::from(extra.is_some()),
            started.elapsed()
        ),
    );
    assert!(killed.is_some(), "the leader was never killed");
    assert_eq!(handled_after_ack, 0, "an acked record was handled again");
    assert!(
        extra.is_none(),
        "a record came back after every one was acked: {extra:?}"
    );
    assert_eq!(handled.len() as u64, total);
}
