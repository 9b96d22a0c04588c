//! Fast mode, then full mode with HiGHS's progress log, on one scenario file;
//! prints both checked reports and the full-mode grid. For long full-mode runs
//! (the S7 figures in BENCHMARKS.md):
//! `cargo run --release -p ace-planner --example full_log -- planner/scenarios/s7 600`
//! An optional third argument sets `relaxation_share` (0 skips phase 1).
use ace_planner::{check, compare, fast, full, parse, Report};

fn line(name: &str, r: &Report) {
    println!(
        "{name}: valid {} utilisation {:.1} % value {} shortfall {}",
        r.valid(),
        100.0 * r.utilization,
        r.value,
        r.shortfall
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| "planner/scenarios/s7".into());
    let secs: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(60.0);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let s = parse(&text, &path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let share: Option<f64> = args.next().and_then(|a| a.parse().ok());
    let warm = fast::solve(&s);
    line("fast", &warm.report);
    let mut opts = full::Options {
        time_limit_s: secs,
        log: true,
        ..full::Options::default()
    };
    if let Some(share) = share {
        opts.relaxation_share = share;
    }
    let clock = std::time::Instant::now();
    let result = full::solve(&s, &warm.plan, opts);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "full mode: {:.1} s wall, load average {}",
        clock.elapsed().as_secs_f64(),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    match result {
        Ok(out) => {
            println!("{:?}", out.proof);
            line("full", &check(&s, &out.plan));
            print!("{}", compare::grid(&s, &out.plan, 64));
        }
        Err(e) => println!("full mode: {e}"),
    }
}
