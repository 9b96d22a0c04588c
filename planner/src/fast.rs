//! Fast mode: the hot-path heuristic, run on every job arrival.
//!
//! Why this shape: the note's stand-in commits to one job order (priority,
//! then arrival) and one block rule (lowest index), and that single order is
//! what loses value when a big high-value job is blocked by small ones placed
//! first, or when small jobs fragment the free GPUs. Fast mode keeps the
//! stand-in's structural rules (so every grid is legal by construction) but:
//!
//! 1. tries five job orders (the stand-in's, value-weighted, big-rocks first,
//!    arrival, ...) x {lowest-index, best-fit} blocks x two RT layouts: RT by
//!    count, placed on GPUs afterwards, or RT as a fixed staircase at the top
//!    GPU indices (legal under the swap cap by construction);
//! 2. improves the two best starts with seeded late-acceptance hill climbing
//!    over the order and per-job start delays (swap two jobs, move one
//!    earlier, make one wait 1-3 steps); the walk follows
//!    `objective + mean priority x GPU-steps` so it can cross states that beat
//!    the stand-in on one axis only; the pass budget depends on the size;
//! 3. places RT on concrete GPUs with [`crate::rt::assign`] (high indices,
//!    furthest next batch use, GPUs that batch will claim shared out among
//!    the apps, pre-migration) so the per-GPU swap cap holds;
//! 4. checks the result with the independent checker and keeps the best valid
//!    plan among itself, the stand-in and FIFO, ranked first by whether it is
//!    at least as good as the stand-in on both utilisation and objective, then
//!    by objective, then utilisation. So whenever FIFO's plan is valid, fast
//!    mode's ranks at least as high; that is not "at least FIFO's value":
//!    when FIFO under-serves RT (inherited work inside its reservation) its
//!    value can be higher and its objective far lower;
//! 5. if no candidate is valid, returns [`feasible::minimal`] (inherited work
//!    and the GPUs RT is forced to keep), valid whenever any plan is.
//!
//! RT demand is first lowered to what the swap cap lets an app reach
//! ([`feasible::ceiling`]): a demand jump beyond `2K` becomes shortfall
//! spread over the steps around it rather than a cap violation, and every
//! layout below works from those reachable counts. Batch placement leaves
//! room for that RT demand at every step, so fast mode
//! never trades RT demand for batch work (the penalty is 5-10x the top
//! priority, so that trade never pays). Same input, same plan: the search is
//! seeded and its budget counts passes, not time.

use crate::baseline::{self, order_by};
use crate::check::{check, Report};
use crate::feasible;
use crate::model::{Plan, Scenario};
use crate::rng::Rng;
use crate::rt;
use crate::sched::{Rules, Scheduler};
use std::cmp::Reverse;

/// Fast-mode knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Local-search passes; `None` picks a budget from the instance size.
    pub passes: Option<usize>,
    /// Seed of the local search.
    pub seed: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            passes: None,
            seed: 0x00AC_E000,
        }
    }
}

/// Fast mode's answer with its checked report.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The chosen plan.
    pub plan: Plan,
    /// The checker's report on it.
    pub report: Report,
    /// Which candidate won ("search", "greedy", "fifo", or "minimal": only
    /// the forced parts, when no other candidate was valid).
    pub source: &'static str,
}

/// The stand-in's utilisation (GPU-steps) and objective as the note counts
/// them (RT demand served in full, swap cap on counts only).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Floor {
    cells: u64,
    objective: f64,
}

/// Ranking of candidate plans: first whether the plan is at least as good as
/// the stand-in on both utilisation and objective, then objective, then
/// GPU-steps used.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Key {
    floor: bool,
    objective: f64,
    cells: u64,
}

impl Key {
    const WORST: Key = Key {
        floor: false,
        objective: f64::NEG_INFINITY,
        cells: 0,
    };

    fn new(objective: f64, cells: u64, floor: Floor) -> Key {
        Key {
            floor: cells >= floor.cells && objective >= floor.objective - 1e-9,
            objective,
            cells,
        }
    }

