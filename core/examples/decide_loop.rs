//! Runs the decision N times over a 64-destination fleet, for instruction
//! counts that do not depend on machine load:
//!
//! ```sh
//! cargo build --release -p ace-core --example decide_loop
//! valgrind --tool=callgrind target/release/examples/decide_loop 100000
//! ```
//! Instructions per decision = (total with N) - (total with 0), over N.
//! Run natively it also prints the CPU time per decision (from
//! `/proc/self/schedstat`, so time spent descheduled on a busy machine
//! does not count).

use ace_core::cost::{CostModel, Tier};
use ace_core::dispatch::{decide, Fleet, Request, Slate};
use ace_core::health::{Health, HealthPolicy};
use std::hint::black_box;

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let d = 64usize;
    let tiers = Tier::ALL;
    let models: Vec<CostModel> = (0..d)
        .map(|i| {
            let tier = tiers.get(i % tiers.len()).copied().unwrap_or(Tier::Payg);
            CostModel {
                tier,
                usd_per_input_token: 1e-8 * (1 + i % 7) as f64,
                usd_per_output_token: 3e-8,
                usd_per_gpu_hour: 2.0,
                tokens_per_second: 1500.0,
                capacity: if tier == Tier::Payg { 0 } else { 32 },
                ..CostModel::default()
            }
        })
        .collect();
    let health = vec![Health::default(); d];
    let in_flight: Vec<u32> = (0..d).map(|i| (i * 7 % 30) as u32).collect();
    let policy = HealthPolicy::default();
    let fleet = Fleet {
        models: &models,
        health: &health,
        in_flight: &in_flight,
        live: &[],
        learned: &[],
        policy: &policy,
    };
    let mask = [u64::MAX];
    let req = Request::untimed(1200, 300, 0.002);
    let mut slate = Slate::new(d);
    slate.refresh(&fleet, 5);
    let mut sum = 0usize;
    let t0 = cpu_ns();
    for _ in 0..n {
        if let Ok(c) = decide(black_box(&slate), black_box(&mask), &mask, black_box(&req)) {
            sum += c.index;
        }
    }
    let t1 = cpu_ns();
    println!("checksum {sum}");
    if let (Some(t0), Some(t1)) = (t0, t1) {
        if n > 0 {
            println!("{:.1} ns CPU per decision", (t1 - t0) as f64 / n as f64);
        }
    }
}

/// Nanoseconds this process has run on a CPU.
fn cpu_ns() -> Option<u64> {
    std::fs::read_to_string("/proc/self/schedstat")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
