//! ace-flow: what one request does, independent of how a proxy runs it.
//!
//! Every host runs this crate's one request flow ([`flow::Flow`]) over a
//! small host trait ([`flow::Host`]): the Wasm filter (`ace-filter`), the
//! Envoy dynamic module (`ace-dynamic`), the fleet simulator (`ace-sim`)
//! and the tests' mock. So a rule written here holds in every host, and a
//! host adds only what its proxy makes it do (how to read a header, where
//! shared state lives).
//!
//! The steps the flow runs, in order: reading attributes ([`attributes`],
//! [`headers`], [`body`]), feasibility, the merit order and the outcome
//! ([`request`]), the rungs a request may take before an upstream: model
//! routing ([`routing`]) and the response cache ([`cache`]); token usage
//! in responses ([`usage`]) and the event line ([`event`]). What the
//! control service says is checked and applied by [`control`].
//!
//! The configuration it runs with is `ace-config`'s, validated once; the
//! state built from it (policy tables borrowed, routing and cache built
//! against them) is the flow's [`flow::Setup`].
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![deny(clippy::panic, clippy::indexing_slicing)]

pub mod attributes;
pub mod body;
pub mod budget;
pub mod cache;
pub mod control;
pub mod counters;
pub mod event;
pub mod fleet;
pub mod flow;
pub mod headers;
pub mod headroom;
pub mod host;
pub mod parking;
pub mod prefix;
pub mod request;
pub mod rerun;
pub mod routing;
pub mod setup;
pub mod stage;
pub mod store;
pub mod stream_usage;
pub mod tokens;
pub mod upstream;
pub mod usage;

pub use ace_config as config;
/// The event line's fields and version, defined in `ace-event` (the
/// contract the ledger and pricing read too); here so that the flow's
/// writer and its users name them as before.
pub use ace_event::{event_fields, schema};
pub use flow::Setup;
pub use request::{
    RESPONSE_COST_HEADER, RESPONSE_DESTINATION_HEADER, RESPONSE_REASON_HEADER, RESPONSE_TIER_HEADER,
};
