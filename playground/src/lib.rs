//! ace-playground: the policy compiler, its verifier and `explain`, built
//! for `wasm32-unknown-unknown` with wasm-bindgen, behind the small API the
//! playground page (`www/`) uses.
//!
//! Why a crate of its own: the people who write residency and compliance
//! policies are often not the people who run Envoy. In the browser they can
//! edit, compile, verify and ask "where may this request go, and why not
//! there?" with nothing installed and no data leaving the page, while
//! `ace-policy` stays free of browser concerns: this crate only moves
//! strings and bytes between the page and it.
//!
//! - [`session`]: the operations on plain Rust types (testable natively);
//!   the answers, the tables' checksum above all, equal the `ace` command's.
//! - [`wasm`]: the wasm-bindgen surface the page's script calls.
//!
//! `scripts/build-playground.sh` builds the module and assembles the static
//! site; `ace playground` serves it.
#![forbid(unsafe_code)]
// The no-panic lints of product code (tests/tests/lints.rs checks them;
// tests may still unwrap and index: clippy.toml).
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![deny(clippy::panic, clippy::indexing_slicing)]

pub mod session;
pub mod wasm;
