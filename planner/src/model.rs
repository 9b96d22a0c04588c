//! The planning model: GPUs by time steps, elastic real-time (RT) apps and
//! rigid batch-like jobs, plus every knob the Dharma post left open.
//!
//! Why a separate module: every policy (FIFO, the note's greedy, fast mode,
//! full mode) and the independent checker read the same types, so the model is
//! defined once and the policies only emit a [`Plan`] grid.

use serde::Serialize;

/// Kinds of batch-like work (§1.2 of the scheduling note). The kind is a label
/// only: the constraints are the same for every kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum JobKind {
    /// Training or fine-tuning.
    Train,
    /// Offline batch inference.
    BatchInf,
    /// Quantization.
    Quant,
    /// Evaluation.
    Eval,
}

impl JobKind {
    /// The name used in scenario files.
    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::Train => "train",
            JobKind::BatchInf => "batchinf",
            JobKind::Quant => "quant",
            JobKind::Eval => "eval",
        }
    }

    /// Parses a scenario-file kind name.
    pub fn parse(s: &str) -> Option<JobKind> {
        match s {
            "train" => Some(JobKind::Train),
            "batchinf" => Some(JobKind::BatchInf),
            "quant" => Some(JobKind::Quant),
            "eval" => Some(JobKind::Eval),
            _ => None,
        }
    }
}

/// A batch-like job: a contiguous block of `size` GPUs (a power of two) held
/// for `duration` steps without interruption.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Job {
    /// Identifier from the scenario (unique).
    pub id: u32,
    /// Workload label.
    pub kind: JobKind,
    /// GPUs, a power of two.
    pub size: u32,
    /// Steps of work still to do.
    pub duration: u32,
    /// Priority weight (> 0); value is priority x GPU-steps.
    pub priority: u32,
    /// First step at which the job may start.
    pub arrival: u32,
    /// Running work inherited from the previous plan: the job is pinned at
    /// step 0 on GPUs `[first_gpu, first_gpu + size)`.
    pub running: Option<u32>,
}

/// An elastic real-time inference app with a per-step GPU demand curve.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RtApp {
    /// Identifier from the scenario (unique).
    pub id: u32,
    /// GPUs wanted at each step (length = horizon).
    pub demand: Vec<u32>,
    /// Swap cap K: between consecutive steps the app may gain and lose at most
    /// `2K` GPUs in total (one swap = one GPU out plus one GPU in).
    pub swap_cap: u32,
    /// GPUs the app held at the step before the horizon (rolling horizon); the
    /// swap cap also applies between that set and step 0.
    pub previous: Option<Vec<u32>>,
}

/// What to do with batch work that would run past the end of the horizon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PastHorizon {
    /// Allowed; only the steps inside the horizon count (the note's fixtures).
    ProRata,
    /// A job may start only if it finishes inside the horizon.
    Forbid,
}

/// The open choices of the model, all configurable per scenario.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Config {
    /// Blocks must start at a multiple of their size (buddy alignment).
    /// Default false: the note's FIFO and greedy use any lowest-index block.
    pub align: bool,
    /// Treatment of work past the horizon. Default pro rata.
    pub past_horizon: PastHorizon,
    /// Time decay: a GPU-step at step t is worth `gamma^t`. Default 1 (the
    /// note's value figures have no decay).
    pub gamma: f64,
    /// RT penalty per unmet GPU-step, as a multiple of the highest batch
    /// priority in the scenario, so that RT always outranks batch work.
    /// Default 5 (the post says 5-10x).
    pub rt_penalty: f64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            align: false,
            past_horizon: PastHorizon::ProRata,
            gamma: 1.0,
            rt_penalty: 5.0,
        }
    }
}

/// A planning problem.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Scenario {
    /// Name, for reports.
    pub name: String,
    /// GPUs, indexed `0..gpus` (contiguity is by index).
    pub gpus: u32,
    /// Steps in the horizon (24 hourly steps by default).
    pub steps: u32,
    /// Elastic RT apps.
    pub rt: Vec<RtApp>,
    /// Batch-like jobs.
    pub jobs: Vec<Job>,
    /// Open choices.
    pub config: Config,
}

