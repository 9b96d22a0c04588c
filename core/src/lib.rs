//! ace-core: the decision model that the filter, the CLI and the control
//! service share.
//!
//! Why a separate crate: the decision must be the same function everywhere
//! it is made or simulated (inside Envoy, in `ace sim`, in property tests),
//! and it must be small enough to read in one sitting. So it holds no I/O,
//! allocates nothing per decision, and builds for `no_std` + `alloc`, which
//! keeps it honest inside a Wasm VM.
//!
//! Today it holds the walking skeleton of merit order: among the configured
//! destinations, the lowest static price wins, ties broken by position.
#![cfg_attr(not(feature = "std"), no_std)]

extern crate alloc;

pub mod cost;
pub mod dispatch;
pub mod health;
pub mod merit;
pub mod tables;
