//! Whether a scenario admits any valid plan, why not, and the plan that is
//! valid by construction when one exists.
//!
//! Why a separate pass: almost everything in a plan is optional (a job need
//! not start, RT demand may go unmet at a penalty), so a well-formed scenario
//! has no valid plan only when its forced parts clash. Two things are forced:
//! the state before step 0 (inherited `running=` blocks and each RT app's
//! `prev=` GPUs, which must have had one owner per GPU), and the swap cap's
//! limit on shedding: an app that held `p` GPUs before step 0 can drop at most
//! `2K` per step, so it still holds at least `p - 2K(t+1)` at step `t`, which
//! its demand must allow. [`check`] tests exactly these, and [`minimal`]
//! builds the plan that keeps only the forced parts (running blocks, and each
//! app shedding its `prev=` GPUs as fast as the cap allows): whenever [`check`]
//! passes, that plan satisfies every rule of [`crate::check`](mod@crate::check), so fast mode
//! can always fall back to it.

use crate::model::{Cell, Plan, Scenario};
use std::fmt;

/// A scenario item, by index into `Scenario::jobs` or `Scenario::rt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item {
    /// A batch job.
    Job(usize),
    /// An RT app.
    Rt(usize),
}

/// Why a scenario has no valid plan: the item to fix, the item it clashes
/// with (if any), and what to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Infeasible {
    /// The item whose line is reported.
    pub item: Item,
    /// The other item of a clash.
    pub other: Option<Item>,
    /// What is wrong and how to fix it.
    pub reason: String,
}

impl fmt::Display for Infeasible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "no valid plan: {}", self.reason)
    }
}

impl std::error::Error for Infeasible {}

fn name(s: &Scenario, item: Item) -> String {
    match item {
        Item::Job(j) => format!("running job {}", s.jobs[j].id),
        Item::Rt(r) => format!("rt app {} (prev=)", s.rt[r].id),
    }
}

/// The fewest GPUs app `r` can hold at each step given its `prev=` set and
/// swap cap (all zero without `prev=`).
pub fn floor_holding(s: &Scenario, r: usize) -> Vec<u64> {
    let app = &s.rt[r];
    let cap = 2 * u64::from(app.swap_cap);
    let mut h = app.previous.as_ref().map_or(0, |p| p.len() as u64);
    (0..s.steps)
        .map(|_| {
            h = h.saturating_sub(cap);
            h
        })
        .collect()
}

/// The most GPUs app `r` can hold at each step: its demand, lowered so that
/// the count changes by at most `2K` between steps (forwards from `prev=` and
/// from each earlier step, backwards from each later one). Any plan's holding
/// is at most this curve, and the curve itself moves within the cap, so a
/// policy that targets it turns a demand jump beyond the cap into shortfall
/// instead of a violation.
pub fn ceiling(s: &Scenario, r: usize) -> Vec<u32> {
    let app = &s.rt[r];
    let cap = 2 * u64::from(app.swap_cap);
    let mut c: Vec<u64> = app.demand.iter().map(|&d| u64::from(d)).collect();
    let mut before = app.previous.as_ref().map(|p| p.len() as u64);
    for v in c.iter_mut() {
        if let Some(b) = before {
            *v = (*v).min(b + cap);
        }
        before = Some(*v);
    }
    for t in (0..c.len().saturating_sub(1)).rev() {
        c[t] = c[t].min(c[t + 1] + cap);
    }
    c.into_iter().map(|v| v as u32).collect()
}

/// `s` with every RT demand curve replaced by its [`ceiling`]: the demand a
/// plan can actually serve. Shortfall against `s` is the same plan's
/// shortfall against this plus the constant `sum(demand - ceiling)`.
pub fn capped(s: &Scenario) -> Scenario {
    let mut out = s.clone();
    for (r, app) in out.rt.iter_mut().enumerate() {
        app.demand = ceiling(s, r);
    }
    out
}

/// `Ok` when some plan passes the checker; otherwise the first clash found.
pub fn check(s: &Scenario) -> Result<(), Infeasible> {
    // Before step 0 every GPU had one owner: running blocks and prev= sets.
    let mut owner: Vec<Option<Item>> = vec![None; s.gpus as usize];
    let claims = s
        .jobs
        .iter()
        .enumerate()
        .filter_map(|(j, job)| {
            let g0 = job.running?;
            Some((Item::Job(j), (g0..g0.saturating_add(job.size)).collect()))
        })
        .chain(
            s.rt.iter()
                .enumerate()
                .filter_map(|(r, app)| Some((Item::Rt(r), app.previous.clone()?))),
        );
    for (item, gpus) in claims {
        let gpus: Vec<u32> = gpus;
        for g in gpus {
            let Some(slot) = owner.get_mut(g as usize) else {
                return Err(Infeasible {
                    item,
                    other: None,
                    reason: format!("{} names GPU {g}, outside 0..{}", name(s, item), s.gpus),
                });
            };
            if let Some(first) = *slot {
                return Err(Infeasible {
                    item,
                    other: Some(first),
                    reason: format!(
                        "{} and {} both held GPU {g} before step 0; a GPU has one owner, so \
                         move one of them (running=) or drop the GPU from prev=",
                        name(s, first),
                        name(s, item)
                    ),
                });
            }
            *slot = Some(item);
        }
    }
    // Shedding: the fewest GPUs an app can hold must fit its demand.
    for (r, app) in s.rt.iter().enumerate() {
        let Some(prev) = &app.previous else { continue };
        for (t, h) in floor_holding(s, r).into_iter().enumerate() {
            let d = u64::from(app.demand[t]);
            if h > d {
                return Err(Infeasible {
                    item: Item::Rt(r),
                    other: None,
                    reason: format!(
                        "rt app {} held {} GPUs before step 0 (prev=) and may drop at most {} \
                         per step (2 x cap={}), so it still holds at least {h} at step {t}, \
                         above its demand {d} there; shorten prev=, raise cap= or raise that \
                         demand",
                        app.id,
                        prev.len(),
                        2 * u64::from(app.swap_cap),
                        app.swap_cap
                    ),
                });
            }
        }
    }
    Ok(())
}

/// The plan with only the forced parts: running blocks in place, and each RT
/// app keeping the lowest [`floor_holding`] GPUs of its `prev=` set (a
/// shrinking prefix, so it only ever loses GPUs, at most `2K` per step).
/// Valid whenever [`check`] passes.
pub fn minimal(s: &Scenario) -> Plan {
    let mut plan = Plan::empty(s);
    for (j, job) in s.jobs.iter().enumerate() {
        if let Some(g0) = job.running {
            for t in 0..s.clipped(job, 0) {
                for g in g0..g0.saturating_add(job.size).min(s.gpus) {
                    plan.set(g, t, Cell::Job(j as u32));
                }
            }
        }
    }
    for (r, app) in s.rt.iter().enumerate() {
        let Some(prev) = &app.previous else { continue };
        let mut gpus = prev.clone();
        gpus.sort_unstable();
        for (t, h) in floor_holding(s, r).into_iter().enumerate() {
            for &g in gpus.iter().take(h as usize).filter(|&&g| g < s.gpus) {
                plan.set(g, t as u32, Cell::Rt(r as u16));
            }
        }
    }
    plan
}
