//! Power cuts of one node of three (#29): a KRaft cluster of the test's own
//! (three JVMs, each broker and controller, every one a voter, from the jars
//! `scripts/kafka.sh install` cached), `min.insync.replicas=2`, a topic at
//! replication factor 3 with three partitions (each node the preferred
//! leader of one, and leadership given back to it within a second of its
//! return: `leader.imbalance.check.interval.seconds=1`). Node 1's log and
//! metadata directories are on `bus-testfs` (a FUSE filesystem that keeps
//! what was not fsynced in memory); nodes 2 and 3 are on the real disk and
//! keep running. Each round `KafkaBus` publishers with UIDs run in four
//! threads, node 1 loses power (`kill -9`, then everything it did not
//! fsync is dropped, every other cut torn), restarts, and is waited for
//! until it is back in sync and leads again; then every ack is checked
//! (`bus_testfs::rounds`: present once, at its offset, same bytes; holes;
//! duplicates). Kafka fsyncs nothing of the records itself: an ack means
//! the record is in the page cache of two replicas, so the loss of one
//! node's cache must lose nothing. Nothing of node 1 is written back after
//! provisioning (the topic is created in the same boot).
//!
//! Short by default (CI: 2 cuts); `BUS_POWER_ROUNDS=50 cargo test -p
//! bus-kafka --test power_cut_cluster -- --nocapture` is the long run.
//! Ports: `bus_conformance::util::free_base` (below the ephemeral range). Needs
//! root, `/dev/fuse`, Java and the cached Kafka jars (skips loudly without;
//! fails with `BUS_REQUIRE_BROKERS=1`).

mod common;

use std::path::Path;
use std::time::Duration;

use bus_core::{AckDurability, BusError, EventBus};
use bus_kafka::{KafkaBus, KafkaOptions, kafka_topic_name};
use bus_testfs::rounds::{self, Config, HEADER, poll};
use common::kraft::{Node, Ports};
use common::own::{cluster_id, kafka_libs};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

const TOPIC: &str = "kafka_cluster_cut";
const PARTITIONS: u32 = 3;
/// How long the restarted node may take to be back in sync, and the
/// three JVMs to form the cluster (slow on two loaded cores: more than the
/// round loop's 90 s to connect was seen).
const WAIT: Duration = Duration::from_secs(240);
/// How long to wait for it to lead a partition again (soft: counted).
const LEAD_WAIT: Duration = Duration::from_secs(30);

/// Node settings beyond the cluster's: leadership given back to the
/// preferred replica promptly, so the node cut next leads a partition.
const EXTRA: &str =
    "auto.leader.rebalance.enable=true\nleader.imbalance.check.interval.seconds=1\n";

/// A base port with base+0..2 and base+100..102 free (brokers and
/// controllers), below the ephemeral range.
fn free_base() -> u16 {
    bus_conformance::util::free_base(&[0, 1, 2, 100, 101, 102])
}

/// The cluster; node 0 (Kafka's node 1) is the one on the mount.
struct Cluster {
    nodes: Vec<Node>,
    brokers: String,
    started: bool,
    /// Restarts after which the cut node led a partition again (the
    /// following cut hit a leader).
    leading: usize,
    /// Restarts after a cut.
    restarts: usize,
}

impl Cluster {
    fn new(libs: &Path, scratch: &Path, mount: &Path) -> Result<Self, String> {
        let base = free_base();
        let ports: [Ports; 3] = std::array::from_fn(|i| {
            let i = u16::try_from(i).unwrap_or(0);
            Ports {
                broker: base + i,
                controller: base + 100 + i,
            }
        });
        let cluster = cluster_id();
        let mut nodes = Vec::new();
        for index in 0..3 {
            let scratch = scratch.join(format!("n{index}"));
            let data = if index == 0 {
                mount.join("kafka")
            } else {
                scratch.join("data")
            };
            nodes.push(Node::of_three(
                libs.to_owned(),
                &scratch,
                &data,
                index,
                &ports,
                &cluster,
                EXTRA,
            )?);
        }
        // The format is the installation: `meta.properties` reaches the
        // disk as a writeback would. Everything later is strict.
        rounds::writeback(mount).map_err(|e| format!("writeback: {e}"))?;
        let brokers = nodes
            .iter()
            .map(Node::address)
            .collect::<Vec<_>>()
            .join(",");
        Ok(Self {
            nodes,
            brokers,
            started: false,
            leading: 0,
            restarts: 0,
        })
    }

