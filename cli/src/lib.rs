//! The parts of the `ace` command that other crates (tests, tools) reuse.
#![forbid(unsafe_code)]

pub mod control_fleet;
pub mod output;
pub mod plugin;
