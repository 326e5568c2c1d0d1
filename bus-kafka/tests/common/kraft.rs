//! One KRaft node (broker and controller in one JVM) of a test's own, its
//! configuration and console log in a scratch directory and its data
//! directory wherever the test says (the power-cut tests put it on
//! `bus-testfs`): formatted, started and killed with `kill -9`. The
//! power-cut tests of one broker and of a three-node cluster share it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::own::{cluster_id, java};

/// Settings every node of these tests has: small thread pools, no
/// rebalance delay.
const COMMON: &str = "controller.listener.names=CONTROLLER\ninter.broker.listener.name=PLAINTEXT\n\
    listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT\n\
    offsets.topic.num.partitions=1\ngroup.initial.rebalance.delay.ms=0\n\
    num.network.threads=2\nnum.io.threads=2\nnum.recovery.threads.per.data.dir=1\n\
    background.threads=2\nlog.cleaner.threads=1\n";

/// Client and controller ports of one node.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    pub broker: u16,
    pub controller: u16,
}

/// A node, formatted, not necessarily running.
pub struct Node {
    libs: PathBuf,
    scratch: PathBuf,
    heap: &'static [&'static str],
    pub ports: Ports,
    child: Option<Child>,
}

impl Node {
    /// A single-node cluster: internal topics at replication factor 1,
    /// `extra` appended to the properties.
    pub fn single(
        libs: PathBuf,
        scratch: &Path,
        data: &Path,
        ports: Ports,
        extra: &str,
    ) -> Result<Self, String> {
        let properties = format!(
            "node.id=1\ncontroller.quorum.voters=1@127.0.0.1:{}\n\
             offsets.topic.replication.factor=1\n\
             transaction.state.log.replication.factor=1\ntransaction.state.log.min.isr=1\n\
             share.coordinator.state.topic.replication.factor=1\nshare.coordinator.state.topic.min.isr=1\n{extra}",
            ports.controller
        );
        Self::format(libs, scratch, data, ports, &properties, &cluster_id())
    }

    /// Node `index` (0..3) of a three-node cluster whose nodes have
    /// `ports`: every node a voter, internal topics at replication factor
    /// 3, `min.insync.replicas=2`, no unclean elections, a dead node fenced
    /// after 3 s (as `scripts/kafka-cluster.sh` configures its cluster).
    pub fn of_three(
        libs: PathBuf,
        scratch: &Path,
        data: &Path,
        index: usize,
        ports: &[Ports; 3],
        cluster: &str,
        extra: &str,
    ) -> Result<Self, String> {
        let voters: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{}@127.0.0.1:{}", i + 1, p.controller))
            .collect();
        let properties = format!(
            "node.id={}\ncontroller.quorum.voters={}\n\
             offsets.topic.replication.factor=3\n\
             transaction.state.log.replication.factor=3\ntransaction.state.log.min.isr=2\n\
             transaction.state.log.num.partitions=1\n\
             share.coordinator.state.topic.replication.factor=3\nshare.coordinator.state.topic.min.isr=2\n\
             default.replication.factor=3\nmin.insync.replicas=2\nunclean.leader.election.enable=false\n\
             broker.session.timeout.ms=3000\nbroker.heartbeat.interval.ms=500\n{extra}",
            index + 1,
            voters.join(",")
        );
        Self::heavy(Self::format(
            libs,
            scratch,
            data,
            ports[index],
            &properties,
            cluster,
        )?)
    }

    /// Three JVMs on two cores: a smaller heap each.
    fn heavy(mut self) -> Result<Self, String> {
        self.heap = &["-Xms128m", "-Xmx256m"];
        Ok(self)
    }

    fn format(
        libs: PathBuf,
        scratch: &Path,
        data: &Path,
        ports: Ports,
        properties: &str,
        cluster: &str,
    ) -> Result<Self, String> {
        std::fs::create_dir_all(scratch).map_err(|e| e.to_string())?;
        let properties = format!(
            "process.roles=broker,controller\nlog.dirs={}\n\
             listeners=PLAINTEXT://127.0.0.1:{},CONTROLLER://127.0.0.1:{}\n\
             advertised.listeners=PLAINTEXT://127.0.0.1:{}\n{COMMON}{properties}",
            data.display(),
            ports.broker,
            ports.controller,
            ports.broker
        );
        std::fs::write(scratch.join("server.properties"), properties).map_err(|e| e.to_string())?;
        let node = Self {
            libs,
            scratch: scratch.to_owned(),
            heap: &["-Xms256m", "-Xmx512m"],
            ports,
            child: None,
        };
        let status = node
            .java("kafka.tools.StorageTool")
            .args(["format", "--ignore-formatted", "-t", cluster, "-c"])
            .arg(scratch.join("server.properties"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("kafka storage format: {status}"));
        }
        Ok(node)
    }

    fn java(&self, main: &str) -> Command {
        let mut command = Command::new(java());
        command
            .args(self.heap)
            .arg("-XX:+UseSerialGC")
            .arg(format!(
                "-Dkafka.logs.dir={}",
                self.scratch.join("logs").display()
            ))
            .arg("-cp")
            .arg(format!("{}/*", self.libs.display()))
            .arg(main)
            .stdin(Stdio::null());
        command
    }

    /// Starts the node (its output appended to `kafka.out` in the scratch
    /// directory); whoever needs it ready polls for that.
    pub fn start(&mut self) -> Result<(), String> {
        if self.running() {
            return Ok(());
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.scratch.join("kafka.out"))
            .map_err(|e| e.to_string())?;
        let child = self
            .java("kafka.Kafka")
            .arg(self.scratch.join("server.properties"))
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("start kafka: {e}"))?;
        self.child = Some(child);
        Ok(())
    }

    /// Whether the JVM started last is still alive.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// `kill -9`, and reaped.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `127.0.0.1:port` of the client listener.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.ports.broker)
    }

    /// The last `lines` lines of the node's console output, newest first.
    pub fn tail(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(self.scratch.join("kafka.out")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(lines).collect();
        tail.join("\n")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}
