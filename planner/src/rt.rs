//! Which GPUs serve real-time inference at each step.
//!
//! Why a separate pass: batch placement only needs RT *counts* (capacity),
//! but the swap cap is about GPU *identity*. Once batch blocks are fixed, this
//! pass walks the steps in order and, for each app, keeps the GPUs it already
//! holds when they stay free, adds or drops GPUs by "furthest next batch use"
//! (a GPU that batch work will claim soon is the first to drop and the last to
//! take, like Belady's cache rule), and prefers high GPU indices so that low
//! indices stay contiguous for batch blocks. Gains are limited so that gains
//! plus losses stay within `2K`; demand that cannot be met that way becomes
//! shortfall rather than an invalid plan. Spare swap budget is spent moving
//! RT off GPUs that batch work is about to claim (pre-migration), so a block
//! start rarely forces more than `2K` moves at one step.

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

/// Assigns RT apps to the GPUs that batch work leaves free in `plan`.
/// Existing RT cells are cleared first.
pub fn assign(s: &Scenario, plan: &mut Plan) -> Stats {
    let mut stats = Stats::default();
    let (gn, tn) = (s.gpus as usize, s.steps as usize);
    for c in plan.cells.iter_mut() {
        if matches!(c, Cell::Rt(_)) {
            *c = Cell::Idle;
        }
    }
    // next_use[t*G+g] = first step >= t at which batch holds GPU g (or T).
    let mut next_use = vec![tn as u32; gn * tn];
    for g in 0..gn {
        let mut next = tn as u32;
        for t in (0..tn).rev() {
            if matches!(plan.cells[t * gn + g], Cell::Job(_)) {
                next = t as u32;
            }
            next_use[t * gn + g] = next;
        }
    }
    let mut prev: Vec<Vec<u32>> =
        s.rt.iter()
            .map(|r| r.previous.clone().unwrap_or_default())
            .collect();
    let mut has_prev: Vec<bool> = s.rt.iter().map(|r| r.previous.is_some()).collect();
    let mut cand: Vec<u32> = Vec::with_capacity(gn);
    for t in 0..tn {
        let row = t * gn;
        for (ri, app) in s.rt.iter().enumerate() {
            let want = app.demand[t] as usize;
            let key = |g: u32| (next_use[row + g as usize], g);
            // GPUs kept from the previous step.
            let mut keep: Vec<u32> = prev[ri]
                .iter()
                .copied()
                .filter(|&g| (g as usize) < gn && plan.cells[row + g as usize] == Cell::Idle)
                .collect();
            if keep.len() > want {
                keep.sort_unstable_by_key(|&g| std::cmp::Reverse(key(g)));
                keep.truncate(want);
            }
            let lost = prev[ri].len() - keep.len();
            if has_prev[ri] && lost > 2 * app.swap_cap as usize {
                stats.over_cap += 1;
            }
            let budget = if has_prev[ri] {
                (2 * app.swap_cap as usize).saturating_sub(lost)
            } else {
                usize::MAX
            };
            let need = (want - keep.len()).min(budget);
            let mut gained = 0;
            for &g in &keep {
                plan.cells[row + g as usize] = Cell::Rt(ri as u16);
            }
            if need > 0 {
                cand.clear();
                cand.extend((0..gn as u32).filter(|&g| plan.cells[row + g as usize] == Cell::Idle));
                if cand.len() > need {
                    cand.select_nth_unstable_by_key(need - 1, |&g| std::cmp::Reverse(key(g)));
                    cand.truncate(need);
                }
                for &g in &cand {
                    plan.cells[row + g as usize] = Cell::Rt(ri as u16);
                }
                gained = cand.len();
                keep.extend_from_slice(&cand);
            }
            if has_prev[ri] {
                // Pre-migration: spend spare swap budget moving off GPUs that
                // batch work claims within LOOKAHEAD steps, so that the claim
                // does not force more than 2K losses at once.
                let mut spare = (2 * app.swap_cap as usize).saturating_sub(lost + gained);
                while spare >= 2 {
                    let soon = keep
                        .iter()
                        .enumerate()
                        .filter(|(_, &g)| next_use[row + g as usize] <= t as u32 + LOOKAHEAD)
                        .min_by_key(|(_, &g)| next_use[row + g as usize]);
                    let Some((pos, &g)) = soon else { break };
                    let free = (0..gn as u32)
                        .filter(|&h| plan.cells[row + h as usize] == Cell::Idle)
                        .max_by_key(|&h| key(h));
                    let Some(h) = free else { break };
                    if next_use[row + h as usize] <= next_use[row + g as usize] {
                        break;
                    }
                    plan.cells[row + g as usize] = Cell::Idle;
                    plan.cells[row + h as usize] = Cell::Rt(ri as u16);
                    keep[pos] = h;
                    spare -= 2;
                }
            }
            stats.served += keep.len() as u64;
            stats.shortfall += (want - keep.len()) as u64;
            prev[ri] = keep;
            has_prev[ri] = true;
        }
    }
    stats
}
