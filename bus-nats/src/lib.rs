#![doc = include_str!("../README.md")]

#[cfg(feature = "async")]
mod asynchronous;
mod bus;
mod consumer;
mod cursor;
mod errors;
mod fetch;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod get;
pub mod naming;
mod options;
mod publish;
mod record;
mod shared;
mod subscribe;
mod topics;
mod uid;

pub use bus::NatsBus;

/// URL schemes [`NatsBus::connect`] accepts (`tls://` requires TLS); the
/// `bus` facade routes by this list.
pub const SCHEMES: &[&str] = &["nats", "tls"];
pub use options::{DEFAULT_PREFIX, NatsOptions};
