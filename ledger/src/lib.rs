//! ace-ledger: what every request really cost, what all pay-as-you-go
//! would have charged for the same traffic, and why the difference is a
//! saving the product may claim.
//!
//! The filter writes one event per request into Envoy's access log. The
//! ledger does not trust the money in it: it re-derives each booked cost
//! and counterfactual from the plugin configuration the event names
//! ([`configs`], [`price`]), so a preference bias or a health derate, which
//! move the ranking only, can never move a booked cost or a saving. Money
//! is integer nano-dollars ([`money`]) so sums are exact and the four-way
//! split ([`split`]) adds up to the total to the nano-dollar.
//!
//! Savings are earned per window ([`window`]): a tenant's window whose
//! served fraction, SLO attainment or cache false-hit rate missed its
//! bound forfeits its savings, so dropping or slowing traffic can never
//! look like saving money. Reports ([`report`], [`chargeback`], [`html`],
//! [`focus`]) are computed from the stored rows by the same code whatever
//! the store ([`store`]: SQLite on one machine, PostgreSQL for a mesh of
//! Envoys), and every figure traces back to its request ids ([`trace`]);
//! text from the log is printed escaped ([`text`]).
//!
//! Tenant budgets are read from the same books ([`budget::readings`], what
//! the control service publishes, read again and again by a
//! [`spend::Reader`]) and their use is reported.
//!
//! What the providers say they charged ([`bill`]: their usage and cost
//! records) is stored beside the events and reconciled with the books
//! ([`bill::reconcile`]).
//!
//! [`book::Ledger`] ties a store and its configurations together.
#![forbid(unsafe_code)]
// The no-panic lints of product code (tests/tests/lints.rs checks them;
// tests may still unwrap and index: clippy.toml).
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![deny(clippy::panic, clippy::indexing_slicing)]

pub mod bill;
pub mod book;
pub mod budget;
pub mod chargeback;
pub mod configs;
pub mod event;
pub mod focus;
pub mod html;
pub mod ingest;
pub mod kind;
pub use ace_pricing::money;
pub mod price;
pub mod report;
pub mod row;
pub mod spend;
pub mod split;
pub mod store;
pub mod text;
pub mod time;
pub mod trace;
pub mod window;
