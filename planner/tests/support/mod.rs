//! An independent plan checker, feasibility test and exhaustive optimum for
//! the stress tests, written from the rules in `planner/README.md` without
//! the planner's own checker (`check.rs`) or feasibility code
//! (`feasible.rs`), so that a bug there cannot hide itself.
#![allow(dead_code)]

use ace_planner::{Cell, PastHorizon, Plan, Scenario};
use std::collections::{BTreeSet, HashMap};

/// Figures of a valid plan, recomputed from the grid.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figures {
    pub value: f64,
    pub shortfall: u64,
    pub objective: f64,
}

pub fn lambda(s: &Scenario) -> f64 {
    let top = s.jobs.iter().map(|j| j.priority).max().unwrap_or(1);
    s.config.rt_penalty * f64::from(top.max(1))
}

fn weight(s: &Scenario, t: u32) -> f64 {
    s.config.gamma.powi(t as i32)
}

/// Steps a job started at `start` runs inside the horizon.
fn run_len(s: &Scenario, dur: u32, start: u32) -> u32 {
    (u64::from(dur).min(u64::from(s.steps - start))) as u32
}

/// Legal `(start, first GPU)` choices of job `j` (running jobs: their pin).
pub fn choices(s: &Scenario, j: usize) -> Vec<(u32, u32)> {
    let job = &s.jobs[j];
    if let Some(g) = job.running {
        return vec![(0, g)];
    }
    let mut out = Vec::new();
    for start in job.arrival..s.steps {
        if s.config.past_horizon == PastHorizon::Forbid
            && u64::from(start) + u64::from(job.duration) > u64::from(s.steps)
        {
            continue;
        }
        for o in 0..s.gpus {
            if u64::from(o) + u64::from(job.size) > u64::from(s.gpus) {
                break;
            }
            if s.config.align && o % job.size != 0 {
                continue;
            }
            out.push((start, o));
        }
    }
    out
}

/// Why the scenario has no valid plan, derived from the rules: two owners of
/// one GPU before step 0 (running blocks, prev= sets), or an app that cannot
/// shed its prev= GPUs down to its demand at 2K per step.
pub fn infeasible(s: &Scenario) -> Option<String> {
    let mut owners: HashMap<u32, String> = HashMap::new();
    for j in &s.jobs {
        if let Some(g0) = j.running {
            for g in g0..g0 + j.size {
                if let Some(o) = owners.insert(g, format!("job {}", j.id)) {
                    return Some(format!("GPU {g}: {o} and job {}", j.id));
                }
            }
        }
    }
    for r in &s.rt {
        for &g in r.previous.iter().flatten() {
            if let Some(o) = owners.insert(g, format!("app {}", r.id)) {
                return Some(format!("GPU {g}: {o} and app {}", r.id));
            }
        }
    }
    for r in &s.rt {
        let Some(p) = &r.previous else { continue };
        let mut least = p.len() as i64;
        for (t, &d) in r.demand.iter().enumerate() {
            least = (least - 2 * i64::from(r.swap_cap)).max(0);
            if least > i64::from(d) {
                return Some(format!("app {} holds >= {least} at step {t}", r.id));
            }
        }
    }
    None
}

/// Validates `plan` against every rule and recomputes its figures.
pub fn verify(s: &Scenario, plan: &Plan) -> Result<Figures, String> {
    let (gn, tn) = (s.gpus, s.steps);
    if plan.gpus != gn || plan.steps != tn || plan.cells.len() != (gn * tn) as usize {
        return Err("grid shape".into());
    }
    if let Some(why) = infeasible(s) {
        return Err(format!("scenario has no valid plan: {why}"));
    }
    let mut job_cells: Vec<BTreeSet<(u32, u32)>> = vec![BTreeSet::new(); s.jobs.len()];
    let mut rt_sets: Vec<Vec<BTreeSet<u32>>> = vec![vec![BTreeSet::new(); tn as usize]; s.rt.len()];
    let mut value = 0.0;
    for t in 0..tn {
        for g in 0..gn {
            match plan.cells[(t * gn + g) as usize] {
                Cell::Idle => {}
                Cell::Rt(r) => {
                    let r = usize::from(r);
                    if r >= s.rt.len() {
                        return Err(format!("unknown app at {g},{t}"));
                    }
                    rt_sets[r][t as usize].insert(g);
                }
                Cell::Job(j) => {
                    let j = j as usize;
                    if j >= s.jobs.len() {
                        return Err(format!("unknown job at {g},{t}"));
                    }
                    job_cells[j].insert((t, g));
                    value += f64::from(s.jobs[j].priority) * weight(s, t);
                }
            }
        }
    }
    for (j, cells) in job_cells.iter().enumerate() {
        let job = &s.jobs[j];
        let Some(&(t0, _)) = cells.iter().next() else {
            if job.running.is_some() {
                return Err(format!("running job {} dropped", job.id));
            }
            continue;
        };
        let g0 = cells.iter().map(|c| c.1).min().unwrap_or(0);
        if !choices(s, j).contains(&(t0, g0)) {
            return Err(format!(
                "job {} at step {t0} GPU {g0} is not a legal start",
                job.id
            ));
        }
        let want: BTreeSet<(u32, u32)> = (t0..t0 + run_len(s, job.duration, t0))
            .flat_map(|t| (g0..g0 + job.size).map(move |g| (t, g)))
            .collect();
        if &want != cells {
            return Err(format!(
                "job {} is not one {}-GPU block from its start",
                job.id, job.size
            ));
        }
    }
    let mut shortfall = 0u64;
    for (r, app) in s.rt.iter().enumerate() {
        for t in 0..tn as usize {
            let held = rt_sets[r][t].len() as u64;
            let d = u64::from(app.demand[t]);
            if held > d {
                return Err(format!("app {} holds {held} > {d} at step {t}", app.id));
            }
            shortfall += d - held;
            let before: Option<BTreeSet<u32>> = if t == 0 {
                app.previous.as_ref().map(|p| p.iter().copied().collect())
            } else {
                Some(rt_sets[r][t - 1].clone())
            };
            if let Some(b) = before {
                let moves = b.symmetric_difference(&rt_sets[r][t]).count() as u64;
                if moves > 2 * u64::from(app.swap_cap) {
                    return Err(format!("app {} moves {moves} GPUs at step {t}", app.id));
                }
            }
        }
    }
    Ok(Figures {
        value,
        shortfall,
        objective: value - lambda(s) * shortfall as f64,
    })
}