impl Scenario {
    /// Weight of one GPU-step at step `t` (`gamma^t`).
    pub fn weight(&self, t: u32) -> f64 {
        if self.config.gamma == 1.0 {
            1.0
        } else {
            self.config.gamma.powi(t as i32)
        }
    }

    /// Penalty per unmet RT GPU-step (`rt_penalty` x highest priority).
    pub fn lambda(&self) -> f64 {
        let top = self
            .jobs
            .iter()
            .map(|j| j.priority)
            .max()
            .unwrap_or(1)
            .max(1);
        self.config.rt_penalty * f64::from(top)
    }

    /// Total RT demand at step `t`.
    pub fn rt_demand(&self, t: u32) -> u32 {
        self.rt.iter().map(|r| r.demand[t as usize]).sum()
    }

    /// Steps a job started at `start` occupies inside the horizon.
    pub fn clipped(&self, job: &Job, start: u32) -> u32 {
        job.duration.min(self.steps.saturating_sub(start))
    }

    /// Whether a job started at `start` runs its whole duration inside the
    /// horizon (no overflow for any duration).
    pub fn finishes(&self, job: &Job, start: u32) -> bool {
        u64::from(start) + u64::from(job.duration) <= u64::from(self.steps)
    }

    /// Whether `start` is a legal start step for `job` (release time and the
    /// past-horizon rule; running jobs may only start at 0).
    pub fn start_ok(&self, job: &Job, start: u32) -> bool {
        if start >= self.steps {
            return false;
        }
        if job.running.is_some() {
            return start == 0;
        }
        if start < job.arrival {
            return false;
        }
        match self.config.past_horizon {
            PastHorizon::ProRata => true,
            PastHorizon::Forbid => self.finishes(job, start),
        }
    }

    /// Whether a block of `size` may begin at GPU `offset`.
    pub fn offset_ok(&self, size: u32, offset: u32) -> bool {
        u64::from(offset) + u64::from(size) <= u64::from(self.gpus)
            && (!self.config.align || offset.is_multiple_of(size.max(1)))
    }
}

/// Who holds one GPU at one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Cell {
    /// Nobody.
    Idle,
    /// The RT app at this index of `Scenario::rt`.
    Rt(u16),
    /// The batch job at this index of `Scenario::jobs`.
    Job(u32),
}

/// A plan: a GPU x step grid of owners. Policies only produce this grid; all
/// metrics come from the checker, which derives them from the grid alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// GPUs.
    pub gpus: u32,
    /// Steps.
    pub steps: u32,
    /// Owners, step-major: index `t * gpus + g`.
    pub cells: Vec<Cell>,
}

impl Plan {
    /// An all-idle plan for a scenario's shape.
    pub fn empty(s: &Scenario) -> Plan {
        Plan {
            gpus: s.gpus,
            steps: s.steps,
            cells: vec![Cell::Idle; (s.gpus as usize) * (s.steps as usize)],
        }
    }

    /// Owner of GPU `g` at step `t`.
    pub fn at(&self, g: u32, t: u32) -> Cell {
        self.cells[(t as usize) * (self.gpus as usize) + g as usize]
    }

    /// Sets the owner of GPU `g` at step `t`.
    pub fn set(&mut self, g: u32, t: u32, c: Cell) {
        let i = (t as usize) * (self.gpus as usize) + g as usize;
        self.cells[i] = c;
    }

    /// Batch placements `(job index, start, first GPU)` read off the grid, in
    /// order of start then GPU.
    pub fn placements(&self) -> Vec<(usize, u32, u32)> {
        let mut seen = Vec::new();
        let mut out = Vec::new();
        for t in 0..self.steps {
            for g in 0..self.gpus {
                if let Cell::Job(j) = self.at(g, t) {
                    let j = j as usize;
                    if seen.len() <= j {
                        seen.resize(j + 1, false);
                    }
                    if !seen[j] {
                        seen[j] = true;
                        out.push((j, t, g));
                    }
                }
            }
        }
        out
    }
}
