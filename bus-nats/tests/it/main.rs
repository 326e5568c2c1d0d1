//! bus-nats's integration tests that can share one process, one module per
//! behaviour (one binary links once; issue #27). Beside this folder stay the
//! tests that need a process or a server of their own: the conformance
//! suites, `outage.rs`, `replication.rs` and `cluster_faults.rs` (run by
//! name by scripts/test-clusters.sh), and `subscribe_drop.rs`, which counts
//! the process's threads.

#[path = "../common/mod.rs"]
mod common;

#[cfg(feature = "async")]
mod async_surface;
mod connect_retry;
mod limits;
mod replay;
mod secure;
mod subscribe;
mod subscribe_outage;
mod uid_subjects;
