//! Full mode: the exact model of §1.4 of the scheduling note as a
//! time-indexed 0-1 program, solved by HiGHS and warm-started from fast mode.
//!
//! Why HiGHS: it is a real branch-and-cut MILP solver (presolve, cuts,
//! heuristics, a proven dual bound), MIT-licensed, built from source by the
//! `highs` crate with cmake and a C++ compiler, and it accepts a MIP start.
//! The pure-Rust alternatives we could build (microlp via good_lp) lack cuts
//! and a useful bound on instances of this size. See `planner/README.md`.
//!
//! Variables:
//! * `y[b,s,o]` (binary): job `b` starts at step `s` on block `[o, o+size)`,
//!   for legal starts (release, past-horizon rule) and offsets (alignment);
//!   its objective is `priority x size x sum of gamma^t` over its clipped run.
//! * `x[g,r,t]` (binary): GPU `g` serves RT app `r` at step `t`.
//! * `u[r,t] >= 0`: unmet RT demand, cost `lambda` each.
//! * `z[g,r,t] >= |x[g,r,t] - x[g,r,t-1]|`: GPU moves, `sum_g z <= 2K`.
//!
//! Rows: each GPU-step holds at most one owner; each job starts at most once;
//! `sum_g x[g,r,t] + u[r,t] = d[r,t]`; the swap-cap rows. Running jobs are
//! fixed in place by removing their cells from every other variable.

use crate::model::{Plan, Scenario};
use serde::Serialize;

/// Full-mode knobs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Options {
    /// Wall-clock limit for the solver, seconds.
    pub time_limit_s: f64,
    /// Refuse instances with more nonzeros than this (memory guard).
    pub max_nonzeros: usize,
    /// HiGHS `mip_heuristic_effort` (0..1, HiGHS's default 0.05). More effort
    /// on primal heuristics finds good plans sooner on these packing models.
    pub heuristic_effort: f64,
    /// Optional utilisation floor: require at least this many GPU-steps in
    /// use (RT served + batch). Used to ask whether a plan dominating a
    /// baseline on both utilisation and value exists.
    pub min_gpu_steps: Option<u64>,
    /// Print HiGHS's progress log (incumbents, bound, nodes) to stdout.
    pub log: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            time_limit_s: 60.0,
            max_nonzeros: 4_000_000,
            heuristic_effort: 0.3,
            min_gpu_steps: None,
            log: false,
        }
    }
}

/// What the solver proved about its plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Proof {
    /// The solver's status, e.g. "Optimal" or "ReachedTimeLimit".
    pub status: String,
    /// True when HiGHS proved optimality (within its default 0.01% gap).
    pub optimal: bool,
    /// Objective of the returned plan as the solver sees it.
    pub objective: f64,
    /// Best proven upper bound on the objective.
    pub bound: f64,
    /// Relative gap `(bound - objective) / max(|objective|, 1)`.
    pub gap: f64,
    /// Columns and nonzeros of the model.
    pub columns: usize,
    /// Nonzeros of the constraint matrix.
    pub nonzeros: usize,
}

/// Full mode's answer: a plan (still to be checked by the caller) and proof.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The best plan found (never worse than the warm start).
    pub plan: Plan,
    /// Solver facts.
    pub proof: Proof,
}

#[cfg(not(feature = "milp"))]
/// Full mode is unavailable without the `milp` feature.
pub fn solve(_s: &Scenario, _warm: &Plan, _opts: Options) -> Result<Outcome, String> {
    Err(
        "full mode needs ace-planner's `milp` feature (HiGHS); rebuild with default features"
            .into(),
    )
}

#[cfg(feature = "milp")]
pub use imp::solve;

#[cfg(feature = "milp")]
mod imp {
    use super::{Options, Outcome, Proof};
    use crate::model::{Cell, Plan, Scenario};
    use highs::{Col, HighsModelStatus, RowProblem, Sense};

