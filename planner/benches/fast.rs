//! Criterion benches of fast mode: S1 (8 GPUs), S6 (64 GPUs, 30 jobs), a
//! generated 1,024-GPU, 500-job scenario, and the stress generator's spiky
//! instances at 64 x 30 and 1,024 x 500 (goals: <= 1 ms and <= 10 ms). Every
//! bench checks its plan first.

use ace_planner::{check, fast, gen, parse, stress, Scenario};
use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;

fn scenario(n: u32) -> Scenario {
    let path = format!("{}/scenarios/s{n}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("scenario file");
    parse(&text, &format!("s{n}")).expect("valid scenario")
}

fn bench(c: &mut Criterion) {
    let cases = [
        ("s1_8gpu_14jobs", scenario(1)),
        ("s6_64gpu_30jobs", scenario(6)),
        ("gen_1024gpu_500jobs", gen::sized(7, 1024, 500)),
        ("stress_64gpu_30jobs", stress::sized(7, 64, 30)),
        ("stress_1024gpu_500jobs", stress::sized(7, 1024, 500)),
    ];
    let mut g = c.benchmark_group("fast");
    for (name, s) in &cases {
        let out = fast::solve(s);
        let r = check(s, &out.plan);
        assert!(r.valid(), "{name}: {:?}", r.violations);
        eprintln!(
            "{name}: util {:.1}% value {} shortfall {} (source {})",
            r.utilization * 100.0,
            r.value,
            r.shortfall,
            out.source
        );
        g.bench_function(*name, |b| b.iter(|| fast::solve(black_box(s))));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
