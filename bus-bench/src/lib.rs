//! The benchmarks of the bus workspace: every benchmark program (the
//! examples of this crate) and the raw-client references they measure each
//! network backend against: plain async-nats, rdkafka and tokio-postgres
//! doing the same work as the bus (same broker, same records, same layout),
//! so the `bench_*` examples and [`side_by_side`] can print what the bus
//! costs on top of its client.
//!
//! A benchmark tool of this workspace, not a library (`publish = false`): it
//! reaches the backends only through their public API, and nothing else in
//! the workspace depends on it. One module per backend, each behind the
//! cargo feature of that name.
//!
//! | feature | module | raw client |
//! |---|---|---|
//! | `nats` | [`nats`] | async-nats (JetStream) |
//! | `kafka` | [`kafka`] | rdkafka |
//! | `postgres` | [`postgres`] | tokio-postgres, running the bus's own SQL |

#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod side_by_side;
