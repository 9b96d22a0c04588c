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
    /// Share of `time_limit_s` for phase 1, the count relaxation (RT as
    /// counts, no swap cap): its bound tightens the reported gap and its
    /// batch placement, with RT assigned by `rt::assign`, replaces the warm
    /// start when better. 0 skips it.
    pub relaxation_share: f64,
    /// Skip phase 1 when its batch part has more nonzeros than this. Measured:
    /// it settles S1-S5 (at most 45k nonzeros) in seconds, but at S7's size
    /// (244k) it finds nothing in 15 s and at S6's (716k) not even its root
    /// LP, so there it only takes time from the full model.
    pub relaxation_max_nonzeros: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            time_limit_s: 60.0,
            max_nonzeros: 4_000_000,
            heuristic_effort: 0.3,
            min_gpu_steps: None,
            log: false,
            relaxation_share: 0.25,
            relaxation_max_nonzeros: 100_000,
        }
    }
}

/// What is proven about the returned plan. Every figure is about that plan
/// and the whole objective, inherited work included.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Proof {
    /// The solver's status, e.g. "Optimal" or "ReachedTimeLimit", and when
    /// the warm start was returned instead of the solver's plan, why.
    pub status: String,
    /// True when the returned plan is within HiGHS's default relative gap
    /// (0.01 %) of the bound.
    pub optimal: bool,
    /// Objective of the returned plan, as the checker computes it.
    pub objective: f64,
    /// Proven upper bound on the objective of any plan.
    pub bound: f64,
    /// Relative gap `(bound - objective) / max(|objective|, 1)`.
    pub gap: f64,
    /// Columns and nonzeros of the model.
    pub columns: usize,
    /// Nonzeros of the constraint matrix.
    pub nonzeros: usize,
}

/// Full mode's answer: a checked plan and what is proven about it.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The best valid plan found (never worse than the warm start).
    pub plan: Plan,
    /// Facts about `plan`.
    pub proof: Proof,
}

/// The solver's plan and facts, before checking.
#[derive(Debug, Clone)]
struct Raw {
    plan: Plan,
    status: String,
    /// Proven upper bound on the whole objective (inherited work included).
    bound: f64,
    columns: usize,
    nonzeros: usize,
}

#[cfg(not(feature = "milp"))]
fn solve_raw(_s: &Scenario, _warm: &Plan, _opts: Options) -> Result<Raw, String> {
    Err(
        "full mode needs ace-planner's `milp` feature (HiGHS); rebuild with default features"
            .into(),
    )
}

#[cfg(feature = "milp")]
use imp::solve as solve_raw;

/// HiGHS's default relative gap for "optimal" (`mip_rel_gap`).
const PROVEN_GAP: f64 = 1e-4;

/// Solves the exact model, warm-started from `warm` (a valid plan, e.g. fast
/// mode's), and returns the better of the solver's plan and `warm` by the
/// checker's objective, with status, bound and gap of the plan returned.
/// Errors: the scenario has no valid plan, `warm` is invalid, the model is
/// too large, or the solver failed or found its model infeasible.
pub fn solve(s: &Scenario, warm: &Plan, opts: Options) -> Result<Outcome, String> {
    crate::feasible::check(s).map_err(|e| format!("full mode: {e}"))?;
    let theirs = crate::check(s, warm);
    if let Some(v) = theirs.violations.first() {
        return Err(format!(
            "full mode: the warm start is not a valid plan: {v}"
        ));
    }
    let raw = solve_raw(s, warm, opts)?;
    let mine = crate::check(s, &raw.plan);
    let (plan, objective, status) = if mine.valid() && mine.objective >= theirs.objective - 1e-9 {
        (raw.plan, mine.objective, raw.status)
    } else {
        let why = match mine.violations.first() {
            Some(v) => format!("invalid ({v})"),
            None => format!("worse ({})", mine.objective),
        };
        let status = format!(
            "{}; returned the warm start, the solver's plan was {why}",
            raw.status
        );
        (warm.clone(), theirs.objective, status)
    };
    // HiGHS's bound carries its feasibility tolerance: a bound a hair below
    // a valid plan is that plan's objective. A real shortfall is reported.
    let slack = 1e-6 * objective.abs().max(1.0);
    let mut bound = raw.bound;
    let mut status = status;
    if bound < objective && bound >= objective - slack {
        bound = objective;
    } else if bound < objective {
        status.push_str("; the bound is below a valid plan, so it is not trusted");
    }
    let gap = if bound.is_finite() && bound >= objective {
        (bound - objective) / objective.abs().max(1.0)
    } else {
        f64::INFINITY
    };
    Ok(Outcome {
        plan,
        proof: Proof {
            status,
            optimal: gap <= PROVEN_GAP,
            objective,
            bound,
            gap,
            columns: raw.columns,
            nonzeros: raw.nonzeros,
        },
    })
}

