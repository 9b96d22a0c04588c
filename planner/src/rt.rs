//! Which GPUs serve real-time inference at each step.
//!
//! Why a separate pass: batch placement only needs RT *counts* (capacity),
//! but the swap cap is about GPU *identity*. Once batch blocks are fixed, this
//! pass walks the steps in order. Each app keeps the GPUs it already holds
//! when they stay free; GPUs are taken by "furthest next batch use" (a GPU
//! that batch work will claim soon is the last to take and the first to drop,
//! like Belady's cache rule), preferring high indices so that low indices stay
//! contiguous for batch blocks. Gains are limited so that gains plus losses
//! stay within `2K`; demand that cannot be met that way becomes shortfall
//! rather than an invalid plan.
//!
//! The apps are assigned together, not one after another: when a batch block
//! starts on GPUs RT holds, each app that holds some must replace them, and it
//! can replace only about `K` per step. So each GPU an app gains goes to the
//! app with the most room to give it up at the step batch claims it
//! (`exposure`), and spare swap budget is spent moving RT off GPUs that
//! batch work is about to claim (pre-migration), most exposed app first. In
//! S7 this is what makes the stand-in's batch placement legal: its block
//! start at hour 14 claims 5 RT GPUs at once, which one app cannot replace
//! (the earlier app-by-app pass gave all 5 to app 2) but three apps can.

use crate::model::{Cell, Plan, Scenario};

/// How many steps ahead pre-migration looks for batch claims on RT GPUs.
const LOOKAHEAD: u32 = 24;

/// What the assignment achieved, for fast mode's cheap scoring (the checker
/// remains the authority).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// RT GPU-steps served.
    pub served: u64,
    /// Unmet RT GPU-steps.
    pub shortfall: u64,
    /// Steps at which batch work forced an app to lose more than `2K` GPUs.
    pub over_cap: u32,
}

/// The claim steps (`next_use`) of the GPUs one app holds, sorted, so that
/// [`exposure`] counts the GPUs claimed at one step without a scan.
#[derive(Debug, Clone, Default)]
struct Claims(Vec<u32>);

impl Claims {
    fn count(&self, c: u32) -> usize {
        self.0.partition_point(|&x| x <= c) - self.0.partition_point(|&x| x < c)
    }

    fn add(&mut self, c: u32) {
        let at = self.0.partition_point(|&x| x <= c);
        self.0.insert(at, c);
    }

    fn remove(&mut self, c: u32) {
        let at = self.0.partition_point(|&x| x < c);
        self.0.remove(at);
    }
}

/// Assigns RT apps to the GPUs that batch work leaves free in `plan`.
/// Existing RT cells are cleared first.
pub fn assign(s: &Scenario, plan: &mut Plan) -> Stats {
    assign_until(s, plan, false)
}

/// Like [`assign`] for scoring only: stops at the first step where batch work
/// forces an app past its swap cap (the plan is then invalid whatever happens
/// later) and returns `None`, leaving `plan` partly assigned.
pub fn assign_within_cap(s: &Scenario, plan: &mut Plan) -> Option<Stats> {
    let st = assign_until(s, plan, true);
    (st.over_cap == 0).then_some(st)
}

