//! How long one dependent memory load takes on this machine, by working-set
//! size: the floor under any lookup in an in-memory index that outgrows the
//! CPU caches (bench_embedded's `find_event_by_uid` at 1,000,000 UIDs).
//!
//! Each row chases a random cycle through one word per 64-byte line of a
//! buffer of that size, so every load depends on the one before (no
//! overlap, no prefetch) and the time per step is the load latency.
//!
//! ```text
//! cargo run --release -p bus-bench --example memory_latency
//! ```
#![allow(
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    clippy::cast_precision_loss,
    missing_docs
)]

use std::time::Instant;

/// Words per 64-byte cache line.
const LINE_WORDS: usize = 8;
const STEPS: usize = 4_000_000;

/// A xorshift generator: enough to shuffle.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Nanoseconds per load over a working set of `bytes`.
fn chase(bytes: usize, rng: &mut Rng) -> f64 {
    let lines = bytes / 64;
    let mut order: Vec<usize> = (0..lines).collect();
    for i in (1..lines).rev() {
        order.swap(i, rng.below(i + 1));
    }
    let mut words = vec![0usize; lines * LINE_WORDS];
    for pair in order.windows(2) {
        words[pair[0] * LINE_WORDS] = pair[1] * LINE_WORDS;
    }
    words[order[lines - 1] * LINE_WORDS] = order[0] * LINE_WORDS;
    let mut at = order[0] * LINE_WORDS;
    for _ in 0..lines.min(STEPS) {
        at = words[at];
    }
    let start = Instant::now();
    for _ in 0..STEPS {
        at = words[at];
    }
    let took = start.elapsed();
    std::hint::black_box(at);
    took.as_nanos() as f64 / STEPS as f64
}

fn main() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    println!("{:>12} {:>14}", "working set", "ns per load");
    for mib in [1usize, 2, 4, 8, 16, 32, 64, 128] {
        let ns = chase(mib << 20, &mut rng);
        println!("{:>8} MiB {ns:>14.1}", mib);
    }
}