    /// The cluster's metadata (an all-topics request, which never creates
    /// one).
    fn metadata(&self) -> Result<rdkafka::metadata::Metadata, String> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", "bus-test-metadata")
            .set("allow.auto.create.topics", "false")
            .create()
            .map_err(|e| e.to_string())?;
        consumer
            .fetch_metadata(None, Duration::from_secs(5))
            .map_err(|e| e.to_string())
    }

    /// Every node registered with the controller.
    fn wait_formed(&self) -> Result<(), String> {
        poll("the three nodes registered", WAIT, || {
            let brokers = self.metadata()?.brokers().len();
            if brokers == 3 {
                Ok(())
            } else {
                Err(format!("{brokers} brokers"))
            }
        })
    }

    /// Per partition of the topic: its leader's node id and how many
    /// replicas are in sync; empty while the topic is unknown.
    fn partitions(&self) -> Result<Vec<(i32, usize)>, String> {
        let metadata = self.metadata()?;
        let name = kafka_topic_name(TOPIC);
        Ok(metadata
            .topics()
            .iter()
            .filter(|topic| topic.name() == name)
            .flat_map(|topic| topic.partitions())
            .map(|partition| (partition.leader(), partition.isr().len()))
            .collect())
    }

    /// The cut node is back: every partition has three in-sync replicas.
    /// Then, softly, it leads one again.
    fn wait_back(&mut self) -> Result<(), String> {
        poll("the restarted node back in sync", WAIT, || {
            let partitions = self.partitions()?;
            if partitions.iter().all(|(_, isr)| *isr == 3) {
                Ok(())
            } else {
                Err(format!("(leader, in sync) per partition: {partitions:?}"))
            }
        })?;
        self.restarts += 1;
        let leads = poll("the restarted node leading a partition", LEAD_WAIT, || {
            let partitions = self.partitions()?;
            if partitions.iter().any(|(leader, _)| *leader == 1) {
                Ok(())
            } else {
                Err(format!("leaders: {partitions:?}"))
            }
        });
        match leads {
            Ok(()) => self.leading += 1,
            Err(why) => eprintln!("cut node not leading: {why}"),
        }
        Ok(())
    }

    /// The console output of every node, newest lines first.
    fn tails(&self) -> String {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, node)| format!("node {}:\n{}", i + 1, node.tail(20)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl rounds::Server for Cluster {
    fn start(&mut self) -> Result<(), String> {
        for node in &mut self.nodes {
            node.start()?;
        }
        if std::mem::replace(&mut self.started, true) {
            // After a cut: the next round starts with the node in sync.
            self.wait_back()
        } else {
            self.wait_formed()
        }
    }

    /// The power of node 1 only: the others keep serving.
    fn kill(&mut self) {
        self.nodes[0].kill();
    }

    fn connect(&self) -> Result<Box<dyn EventBus>, BusError> {
        let options = KafkaOptions::new([self.brokers.clone()]).timeout(Duration::from_secs(10));
        let bus = KafkaBus::connect_with(options)?;
        assert_eq!(
            bus.capabilities().ack_durability,
            AckDurability::Replicated { min_insync: 2 }
        );
        Ok(Box::new(bus))
    }
}

#[test]
fn one_node_of_three_loses_power_and_no_ack_is_lost() {
    let test = "one_node_of_three_loses_power";
    let Some(libs) = kafka_libs() else {
        common::skip(test, "no cached Kafka jars (scripts/kafka.sh install)");
        return;
    };
    let root = tempfile::tempdir().expect("temp dir");
    let (backing, mnt) = (root.path().join("backing"), root.path().join("mnt"));
    std::fs::create_dir(&backing).expect("backing");
    std::fs::create_dir(&mnt).expect("mountpoint");
    let Some(fs) =
        bus_testfs::mount_or_skip(test, &backing, &mnt).unwrap_or_else(|e| panic!("{e}"))
    else {
        return;
    };
    let mut cluster =
        Cluster::new(&libs, root.path(), fs.path()).unwrap_or_else(|e| panic!("{test}: {e}"));
    let config = Config {
        rounds: rounds::rounds_from_env(2),
        threads: 4,
        partitions: PARTITIONS,
        replication_factor: 3,
        acks_per_round: 300,
        torn: true,
        topic: TOPIC.to_owned(),
        writeback_after_provision: false,
    };
    let started = std::time::Instant::now();
    let tally = rounds::run(&fs, &mut cluster, &config).unwrap_or_else(|e| {
        panic!(
            "{test}: {e}\nconsole (last lines, newest first):\n{}",
            cluster.tails()
        )
    });
    println!(
        "{HEADER}\n{}\nthe cut node led a partition again after {} of {} restarts; test took {:?}",
        tally.row(
            "Kafka, 3 nodes, `min.insync.replicas=2`, one node's power cut (defaults: no fsync)"
        ),
        cluster.leading,
        cluster.restarts,
        started.elapsed()
    );
    drop(cluster);
    assert!(tally.acked > 0);
    assert!(
        tally.pages_dropped > 0,
        "the cuts dropped nothing the node had written: the filesystem is not doing its job"
    );
    assert!(
        tally.lossless(),
        "one node's power cut lost acks: {tally:?}"
    );
}
