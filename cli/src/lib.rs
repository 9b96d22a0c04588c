//! The parts of the `ace` command that other crates (tests, tools) reuse.
#![forbid(unsafe_code)]
// The no-panic lints of product code (tests/tests/lints.rs checks them;
// tests may still unwrap and index: clippy.toml).
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![deny(clippy::panic, clippy::indexing_slicing)]

pub mod ingest_summary;
pub mod output;
pub mod plugin;
pub mod shadow;
pub mod spend;