    fn beats(self, o: Key) -> bool {
        if self.floor != o.floor {
            return self.floor;
        }
        if (self.objective - o.objective).abs() > 1e-9 {
            return self.objective > o.objective;
        }
        self.cells > o.cells
    }
}

/// Instances this small (jobs, on at most 64 GPUs) get the large pass budget.
const SMALL_JOBS: usize = 20;

/// Default number of local-search passes (a pass re-places every job).
/// Small instances (at most 20 jobs on at most 64 GPUs, like S1-S5) get 1,200
/// passes, about 1-1.5 ms of CPU, the post's own fast-mode time on its
/// contended scenarios; measured on the golden scenarios, the extra passes
/// make the search reliably find the plans that beat the stand-in in S1 and
/// S4 for every seed we tried. Larger ones get `60,000 / (jobs^2 x words)`
/// within 12..=400 (`words` = GPUs/64 rounded up): 66 passes at 64 GPUs and
/// 30 jobs (under a millisecond), the minimum 12 at 1,024 GPUs and 500 jobs.
/// Horizons of `d` days divide the budget by `d^2` (at least 12 passes).
fn auto_passes(s: &Scenario) -> usize {
    let words = (s.gpus as usize).div_ceil(64);
    let n = s.jobs.len().max(1);
    // A pass costs about steps^2 on long horizons (each start tried scans
    // its window), so horizons beyond a day share the same work.
    let days = (s.steps as usize).div_ceil(24).max(1);
    let passes = if n <= SMALL_JOBS && words == 1 {
        1_200
    } else {
        (60_000 / (n * n * words)).min(400)
    };
    (passes / (days * days)).clamp(12, 1_200)
}

/// Scores the scheduler's current schedule; `None` when RT cannot be placed
/// within the swap cap. Without a grid, or with RT as the staircase, the
/// score assumes RT gets its demand (cheap: batch is scored from the
/// placements). With a grid and RT placed by count, it writes the schedule
/// into `grid`, places RT on GPUs with [`rt::assign_within_cap`] (which
/// gives up at the first swap-cap breach: `None`) and scores what that
/// achieved. The cheap key never ranks below the exact one (RT served in
/// full is the most it can serve), so a cheap key that does not beat a rival
/// means the exact one does not either.
fn evaluate(
    s: &Scenario,
    sched: &Scheduler,
    rules: Rules,
    stair_cells: u64,
    floor: Floor,
    grid: Option<&mut Plan>,
) -> Option<Key> {
    let (value, batch) = sched.score(s);
    let Some(plan) = grid.filter(|_| !rules.rt_stair) else {
        if sched.stair_conflict {
            return None;
        }
        return Some(Key::new(value, batch + stair_cells, floor));
    };
    sched.write_plan(s, plan);
    let st = rt::assign_within_cap(s, plan)?;
    Some(rt_key(s, value, batch, st, floor))
}

/// The key of a schedule worth `value` with `batch` GPU-steps once RT is
/// placed as `st` says.
fn rt_key(s: &Scenario, value: f64, batch: u64, st: rt::Stats, floor: Floor) -> Key {
    let objective = value - s.lambda() * st.shortfall as f64;
    Key::new(objective, batch + st.served, floor)
}

fn report_key(r: &Report, floor: Floor) -> Key {
    Key::new(r.objective, r.rt_served + r.batch_gpu_steps, floor)
}

/// Runs fast mode with default options.
pub fn solve(s: &Scenario) -> Outcome {
    solve_with(s, Options::default())
}

