//! ace-core: the decision model that the filter, the CLI and the control
//! service share.
//!
//! Why a separate crate: the decision must be the same function everywhere
//! it is made or simulated (inside Envoy, in `ace sim`, in property tests),
//! and it must be small enough to read in one sitting. So it holds no I/O,
//! allocates nothing per decision, and builds for `no_std` + `alloc`, which
//! keeps it honest inside a Wasm VM.
//!
//! Read it in this order:
//!
//! - [`cost`]: what one more request costs on a destination, by tier (the
//!   supply curve's rungs, the stutter knee, warmth, bias);
//! - [`health`]: trips, throttling caps and derates, from observed outcomes;
//! - [`latency`]: each destination's time to first token, learned by load
//!   from its answers, with the manifest's figures as the prior;
//! - [`tables`]: the compiled Cedar policy as bitmask tables (feasibility);
//! - [`signal`]: what the control service says of each destination (a
//!   drain, its load, a capacity or price change), folded into its price;
//! - [`dispatch`]: the decision itself: price the fleet when it changes,
//!   then per request take the cheapest feasible, open destination;
//! - [`queue`]: waiting for a cheaper destination past its knee, priced
//!   as one more rung against the one chosen now;
//! - [`fleet`]: the live state a host keeps (health, load, the priced
//!   slate) and what a claim, a release and an outcome do to it.
#![cfg_attr(not(feature = "std"), no_std)]
#![forbid(unsafe_code)]
// Beyond the workspace lints: this code reads configuration and requests
// inside Envoy, where a panic kills a worker's VM (tests may still assert
// with unwrap and indexing: see clippy.toml).
#![warn(missing_docs)]
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![deny(clippy::panic, clippy::indexing_slicing)]

extern crate alloc;

pub mod cost;
pub mod dispatch;
pub mod fleet;
pub mod health;
pub mod latency;
pub mod queue;
pub mod signal;
pub mod tables;
