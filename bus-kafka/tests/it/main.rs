//! bus-kafka's integration tests that can share one process and the
//! shared broker, one module per behaviour (one binary links librdkafka
//! once; issue #27). Beside this folder stay the tests that need a process
//! or brokers of their own: the conformance suites, `outage.rs`,
//! `subscribe_outage.rs` and `secure.rs` (each starts private brokers, one
//! at a time), `replication.rs` and `cluster_faults.rs` (run by name by
//! scripts/test-clusters.sh), and `subscribe_drop.rs`, which counts the
//! process's threads and file descriptors.

#[path = "../common/mod.rs"]
mod common;

#[cfg(feature = "async")]
mod async_surface;
mod flush;
mod no_auto_create;
mod provision_registry;
mod subscribe;
