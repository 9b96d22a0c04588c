//! Runs every policy on one scenario and renders the results: the data behind
//! `ace plan` and `ace plan --json`.
//!
//! Why in the library: the CLI stays a thin shell, and tests can assert on
//! the same numbers and grid a person sees.

use crate::check::{check, Report};
use crate::model::{Cell, Plan, Scenario};
use crate::{baseline, fast, full};
use serde::Serialize;
use std::fmt::Write;
use std::time::Instant;

/// One policy's checked result.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyResult {
    /// Fraction of G x T GPU-steps in use (RT served + batch).
    pub utilization: f64,
    /// Priority x decayed batch GPU-steps.
    pub value: f64,
    /// `value - lambda x shortfall`.
    pub objective: f64,
    /// Jobs whose whole duration fits in the horizon.
    pub completed: u32,
    /// Jobs placed at all.
    pub started: u32,
    /// Jobs in the scenario.
    pub jobs: usize,
    /// Unmet RT GPU-steps.
    pub shortfall: u64,
    /// RT GPU moves (gained + lost between steps).
    pub swaps: u64,
    /// Wall time of the policy, milliseconds.
    pub solve_ms: f64,
    /// Whether the checker accepted the plan.
    pub valid: bool,
    /// The checker's complaints, if any.
    pub violations: Vec<String>,
    /// Full mode only: what the solver proved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proof: Option<full::Proof>,
    /// Full mode only: why it did not run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The plan for readers: placements per job, RT GPUs per app and step.
    #[serde(rename = "plan", skip_serializing_if = "Option::is_none")]
    pub view: Option<PlanView>,
    /// The plan grid (serialised as `view`).
    #[serde(skip)]
    pub plan: Option<Plan>,
}

/// Where one batch job runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JobPlacement {
    /// Job id from the scenario.
    pub id: u32,
    /// Start step.
    pub start: u32,
    /// First GPU of its block.
    pub gpu: u32,
    /// GPUs in the block.
    pub size: u32,
    /// Steps it runs inside the horizon.
    pub steps: u32,
}

/// The GPUs one RT app holds at each step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RtHolding {
    /// App id from the scenario.
    pub id: u32,
    /// `gpus[t]`: the GPUs it holds at step `t`, ascending.
    pub gpus: Vec<Vec<u32>>,
}

/// A plan as a reader audits it (the `plan` member of `--json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlanView {
    /// Placed jobs, by start then GPU.
    pub jobs: Vec<JobPlacement>,
    /// Ids of jobs not placed.
    pub unplaced: Vec<u32>,
    /// Every RT app, in file order.
    pub rt: Vec<RtHolding>,
}

impl PlanView {
    /// Reads the view off a plan grid.
    pub fn of(s: &Scenario, plan: &Plan) -> PlanView {
        let placed = plan.placements();
        let jobs: Vec<JobPlacement> = placed
            .iter()
            .filter_map(|&(j, start, gpu)| {
                let job = s.jobs.get(j)?;
                Some(JobPlacement {
                    id: job.id,
                    start,
                    gpu,
                    size: job.size,
                    steps: s.clipped(job, start),
                })
            })
            .collect();
        let unplaced = s
            .jobs
            .iter()
            .enumerate()
            .filter(|(j, _)| !placed.iter().any(|p| p.0 == *j))
            .map(|(_, job)| job.id)
            .collect();
        let mut rt: Vec<RtHolding> =
            s.rt.iter()
                .map(|a| RtHolding {
                    id: a.id,
                    gpus: vec![Vec::new(); plan.steps as usize],
                })
                .collect();
        for t in 0..plan.steps {
            for g in 0..plan.gpus {
                if let Cell::Rt(r) = plan.at(g, t) {
                    if let Some(h) = rt.get_mut(usize::from(r)) {
                        h.gpus[t as usize].push(g);
                    }
                }
            }
        }
        PlanView { jobs, unplaced, rt }
    }
}

impl PolicyResult {
    fn from_report(s: &Scenario, r: Report, ms: f64, plan: Plan) -> PolicyResult {
        PolicyResult {
            utilization: r.utilization,
            value: r.value,
            objective: r.objective,
            completed: r.completed,
            started: r.started,
            jobs: s.jobs.len(),
            shortfall: r.shortfall,
            swaps: r.swaps,
            solve_ms: ms,
            valid: r.valid(),
            violations: r.violations,
            proof: None,
            error: None,
            view: Some(PlanView::of(s, &plan)),
            plan: Some(plan),
        }
    }

    fn failed(s: &Scenario, error: String) -> PolicyResult {
        PolicyResult {
            utilization: 0.0,
            value: 0.0,
            objective: 0.0,
            completed: 0,
            started: 0,
            jobs: s.jobs.len(),
            shortfall: 0,
            swaps: 0,
            solve_ms: 0.0,
            valid: false,
            violations: Vec::new(),
            proof: None,
            error: Some(error),
            view: None,
            plan: None,
        }
    }
}

/// All four policies on one scenario.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// Scenario name.
    pub scenario: String,
    /// GPUs.
    pub gpus: u32,
    /// Steps.
    pub steps: u32,
    /// FIFO baseline.
    pub fifo: PolicyResult,
    /// The note's priority-horizon greedy.
    pub greedy: PolicyResult,
    /// Fast mode.
    pub fast: PolicyResult,
    /// Full mode (`None` when skipped).
    pub full: Option<PolicyResult>,
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let t0 = Instant::now();
    let v = f();
    (v, t0.elapsed().as_secs_f64() * 1e3)
}

