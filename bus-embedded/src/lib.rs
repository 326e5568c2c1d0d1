#![doc = include_str!("../README.md")]

#[cfg(feature = "async")]
mod asynchronous;
mod bus;
/// The cold tier (C24): archive sealed history, read below the hot log start.
#[cfg(feature = "cold")]
pub mod cold;
mod consumer;
mod fsutil;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod inner;
mod log;
mod notifier;
mod options;
mod partition;
mod publish;
mod raw;
mod subscribe;
mod topics;
mod uid;
mod watch;

#[doc(hidden)]
pub mod testing;

pub use bus::EmbeddedBus;
pub use raw::StoredBytes;

/// URL schemes the `bus` facade routes to this backend (`file://DIR`; a
/// bare path is taken as a directory too).
pub const SCHEMES: &[&str] = &["file"];
pub use options::{Durability, Options};
