//! Helpers shared by the cases and by backends' own tests.

use std::time::{Duration, Instant};

use bus_core::{BusError, EventBus, PublishAck, StoredEvent, partition_for};

/// Polls `condition` until it returns `Some`, or panics after `deadline`
/// naming `what`. The pause between polls grows from 1 ms to 50 ms.
///
/// # Panics
/// When the deadline passes.
pub fn poll_until<T>(
    what: &str,
    deadline: Duration,
    mut condition: impl FnMut() -> Option<T>,
) -> T {
    let start = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(value) = condition() {
            return value;
        }
        assert!(
            start.elapsed() < deadline,
            "timed out after {deadline:?} waiting for {what}"
        );
        std::thread::park_timeout(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Every record of a partition from `from`, in pages of 100.
///
/// # Panics
/// On a fetch error or a page that does not continue the previous one.
pub fn fetch_all(bus: &dyn EventBus, topic: &str, partition: u32, from: u64) -> Vec<StoredEvent> {
    try_fetch_all(bus, topic, partition, from)
        .unwrap_or_else(|error| panic!("fetch {topic}/{partition} from {from}: {error}"))
}

/// [`fetch_all`], returning the first fetch error (for reads that may meet
/// a transient error and be retried).
///
/// # Panics
/// On a page that does not continue the previous one.
pub fn try_fetch_all(
    bus: &dyn EventBus,
    topic: &str,
    partition: u32,
    from: u64,
) -> Result<Vec<StoredEvent>, bus_core::BusError> {
    let mut out: Vec<StoredEvent> = Vec::new();
    let mut offset = from;
    loop {
        let page = bus.fetch(topic, partition, offset, 100)?;
        let Some(last) = page.last() else {
            return Ok(out);
        };
        assert!(page[0].offset >= offset, "fetch went backwards");
        offset = last.offset + 1;
        out.extend(page);
    }
}

/// Asserts `events` have ascending offsets without holes.
///
/// # Panics
/// On a hole or a repeat.
pub fn assert_contiguous(events: &[StoredEvent]) {
    for pair in events.windows(2) {
        assert_eq!(
            pair[1].offset,
            pair[0].offset + 1,
            "offsets must be contiguous: {} then {}",
            pair[0].offset,
            pair[1].offset
        );
    }
}

/// The key of the first `key-N` (N from 0) that lands on `partition` of `n`.
///
/// # Panics
/// Never in practice: FNV spreads well within 100,000 tries.
pub fn key_for_partition(prefix: &str, partition: u32, n: u32) -> String {
    (0..100_000)
        .map(|i| format!("{prefix}-{i}"))
        .find(|key| partition_for(key, n) == partition)
        .unwrap_or_else(|| panic!("no key for partition {partition} of {n}"))
}

/// Publishes `count` values `{"n": i}` under `key` and returns the acks.
///
/// # Panics
/// On a publish error.
pub fn publish_n(bus: &dyn EventBus, topic: &str, key: &str, count: usize) -> Vec<PublishAck> {
    (0..count)
        .map(|n| {
            bus.publish(topic, key, &serde_json::json!({ "n": n }))
                .unwrap_or_else(|error| panic!("publish #{n} to {topic}: {error}"))
        })
        .collect()
}

/// Asserts `result` is an error matching `pattern`, printing what it was otherwise.
#[macro_export]
macro_rules! assert_err {
    ($result:expr, $pattern:pat $(if $guard:expr)?) => {
        match $result {
            Err($pattern) $(if $guard)? => {}
            other => panic!(
                "expected Err({}), got {:?}",
                stringify!($pattern),
                other.map(|_| "Ok(..)")
            ),
        }
    };
}

/// Extracts `Ok`, panicking with the error and `what`.
///
/// # Panics
/// On `Err`.
pub fn ok<T>(what: &str, result: Result<T, BusError>) -> T {
    result.unwrap_or_else(|error| panic!("{what}: {error} ({error:?})"))
}

/// Runs `attempt`, which must fail within `limit`, and checks that neither
/// the error's message nor its `Debug` form shows any of `secrets`
/// (contract C10 and C13 for a refused connection).
///
/// # Panics
/// When `attempt` succeeds, fails too late, or shows a secret.
pub fn assert_refused_quietly<T: std::fmt::Debug>(
    what: &str,
    limit: Duration,
    secrets: &[&str],
    attempt: impl FnOnce() -> Result<T, BusError>,
) {
    let started = Instant::now();
    let error = match attempt() {
        Ok(value) => panic!("{what}: expected an error, got {value:?}"),
        Err(error) => error,
    };
    let took = started.elapsed();
    assert!(took <= limit, "{what}: failed after {took:?} (> {limit:?})");
    for text in [error.to_string(), format!("{error:?}")] {
        for secret in secrets {
            assert!(
                !text.contains(secret),
                "{what}: the error shows a secret: {text}"
            );
        }
    }
}

/// Time the hypervisor took from this machine's vCPUs so far (the `steal`
/// column of /proc/stat, in clock ticks; `None` off Linux). Benchmarks
/// print it beside their ratios, so a run the host disturbed shows.
pub fn steal_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines()
        .find(|line| line.starts_with("cpu "))?
        .split_whitespace()
        .nth(8)?
        .parse()
        .ok()
}

/// The ports the tests' own servers (brokers, clusters, S3) listen on:
/// below Linux's ephemeral range (32768 and up), so a client connection of
/// another test cannot take one between the check and the server's bind (a
/// port the kernel handed out by binding port 0 was taken that way by a
/// test in another lane, CI rehearsal of 2026-12-07), and clear of the
/// fixed ports of the scripts (24222.., 26000.., 29092..).
pub const TEST_PORTS: std::ops::Range<u16> = 20_000..24_000;

/// A port of [`TEST_PORTS`] nothing listens on, never handed out twice in
/// one process.
///
/// # Panics
/// When no port of the range is free.
#[must_use]
pub fn free_port() -> u16 {
    free_base(&[0])
}

/// A port `base` of [`TEST_PORTS`] such that `base + offset` is free for
/// every offset (a cluster's broker and controller ports), chosen at
/// random so concurrent test processes rarely try the same; none of them
/// handed out before in this process.
///
/// # Panics
/// When no such base is free.
#[must_use]
pub fn free_base(offsets: &[u16]) -> u16 {
    static TAKEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut taken = lock_taken(&TAKEN);
    let span = offsets.iter().copied().max().unwrap_or(0);
    let width = u32::from(TEST_PORTS.end - TEST_PORTS.start - span);
    for _ in 0..2_000 {
        let pick = u32::try_from(uuid::Uuid::new_v4().as_u128() % u128::from(width)).unwrap_or(0);
        let base = TEST_PORTS.start + u16::try_from(pick).unwrap_or(0);
        let ports: Vec<u16> = offsets.iter().map(|offset| base + offset).collect();
        if ports.iter().any(|port| taken.contains(port)) {
            continue;
        }
        if ports
            .iter()
            .all(|port| std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok())
        {
            taken.extend(ports);
            return base;
        }
    }
    panic!("no free ports in {TEST_PORTS:?} for offsets {offsets:?}");
}

fn lock_taken(taken: &std::sync::Mutex<Vec<u16>>) -> std::sync::MutexGuard<'_, Vec<u16>> {
    taken
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
