//! The independent plan checker.
//!
//! Why independent: every policy writes only a GPU x step grid of owners, and
//! this module re-derives everything from that grid without trusting the
//! policy's own bookkeeping. It validates the five constraints of §1.2 of the
//! scheduling note and computes every reported metric, so a policy cannot
//! report numbers its grid does not back.
//!
//! 1. One job per GPU-step: structural in the grid (one owner per cell); the
//!    checker verifies that every owner names a real app or job.
//! 2. Demand range and inheritance: an RT app holds at most its demand; a
//!    batch job holds exactly `size` GPUs while it runs, starts no earlier
//!    than its arrival; running (inherited) jobs stay where they are.
//! 3. Contiguous power-of-two blocks (aligned when `align` is set).
//! 4. Swap cap: between consecutive steps an RT app gains plus loses at most
//!    `2K` GPUs (also against the inherited set before step 0).
//! 5. No interruption: a started job holds one rectangle of GPUs x steps from
//!    its start to its end (or the horizon).
//! 6. The state before step 0 is one owner per GPU: running blocks and `prev=`
//!    sets do not overlap (a scenario that breaks this has no valid plan;
//!    [`crate::feasible`] says why).

use crate::model::{Cell, PastHorizon, Plan, Scenario};
use serde::Serialize;

/// Metrics and violations of one plan, all derived from the grid.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Human-readable violations; empty when the plan is valid.
    pub violations: Vec<String>,
    /// (RT GPU-steps served + batch GPU-steps) / (G x T).
    pub utilization: f64,
    /// Sum over batch GPU-steps of priority x gamma^t.
    pub value: f64,
    /// `value - lambda x shortfall`: what the planners maximise.
    pub objective: f64,
    /// Batch GPU-steps inside the horizon.
    pub batch_gpu_steps: u64,
    /// RT GPU-steps served.
    pub rt_served: u64,
    /// Unmet RT GPU-steps.
    pub shortfall: u64,
    /// RT GPU moves: GPUs gained plus GPUs lost between consecutive steps.
    pub swaps: u64,
    /// Jobs whose whole duration runs inside the horizon.
    pub completed: u32,
    /// Jobs placed at all.
    pub started: u32,
}

impl Report {
    /// True when the plan satisfies every constraint.
    pub fn valid(&self) -> bool {
        self.violations.is_empty()
    }
}

#[derive(Clone, Copy)]
struct Bbox {
    g0: u32,
    g1: u32,
    t0: u32,
    t1: u32,
    count: u64,
}

