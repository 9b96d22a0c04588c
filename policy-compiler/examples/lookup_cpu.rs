//! Lookup cost in CPU time rather than wall time, for a machine shared with
//! other work (where criterion's wall-clock numbers are inflated by
//! descheduling): compiles the bench fleet, runs 20 million lookups and
//! prints user CPU nanoseconds per lookup.
//!
//! `cargo run --release -p ace-policy --example lookup_cpu -- 64`
#![allow(clippy::unwrap_used, missing_docs)]

#[path = "../benches/support/mod.rs"]
mod support;

use ace_core::tables::Tables;
use std::hint::black_box;

fn user_cpu_ns() -> u128 {
    // utime is field 14 of /proc/self/stat, in clock ticks (100 Hz).
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after = stat.rsplit(')').next().unwrap();
    let utime: u128 = after.split_whitespace().nth(11).unwrap().parse().unwrap();
    utime * 10_000_000
}

fn main() {
    let n: usize = std::env::args().nth(1).map_or(64, |a| a.parse().unwrap());
    let project = ace_policy::Project::load(support::sources(n)).unwrap();
    let compiled = ace_policy::compile(&project).unwrap();
    let tables = Tables::load(&compiled.bytes).unwrap();
    let reqs = support::requests(&project, 1024);
    let mut out = vec![0u64; tables.words()];
    let iters = 20_000_000u128;
    let start = user_cpu_ns();
    let wall = std::time::Instant::now();
    for i in 0..iters as usize {
        tables
            .feasible(black_box(&reqs[i & 1023]), &mut out)
            .unwrap();
        black_box(&out);
    }
    let cpu = user_cpu_ns() - start;
    println!(
        "lookup at {n} destinations: {:.1} ns user CPU per lookup ({:.1} ns wall)",
        cpu as f64 / iters as f64,
        wall.elapsed().as_nanos() as f64 / iters as f64
    );
}
