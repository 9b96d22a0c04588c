//! The control service's integration tests, one module per subject, built
//! as one test binary: each links the service with the ledger's SQLite
//! and PostgreSQL clients, and linking three binaries was a good share of
//! `make test`'s build. Run one subject with
//! `cargo test -p ace-control --test control budgets::`.

mod budgets;
mod common;
mod connections;
mod hostile;
mod serve;
