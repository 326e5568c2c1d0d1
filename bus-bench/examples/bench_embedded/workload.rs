//! What the benchmark publishes (events of ~200 bytes, fixed or varied)
//! and the small arithmetic its tables share.

use std::time::Duration;

use serde_json::{Value, json};

pub fn event(i: u64) -> Value {
    let mut value = json!({
        "metadata": {"uid": format!("e{i}")},
        "agent": format!("agent-{}", i % 16),
        "kind": "tool_call",
        "seq": i,
        "payload": "",
    });
    let len = serde_json::to_vec(&value).unwrap().len();
    value["payload"] = json!("x".repeat(200usize.saturating_sub(len)));
    value
}

/// Words of the varied events' text.
pub const WORDS: [&str; 32] = [
    "read", "write", "file", "open", "search", "query", "result", "error", "retry", "user",
    "agent", "tool", "call", "plan", "step", "done", "cache", "miss", "token", "model", "fetch",
    "index", "merge", "diff", "test", "build", "deploy", "check", "lint", "format", "commit",
    "review",
];

/// A ~200-byte event whose fields vary as a real log's do (ids, a
/// timestamp, a duration, a few words of text) rather than the padding of
/// one repeated letter [`event`] uses, which compresses unrealistically well.
pub fn varied_event(i: u64) -> Value {
    let mut rng = Lcg(i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut value = json!({
        "metadata": {"uid": format!("e{i}")},
        "agent": format!("agent-{}", rng.below(16)),
        "kind": WORDS[rng.below(8) as usize],
        "seq": i,
        "ts": 1_764_900_000_000u64 + i * 37 + rng.below(1000),
        "ms": rng.below(5000),
        "trace": format!("{:08x}{:08x}", rng.below(1 << 32), rng.below(1 << 32)),
        "text": "",
    });
    let room = 200usize.saturating_sub(serde_json::to_vec(&value).unwrap().len());
    let mut text = String::new();
    while text.len() < room {
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(WORDS[rng.below(WORDS.len() as u64) as usize]);
    }
    text.truncate(room);
    value["text"] = json!(text);
    value
}

pub fn uid(i: u64) -> String {
    format!("e{i}")
}

pub fn rate(n: u64, elapsed: Duration) -> f64 {
    n as f64 / elapsed.as_secs_f64()
}

/// Flushes every dirty page to disk (`sync`) before a latency phase, so
/// that neither side's reads wait behind the kernel writing back the
/// gigabytes the previous phase wrote: at 10,000,000 records, a find's p99
/// measured right after SQLite's fill and the bus's replay was 194-243 µs,
/// and 6.1-6.5 µs in the rounds after it (median unchanged).
pub fn settle() {
    let _ = std::process::Command::new("sync").status();
}

/// The median and the 99th percentile of timed calls, in µs.
#[derive(Clone, Copy)]
pub struct Latency {
    pub p50: f64,
    pub p99: f64,
}

impl Latency {
    pub fn of(mut samples: Vec<Duration>) -> Self {
        samples.sort();
        let at = |fraction: f64| {
            let i = ((samples.len() as f64 * fraction) as usize).min(samples.len() - 1);
            samples[i].as_secs_f64() * 1e6
        };
        Self {
            p50: at(0.5),
            p99: at(0.99),
        }
    }
}

pub struct Lcg(pub u64);
impl Lcg {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n.max(1)
    }
}
