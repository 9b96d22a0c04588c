//! ace-filter: ACE's HTTP filter for Envoy, a thin adapter over `ace-core`.
//!
//! It turns Envoy's view of a request into inputs for the core, and the
//! core's answer into a routing header. All decisions live in the core;
//! all parsing happens once, when a configuration arrives ([`config`]).
//!
//! The crate has two layers:
//!
//! - What one request does, independent of how Envoy runs the filter:
//!   the request flow ([`flow`]), generic over a small host trait, and the
//!   steps it runs: parsing the configuration ([`config`]), reading
//!   attributes ([`attributes`], [`headers`], [`body`]), the steps from
//!   headers to decision to outcome ([`request`]), token usage in
//!   responses ([`usage`]), the event line ([`event`]), and what the
//!   control service says, checked and applied ([`control`]). No host calls;
//!   the Envoy dynamic module (`ace-dynamic`) is the other host of this
//!   layer.
//! - The proxy-wasm adapter (`wasm`, with [`host`]; [`state`] is its
//!   shared-data protocol, kept host-free so it can be tested), behind
//!   the default `wasm` feature: what Istio's WasmPlugin loads. Built for
//!   `wasm32-wasip1` it is the module `make wasm` ships.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

pub mod attributes;
pub mod body;
pub mod cache;
pub mod config;
pub mod control;
pub mod event;
pub mod flow;
pub mod headers;
pub mod request;
pub mod routing;
pub mod state;
pub mod usage;

#[cfg(feature = "wasm")]
pub mod host;
#[cfg(feature = "wasm")]
mod wasm;

pub use request::{
    RESPONSE_COST_HEADER, RESPONSE_DESTINATION_HEADER, RESPONSE_REASON_HEADER, RESPONSE_TIER_HEADER,
};
