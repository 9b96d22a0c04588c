//! ace-planner: the slow loop. It decides, hours ahead, how many owned GPUs
//! real-time inference gets each hour, which deferrable batch-like jobs fill
//! the troughs, and how much reserved capacity to buy at all.
//!
//! Why this crate exists: merit order (ace-core) decides each request given
//! today's capacity, but most of the money is decided earlier, when capacity is
//! planned and bought. The model (GPUs x steps, elastic RT with a swap cap,
//! rigid power-of-two batch blocks, inherited running work, priority x decay
//! objective with an RT shortfall penalty, the FIFO and stand-in baselines,
//! the golden scenarios) is written down in `planner/README.md`, section
//! "The model", the reference for this crate. Every plan is a grid that the
//! independent [`check`](mod@check) module validates and measures; policies
//! never report their own metrics.
//!
//! Policies: [`baseline::fifo`] and [`baseline::greedy`] (the two
//! baselines), [`fast::solve`] (the hot-path heuristic), [`full::solve`] (the
//! exact 0-1 model on HiGHS, warm-started from fast mode). [`rolling`] commits
//! one step at a time and exposes the owned capacity the control service
//! publishes; [`commit`] sizes reserved capacity with the critical-fractile
//! rule; [`gen`] makes random scenarios.
#![forbid(unsafe_code)]

pub mod baseline;
pub mod check;
pub mod commit;
pub mod compare;
pub mod fast;
pub mod feasible;
pub mod full;
pub mod gen;
pub mod model;
pub mod occupancy;
pub mod rng;
pub mod rolling;
pub mod rt;
pub mod scenario;
pub mod sched;
pub mod stress;
pub mod study;

pub use check::{check, Report};
pub use model::{Cell, Config, Job, JobKind, PastHorizon, Plan, RtApp, Scenario};
pub use scenario::{parse, ParseError};