    struct Start {
        col: Col,
        job: usize,
        start: u32,
        gpu: u32,
    }

    /// Solves the exact model, warm-started from `warm` (a valid plan, e.g.
    /// fast mode's). Returns the better of the solver's plan and `warm`.
    pub fn solve(s: &Scenario, warm: &Plan, opts: Options) -> Result<Outcome, String> {
        let (gn, tn) = (s.gpus as usize, s.steps as usize);
        let nr = s.rt.len();
        let lambda = s.lambda();
        // Cells held by running work are off limits to everything else.
        let mut pinned = vec![false; gn * tn];
        for j in s.jobs.iter().filter(|j| j.running.is_some()) {
            let g0 = j.running.unwrap_or(0) as usize;
            for t in 0..s.clipped(j, 0) as usize {
                for g in g0..g0 + j.size as usize {
                    pinned[t * gn + g] = true;
                }
            }
        }
        let mut pb = RowProblem::default();
        let mut cell_rows: Vec<Vec<(Col, f64)>> = vec![Vec::new(); gn * tn];
        let mut job_rows: Vec<Vec<(Col, f64)>> = vec![Vec::new(); s.jobs.len()];
        let mut starts: Vec<Start> = Vec::new();
        let mut nonzeros = 0usize;
        for (ji, job) in s.jobs.iter().enumerate() {
            if job.running.is_some() {
                continue;
            }
            for start in 0..s.steps {
                if !s.start_ok(job, start) {
                    continue;
                }
                let len = s.clipped(job, start);
                let w: f64 = (start..start + len).map(|t| s.weight(t)).sum();
                let coef = f64::from(job.priority) * f64::from(job.size) * w;
                for o in 0..s.gpus {
                    if !s.offset_ok(job.size, o) {
                        continue;
                    }
                    let blocked = (start..start + len)
                        .any(|t| (o..o + job.size).any(|g| pinned[t as usize * gn + g as usize]));
                    if blocked {
                        continue;
                    }
                    nonzeros += (len * job.size) as usize + 1;
                    if nonzeros > opts.max_nonzeros {
                        return Err(format!(
                            "full mode: the model exceeds {} nonzeros ({} GPUs, {} jobs); use fast \
                             mode or raise max_nonzeros",
                            opts.max_nonzeros,
                            s.gpus,
                            s.jobs.len()
                        ));
                    }
                    let c = pb.add_integer_column(coef, 0..=1);
                    for t in start..start + len {
                        for g in o..o + job.size {
                            cell_rows[t as usize * gn + g as usize].push((c, 1.0));
                        }
                    }
                    job_rows[ji].push((c, 1.0));
                    starts.push(Start {
                        col: c,
                        job: ji,
                        start,
                        gpu: o,
                    });
                }
            }
        }
        // x[g,r,t] and u[r,t].
        let mut x_cols: Vec<Option<Col>> = vec![None; gn * nr * tn];
        let xi = |g: usize, r: usize, t: usize| (t * nr + r) * gn + g;
        let mut u_cols: Vec<Col> = Vec::with_capacity(nr * tn);
        for t in 0..tn {
            for (r, app) in s.rt.iter().enumerate() {
                let mut row: Vec<(Col, f64)> = Vec::with_capacity(gn + 1);
                if app.demand[t] > 0 {
                    for g in 0..gn {
                        if pinned[t * gn + g] {
                            continue;
                        }
                        let c = pb.add_integer_column(0.0, 0..=1);
                        x_cols[xi(g, r, t)] = Some(c);
                        cell_rows[t * gn + g].push((c, 1.0));
                        row.push((c, 1.0));
                    }
                }
                let u = pb.add_column(-lambda, 0..);
                u_cols.push(u);
                row.push((u, 1.0));
                let d = f64::from(app.demand[t]);
                nonzeros += row.len();
                pb.add_row(d..=d, &row);
            }
        }
        // Swap cap: z >= x_t - x_{t-1}, z >= x_{t-1} - x_t, sum_g z <= 2K.
        let mut z_cols: Vec<(usize, usize, usize, Col)> = Vec::new();
        for (r, app) in s.rt.iter().enumerate() {
            for t in 0..tn {
                let prev_const = |g: usize| -> Option<f64> {
                    if t == 0 {
                        app.previous
                            .as_ref()
                            .map(|p| if p.contains(&(g as u32)) { 1.0 } else { 0.0 })
                    } else {
                        None
                    }
                };
                if t == 0 && app.previous.is_none() {
                    continue;
                }
                let mut cap_row: Vec<(Col, f64)> = Vec::new();
                for g in 0..gn {
                    let now = x_cols[xi(g, r, t)];
                    let before = if t > 0 { x_cols[xi(g, r, t - 1)] } else { None };
                    let before_c = prev_const(g).unwrap_or(0.0);
                    if now.is_none() && before.is_none() && before_c == 0.0 {
                        continue;
                    }
                    let z = pb.add_column(0.0, 0..);
                    z_cols.push((g, r, t, z));
                    cap_row.push((z, 1.0));
                    // z - x_t + x_{t-1} >= 0 and z + x_t - x_{t-1} >= 0, with a
                    // constant x_{t-1} moved to the bound.
                    let mut a = vec![(z, 1.0)];
                    let mut b = vec![(z, 1.0)];
                    if let Some(c) = now {
                        a.push((c, -1.0));
                        b.push((c, 1.0));
                    }
                    if let Some(c) = before {
                        a.push((c, 1.0));
                        b.push((c, -1.0));
                    }
                    nonzeros += a.len() + b.len() + 1;
                    pb.add_row(-before_c.., &a);
                    pb.add_row(before_c.., &b);
                }
                if !cap_row.is_empty() {
                    let k = 2.0 * f64::from(app.swap_cap);
                    pb.add_row(..=k, &cap_row);
                }
            }
        }
        if let Some(min) = opts.min_gpu_steps {
            let mut row: Vec<(Col, f64)> = Vec::new();
            for st in &starts {
                let j = &s.jobs[st.job];
                row.push((st.col, f64::from(j.size * s.clipped(j, st.start))));
            }
            row.extend(x_cols.iter().flatten().map(|&c| (c, 1.0)));
            let pinned_cells = pinned.iter().filter(|p| **p).count() as f64;
            pb.add_row((min as f64 - pinned_cells).., &row);
        }
        for row in job_rows.iter().filter(|r| r.len() > 1) {
            pb.add_row(..=1.0, row);
        }
        for row in cell_rows.iter().filter(|r| r.len() > 1) {
            pb.add_row(..=1.0, row);
        }
        let columns = pb.num_cols();
        // Warm start from the given plan.
        let mut sol = vec![0.0; columns];
        let warm_place = warm.placements();
        for (k, st) in starts.iter().enumerate() {
            if warm_place
                .iter()
                .any(|&(j, t, g)| j == st.job && t == st.start && g == st.gpu)
            {
                sol[k] = 1.0;
            }
        }
        let mut served = vec![0u32; nr * tn];
        for t in 0..tn {
            for g in 0..gn {
                if let Cell::Rt(r) = warm.at(g as u32, t as u32) {
                    let r = usize::from(r);
                    if let Some(c) = x_cols.get(xi(g, r, t)).copied().flatten() {
                        sol[c.index()] = 1.0;
                        served[t * nr + r] += 1;
                    }
                }
            }
        }
        for t in 0..tn {
            for (r, app) in s.rt.iter().enumerate() {
                let u = u_cols[t * nr + r];
                sol[u.index()] = f64::from(app.demand[t].saturating_sub(served[t * nr + r]));
            }
        }
        let held = |g: usize, r: usize, t: usize| -> f64 {
            x_cols[xi(g, r, t)].map(|c| sol[c.index()]).unwrap_or(0.0)
        };
        let mut zvals = Vec::with_capacity(z_cols.len());
        for &(g, r, t, z) in &z_cols {
            let before = if t == 0 {
                let p = s.rt[r].previous.as_ref();
                if p.is_some_and(|p| p.contains(&(g as u32))) {
                    1.0
                } else {
                    0.0
                }
            } else {
                held(g, r, t - 1)
            };
            zvals.push((z.index(), (held(g, r, t) - before).abs()));
        }
        for (i, v) in zvals {
            sol[i] = v;
        }
        let mut model = pb.optimise(Sense::Maximise);
        if opts.log {
            model.set_option("output_flag", true);
            model.set_option("log_to_console", true);
        } else {
            model.make_quiet();
        }
        model.set_option("time_limit", opts.time_limit_s);
        model.set_option("threads", 1);
        model.set_option("mip_heuristic_effort", opts.heuristic_effort);
        model
            .try_set_solution(Some(&sol), None, None, None)
            .map_err(|e| format!("full mode: HiGHS rejected the warm start: {e:?}"))?;
        let solved = model
            .try_solve()
            .map_err(|e| format!("full mode: HiGHS failed: {e:?}"))?;
        let status = solved.status();
        let values = solved.get_solution();
        let cols = values.columns();
        let objective = solved.objective_value();
        let bound = solved
            .double_info_value(c"mip_dual_bound")
            .unwrap_or(f64::INFINITY);
        let has_solution = cols.len() == columns
            && !matches!(
                status,
                HighsModelStatus::Infeasible
                    | HighsModelStatus::LoadError
                    | HighsModelStatus::ModelError
                    | HighsModelStatus::SolveError
            );
        let mut plan = Plan::empty(s);
        if has_solution {
            for (k, st) in starts.iter().enumerate() {
                if cols[k] > 0.5 {
                    let j = &s.jobs[st.job];
                    for t in st.start..st.start + s.clipped(j, st.start) {
                        for g in st.gpu..st.gpu + j.size {
                            plan.set(g, t, Cell::Job(st.job as u32));
                        }
                    }
                }
            }
            for t in 0..tn {
                for r in 0..nr {
                    for g in 0..gn {
                        if x_cols[xi(g, r, t)].is_some_and(|c| cols[c.index()] > 0.5) {
                            plan.set(g as u32, t as u32, Cell::Rt(r as u16));
                        }
                    }
                }
            }
        }
        for j in s
            .jobs
            .iter()
            .enumerate()
            .filter(|(_, j)| j.running.is_some())
        {
            let (ji, job) = j;
            let g0 = job.running.unwrap_or(0);
            for t in 0..s.clipped(job, 0) {
                for g in g0..g0 + job.size {
                    plan.set(g, t, Cell::Job(ji as u32));
                }
            }
        }
        let gap = if bound.is_finite() {
            ((bound - objective) / objective.abs().max(1.0)).max(0.0)
        } else {
            f64::INFINITY
        };
        Ok(Outcome {
            plan,
            proof: Proof {
                status: format!("{status:?}"),
                optimal: status == HighsModelStatus::Optimal,
                objective,
                bound,
                gap,
                columns,
                nonzeros,
            },
        })
    }
}

/// Runs full mode and falls back to `warm` when the solver's plan is not
/// better by the checker's objective (or is invalid).
pub fn solve_checked(s: &Scenario, warm: &Plan, opts: Options) -> Result<Outcome, String> {
    let out = solve(s, warm, opts)?;
    let mine = crate::check(s, &out.plan);
    let theirs = crate::check(s, warm);
    if mine.valid() && (!theirs.valid() || mine.objective >= theirs.objective - 1e-9) {
        Ok(out)
    } else {
        Ok(Outcome {
            plan: warm.clone(),
            proof: out.proof,
        })
    }
}
