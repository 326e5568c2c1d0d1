//! The power-cut round loop and the ack check, shared by the broker tests
//! (bus-nats, bus-postgres, bus-kafka `tests/power_cut.rs`; #29 round 2).
//!
//! A [`Server`] is a private broker whose data directory is on the mount.
//! Each round: a fresh bus connects (through the trait, as an application
//! does); publishers with UIDs in several threads publish until enough acks
//! are in; the power goes — `kill -9` of every server process, then
//! everything unsynced is dropped (every other round torn, when asked); the
//! power comes back and the server restarts on what the disk kept; a fresh
//! bus reads every partition and every ack is checked: present once, at its
//! offset, with the same value; holes and duplicated UIDs are counted. Acks
//! that survived their own round are checked again after every later cut.
//!
//! When the restarted server no longer knows the topic (`UnknownTopic`: a
//! stream or the bus's registry record was never fsynced), every ack of the
//! topic still standing is counted lost ([`Tally::topic_lost`] says how
//! often) and the topic is provisioned again for the next round.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bus_core::{BusError, EventBus, Manifest, StoredEvent, TopicSpec};
use serde_json::{Value, json};

use crate::PowerFs;

/// A private server with its data directory on the mount.
pub trait Server {
    /// Starts it (the first time, or on what a cut left), ready to serve.
    fn start(&mut self) -> Result<(), String>;
    /// `kill -9` every process of the server and reaps them: the machine
    /// died, nothing runs its shutdown.
    fn kill(&mut self);
    /// A fresh bus on the running server.
    fn connect(&self) -> Result<Box<dyn EventBus>, BusError>;
}

/// What the rounds do.
#[derive(Debug, Clone)]
pub struct Config {
    /// Power cuts.
    pub rounds: usize,
    /// Publishing threads.
    pub threads: usize,
    /// Partitions of the topic.
    pub partitions: u32,
    /// Its replication factor (1 on one server; 3 on a Kafka cluster).
    pub replication_factor: u16,
    /// Acks to wait for before a cut (the cut comes after at least this
    /// many, at most a minute after the round started).
    pub acks_per_round: usize,
    /// Every other cut torn (a seeded random subset of the unsynced pages
    /// reaches the disk first).
    pub torn: bool,
    /// The topic (each test its own).
    pub topic: String,
    /// After provisioning, fsync every file and directory on the mount:
    /// the kernel's periodic writeback (dirty pages older than 30 s) and
    /// the journal commit of ext4 or XFS, which put a server's metadata on
    /// disk without its own fsync when the machine runs long enough. The
    /// test then measures the acks of a topic provisioned a while before,
    /// not a server that never fsyncs what it writes at creation (which
    /// `false` shows: every stream created in the same boot lost).
    pub writeback_after_provision: bool,
}

