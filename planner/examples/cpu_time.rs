//! CPU time per fast-mode solve (from /proc/self/schedstat, so it does not
//! count time the process waits for a core on a loaded machine), with the
//! plan's checked figures. Companion to the criterion bench, whose
//! wall-clock numbers inflate under load.
//! `cargo run --release -p ace-planner --example cpu_time`
use ace_planner::{check, fast, gen, parse, stress, Scenario};

fn cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

fn golden(n: u32) -> Option<Scenario> {
    let path = format!("{}/scenarios/s{n}", env!("CARGO_MANIFEST_DIR"));
    parse(&std::fs::read_to_string(path).ok()?, &format!("s{n}")).ok()
}

fn main() {
    let mut cases: Vec<(String, Scenario)> = (1..=7)
        .filter_map(|n| {
            golden(n).map(|s| (format!("S{n} ({} GPUs, {} jobs)", s.gpus, s.jobs.len()), s))
        })
        .collect();
    cases.push(("gen 1024 GPUs, 500 jobs".into(), gen::sized(7, 1024, 500)));
    cases.push(("stress 64 GPUs, 30 jobs".into(), stress::sized(7, 64, 30)));
    cases.push((
        "stress 1024 GPUs, 500 jobs".into(),
        stress::sized(7, 1024, 500),
    ));
    for (name, s) in &cases {
        let r = check(s, &fast::solve(s).plan);
        let iters = if s.gpus >= 1024 { 50 } else { 300 };
        let t0 = cpu_ns();
        for _ in 0..iters {
            std::hint::black_box(fast::solve(std::hint::black_box(s)));
        }
        let per = (cpu_ns() - t0) as f64 / f64::from(iters) / 1e6;
        println!(
            "{name:<28} {per:>9.3} ms CPU per solve   util {:>5.1}%  value {:>12.1}  objective {:>12.1}  valid {}",
            r.utilization * 100.0,
            r.value,
            r.objective,
            r.valid()
        );
    }
}
