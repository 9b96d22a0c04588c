//! The two baselines of §1.5 of the scheduling note, exactly as written.
//!
//! Why keep them exact: the seven golden scenarios reproduce the Dharma post's
//! figures only under these precise rules, so they double as regression tests
//! and as the floor fast mode must clear.
//!
//! * **FIFO**: reserve `R = sum_r max_t d[r,t]` GPUs (indices `0..R`, one
//!   slice per app in file order) for the whole day; RT app `r` serves `d[r,t]`
//!   from the lowest GPUs of its slice. Batch jobs in `(arrival, id)` order go
//!   to the earliest start >= arrival on the lowest-index contiguous free block
//!   in `[R, G)`, for their horizon-clipped duration; no priority, implicit
//!   backfill.
//! * **Greedy** ("priority-horizon greedy", the post's stand-in): batch jobs in
//!   `(priority desc, arrival, id)` order, each at the earliest start >= arrival
//!   where a lowest-index block is free for its clipped duration and batch plus
//!   RT demand stays within G at every step. RT then takes any free GPUs. The
//!   note checks the swap cap on counts only; here RT GPUs are chosen by
//!   [`crate::rt::assign`] and the checker judges the real per-GPU cap.

use crate::model::{Cell, Plan, Scenario};
use crate::rt;
use crate::sched::{Rules, Scheduler};

/// Job indices sorted by `key`, ties broken by id.
pub(crate) fn order_by<K: Ord>(s: &Scenario, key: impl Fn(usize) -> K) -> Vec<usize> {
    let mut o: Vec<usize> = (0..s.jobs.len()).collect();
    o.sort_by_key(|&i| (key(i), s.jobs[i].id));
    o
}

/// The FIFO baseline's plan.
pub fn fifo(s: &Scenario) -> Plan {
    let reserve: u32 =
        s.rt.iter()
            .map(|r| r.demand.iter().copied().max().unwrap_or(0))
            .sum();
    let reserve = reserve.min(s.gpus);
    let order = order_by(s, |i| s.jobs[i].arrival);
    let mut sched = Scheduler::new(s);
    let rules = Rules {
        lo: reserve,
        hi: s.gpus,
        capacity: false,
        best_fit: false,
        rt_stair: false,
    };
    sched.run(s, &order, rules);
    let mut plan = sched.to_plan(s);
    let mut base = 0u32;
    for (ri, app) in s.rt.iter().enumerate() {
        let slice = app.demand.iter().copied().max().unwrap_or(0);
        let end = (base + slice).min(s.gpus);
        for t in 0..s.steps {
            let mut want = app.demand[t as usize];
            for g in base..end {
                if want == 0 {
                    break;
                }
                if plan.at(g, t) == Cell::Idle {
                    plan.set(g, t, Cell::Rt(ri as u16));
                    want -= 1;
                }
            }
        }
        base = end;
    }
    plan
}

/// The stand-in order: priority descending, then arrival, then id.
pub(crate) fn greedy_order(s: &Scenario) -> Vec<usize> {
    order_by(s, |i| {
        (std::cmp::Reverse(s.jobs[i].priority), s.jobs[i].arrival)
    })
}

/// The note's priority-horizon greedy stand-in.
pub fn greedy(s: &Scenario) -> Plan {
    let mut sched = Scheduler::new(s);
    let rules = Rules {
        lo: 0,
        hi: s.gpus,
        capacity: true,
        best_fit: false,
        rt_stair: false,
    };
    sched.run(s, &greedy_order(s), rules);
    let mut plan = sched.to_plan(s);
    rt::assign(s, &mut plan);
    plan
}