/// Runs fast mode. The plan is valid whenever the scenario has a valid plan
/// at all ([`feasible::check`]).
pub fn solve_with(orig: &Scenario, opts: Options) -> Outcome {
    // Plan against the demand the swap cap lets RT serve; score against the
    // real demand.
    let capped = feasible::capped(orig);
    let s = &capped;
    let mut sched = Scheduler::new(s);
    let jobs = &s.jobs;
    let work = |i: usize| u64::from(jobs[i].size) * u64::from(jobs[i].duration);
    let orders: [Vec<usize>; 5] = [
        baseline::greedy_order(s),
        order_by(s, |i| (Reverse(jobs[i].priority), Reverse(work(i)))),
        order_by(s, |i| Reverse(u64::from(jobs[i].priority) * work(i))),
        order_by(s, |i| (Reverse(jobs[i].size), Reverse(jobs[i].priority))),
        order_by(s, |i| (jobs[i].arrival, Reverse(jobs[i].priority))),
    ];
    let stair_cells: u64 = (0..s.steps)
        .map(|t| u64::from(s.rt_demand(t).min(s.gpus)))
        .sum();
    let rule = |best_fit: bool, rt_stair: bool| Rules {
        lo: 0,
        hi: s.gpus,
        capacity: !rt_stair,
        best_fit,
        rt_stair,
    };
    // The floor: the stand-in's utilisation as the note counts it (RT demand
    // served in full, swap cap on counts only). The same run with RT placed
    // on GPUs is the stand-in's plan (`baseline::greedy`) and the first
    // start below.
    let stand_in = rule(false, false);
    sched.run(s, &orders[0], stand_in);
    let (gv, gc) = sched.score(s);
    let floor = Floor {
        cells: gc + stair_cells,
        objective: gv,
    };
    let mut grid = Plan::empty(s);
    sched.write_plan(s, &mut grid);
    let st = rt::assign(s, &mut grid);
    let stand_in_key = (st.over_cap == 0).then(|| rt_key(s, gv, gc, st, floor));
    let greedy_plan = grid.clone();
    // Best start per rule set: (key, order, rules).
    let mut starts: Vec<(Key, Vec<usize>, Rules)> = Vec::new();
    // The staircase ignores prev= sets, so it only applies without them.
    let stair_ok = s.rt.iter().all(|r| r.previous.is_none());
    for (fit, stair) in [(false, false), (true, false), (false, true), (true, true)] {
        if stair && !stair_ok {
            continue;
        }
        let r = rule(fit, stair);
        let mut top: Option<(Key, &Vec<usize>)> = None;
        let mut rest = &orders[..];
        if r == stand_in {
            top = stand_in_key.map(|k| (k, &orders[0]));
            rest = &orders[1..];
        }
        for o in rest {
            sched.run(s, o, r);
            // Exact scoring only when the cheap bound could win.
            let Some(bound) = evaluate(s, &sched, r, stair_cells, floor, None) else {
                continue;
            };
            if top.is_some_and(|(t, _)| !bound.beats(t)) {
                continue;
            }
            if let Some(k) = evaluate(s, &sched, r, stair_cells, floor, Some(&mut grid)) {
                if top.is_none_or(|(t, _)| k.beats(t)) {
                    top = Some((k, o));
                }
            }
        }
        if let Some((k, o)) = top {
            starts.push((k, o.clone(), r));
        }
    }
    starts.sort_by(|a, b| {
        if a.0.beats(b.0) {
            std::cmp::Ordering::Less
        } else if b.0.beats(a.0) {
            std::cmp::Ordering::Greater
        } else {
            std::cmp::Ordering::Equal
        }
    });
    // Climb from the two best starts, splitting the passes.
    let climbs = 2;
    starts.truncate(climbs);
    let passes = opts.passes.unwrap_or_else(|| auto_passes(s));
    let mut rng = Rng::new(opts.seed);
    let mut best: Option<(Key, Vec<usize>, Vec<u32>, Rules)> = None;
    for (k0, order, rules) in starts {
        let (k, o, d) = climb(
            s,
            &mut sched,
            &mut grid,
            &mut rng,
            order,
            k0,
            rules,
            passes / climbs.max(1),
            stair_cells,
            floor,
        );
        if best.as_ref().is_none_or(|b| k.beats(b.0)) {
            best = Some((k, o, d, rules));
        }
    }
    let (_, best_order, best_delay, cur_rules) = best.unwrap_or((
        Key::WORST,
        orders[0].clone(),
        Vec::new(),
        rule(false, false),
    ));
    sched.run_delayed(s, &best_order, &best_delay, cur_rules);
    let mut plan = grid;
    sched.write_plan(s, &mut plan);
    if !cur_rules.rt_stair {
        rt::assign(s, &mut plan);
    }
    let report = check(orig, &plan);
    let mut out = Outcome {
        plan,
        report,
        source: "search",
    };
    for (source, alt) in [("greedy", greedy_plan), ("fifo", baseline::fifo(s))] {
        let r = check(orig, &alt);
        let wins = r.valid()
            && (!out.report.valid() || report_key(&r, floor).beats(report_key(&out.report, floor)));
        if wins {
            out = Outcome {
                plan: alt,
                report: r,
                source,
            };
        }
    }
    if !out.report.valid() {
        // Valid by construction whenever any plan is (feasible::minimal).
        let plan = feasible::minimal(orig);
        let report = check(orig, &plan);
        out = Outcome {
            plan,
            report,
            source: "minimal",
        };
    }
    out
}

