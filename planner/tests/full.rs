//! Full mode (HiGHS) on small golden scenarios: the plan passes the checker,
//! is never worse than its fast-mode warm start, and optimality is proved.
#![cfg(feature = "milp")]

use ace_planner::{check, fast, full, parse};

#[test]
fn full_mode_proves_optimality_on_s1_and_s5() {
    for (n, optimum) in [(1u32, 1054.0), (5, 735.0)] {
        let path = format!("{}/scenarios/s{n}", env!("CARGO_MANIFEST_DIR"));
        let s = parse(&std::fs::read_to_string(path).unwrap(), "s").unwrap();
        let warm = fast::solve(&s);
        let out = full::solve_checked(&s, &warm.plan, full::Options::default()).unwrap();
        let r = check(&s, &out.plan);
        assert!(r.valid(), "S{n}: {:?}", r.violations);
        assert!(
            r.objective >= warm.report.objective,
            "S{n}: worse than the warm start"
        );
        assert!(out.proof.optimal, "S{n}: {:?}", out.proof);
        assert!(out.proof.gap <= 1e-4, "S{n}: {:?}", out.proof);
        assert_eq!(r.objective, optimum, "S{n}");
    }
}

#[test]
fn utilisation_floor_is_respected() {
    let path = format!("{}/scenarios/s5", env!("CARGO_MANIFEST_DIR"));
    let s = parse(&std::fs::read_to_string(path).unwrap(), "s").unwrap();
    let warm = fast::solve(&s);
    let floor = warm.report.rt_served + warm.report.batch_gpu_steps;
    let opts = full::Options {
        min_gpu_steps: Some(floor),
        ..full::Options::default()
    };
    let out = full::solve_checked(&s, &warm.plan, opts).unwrap();
    let r = check(&s, &out.plan);
    assert!(
        r.valid() && r.rt_served + r.batch_gpu_steps >= floor,
        "{r:?}"
    );
}
