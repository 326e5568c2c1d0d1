//! The `bus` binary, driven as a user would, through pipes.
#![cfg(feature = "embedded")]
#![allow(clippy::unwrap_used)]

#[cfg(feature = "cold")]
mod archive;
mod basics;
mod consumers;
mod docs;
mod exit_codes;
mod headers;
mod logging;
mod positions;
mod profiles;
mod publish;
mod secrets;
mod support;