/// Late-acceptance hill climbing over the job order and per-job start
/// delays: a move (swap two jobs, move one earlier, or make one job wait 1-3
/// steps past its arrival, or stop waiting) is kept when it is no worse than
/// the current state or than the state `HISTORY` moves ago, which lets the
/// search leave shallow local optima. Delays let a job leave room for a later,
/// bigger one, which no pure order can express. Returns the best state seen.
#[allow(clippy::too_many_arguments)]
fn climb(
    s: &Scenario,
    sched: &mut Scheduler,
    grid: &mut Plan,
    rng: &mut Rng,
    mut cur_order: Vec<usize>,
    cur: Key,
    rules: Rules,
    passes: usize,
    stair_cells: u64,
    floor: Floor,
) -> (Key, Vec<usize>, Vec<u32>) {
    const HISTORY: usize = 8;
    let n = cur_order.len();
    let mut cur_delay = vec![0u32; s.jobs.len()];
    let mut best = (cur, cur_order.clone(), cur_delay.clone());
    if n < 2 {
        return best;
    }
    // The walk follows a scalar (objective + mu x GPU-steps, mu = mean
    // priority) so that it can cross states that beat the stand-in on one
    // axis only; `best` keeps the Key order (dominating the stand-in first).
    let mu = s.jobs.iter().map(|j| f64::from(j.priority)).sum::<f64>() / s.jobs.len().max(1) as f64;
    let scalar = |k: Key| k.objective + mu * k.cells as f64;
    let mut cur_v = scalar(cur);
    let mut history = [cur_v; HISTORY];
    let mut trial = cur_order.clone();
    let mut trial_delay = cur_delay.clone();
    for pass in 0..passes {
        trial.clone_from(&cur_order);
        trial_delay.clone_from(&cur_delay);
        let i = rng.below(n as u64) as usize;
        let j = rng.below(n as u64) as usize;
        match rng.below(3) {
            0 => trial.swap(i, j),
            1 => {
                let (a, b) = (i.min(j), i.max(j));
                trial[a..=b].rotate_right(1);
            }
            _ => {
                let job = trial[i];
                trial_delay[job] = if trial_delay[job] > 0 && rng.below(2) == 0 {
                    0
                } else {
                    rng.range(1, 3)
                };
            }
        }
        sched.run_delayed(s, &trial, &trial_delay, rules);
        let Some(k) = evaluate(s, sched, rules, stair_cells, floor, None) else {
            continue;
        };
        let slot = pass % HISTORY;
        let v = scalar(k);
        // A new best must survive exact scoring before it is kept.
        if k.beats(best.0) {
            match evaluate(s, sched, rules, stair_cells, floor, Some(grid)) {
                Some(e) if e.beats(best.0) => best = (e, trial.clone(), trial_delay.clone()),
                _ => continue,
            }
        }
        if v >= cur_v - 1e-9 || v >= history[slot] - 1e-9 {
            cur_v = v;
            std::mem::swap(&mut cur_order, &mut trial);
            std::mem::swap(&mut cur_delay, &mut trial_delay);
        }
        if cur_v > history[slot] {
            history[slot] = cur_v;
        }
    }
    best
}
