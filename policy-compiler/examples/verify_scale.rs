//! Verify at scale: compiles the bench fleet of N destinations (request
//! space 10^6 known combinations), verifies the tables against the
//! independent Cedar reference, and prints the time and the coverage.
//! BENCHMARKS.md quotes it for 256 and 1,024 destinations; the timing goal
//! (256 destinations in under a minute) is the criterion bench
//! `verify/256`.
//!
//! `cargo run --release -p ace-policy --example verify_scale -- 256`
#![allow(clippy::unwrap_used, missing_docs)]

#[path = "../benches/support/mod.rs"]
mod support;

use ace_policy::oracle::Oracle;
use std::time::Instant;

fn main() {
    let n: usize = std::env::args().nth(1).map_or(256, |a| a.parse().unwrap());
    let sources = support::sources(n);
    let project = ace_policy::Project::load(sources.clone()).unwrap();
    let compiled = ace_policy::compile(&project).unwrap();
    let start = Instant::now();
    let oracle = Oracle::load(&sources).unwrap();
    let report = ace_policy::verify::verify(&oracle, &compiled.bytes).unwrap();
    let elapsed = start.elapsed();
    println!("destinations: {n}");
    println!("coverage: {}", report.coverage_line());
    println!(
        "checked {} requests ({} with every value known) = {} decisions in {:.1?}, mismatches: {}",
        report.requests, report.known, report.decisions, elapsed, report.mismatch_count
    );
}
