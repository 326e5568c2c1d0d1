//! The `bus` command's pieces.

pub mod commands;
pub mod progress;
