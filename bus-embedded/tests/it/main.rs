//! bus-embedded's integration tests that can share one process, one module
//! per behaviour (one binary links once; issue #27). Tests that need a
//! process of their own stay beside this folder: `crash.rs` and
//! `consumer_crash.rs` re-run their binary as a child to kill it,
//! `subscribe.rs` starts a writer child, `subscribe_resources.rs` counts the
//! process's threads and fds, `metrics.rs` and `tracing.rs` install
//! process-wide recorders and subscribers, and the conformance suites are
//! their own binaries.

#[path = "../support/mod.rs"]
mod support;

#[cfg(feature = "async")]
mod async_surface;
mod batch_frames;
mod compression;
mod damage;
mod damaged_frames;
mod faults;
mod file_layer_faults;
mod forged_uids;
mod limits;
mod power_loss_files;
mod raw_reads;
mod readonly_damage;
mod recovery;
mod retention_reads;
mod subscribe_fanout;
mod topic_spec;
mod uid_locator;
mod uid_tables;
