//! ace-event: the event line's contract, the one JSON line every request
//! leaves in the access log (`ace.event/2`).
//!
//! [`event_fields!`] is the one list of the line's fields (name, the type
//! the flow fills in, JSON kind, presence, meaning); [`SCHEMA`] its
//! version; [`schema::FIELDS`] the list as a table.
//!
//! Why a crate of its own, and a leaf (it depends on no crate of the
//! workspace): the line has a writer and several readers. The flow
//! (`ace-flow`) writes it inside Envoy; the ledger (`ace-ledger`) reads it
//! back and stores it; the books' pricing (`ace-pricing`) reads its facts;
//! the simulator (`ace-sim`) writes the same line for the requests it
//! simulates. Each of them derives its part (the writer, the reader, the
//! stored row, the columns) from the one list here, so none of them can
//! drift from the others, and a reader takes the line's definition without
//! taking the request flow that writes it.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
// The no-panic lints of product code (tests/tests/lints.rs checks them;
// tests may still unwrap and index: clippy.toml).
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![deny(clippy::panic, clippy::indexing_slicing)]

pub mod schema;

pub use schema::SCHEMA;

/// Values of the line's `reason` that a reader acts on, named once for
/// the flow that writes them and the ledger that counts them.
pub mod reason {
    /// An answer from ACE's response cache.
    pub const CACHE_HIT: &str = "cache_hit";
    /// A cache hit sent upstream to be checked (the ledger counts these
    /// among a window's checked hits).
    pub const CACHE_CHECK: &str = "cache_check";
}
