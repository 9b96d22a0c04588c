//! The list scheduler that FIFO, the greedy stand-in and fast mode share:
//! take jobs in a given order, put each at its earliest legal start on a free
//! contiguous block.
//!
//! Why shared: the three policies differ only in the job order, the GPU range
//! batch may use, whether RT demand counts against capacity, and how a block
//! is chosen. Sharing the loop keeps FIFO and the stand-in exactly as the note
//! defines them while fast mode explores orders and block rules around them.

use crate::model::{Cell, Plan, Scenario};
use crate::occupancy::Occupancy;

/// How the list scheduler places a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// Batch may use GPUs `[lo, hi)`.
    pub lo: u32,
    /// See `lo`.
    pub hi: u32,
    /// Require batch(t) + RT demand(t) <= G at every step of the window.
    pub capacity: bool,
    /// Tightest free run instead of the lowest-index one.
    pub best_fit: bool,
    /// Pre-place RT as a fixed staircase at the top GPU indices: app `r`
    /// grows down from its anchor `G - sum_{q<r} max d_q`, so its GPU set
    /// changes by exactly `|d[t] - d[t-1]|` per step and the swap cap holds
    /// whenever the demand curve respects it. Batch blocks then simply avoid
    /// those cells (use with `capacity: false`).
    pub rt_stair: bool,
}

/// One placed batch job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Index into `Scenario::jobs`.
    pub job: usize,
    /// Start step.
    pub start: u32,
    /// First GPU.
    pub gpu: u32,
}

/// Reusable state for repeated scheduling of one scenario.
#[derive(Debug, Clone)]
pub struct Scheduler {
    /// Occupancy of the current schedule.
    pub occ: Occupancy,
    /// Placements of the current schedule (pinned work first).
    pub placed: Vec<Placement>,
    /// GPUs left for batch at each step after RT demand.
    room: Vec<u32>,
    /// Staircase cells `(step, first GPU, count, app)` when `rt_stair` is on.
    stair: Vec<(u32, u32, u32, u16)>,
    /// The staircase collided with inherited work (the layout is unusable).
    pub stair_conflict: bool,
    rules: Option<Rules>,
    /// `failed[k * steps + t]`: the shortest window from step `t` in which
    /// no block of `2^k` GPUs was free under the current rules (`u32::MAX`:
    /// none yet). Blocks are only added between resets, so every longer
    /// window and larger block from `t` fails too and is not searched again.
    failed: Vec<u32>,
}

impl Scheduler {
    /// Prepares a scheduler for `s`.
    pub fn new(s: &Scenario) -> Scheduler {
        let room = (0..s.steps)
            .map(|t| s.gpus.saturating_sub(s.rt_demand(t)))
            .collect();
        let mut stair = Vec::new();
        let mut top = s.gpus;
        for (ri, app) in s.rt.iter().enumerate() {
            let peak = app.demand.iter().copied().max().unwrap_or(0).min(top);
            for t in 0..s.steps {
                let d = app.demand[t as usize].min(peak);
                if d > 0 {
                    stair.push((t, top - d, d, ri as u16));
                }
            }
            top -= peak;
        }
        Scheduler {
            occ: Occupancy::new(s.gpus, s.steps),
            placed: Vec::with_capacity(s.jobs.len()),
            room,
            stair,
            stair_conflict: false,
            rules: None,
            failed: vec![u32::MAX; (s.gpus.max(1).ilog2() as usize + 1) * s.steps as usize],
        }
    }

    /// Clears the schedule and places inherited (running) jobs where they are
    /// (and the RT staircase when `rules.rt_stair`).
    pub fn reset(&mut self, s: &Scenario, rules: Rules) {
        self.occ.reset();
        self.placed.clear();
        self.rules = Some(rules);
        self.stair_conflict = false;
        self.failed.fill(u32::MAX);
        for (i, j) in s.jobs.iter().enumerate() {
            if let Some(g) = j.running {
                let len = s.clipped(j, 0);
                self.occ.occupy(0, len, g, j.size);
                self.placed.push(Placement {
                    job: i,
                    start: 0,
                    gpu: g,
                });
            }
        }
        if rules.rt_stair {
            for &(t, g, d, _) in &self.stair {
                if !self.occ.is_free(t, 1, g, d) {
                    self.stair_conflict = true;
                }
                self.occ.occupy(t, 1, g, d);
            }
        }
    }