/// Subsets of `free` (a GPU bitmask) with at most `d` members.
fn subsets(free: u32, d: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut sub = free;
    loop {
        if sub.count_ones() <= d {
            out.push(sub);
        }
        if sub == 0 {
            break;
        }
        sub = (sub - 1) & free;
    }
    out
}

/// The fewest unmet RT GPU-steps given the GPUs batch leaves free at each
/// step (bitmasks), by dynamic programming over every app's GPU set; `None`
/// when no RT assignment satisfies the swap cap.
fn min_shortfall(s: &Scenario, free: &[u32]) -> Option<u64> {
    let prev: Vec<Option<u32>> =
        s.rt.iter()
            .map(|r| {
                r.previous
                    .as_ref()
                    .map(|p| p.iter().fold(0, |m, g| m | 1 << g))
            })
            .collect();
    // State: one set per app; None = "no constraint" (step -1 without prev).
    let mut states: HashMap<Vec<Option<u32>>, u64> = HashMap::new();
    states.insert(prev, 0);
    for (t, &free_t) in free.iter().enumerate() {
        let mut next: HashMap<Vec<Option<u32>>, u64> = HashMap::new();
        for (state, cost) in &states {
            // Assign apps one at a time over the remaining free GPUs.
            let mut partial: Vec<(Vec<Option<u32>>, u32, u64)> = vec![(Vec::new(), free_t, *cost)];
            for (r, app) in s.rt.iter().enumerate() {
                let d = app.demand[t];
                let mut grown = Vec::new();
                for (sets, left, c) in &partial {
                    for sub in subsets(*left, d) {
                        if let Some(b) = state[r] {
                            if (b ^ sub).count_ones() > 2 * app.swap_cap {
                                continue;
                            }
                        }
                        let mut v = sets.clone();
                        v.push(Some(sub));
                        grown.push((v, left & !sub, c + u64::from(d - sub.count_ones())));
                    }
                }
                partial = grown;
            }
            for (sets, _, c) in partial {
                let e = next.entry(sets).or_insert(u64::MAX);
                *e = (*e).min(c);
            }
        }
        states = next;
    }
    states.values().copied().min()
}

/// The best objective over every plan, by enumerating every batch placement
/// and, for each, the best RT assignment. Only for tiny scenarios (G <= 4).
pub fn optimum(s: &Scenario) -> Option<f64> {
    assert!(s.gpus <= 4 && s.steps <= 8);
    let opts: Vec<Vec<Option<(u32, u32)>>> = (0..s.jobs.len())
        .map(|j| {
            let mut c: Vec<Option<(u32, u32)>> = choices(s, j).into_iter().map(Some).collect();
            if s.jobs[j].running.is_none() {
                c.push(None);
            }
            c
        })
        .collect();
    let mut memo: HashMap<Vec<u32>, Option<u64>> = HashMap::new();
    let mut best: Option<f64> = None;
    let mut pick = vec![0usize; opts.len()];
    loop {
        // Evaluate this combination.
        let mut busy = vec![0u32; s.steps as usize];
        let mut value = 0.0;
        let mut ok = true;
        for (j, &k) in pick.iter().enumerate() {
            let Some((t0, g0)) = opts[j][k] else { continue };
            let job = &s.jobs[j];
            let mask = ((1u32 << job.size) - 1) << g0;
            for t in t0..t0 + run_len(s, job.duration, t0) {
                if busy[t as usize] & mask != 0 {
                    ok = false;
                }
                busy[t as usize] |= mask;
                value += f64::from(job.priority) * f64::from(job.size) * weight(s, t);
            }
        }
        if ok {
            let all = (1u32 << s.gpus) - 1;
            let free: Vec<u32> = busy.iter().map(|b| all & !b).collect();
            let short = *memo
                .entry(free.clone())
                .or_insert_with(|| min_shortfall(s, &free));
            if let Some(short) = short {
                let obj = value - lambda(s) * short as f64;
                if best.is_none_or(|b| obj > b) {
                    best = Some(obj);
                }
            }
        }
        // Next combination.
        let mut i = 0;
        loop {
            if i == pick.len() {
                return best;
            }
            pick[i] += 1;
            if pick[i] < opts[i].len() {
                break;
            }
            pick[i] = 0;
            i += 1;
        }
    }
}
