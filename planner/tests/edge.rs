//! Edge cases: odd shapes and every option go through all policies and the
//! checker without panics, and inherited work stays pinned.

use ace_planner::{baseline, check, compare, fast, parse};

const CASES: &[&str] = &[
    "gpus 1\nsteps 1\n",
    "gpus 1\nsteps 1\njob 0 eval 1 1 1 0\n",
    "gpus 2\nsteps 3\nrt 0 2 2 2\njob 0 eval 1 1 1 0\n",
    "gpus 4\nsteps 4\nrt 0 3 3 3 3\nrt 1 3 3 3 3\njob 0 eval 1 1 1 0\n",
    "gpus 8\nsteps 6\nalign true\npast_horizon forbid\ngamma 0.9\nrt_penalty 10\n\
     rt 0 1 2 2 1 0 0 cap=1 prev=3\njob 0 train 4 3 5 0 running=4\njob 1 eval 2 2 9 1\n\
     job 2 quant 4 9 3 0\njob 3 batchinf 1 2 2 5\n",
    "gpus 16\nsteps 24\njob 0 train 16 30 1 0\njob 1 train 8 4 2 0 running=0\n",
];

#[test]
fn all_policies_survive_edge_cases() {
    for text in CASES {
        let s = parse(text, "edge").unwrap();
        for plan in [
            baseline::fifo(&s),
            baseline::greedy(&s),
            fast::solve(&s).plan,
        ] {
            let _ = check(&s, &plan);
        }
        let out = fast::solve(&s);
        assert!(out.report.valid(), "{text:?}: {:?}", out.report.violations);
        let c = compare::compare(&s, None);
        assert!(!compare::table(&c).is_empty());
        for (i, j) in s.jobs.iter().enumerate() {
            if let Some(g) = j.running {
                let placed = out.plan.placements();
                assert!(
                    placed.contains(&(i, 0, g)),
                    "{text:?}: running job {} moved",
                    j.id
                );
            }
        }
    }
}

#[test]
fn forbid_keeps_jobs_inside_the_horizon() {
    let s = parse(
        "gpus 4\nsteps 10\npast_horizon forbid\njob 0 train 2 8 5 0\njob 1 train 2 8 5 4\n",
        "f",
    )
    .unwrap();
    let out = fast::solve(&s);
    assert!(out.report.valid());
    // Job 1 arrives at 4 and needs 8 steps: it cannot finish by 10.
    assert!(out.plan.placements().iter().all(|p| p.0 != 1));
}