    /// Places job `i` at its earliest legal start; returns whether it fit.
    pub fn place(&mut self, s: &Scenario, i: usize, rules: Rules) -> bool {
        self.place_after(s, i, 0, rules)
    }

    /// Places job `i` at its earliest legal start no sooner than `delay` steps
    /// after its arrival; returns whether it fit.
    pub fn place_after(&mut self, s: &Scenario, i: usize, delay: u32, rules: Rules) -> bool {
        let job = &s.jobs[i];
        if job.running.is_some() {
            return false;
        }
        // Failures are remembered per block size class (a power of two up
        // to the size), under the rules of the last reset only.
        let class = job.size.max(1).ilog2() as usize * s.steps as usize;
        let memo =
            self.rules == Some(rules) && job.size.is_power_of_two() && class < self.failed.len();
        let mut next = job.arrival.saturating_add(delay);
        while next < s.steps {
            let start = next;
            next += 1;
            if !s.start_ok(job, start) {
                continue;
            }
            let len = s.clipped(job, start);
            if memo && self.failed[class + start as usize] <= len {
                continue;
            }
            if rules.capacity {
                // Every later start whose window still holds the last full
                // step fails too.
                let full = (start..start + len)
                    .rev()
                    .find(|&t| self.occ.used[t as usize] + job.size > self.room[t as usize]);
                if let Some(t) = full {
                    next = t + 1;
                    continue;
                }
            }
            let found = self.occ.find(
                start,
                len,
                job.size,
                rules.lo,
                rules.hi,
                s.config.align,
                rules.best_fit,
            );
            if let Some(gpu) = found {
                self.occ.occupy(start, len, gpu, job.size);
                self.placed.push(Placement { job: i, start, gpu });
                return true;
            }
            if memo {
                for f in self.failed[class + start as usize..]
                    .iter_mut()
                    .step_by(s.steps as usize)
                {
                    *f = (*f).min(len);
                }
            }
        }
        false
    }

    /// Resets, then places jobs in `order`.
    pub fn run(&mut self, s: &Scenario, order: &[usize], rules: Rules) {
        self.reset(s, rules);
        for &i in order {
            self.place(s, i, rules);
        }
    }

    /// Like [`Scheduler::run`], with a per-job start delay (indexed by job).
    pub fn run_delayed(&mut self, s: &Scenario, order: &[usize], delay: &[u32], rules: Rules) {
        self.reset(s, rules);
        for &i in order {
            self.place_after(s, i, delay.get(i).copied().unwrap_or(0), rules);
        }
    }

    /// `(value, batch GPU-steps)` of the current schedule, computed from the
    /// placements (the checker recomputes both from the grid).
    pub fn score(&self, s: &Scenario) -> (f64, u64) {
        let mut value = 0.0;
        let mut cells = 0u64;
        for p in &self.placed {
            let j = &s.jobs[p.job];
            let len = s.clipped(j, p.start);
            let w: f64 = (p.start..p.start + len).map(|t| s.weight(t)).sum();
            value += f64::from(j.priority) * f64::from(j.size) * w;
            cells += u64::from(j.size) * u64::from(len);
        }
        (value, cells)
    }

    /// Writes the current placements into a fresh grid, with the RT staircase
    /// if the last run used one (otherwise RT is left to [`crate::rt::assign`]).
    pub fn to_plan(&self, s: &Scenario) -> Plan {
        let mut plan = Plan {
            gpus: s.gpus,
            steps: s.steps,
            cells: Vec::new(),
        };
        self.write_plan(s, &mut plan);
        plan
    }

    /// Like [`Scheduler::to_plan`], into an existing grid of the same shape
    /// (reusing its allocation).
    pub fn write_plan(&self, s: &Scenario, plan: &mut Plan) {
        plan.cells.clear();
        plan.cells
            .resize((s.gpus as usize) * (s.steps as usize), Cell::Idle);
        (plan.gpus, plan.steps) = (s.gpus, s.steps);
        if self.rules.is_some_and(|r| r.rt_stair) {
            for &(t, g, d, r) in &self.stair {
                for gpu in g..g + d {
                    plan.set(gpu, t, Cell::Rt(r));
                }
            }
        }
        for p in &self.placed {
            let j = &s.jobs[p.job];
            for t in p.start..p.start + s.clipped(j, p.start) {
                for g in p.gpu..p.gpu + j.size {
                    plan.set(g, t, Cell::Job(p.job as u32));
                }
            }
        }
    }
}
