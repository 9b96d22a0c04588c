//! `envoy-load`'s measurements (`src/bin/envoy-load.rs` is its command
//! line), a module per part: what each variant runs ([`variant`]), the
//! Envoys beyond the harness's builder ([`setup`]), the load generators
//! ([`load`]), one measured run ([`bench`](mod@bench): latency, throughput, Envoy's
//! CPU per request), instructions under callgrind ([`callgrind`]), the
//! price of one host call ([`calibrate`]) and the summary ([`report`]).
//!
//! A tool crate: it links the test harness (`ace-harness`) and ships
//! nothing.
#![forbid(unsafe_code)]

pub mod bench;
pub mod calibrate;
pub mod callgrind;
pub mod load;
pub mod report;
pub mod setup;
pub mod variant;
