//! Rolling horizon: plan 24 steps, commit only the current one, advance,
//! re-plan with what runs pinned.
//!
//! Why: a plan for the whole day is stale as soon as a new job arrives, and a
//! planner that optimises to the horizon's end schedules badly near it (the
//! post's "end-of-world effect"). Committing one step at a time keeps the
//! horizon ahead of the clock; pinning running work (same GPUs, remaining
//! duration) and the RT apps' current GPUs (so the swap cap holds across
//! re-plans) makes successive plans update rather than thrash.
//!
//! The current step's RT allocation is the owned capacity the control service
//! publishes to the filter: [`owned_capacity`] reads it off any plan, and
//! [`Rolling::step`] returns it for the step just committed.

use crate::check::Report;
use crate::fast;
use crate::model::{Cell, Config, Job, Plan, RtApp, Scenario};
use serde::Serialize;

/// Owned GPUs one RT app may use at one step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OwnedCapacity {
    /// RT app id.
    pub app: u32,
    /// Number of GPUs.
    pub gpus: u32,
    /// Which GPUs.
    pub gpu_ids: Vec<u32>,
}

/// The owned capacity per RT app at `step` of `plan`: the number the control
/// service publishes to the filter for that hour.
pub fn owned_capacity(s: &Scenario, plan: &Plan, step: u32) -> Vec<OwnedCapacity> {
    let mut out: Vec<OwnedCapacity> =
        s.rt.iter()
            .map(|r| OwnedCapacity {
                app: r.id,
                gpus: 0,
                gpu_ids: Vec::new(),
            })
            .collect();
    if step >= plan.steps {
        return out;
    }
    for g in 0..plan.gpus {
        if let Cell::Rt(r) = plan.at(g, step) {
            if let Some(o) = out.get_mut(usize::from(r)) {
                o.gpus += 1;
                o.gpu_ids.push(g);
            }
        }
    }
    out
}

#[derive(Debug, Clone)]
struct Running {
    job: Job,
    gpu: u32,
    remaining: u32,
}

/// One committed step.
#[derive(Debug, Clone)]
pub struct Step {
    /// Absolute step that was committed.
    pub at: u64,
    /// The plan made at that step (its step 0 is what was committed).
    pub plan: Plan,
    /// The scenario that plan solved (for checking and rendering).
    pub scenario: Scenario,
    /// The checker's report on the plan.
    pub report: Report,
    /// Owned capacity per RT app for the committed step.
    pub owned: Vec<OwnedCapacity>,
    /// Ids of jobs that started at this step.
    pub started: Vec<u32>,
}

/// State of the rolling planner.
#[derive(Debug, Clone)]
pub struct Rolling {
    gpus: u32,
    horizon: u32,
    now: u64,
    /// RT apps; `demand` is a periodic profile indexed by absolute step.
    rt: Vec<RtApp>,
    rt_prev: Vec<Option<Vec<u32>>>,
    queue: Vec<Job>,
    running: Vec<Running>,
    config: Config,
    fast: fast::Options,
}

impl Rolling {
    /// A rolling planner over `gpus` GPUs with a `horizon`-step window. Each
    /// app's `demand` is a profile repeated forever (e.g. 24 hourly values).
    pub fn new(gpus: u32, horizon: u32, rt: Vec<RtApp>, config: Config) -> Result<Rolling, String> {
        if horizon == 0 {
            return Err("rolling horizon must be at least one step".into());
        }
        if let Some(r) = rt.iter().find(|r| r.demand.is_empty()) {
            return Err(format!("rt app {} has an empty demand profile", r.id));
        }
        let rt_prev = rt.iter().map(|r| r.previous.clone()).collect();
        Ok(Rolling {
            gpus,
            horizon,
            now: 0,
            rt,
            rt_prev,
            queue: Vec::new(),
            running: Vec::new(),
            config,
            fast: fast::Options::default(),
        })
    }

    /// A rolling planner seeded with a scenario: its RT curves become daily
    /// profiles and its jobs are submitted with their arrivals.
    pub fn from_scenario(s: &Scenario) -> Result<Rolling, String> {
        let mut r = Rolling::new(s.gpus, s.steps, s.rt.clone(), s.config.clone())?;
        for j in &s.jobs {
            if j.running.is_some() {
                return Err(format!(
                    "job {}: seed the rolling planner without running jobs",
                    j.id
                ));
            }
            r.submit(j.clone());
        }
        Ok(r)
    }

    /// Current absolute step.
    pub fn now(&self) -> u64 {
        self.now
    }

    /// Queues a job; `arrival` is an absolute step.
    pub fn submit(&mut self, job: Job) {
        self.queue.push(job);
    }

    /// The planning problem at the current step.
    pub fn scenario(&self) -> Scenario {
        let now = self.now;
        let rt = self
            .rt
            .iter()
            .zip(&self.rt_prev)
            .map(|(r, prev)| RtApp {
                id: r.id,
                demand: (0..u64::from(self.horizon))
                    .map(|t| r.demand[((now + t) % r.demand.len() as u64) as usize])
                    .collect(),
                swap_cap: r.swap_cap,
                previous: prev.clone(),
            })
            .collect();
        let mut jobs: Vec<Job> = self
            .running
            .iter()
            .map(|r| Job {
                duration: r.remaining,
                arrival: 0,
                running: Some(r.gpu),
                ..r.job.clone()
            })
            .collect();
        for j in &self.queue {
            let rel = u64::from(j.arrival).saturating_sub(now);
            if rel < u64::from(self.horizon) {
                jobs.push(Job {
                    arrival: rel as u32,
                    ..j.clone()
                });
            }
        }
        Scenario {
            name: format!("rolling@{now}"),
            gpus: self.gpus,
            steps: self.horizon,
            rt,
            jobs,
            config: self.config.clone(),
        }
    }

    /// Plans the horizon with fast mode, commits its first step and advances
    /// the clock by one step.
    pub fn step(&mut self) -> Step {
        let s = self.scenario();
        let out = fast::solve_with(&s, self.fast);
        let owned = owned_capacity(&s, &out.plan, 0);
        // Jobs that start now become running work on their block.
        let mut started = Vec::new();
        for (ji, t, g) in out.plan.placements() {
            let job = &s.jobs[ji];
            if t == 0 && job.running.is_none() {
                if let Some(pos) = self.queue.iter().position(|q| q.id == job.id) {
                    let q = self.queue.remove(pos);
                    started.push(q.id);
                    self.running.push(Running {
                        remaining: q.duration,
                        job: q,
                        gpu: g,
                    });
                }
            }
        }
        for r in &mut self.running {
            r.remaining = r.remaining.saturating_sub(1);
        }
        self.running.retain(|r| r.remaining > 0);
        for (prev, o) in self.rt_prev.iter_mut().zip(&owned) {
            *prev = Some(o.gpu_ids.clone());
        }
        let at = self.now;
        self.now += 1;
        Step {
            at,
            plan: out.plan,
            scenario: s,
            report: out.report,
            owned,
            started,
        }
    }
}
