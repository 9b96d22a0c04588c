//! The parts of the demo that the real-Envoy tests reuse: the control
//! service's small fleet ([`control_fleet`]), which scene 6 plays and
//! `tests/tests/control_service.rs` drives.
//!
//! `ace-demo` is a tool, not product code: it links `ace-harness` (scripted
//! upstreams, the Envoy runner) so that the `ace` command does not.
#![forbid(unsafe_code)]

pub mod control_fleet;
