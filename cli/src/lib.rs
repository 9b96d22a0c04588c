//! The parts of the `ace` command that other crates (tests, tools) reuse.
#![forbid(unsafe_code)]

pub mod ingest_summary;
pub mod output;
pub mod plugin;
pub mod shadow;
pub mod spend;
