#![doc = include_str!("../README.md")]

mod acked;
#[cfg(feature = "async")]
mod asynchronous;
mod broker;
mod checkpoint;
mod codec;
mod fetch;
mod frame;
mod fsutil;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod index;
mod inner;
mod keyed;
mod locator;
mod lookup;
mod notifier;
mod options;
mod partition;
mod poison;
mod readonly;
mod recovery;
mod retention;
mod segment;
mod subscribe;
mod topic;
mod uidmap;
mod uidtable;
mod watch;

#[doc(hidden)]
pub mod testing;

pub use broker::EmbeddedBus;

/// URL schemes the `bus` facade routes to this backend (`file://DIR`; a
/// bare path is taken as a directory too).
pub const SCHEMES: &[&str] = &["file"];
pub use options::{Durability, Options};
