//! bus-postgres's integration tests that can share one process, one module
//! per behaviour (one binary links once; issue #27). Beside this folder stay
//! the conformance suites, the durable-consumer suite, and `crash.rs` and
//! `consumer_crash.rs`, which re-run their binary as a child to kill it.

#[path = "../common/mod.rs"]
mod common;

mod async_surface;
mod consumer_outage;
mod consumer_tx;
mod database;
mod outage;
mod outbox;
mod secure;