/// Checks `plan` against `s` and computes its metrics.
pub fn check(s: &Scenario, plan: &Plan) -> Report {
    let mut v = Vec::new();
    let mut rep = Report {
        violations: Vec::new(),
        utilization: 0.0,
        value: 0.0,
        objective: 0.0,
        batch_gpu_steps: 0,
        rt_served: 0,
        shortfall: 0,
        swaps: 0,
        completed: 0,
        started: 0,
    };
    let (gn, tn) = (s.gpus, s.steps);
    if plan.gpus != gn || plan.steps != tn || plan.cells.len() != (gn as usize) * (tn as usize) {
        rep.violations.push(format!(
            "grid is {}x{} ({} cells) but the scenario is {gn} GPUs x {tn} steps",
            plan.gpus,
            plan.steps,
            plan.cells.len()
        ));
        return rep;
    }
    let nr = s.rt.len();
    let weight: Vec<f64> = (0..tn).map(|t| s.weight(t)).collect();
    let mut boxes: Vec<Option<Bbox>> = vec![None; s.jobs.len()];
    // held[r][t] = GPUs of app r at step t.
    let mut held: Vec<Vec<Vec<u32>>> = vec![vec![Vec::new(); tn as usize]; nr];
    // Cells are read a run of equal owners at a time (a block is a run in
    // each of its rows); the figures still add up cell by cell.
    for (t, row) in plan.cells.chunks_exact(gn.max(1) as usize).enumerate() {
        let t = t as u32;
        let mut g = 0;
        while g < gn {
            let cell = row[g as usize];
            let end = g + row[g as usize..].iter().take_while(|&&c| c == cell).count() as u32;
            let run = g..end;
            g = end;
            match cell {
                Cell::Idle => {}
                Cell::Rt(r) => {
                    let r = usize::from(r);
                    if r >= nr {
                        for g in run {
                            v.push(format!(
                                "GPU {g} step {t}: owner names RT app #{r}, which does not exist"
                            ));
                        }
                        continue;
                    }
                    rep.rt_served += u64::from(run.end - run.start);
                    held[r][t as usize].extend(run);
                }
                Cell::Job(j) => {
                    let ji = j as usize;
                    let Some(job) = s.jobs.get(ji) else {
                        for g in run {
                            v.push(format!(
                                "GPU {g} step {t}: owner names job #{ji}, which does not exist"
                            ));
                        }
                        continue;
                    };
                    let n = run.end - run.start;
                    rep.batch_gpu_steps += u64::from(n);
                    for _ in 0..n {
                        rep.value += f64::from(job.priority) * weight[t as usize];
                    }
                    let b = boxes[ji].get_or_insert(Bbox {
                        g0: run.start,
                        g1: run.start,
                        t0: t,
                        t1: t,
                        count: 0,
                    });
                    b.g0 = b.g0.min(run.start);
                    b.g1 = b.g1.max(run.end - 1);
                    b.t0 = b.t0.min(t);
                    b.t1 = b.t1.max(t);
                    b.count += u64::from(n);
                }
            }
        }
    }
    // Batch jobs: constraints 2, 3, 5.
    for (ji, job) in s.jobs.iter().enumerate() {
        let Some(b) = boxes[ji] else {
            if job.running.is_some() {
                v.push(format!(
                    "job {}: running work was dropped (it must stay pinned)",
                    job.id
                ));
            }
            continue;
        };
        rep.started += 1;
        let width = b.g1 - b.g0 + 1;
        let len = b.t1 - b.t0 + 1;
        if u64::from(width) * u64::from(len) != b.count {
            v.push(format!(
                "job {}: its GPU-steps do not form one block (holes or interruption)",
                job.id
            ));
            continue;
        }
        if width != job.size || !job.size.is_power_of_two() {
            v.push(format!(
                "job {}: holds {width} GPUs, needs a block of exactly {}",
                job.id, job.size
            ));
        }
        if len != s.clipped(job, b.t0) {
            v.push(format!(
                "job {}: runs {len} steps from step {}, needs {} (interrupted or stretched)",
                job.id,
                b.t0,
                s.clipped(job, b.t0)
            ));
        }
        if s.config.align && !b.g0.is_multiple_of(job.size) {
            v.push(format!(
                "job {}: block starts at GPU {}, not a multiple of {}",
                job.id, b.g0, job.size
            ));
        }
        if let Some(pin) = job.running {
            if b.t0 != 0 || b.g0 != pin {
                v.push(format!(
                    "job {}: running work moved from step 0 GPU {pin} to step {} GPU {}",
                    job.id, b.t0, b.g0
                ));
            }
        } else if b.t0 < job.arrival {
            v.push(format!(
                "job {}: starts at step {} before its arrival {}",
                job.id, b.t0, job.arrival
            ));
        }
        if s.config.past_horizon == PastHorizon::Forbid
            && job.running.is_none()
            && !s.finishes(job, b.t0)
        {
            v.push(format!(
                "job {}: runs past the horizon, which past_horizon=forbid disallows",
                job.id
            ));
        }
        if s.finishes(job, b.t0) {
            rep.completed += 1;
        }
    }
    // RT apps: constraints 2 and 4.
    for (ri, app) in s.rt.iter().enumerate() {
        let mut prev: Option<&Vec<u32>> = app.previous.as_ref();
        for (t, now) in held[ri].iter().enumerate() {
            let want = app.demand[t] as usize;
            if now.len() > want {
                v.push(format!(
                    "rt app {}: holds {} GPUs at step {t}, above its demand {want}",
                    app.id,
                    now.len()
                ));
            }
            rep.shortfall += want.saturating_sub(now.len()) as u64;
            if let Some(p) = prev {
                let gained = now.iter().filter(|g| !p.contains(g)).count() as u64;
                let lost = p.iter().filter(|g| !now.contains(g)).count() as u64;
                if gained + lost > 2 * u64::from(app.swap_cap) {
                    v.push(format!(
                        "rt app {}: step {t} gains {gained} and loses {lost} GPUs, above the swap cap \
                         2x{}",
                        app.id, app.swap_cap
                    ));
                }
                rep.swaps += gained + lost;
            }
            prev = Some(now);
        }
    }
    // Constraint 6: one owner per GPU before step 0.
    if let Err(e) = crate::feasible::check(s) {
        v.push(e.reason);
    }
    let area = f64::from(gn) * f64::from(tn);
    rep.utilization = (rep.rt_served + rep.batch_gpu_steps) as f64 / area;
    rep.objective = rep.value - s.lambda() * rep.shortfall as f64;
    rep.violations = v;
    rep
}