/// Runs FIFO, greedy, fast and (unless `full_opts` is `None`) full mode.
pub fn compare(s: &Scenario, full_opts: Option<full::Options>) -> Comparison {
    let (p, ms) = timed(|| baseline::fifo(s));
    let fifo = PolicyResult::from_report(s, check(s, &p), ms, p);
    let (p, ms) = timed(|| baseline::greedy(s));
    let greedy = PolicyResult::from_report(s, check(s, &p), ms, p);
    let (out, ms) = timed(|| fast::solve(s));
    let fast_plan = out.plan.clone();
    let fast = PolicyResult::from_report(s, out.report, ms, out.plan);
    let full = full_opts.map(|o| {
        let (res, ms) = timed(|| full::solve(s, &fast_plan, o));
        match res {
            Ok(out) => {
                let r = check(s, &out.plan);
                let mut pr = PolicyResult::from_report(s, r, ms, out.plan);
                pr.proof = Some(out.proof);
                pr
            }
            Err(e) => PolicyResult::failed(s, e),
        }
    });
    Comparison {
        scenario: s.name.clone(),
        gpus: s.gpus,
        steps: s.steps,
        fifo,
        greedy,
        fast,
        full,
    }
}

/// The label of one cell: `.` idle, `R<id>` an RT app, the job id for a
/// batch job (ids from the scenario file, never shortened).
fn label(s: &Scenario, c: Cell) -> String {
    match c {
        Cell::Idle => ".".to_string(),
        Cell::Rt(r) => match s.rt.get(usize::from(r)) {
            Some(a) => format!("R{}", a.id),
            None => "R?".to_string(),
        },
        Cell::Job(j) => match s.jobs.get(j as usize) {
            Some(job) => job.id.to_string(),
            None => "?".to_string(),
        },
    }
}

/// Renders a plan as a GPU x step grid: one row per GPU, one column per step,
/// every column as wide as the longest label so that each job and app is
/// named in full (`.` idle, `R<id>` RT app, otherwise the job id). At most
/// `max_gpus` rows are drawn.
pub fn grid(s: &Scenario, plan: &Plan, max_gpus: u32) -> String {
    let shown = s.gpus.min(max_gpus);
    let mut w = s.steps.saturating_sub(1).to_string().len().max(2);
    for g in 0..shown {
        for t in 0..s.steps {
            w = w.max(label(s, plan.at(g, t)).len());
        }
    }
    let lw = s.gpus.saturating_sub(1).to_string().len().max(3);
    let mut out = String::new();
    let _ = write!(out, "{:<lw$}  ", "GPU");
    for t in 0..s.steps {
        let _ = write!(out, "{t:>w$} ");
    }
    out.push('\n');
    for g in 0..shown {
        let _ = write!(out, "{g:>lw$}  ");
        for t in 0..s.steps {
            let _ = write!(out, "{:>w$} ", label(s, plan.at(g, t)));
        }
        out.push('\n');
    }
    if shown < s.gpus {
        let _ = writeln!(out, "... {} more GPUs not drawn", s.gpus - shown);
    }
    out
}

/// A readable table of the comparison.
pub fn table(c: &Comparison) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<7} {:>6} {:>9} {:>9} {:>9} {:>6} {:>10}  notes",
        "policy", "util", "value", "completed", "shortfall", "swaps", "solve_ms"
    );
    let rows = [
        ("fifo", Some(&c.fifo)),
        ("greedy", Some(&c.greedy)),
        ("fast", Some(&c.fast)),
        ("full", c.full.as_ref()),
    ];
    for (name, r) in rows {
        let Some(r) = r else { continue };
        if let Some(e) = &r.error {
            let _ = writeln!(out, "{name:<7} not run: {e}");
            continue;
        }
        let mut note = if r.valid {
            String::new()
        } else {
            format!(
                "INVALID: {}",
                r.violations.first().map(String::as_str).unwrap_or("")
            )
        };
        if let Some(p) = &r.proof {
            let _ = write!(
                note,
                "{} gap {:.2}% (bound {:.1})",
                if p.optimal { "optimal," } else { "not proven," },
                p.gap * 100.0,
                p.bound
            );
        }
        let _ = writeln!(
            out,
            "{name:<7} {:>5.1}% {:>9.1} {:>5}/{:<3} {:>9} {:>6} {:>10.3}  {note}",
            r.utilization * 100.0,
            r.value,
            r.completed,
            r.jobs,
            r.shortfall,
            r.swaps,
            r.solve_ms
        );
    }
    let gain = |a: &PolicyResult, b: &PolicyResult| {
        let dv = if b.value > 0.0 {
            (a.value / b.value - 1.0) * 100.0
        } else {
            0.0
        };
        format!(
            "{:+.1} pts utilisation, {:+.1}% value",
            (a.utilization - b.utilization) * 100.0,
            dv
        )
    };
    let _ = writeln!(out, "fast vs fifo:   {}", gain(&c.fast, &c.fifo));
    let _ = writeln!(out, "fast vs greedy: {}", gain(&c.fast, &c.greedy));
    if let Some(f) = c.full.as_ref().filter(|f| f.error.is_none()) {
        let _ = writeln!(out, "full vs fast:   {}", gain(f, &c.fast));
    }
    out
}
