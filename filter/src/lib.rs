//! ace-filter: ACE's proxy-wasm HTTP filter, what Istio's WasmPlugin and
//! Envoy's Wasm filter load. Built for `wasm32-wasip1` it is the module
//! `make wasm` ships.
//!
//! A thin adapter: every decision is `ace-flow`'s one request flow, which
//! the dynamic module (`ace-dynamic`) and the simulator run too. This
//! crate says how proxy-wasm reads a header, sends a local reply and
//! shares state between Envoy's worker VMs ([`host`], and [`state`], the
//! shared-data protocol, kept host-free so that it is tested natively),
//! and allocates a request's blocks from free lists ([`alloc`]).
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![deny(clippy::panic, clippy::indexing_slicing)]

pub mod alloc;
pub mod host;
pub mod state;
pub mod stop_iteration;
mod wasm;

/// The module's allocator: size-class free lists over wasi-libc's malloc
/// ([`alloc`] says why). Only in the module, which runs on one thread.
#[cfg(target_arch = "wasm32")]
#[global_allocator]
static ALLOCATOR: alloc::Classes<std::alloc::System> = alloc::Classes::new(std::alloc::System);