/// Rounds from `BUS_POWER_ROUNDS`, else `default` (CI's short run).
pub fn rounds_from_env(default: usize) -> usize {
    std::env::var("BUS_POWER_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// What a configuration's rounds found.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    /// Cuts made.
    pub rounds: usize,
    /// Acks received.
    pub acked: usize,
    /// Acks not found after their round's cut (absent, moved or changed).
    pub lost: usize,
    /// Rounds that lost at least one ack.
    pub rounds_losing: usize,
    /// Acks that survived their own cut and were gone after a later one.
    pub lost_later: usize,
    /// Rounds after which the server no longer knew the topic.
    pub topic_lost: usize,
    /// UIDs shown more than once.
    pub duplicated: usize,
    /// Offsets that do not follow the one before (counted per record).
    pub holes: usize,
    /// Unsynced pages the cuts dropped.
    pub pages_dropped: u64,
    /// The server did not start again, or started and no bus connected,
    /// after the last cut (the rounds ended there; every ack counted lost).
    pub server_lost: bool,
}

impl Tally {
    /// A Markdown row under [`HEADER`].
    pub fn row(&self, name: &str) -> String {
        format!(
            "| {name} | {} | {} | {} ({} rounds) | {} | {} | {} | {} | {} | {} |",
            self.rounds,
            self.acked,
            self.lost,
            self.rounds_losing,
            self.lost_later,
            self.topic_lost,
            self.duplicated,
            self.holes,
            self.pages_dropped,
            if self.server_lost { "no" } else { "yes" }
        )
    }

    /// Nothing acknowledged lost, duplicated or out of place.
    pub fn lossless(&self) -> bool {
        self.lost == 0
            && self.lost_later == 0
            && self.topic_lost == 0
            && self.duplicated == 0
            && self.holes == 0
            && !self.server_lost
    }
}

/// The header of [`Tally::row`].
pub const HEADER: &str = "| configuration | rounds | acked | lost | lost after a later cut | topic gone after a cut | duplicated | holes | unsynced pages dropped | server started after every cut |\n|---|---|---|---|---|---|---|---|---|---|";

/// The value published for `uid`, so the check compares it whole.
pub fn value_for(uid: &str, i: usize) -> Value {
    json!({ "uid": uid, "i": i, "pad": "x".repeat(i % 40), "n": -1.5e300 })
}

/// One acknowledged publish.
#[derive(Debug, Clone)]
struct Acked {
    partition: u32,
    offset: u64,
    value: Value,
}

/// A small seeded generator (round sizes, torn seeds): a failing run prints
/// its seed and replays with `BUS_POWER_SEED`.
fn seed() -> u64 {
    std::env::var("BUS_POWER_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..))
}

/// Polls `what` until it answers or `limit` passes (no sleeps in tests:
/// a short pause between tries only).
pub fn poll<T>(
    what: &str,
    limit: Duration,
    mut f: impl FnMut() -> Result<T, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + limit;
    loop {
        match f() {
            Ok(value) => return Ok(value),
            Err(why) if Instant::now() >= deadline => {
                return Err(format!("{what}: not within {limit:?}: {why}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

const WAIT: Duration = Duration::from_secs(90);

/// Runs `config.rounds` power cuts of `server` on `fs`.
pub fn run(fs: &PowerFs, server: &mut dyn Server, config: &Config) -> Result<Tally, String> {
    let seed = seed();
    eprintln!("power cuts of {}: BUS_POWER_SEED={seed}", config.topic);
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut tally = Tally::default();
    let mut standing: Vec<Acked> = Vec::new();
    let manifest = Manifest::new([TopicSpec::new(&config.topic, config.partitions)
        .with_replication_factor(config.replication_factor)]);
    server.start()?;
    {
        let bus = connect(server)?;
        bus.provision(&manifest)
            .map_err(|e| format!("provision: {e}"))?;
    }
    if config.writeback_after_provision {
        writeback(fs.path()).map_err(|e| format!("writeback: {e}"))?;
    }
    for round in 0..config.rounds {
        let torn = (config.torn && round % 2 == 1).then(|| rng.u64(..));
        let target = config.acks_per_round / 2 + rng.usize(..=config.acks_per_round);
        let bus = match connect(server) {
            Ok(bus) => bus,
            // Not the first round: an earlier cut took what the server
            // needs to serve (a control's database can go whole).
            Err(why) if round > 0 => {
                eprintln!("round {round}: no bus connects after the last cut: {why}");
                lose_server(&mut tally, 0, &standing);
                return Ok(tally);
            }
            Err(why) => return Err(why),
        };
        let acks = publish_until_cut(fs, server, bus, config, round, target, torn, &mut tally)?;
        fs.power_on();
        tally.rounds += 1;
        tally.acked += acks.len();
        if let Err(why) = server.start() {
            // The server does not come back on what the disk kept (a
            // control's cluster can be beyond recovery): everything
            // acknowledged is lost, and the rounds end here.
            eprintln!("round {round}: the server does not start after the cut: {why}");
            lose_server(&mut tally, acks.len(), &standing);
            return Ok(tally);
        }
        let bus = match connect(server) {
            Ok(bus) => bus,
            Err(why) => {
                eprintln!(
                    "round {round}: the server started, but no bus connects after the cut: {why}"
                );
                lose_server(&mut tally, acks.len(), &standing);
                return Ok(tally);
            }
        };
        let shown = match read_everything(bus.as_ref(), config) {
            Ok(shown) => shown,
            Err(BusError::UnknownTopic { .. }) => {
                // The server (or the bus's registry) forgot the topic:
                // every ack of it is gone. Provision it again for the
                // next round.
                tally.topic_lost += 1;
                if tally.topic_lost == 1 {
                    eprintln!(
                        "round {round}: the topic is gone after the cut; the disk holds:\n{}",
                        tree(fs.path())
                    );
                }
                tally.lost += acks.len();
                tally.rounds_losing += usize::from(!acks.is_empty());
                tally.lost_later += standing.len();
                standing.clear();
                poll("provision again after the topic was lost", WAIT, || {
                    bus.provision(&manifest).map_err(|e| e.to_string())
                })?;
                if config.writeback_after_provision {
                    writeback(fs.path()).map_err(|e| format!("writeback: {e}"))?;
                }
                continue;
            }
            Err(e) => return Err(format!("round {round}: read after the cut: {e}")),
        };
        let (by_pos, duplicated, holes) = index(&shown);
        tally.duplicated += duplicated;
        tally.holes += holes;
        let kept = |a: &Acked| by_pos.get(&(a.partition, a.offset)) == Some(&&a.value);
        let lost_now = acks.iter().filter(|a| !kept(a)).count();
        tally.lost += lost_now;
        tally.rounds_losing += usize::from(lost_now > 0);
        let before = standing.len();
        standing.retain(kept);
        tally.lost_later += before - standing.len();
        standing.extend(acks.into_iter().filter(|a| kept(a)));
    }
    server.kill();
    Ok(tally)
}

/// The server is beyond serving after a cut: the round's `acked` records
/// and every `standing` one count as lost, and the rounds end (the tally
/// says the server was lost, so it is never lossless).
fn lose_server(tally: &mut Tally, acked: usize, standing: &[Acked]) {
    tally.server_lost = true;
    tally.lost += acked;
    tally.rounds_losing += usize::from(acked + standing.len() > 0);
    tally.lost_later += standing.len();
}

fn connect(server: &dyn Server) -> Result<Box<dyn EventBus>, String> {
    poll("a bus to connect", WAIT, || {
        server.connect().map_err(|e| e.to_string())
    })
}

/// Publishes from `config.threads` threads until `target` acks (or a
/// minute), then cuts the power; returns the acks.
#[allow(clippy::too_many_arguments)]
fn publish_until_cut(
    fs: &PowerFs,
    server: &mut dyn Server,
    bus: Box<dyn EventBus>,
    config: &Config,
    round: usize,
    target: usize,
    torn: Option<u64>,
    tally: &mut Tally,
) -> Result<Vec<Acked>, String> {
    let acks = Arc::new(Mutex::new(Vec::new()));
    let stop = AtomicBool::new(false);
    let running = AtomicUsize::new(config.threads);
    let errors: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let count = |acks: &Mutex<Vec<Acked>>| acks.lock().map_or(0, |a| a.len());
    std::thread::scope(|scope| {
        for t in 0..config.threads {
            let (acks, stop, running, errors, bus) = (&acks, &stop, &running, &errors, &bus);
            scope.spawn(move || {
                for i in 0.. {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let uid = format!("r{round}-t{t}-{i}");
                    let value = value_for(&uid, i);
                    let key = format!("k{t}-{i}");
                    match bus.publish_idempotent(&config.topic, &key, &value, &uid) {
                        Ok(ack) => {
                            if let Ok(mut acks) = acks.lock() {
                                acks.push(Acked {
                                    partition: ack.partition,
                                    offset: ack.offset,
                                    value,
                                });
                            }
                        }
                        // The power went (or the server refused before the
                        // cut: reported below).
                        Err(e) => {
                            if !stop.load(Ordering::Relaxed)
                                && let Ok(mut errors) = errors.lock()
                            {
                                errors.push(e.to_string());
                            }
                            break;
                        }
                    }
                }
                running.fetch_sub(1, Ordering::Relaxed);
            });
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while count(&acks) < target
            && running.load(Ordering::Relaxed) > 0
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(2));
        }
        // The machine dies: processes first (nothing of theirs runs
        // after), then the page cache.
        stop.store(true, Ordering::Relaxed);
        server.kill();
        let report = match torn {
            Some(seed) => fs.power_cut_torn(seed),
            None => fs.power_cut(),
        };
        tally.pages_dropped += report.pages_lost;
    });
    drop(bus);
    let errors = errors.into_inner().unwrap_or_default();
    let acks = std::mem::take(&mut *acks.lock().map_err(|e| e.to_string())?);
    if acks.is_empty() {
        return Err(format!(
            "round {round}: no publish was acknowledged before the cut: {errors:?}"
        ));
    }
    Ok(acks)
}

/// Every record of every partition, in pages.
fn read_everything(
    bus: &dyn EventBus,
    config: &Config,
) -> Result<Vec<(u32, Vec<StoredEvent>)>, BusError> {
    let mut out = Vec::new();
    for partition in 0..config.partitions {
        let mut events: Vec<StoredEvent> = Vec::new();
        loop {
            let from = events.last().map_or(0, |e| e.offset + 1);
            let page = bus.fetch(&config.topic, partition, from, 1024)?;
            if page.is_empty() {
                break;
            }
            events.extend(page);
        }
        out.push((partition, events));
    }
    Ok(out)
}

type Index<'a> = HashMap<(u32, u64), &'a Value>;

/// Records by position; duplicated UIDs; holes.
fn index(shown: &[(u32, Vec<StoredEvent>)]) -> (Index<'_>, usize, usize) {
    let mut by_pos = HashMap::new();
    let mut uids: HashMap<&str, usize> = HashMap::new();
    let mut holes = 0;
    for (partition, events) in shown {
        let mut next = 0;
        for event in events {
            if event.offset != next {
                holes += 1;
            }
            next = event.offset + 1;
            by_pos.insert((*partition, event.offset), &event.value);
            if let Some(uid) = event.value.get("uid").and_then(Value::as_str) {
                *uids.entry(uid).or_default() += 1;
            }
        }
    }
    let duplicated = uids.values().filter(|&&n| n > 1).count();
    (by_pos, duplicated, holes)
}

/// The files under `dir` with their sizes (what a lost topic left), at
/// most 60 lines.
fn tree(dir: &std::path::Path) -> String {
    let mut lines = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            match entry.metadata() {
                Ok(meta) if meta.is_dir() => stack.push(path),
                Ok(meta) => lines.push(format!("  {} {}", meta.len(), path.display())),
                Err(_) => {}
            }
        }
    }
    lines.sort();
    lines.truncate(60);
    lines.join("\n")
}

/// Fsyncs every file, then every directory under `dir` (deepest first):
/// what the kernel's writeback and a journal commit do given time.
pub fn writeback(dir: &std::path::Path) -> std::io::Result<()> {
    let mut dirs = vec![dir.to_owned()];
    let mut i = 0;
    while i < dirs.len() {
        for entry in std::fs::read_dir(&dirs[i])?.flatten() {
            let kind = entry.file_type()?;
            if kind.is_dir() {
                dirs.push(entry.path());
            } else if kind.is_file() {
                std::fs::File::open(entry.path())?.sync_all()?;
            }
        }
        i += 1;
    }
    for dir in dirs.iter().rev() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}