fn assign_until(s: &Scenario, plan: &mut Plan, stop_over_cap: bool) -> Stats {
    let mut stats = Stats::default();
    let (gn, tn) = (s.gpus as usize, s.steps as usize);
    for c in plan.cells.iter_mut() {
        if matches!(c, Cell::Rt(_)) {
            *c = Cell::Idle;
        }
    }
    // next_use[t*G+g] = first step >= t at which batch holds GPU g (or T),
    // filled row by row from the last step.
    let mut next_use = vec![tn as u32; gn * tn];
    for t in (0..tn).rev() {
        let row = t * gn;
        for g in 0..gn {
            next_use[row + g] = if matches!(plan.cells[row + g], Cell::Job(_)) {
                t as u32
            } else if t + 1 < tn {
                next_use[row + gn + g]
            } else {
                tn as u32
            };
        }
    }
    let mut prev: Vec<Vec<u32>> =
        s.rt.iter()
            .map(|r| r.previous.clone().unwrap_or_default())
            .collect();
    let mut has_prev: Vec<bool> = s.rt.iter().map(|r| r.previous.is_some()).collect();
    let nr = s.rt.len();
    let mut cand: Vec<u32> = Vec::with_capacity(gn);
    let mut held: Vec<Vec<u32>> = vec![Vec::new(); nr];
    let mut claims: Vec<Claims> = vec![Claims::default(); nr];
    let mut need = vec![0usize; nr];
    let mut spare = vec![0usize; nr];
    let mut pressure = vec![0i64; nr];
    let mut offer: Vec<Option<(i64, u32)>> = vec![None; nr];
    // Free GPUs by (next batch use, index), built when pre-migration needs it.
    let mut free: std::collections::BinaryHeap<(u32, u32)> = std::collections::BinaryHeap::new();
    for t in 0..tn {
        let row = t * gn;
        let key = |g: u32| (next_use[row + g as usize], g);
        // 1. Every app keeps the GPUs it held that stay free (dropping the
        //    soonest-claimed ones when its demand falls).
        let mut total_need = 0;
        for (ri, app) in s.rt.iter().enumerate() {
            let want = app.demand[t] as usize;
            let keep = &mut held[ri];
            keep.clear();
            keep.extend(
                prev[ri]
                    .iter()
                    .copied()
                    .filter(|&g| (g as usize) < gn && plan.cells[row + g as usize] == Cell::Idle),
            );
            if keep.len() > want {
                keep.sort_unstable_by_key(|&g| std::cmp::Reverse(key(g)));
                keep.truncate(want);
            }
            for &g in keep.iter() {
                plan.cells[row + g as usize] = Cell::Rt(ri as u16);
            }
            let cl = &mut claims[ri].0;
            cl.clear();
            cl.extend(keep.iter().map(|&g| next_use[row + g as usize]));
            cl.sort_unstable();
            let lost = prev[ri].len() - keep.len();
            let cap = 2 * app.swap_cap as usize;
            if has_prev[ri] && lost > cap {
                stats.over_cap += 1;
                if stop_over_cap {
                    return stats;
                }
            }
            let budget = if has_prev[ri] {
                cap.saturating_sub(lost)
            } else {
                usize::MAX
            };
            need[ri] = (want - keep.len()).min(budget);
            total_need += need[ri];
            spare[ri] = if has_prev[ri] { budget - need[ri] } else { 0 };
        }
        // 2. Gains: the best free GPUs (furthest next batch use), each handed
        //    to the app with the most room to give it up when batch claims it,
        //    so that no app holds more GPUs claimed at one step than its swap
        //    cap lets it replace.
        if total_need > 0 {
            cand.clear();
            cand.extend((0..gn as u32).filter(|&g| plan.cells[row + g as usize] == Cell::Idle));
            if cand.len() > total_need {
                cand.select_nth_unstable_by_key(total_need - 1, |&g| std::cmp::Reverse(key(g)));
                cand.truncate(total_need);
            }
            cand.sort_unstable_by_key(|&g| std::cmp::Reverse(key(g)));
            // Candidates claimed at the same step are adjacent; the apps'
            // exposure to that step is computed once per group and then
            // counts each GPU handed out.
            let mut i = 0;
            while i < cand.len() {
                let claim = next_use[row + cand[i] as usize];
                let end = i + cand[i..].partition_point(|&g| next_use[row + g as usize] == claim);
                for r in 0..nr {
                    pressure[r] = if need[r] > 0 && (claim as usize) < tn {
                        exposure(s, &claims[r], r, claim)
                    } else {
                        0
                    };
                }
                for &g in &cand[i..end] {
                    let ri = (0..nr)
                        .filter(|&r| need[r] > 0)
                        .min_by_key(|&r| (pressure[r], std::cmp::Reverse(need[r]), r))
                        .unwrap_or(0);
                    plan.cells[row + g as usize] = Cell::Rt(ri as u16);
                    held[ri].push(g);
                    claims[ri].add(claim);
                    need[ri] -= 1;
                    if (claim as usize) < tn {
                        pressure[ri] += 1;
                    }
                }
                i = end;
            }
        }
        // 3. Pre-migration: spend spare swap budget moving off GPUs that batch
        //    work claims within LOOKAHEAD steps, most exposed app first, so
        //    that a claim does not force more than 2K moves at once. All of
        //    an app's GPUs claimed at one step are equally exposed, so each
        //    app offers its worst claim step (its first GPU claimed then).
        let horizon = (t as u32 + LOOKAHEAD).min(tn as u32 - 1);
        // Each app's offer, (exposure, claim step), changes only when it moves.
        let offer_of = |r: usize, claims: &Claims, spare: usize| {
            let mut best: Option<(i64, u32)> = None;
            if spare < 2 {
                return best;
            }
            let cl = &claims.0;
            let mut i = 0;
            while i < cl.len() && cl[i] <= horizon {
                let claim = cl[i];
                let p = exposure(s, claims, r, claim);
                if best.is_none_or(|(bp, bc)| {
                    (p, std::cmp::Reverse(claim)) > (bp, std::cmp::Reverse(bc))
                }) {
                    best = Some((p, claim));
                }
                i += cl[i..].partition_point(|&x| x == claim);
            }
            best
        };
        for r in 0..nr {
            offer[r] = offer_of(r, &claims[r], spare[r]);
        }
        let mut heap_built = false;
        loop {
            let mut pick: Option<(i64, u32, usize)> = None;
            for (r, o) in offer.iter().enumerate() {
                let Some((p, claim)) = *o else { continue };
                let better = pick.is_none_or(|(bp, bc, _)| {
                    (p, std::cmp::Reverse(claim)) > (bp, std::cmp::Reverse(bc))
                });
                if better {
                    pick = Some((p, claim, r));
                }
            }
            let Some((_, claim, r)) = pick else { break };
            if !heap_built {
                free.clear();
                free.extend(
                    (0..gn as u32)
                        .filter(|&h| plan.cells[row + h as usize] == Cell::Idle)
                        .map(key),
                );
                heap_built = true;
            }
            let Some(&(h_use, h)) = free.peek() else {
                break;
            };
            if h_use <= claim {
                // No free GPU is safer for this app; stop it migrating.
                spare[r] = 0;
                offer[r] = None;
                continue;
            }
            let pos = held[r]
                .iter()
                .position(|&g| next_use[row + g as usize] == claim)
                .expect("a held GPU has this claim");
            let g = held[r][pos];
            free.pop();
            free.push(key(g));
            plan.cells[row + g as usize] = Cell::Idle;
            plan.cells[row + h as usize] = Cell::Rt(r as u16);
            held[r][pos] = h;
            claims[r].remove(claim);
            claims[r].add(h_use);
            spare[r] -= 2;
            offer[r] = offer_of(r, &claims[r], spare[r]);
        }
        for (ri, app) in s.rt.iter().enumerate() {
            let want = app.demand[t] as usize;
            stats.served += held[ri].len() as u64;
            stats.shortfall += (want - held[ri].len()) as u64;
            std::mem::swap(&mut prev[ri], &mut held[ri]);
            has_prev[ri] = true;
        }
    }
    stats
}

/// How far app `r`, holding GPUs with claim steps `claims`, is over what it
/// can give up when batch claims its GPUs at step `claim`: the GPUs it holds
/// that batch claims then, minus how many it can replace within its swap cap
/// there (`(2K - demand change) / 2`). Positive means a cap violation ahead
/// unless it moves some of them first.
fn exposure(s: &Scenario, claims: &Claims, r: usize, claim: u32) -> i64 {
    let app = &s.rt[r];
    let c = claim as usize;
    let change = if c == 0 {
        0
    } else {
        i64::from(app.demand[c]) - i64::from(app.demand[c - 1])
    };
    let room = (2 * i64::from(app.swap_cap) - change).max(0) / 2;
    claims.count(claim) as i64 - room
}
