//! The parts of the `ace` command that other crates (tests, tools) reuse.

pub mod output;
pub mod plugin;
