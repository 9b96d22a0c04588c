//! The stress generator (`ace_planner::stress`) against an independent
//! checker (`tests/support`): fast mode returns a valid plan on every
//! feasible scenario, and every infeasible one is reported as infeasible,
//! with a line and a reason, by the parser.

mod support;

use ace_planner::scenario::to_text;
use ace_planner::{fast, feasible, parse, stress};

/// Scenarios per run (seeds 0..COUNT).
const COUNT: u64 = 1_000;

#[test]
fn fast_mode_is_valid_on_every_feasible_stress_scenario() {
    let (mut feasible_n, mut infeasible_n, mut jumps, mut minimal) = (0, 0, 0, 0);
    for seed in 0..COUNT {
        let s = stress::scenario(seed);
        let text = to_text(&s);
        let why = support::infeasible(&s);
        assert_eq!(
            why.is_some(),
            feasible::check(&s).is_err(),
            "seed {seed}: independent {why:?} vs planner {:?}\n{text}",
            feasible::check(&s)
        );
        if why.is_some() {
            infeasible_n += 1;
            let e = parse(&text, "x").expect_err("an infeasible scenario must not parse");
            assert!(e.infeasible, "seed {seed}: {e}");
            assert!(e.line > 0, "seed {seed}: no line in {e}");
            assert!(
                e.to_string().contains("no valid plan: "),
                "seed {seed}: {e}"
            );
            continue;
        }
        feasible_n += 1;
        assert_eq!(parse(&text, &s.name).as_ref(), Ok(&s), "seed {seed}");
        jumps += usize::from(s.rt.iter().any(|r| {
            r.demand
                .windows(2)
                .any(|w| w[0].abs_diff(w[1]) > 2 * r.swap_cap)
        }));
        let out = fast::solve(&s);
        minimal += usize::from(out.source == "minimal");
        let fig = support::verify(&s, &out.plan)
            .unwrap_or_else(|e| panic!("seed {seed}: fast plan invalid: {e}\n{text}"));
        assert!(
            out.report.valid(),
            "seed {seed}: {:?}",
            out.report.violations
        );
        assert_eq!(fig.shortfall, out.report.shortfall, "seed {seed}");
        let tol = 1e-9 * fig.objective.abs().max(1.0);
        assert!((fig.value - out.report.value).abs() <= tol, "seed {seed}");
        assert!(
            (fig.objective - out.report.objective).abs() <= tol,
            "seed {seed}"
        );
    }
    eprintln!(
        "{COUNT} stress scenarios: {feasible_n} feasible (fast valid on all; {jumps} with demand \
         jumps beyond the cap; {minimal} fell back to the minimal plan), {infeasible_n} infeasible \
         (all reported)"
    );
    assert!(infeasible_n > 0 && jumps > 0);
}

/// The smallest cases from the issue: demand jumps beyond the cap become
/// shortfall, not a violation.
#[test]
fn demand_jumps_beyond_the_cap_become_shortfall() {
    let cases = [
        (
            "gpus 8\nrt 0 0 0 0 0 0 0 0 6 6 6 6 6 6 0 0 0 0 0 0 0 0 0 0 0\n",
            4,
        ),
        ("gpus 1\nsteps 2\nrt 0 1 0 cap=0\n", 1),
    ];
    for (text, shortfall) in cases {
        let s = parse(text, "jump").unwrap();
        let out = fast::solve(&s);
        let fig = support::verify(&s, &out.plan).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert_eq!(fig.shortfall, shortfall, "{text:?}");
    }
}