#[cfg(feature = "milp")]
mod imp {
    use super::{Options, Raw, PROVEN_GAP};
    use crate::model::{Cell, Plan, Scenario};
    use highs::{Col, HighsModelStatus, RowProblem, Sense};

    struct Start {
        col: Col,
        job: usize,
        start: u32,
        gpu: u32,
    }

    /// The batch columns `y[b,s,o]` and their cell and job rows (not yet
    /// added), shared by the full model and the count relaxation.
    struct Batch {
        starts: Vec<Start>,
        cell_rows: Vec<Vec<(Col, f64)>>,
        job_rows: Vec<Vec<(Col, f64)>>,
    }

    fn batch_columns(
        s: &Scenario,
        pinned: &[bool],
        pb: &mut RowProblem,
        nonzeros: &mut usize,
        opts: Options,
        only: Option<&[(usize, u32, u32)]>,
    ) -> Result<Batch, String> {
        let gn = s.gpus as usize;
        let tn = s.steps as usize;
        let mut cell_rows: Vec<Vec<(Col, f64)>> = vec![Vec::new(); gn * tn];
        let mut job_rows: Vec<Vec<(Col, f64)>> = vec![Vec::new(); s.jobs.len()];
        let mut starts: Vec<Start> = Vec::new();
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
                    if blocked || only.is_some_and(|p| !p.contains(&(ji, start, o))) {
                        continue;
                    }
                    *nonzeros += (len * job.size) as usize + 1;
                    if *nonzeros > opts.max_nonzeros {
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
        Ok(Batch {
            starts,
            cell_rows,
            job_rows,
        })
    }

    /// Phase 1's answer: a plan built from the relaxation's batch placement
    /// and a proven upper bound on the full model's objective.
    struct Relaxed {
        plan: Plan,
        bound: f64,
    }

    /// The count relaxation: batch columns and cell rows as in the full
    /// model, but RT only as a count per step (`sum_r (d - u) + batch GPUs <=
    /// free GPUs`), with no GPU identity and no swap cap. Every full-model
    /// plan projects onto a solution of it, so its dual bound bounds the full
    /// model; it is a fraction of the size and HiGHS closes it quickly. Its
    /// batch placement plus `rt::assign` is a candidate warm start.
    fn relaxation(
        s: &Scenario,
        pinned: &[bool],
        opts: Options,
        limit_s: f64,
    ) -> Result<Option<Relaxed>, String> {
        let (gn, tn) = (s.gpus as usize, s.steps as usize);
        let mut pb = RowProblem::default();
        let mut nonzeros = 0usize;
        let Batch {
            starts,
            cell_rows,
            job_rows,
        } = batch_columns(s, pinned, &mut pb, &mut nonzeros, opts, None)?;
        // Without batch columns it is an LP whose MIP bound HiGHS leaves
        // unset; the full model is small then anyway.
        if nonzeros > opts.relaxation_max_nonzeros || starts.is_empty() {
            return Ok(None);
        }
        let mut cap: Vec<Vec<(Col, f64)>> = vec![Vec::new(); tn];
        for st in &starts {
            let j = &s.jobs[st.job];
            for t in st.start..st.start + s.clipped(j, st.start) {
                cap[t as usize].push((st.col, f64::from(j.size)));
            }
        }
        for (t, row) in cap.iter_mut().enumerate() {
            let mut demand = 0.0;
            for app in &s.rt {
                let d = f64::from(app.demand[t]);
                if d > 0.0 {
                    let u = pb.add_column(-s.lambda(), 0.0..=d);
                    row.push((u, -1.0));
                    demand += d;
                }
            }
            let free = (0..gn).filter(|&g| !pinned[t * gn + g]).count() as f64;
            pb.add_row(..=free - demand, &*row);
        }
        for row in job_rows.iter().filter(|r| r.len() > 1) {
            pb.add_row(..=1.0, row);
        }
        for row in cell_rows.iter().filter(|r| r.len() > 1) {
            pb.add_row(..=1.0, row);
        }
        let mut model = pb.optimise(Sense::Maximise);
        model.make_quiet();
        model.set_option("time_limit", limit_s.max(0.1));
        model.set_option("threads", 1);
        model.set_option("mip_heuristic_effort", opts.heuristic_effort);
        let solved = model
            .try_solve()
            .map_err(|e| format!("full mode: HiGHS failed on the relaxation: {e:?}"))?;
        let bound = solved
            .double_info_value(c"mip_dual_bound")
            .unwrap_or(f64::INFINITY);
        let values = solved.get_solution();
        let cols = values.columns();
        if !bound.is_finite() || cols.len() < starts.len() {
            return Ok(None);
        }
        let mut plan = Plan::empty(s);
        place_starts(s, &starts, cols, &mut plan);
        place_running(s, &mut plan);
        crate::rt::assign(s, &mut plan);
        Ok(Some(Relaxed { plan, bound }))
    }

    /// Writes the starts the solver chose (`cols[k] > 0.5`) into `plan`.
    fn place_starts(s: &Scenario, starts: &[Start], cols: &[f64], plan: &mut Plan) {
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
    }

    /// Writes running (inherited) jobs into `plan` at their fixed place.
    fn place_running(s: &Scenario, plan: &mut Plan) {
        for (ji, job) in s.jobs.iter().enumerate() {
            if let Some(g0) = job.running {
                for t in 0..s.clipped(job, 0) {
                    for g in g0..g0 + job.size {
                        plan.set(g, t, Cell::Job(ji as u32));
                    }
                }
            }
        }
    }

    /// Solves the exact model warm-started from the valid plan `warm`; the
    /// bound includes inherited work.
    pub(super) fn solve(s: &Scenario, warm: &Plan, opts: Options) -> Result<Raw, String> {
        let (gn, tn) = (s.gpus as usize, s.steps as usize);
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
        // The value of running jobs is a constant outside the model; the
        // checker's objective is the model's plus this.
        let offset: f64 = s
            .jobs
            .iter()
            .filter(|j| j.running.is_some())
            .map(|j| {
                let w: f64 = (0..s.clipped(j, 0)).map(|t| s.weight(t)).sum();
                f64::from(j.priority) * f64::from(j.size) * w
            })
            .sum();
        let clock = std::time::Instant::now();
        // Phase 1: the count relaxation gives a bound and maybe a better warm
        // start (skipped under a utilisation floor, which it does not model).
        let mut warm = warm.clone();
        let mut relax_bound = f64::INFINITY;
        let mut relaxed = None;
        if opts.relaxation_share > 0.0 && opts.min_gpu_steps.is_none() {
            let limit = opts.time_limit_s * opts.relaxation_share.min(1.0);
            relaxed = relaxation(s, &pinned, opts, limit)?;
            if let Some(r) = relaxed.as_ref() {
                relax_bound = r.bound;
                let mine = crate::check(s, &r.plan);
                let theirs = crate::check(s, &warm);
                if opts.log {
                    println!(
                        "relaxation: bound {:.2}, its plan {:.2} (valid {}), warm start {:.2}, {:.2} s",
                        r.bound + offset,
                        mine.objective,
                        mine.valid(),
                        theirs.objective,
                        clock.elapsed().as_secs_f64()
                    );
                }
                if mine.valid() && (!theirs.valid() || mine.objective > theirs.objective) {
                    warm = r.plan.clone();
                }
            }
        }
        // Phase 1b: the relaxation's batch placement held fixed, RT placed
        // exactly (a small model): often a plan at the relaxation's bound.
        let warm_objective = crate::check(s, &warm).objective - offset;
        let settled = (relax_bound - warm_objective) / warm_objective.abs().max(1.0) <= PROVEN_GAP;
        if let Some(r) = relaxed.as_ref().filter(|_| !settled) {
            let only = r.plan.placements();
            let left = opts.time_limit_s - clock.elapsed().as_secs_f64();
            let quiet = Options { log: false, ..opts };
            let limit = left.min(opts.time_limit_s * opts.relaxation_share);
            let out = solve_model(
                s,
                &pinned,
                offset,
                &r.plan,
                quiet,
                limit,
                relax_bound,
                Some(&only),
            );
            // A failure here only costs the candidate; phase 2 still runs.
            let plan = out.map(|o| o.plan).unwrap_or_else(|_| r.plan.clone());
            let mine = crate::check(s, &plan);
            let theirs = crate::check(s, &warm);
            if opts.log {
                println!(
                    "fixed batch: its plan {:.2} (valid {}), warm start {:.2}, {:.2} s",
                    mine.objective,
                    mine.valid(),
                    theirs.objective,
                    clock.elapsed().as_secs_f64()
                );
            }
            if mine.valid() && (!theirs.valid() || mine.objective > theirs.objective) {
                warm = plan;
            }
        }
        // Phase 2: the full model, warm-started from the best plan so far.
        let left = opts.time_limit_s - clock.elapsed().as_secs_f64();
        let mut raw = solve_model(s, &pinned, offset, &warm, opts, left, relax_bound, None)?;
        raw.bound += offset;
        Ok(raw)
    }

    /// Builds and solves the full model (batch starts restricted to `only`
    /// when given) within `limit_s`, warm-started from the valid plan `warm`.
    /// `relax_bound` is a proven bound from phase 1 (or infinity).
    #[allow(clippy::too_many_arguments)]
    fn solve_model(
        s: &Scenario,
        pinned: &[bool],
        offset: f64,
        warm: &Plan,
        opts: Options,
        limit_s: f64,
        relax_bound: f64,
        only: Option<&[(usize, u32, u32)]>,
    ) -> Result<Raw, String> {
        let (gn, tn) = (s.gpus as usize, s.steps as usize);
        let nr = s.rt.len();
        let lambda = s.lambda();
        let mut pb = RowProblem::default();
        let mut nonzeros = 0usize;
        let Batch {
            starts,
            mut cell_rows,
            job_rows,
        } = batch_columns(s, pinned, &mut pb, &mut nonzeros, opts, only)?;
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
        // The warm start already meets the relaxation's bound: proven.
        let warm_report = crate::check(s, warm);
        if warm_report.valid() {
            let objective = warm_report.objective - offset;
            let gap = ((relax_bound - objective) / objective.abs().max(1.0)).max(0.0);
            if gap <= PROVEN_GAP {
                return Ok(Raw {
                    plan: warm.clone(),
                    status: "Optimal (count relaxation bound)".into(),
                    bound: relax_bound,
                    columns,
                    nonzeros,
                });
            }
        }
        // Nothing to decide (no jobs to place, no RT): the plan is fixed.
        if columns == 0 {
            return Ok(Raw {
                plan: warm.clone(),
                status: "Optimal (nothing to decide)".into(),
                bound: warm_report.objective - offset,
                columns,
                nonzeros,
            });
        }
        let mut model = pb.optimise(Sense::Maximise);
        if opts.log {
            model.set_option("output_flag", true);
            model.set_option("log_to_console", true);
        } else {
            model.make_quiet();
        }
        model.set_option("time_limit", limit_s.max(0.1));
        model.set_option("threads", 1);
        model.set_option("mip_heuristic_effort", opts.heuristic_effort);
        model
            .try_set_solution(Some(&sol), None, None, None)
            .map_err(|e| format!("full mode: HiGHS rejected the warm start: {e:?}"))?;
        let solved = model
            .try_solve()
            .map_err(|e| format!("full mode: HiGHS failed: {e:?}"))?;
        let status = solved.status();
        if status == HighsModelStatus::Infeasible {
            return Err(format!(
                "full mode: HiGHS found the model infeasible, yet the warm start is a valid plan \
                 (objective {:.2}): the model and the checker disagree",
                warm_report.objective
            ));
        }
        let values = solved.get_solution();
        let cols = values.columns();
        let integers = starts.len() + x_cols.iter().flatten().count();
        // With no integer columns HiGHS solved an LP: its value is the bound.
        let bound = if integers == 0 && status == HighsModelStatus::Optimal {
            solved.objective_value()
        } else {
            solved
                .double_info_value(c"mip_dual_bound")
                .unwrap_or(f64::INFINITY)
        };
        // Both bounds are proven; the tighter one counts.
        let bound = if bound.is_nan() {
            relax_bound
        } else {
            bound.min(relax_bound)
        };
        let has_solution = cols.len() == columns
            && !matches!(
                status,
                HighsModelStatus::LoadError
                    | HighsModelStatus::ModelError
                    | HighsModelStatus::SolveError
            );
        let mut plan = Plan::empty(s);
        if has_solution {
            place_starts(s, &starts, cols, &mut plan);
            for t in 0..tn {
                for r in 0..nr {
                    for g in 0..gn {
                        if x_cols[xi(g, r, t)].is_some_and(|c| cols[c.index()] > 0.5) {
                            plan.set(g as u32, t as u32, Cell::Rt(r as u16));
                        }
                    }
                }
            }
        } else {
            plan = warm.clone();
        }
        place_running(s, &mut plan);
        Ok(Raw {
            plan,
            status: format!("{status:?}"),
            bound,
            columns,
            nonzeros,
        })
    }
}
