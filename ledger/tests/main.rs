//! The ledger's integration tests, one module per subject, built as one
//! test binary: each links the ledger, both stores' clients and the test
//! harness, and linking five binaries was a good share of `make test`'s
//! build. Run one subject with `cargo test -p ace-ledger --test ledger
//! golden::`.

mod bill;
mod common;
mod focus;
mod golden;
mod hostile;
mod html_chromium;
mod postgres;
mod properties;
