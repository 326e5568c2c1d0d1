//! What a backend can promise, so callers and the suite know which rules apply.

/// How long a backend remembers a UID for deduplication (contract C6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DedupHorizon {
    /// As long as the record is retained.
    Retained,
    /// At least the topic's `dedup_window_ms`.
    Window,
}

/// What a publish ack guarantees about the record surviving failures
/// (see docs/contract.md, "What an ack guarantees").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AckDurability {
    /// Nothing beyond the process: an ack may be lost with it (memory), or
    /// with one broker's page cache (a Kafka broker never fsyncs by itself).
    None,
    /// The record was fsynced to disk before the ack: it survives a process
    /// crash and a machine crash, not the loss of the disk.
    Disk,
    /// The record is on at least `min_insync` replicas before the ack, for
    /// topics provisioned at `replication_factor >= 3`: it survives the loss
    /// of one node (and a process crash), not a simultaneous power loss of
    /// all of them.
    Replicated {
        /// Replicas that must hold the record before the ack.
        min_insync: u16,
    },
    /// The client cannot learn it from the server (NATS does not report
    /// `sync_interval`); see docs/contract.md for the server setting that decides.
    Unknown,
}

/// A backend's capabilities report.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Backend name (`memory`, `embedded`, `nats`, `kafka`).
    pub backend: &'static str,
    /// Records survive a reopen of the bus (another handle / process).
    pub durable: bool,
    /// How long UIDs are remembered.
    pub dedup_horizon: DedupHorizon,
    /// `maintenance(now_ms)` expires records by the manifest's retention.
    pub maintenance_retention: bool,
    /// The broker enforces retention by itself (NATS `max_age`, Kafka `retention.ms`).
    pub native_retention: bool,
    /// A second open of the same storage is refused (contract C16).
    pub exclusive_open: bool,
    /// `publish_batch` is pipelined or written as one unit.
    pub native_batch: bool,
    /// What an ack guarantees about durability.
    pub ack_durability: AckDurability,
    /// Records carry headers (C25): `publish_with_headers` stores them and
    /// fetch, subscriptions and consumers return them.
    pub headers: bool,
}

impl Capabilities {
    /// A report for `backend` with nothing promised beyond the trait.
    pub fn minimal(backend: &'static str) -> Self {
        Self {
            backend,
            durable: false,
            dedup_horizon: DedupHorizon::Window,
            maintenance_retention: false,
            native_retention: false,
            exclusive_open: false,
            native_batch: false,
            ack_durability: AckDurability::Unknown,
            headers: false,
        }
    }

    /// Sets `durable`.
    #[must_use]
    pub fn durable(mut self, durable: bool) -> Self {
        self.durable = durable;
        self
    }

    /// Sets `dedup_horizon`.
    #[must_use]
    pub fn dedup_horizon(mut self, horizon: DedupHorizon) -> Self {
        self.dedup_horizon = horizon;
        self
    }

    /// Sets `maintenance_retention`.
    #[must_use]
    pub fn maintenance_retention(mut self, yes: bool) -> Self {
        self.maintenance_retention = yes;
        self
    }

    /// Sets `native_retention`.
    #[must_use]
    pub fn native_retention(mut self, yes: bool) -> Self {
        self.native_retention = yes;
        self
    }

    /// Sets `exclusive_open`.
    #[must_use]
    pub fn exclusive_open(mut self, yes: bool) -> Self {
        self.exclusive_open = yes;
        self
    }

    /// Sets `native_batch`.
    #[must_use]
    pub fn native_batch(mut self, yes: bool) -> Self {
        self.native_batch = yes;
        self
    }

    /// Sets `ack_durability`.
    #[must_use]
    pub fn ack_durability(mut self, durability: AckDurability) -> Self {
        self.ack_durability = durability;
        self
    }

    /// Sets `headers`.
    #[must_use]
    pub fn headers(mut self, yes: bool) -> Self {
        self.headers = yes;
        self
    }
}
