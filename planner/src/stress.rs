//! The stress generator: scenarios unlike the golden ones, for the checks
//! that fast mode is always valid and full mode's figures are right.
//!
//! Why a second generator: [`crate::gen`] mimics the note's fixtures (smooth
//! business-hours curves within the swap cap, no inherited work), so it never
//! exercises demand jumps, `cap=0`, `prev=` sets or overlapping work, which is
//! where fast mode used to return invalid plans. Distributions, per scenario:
//!
//! * Size class: 60 % *small* (G 1..=4, T 1..=4, 0..=3 jobs, 0..=2 RT apps:
//!   small enough to enumerate every plan), 35 % *medium* (G in {8, 16, 32,
//!   64}, T 1..=48, 0..=G+4 jobs, 0..=4 apps), 5 % *extreme* (one of: G 1 x T
//!   1,024; G 4,096 x T 1; G 1,024 x T 24 with up to 64 jobs).
//! * RT demand: starts uniform in 0..=G; at each step it stays (50 %), moves
//!   by up to 2 (25 %) or jumps to a uniform value in 0..=G (25 %), so jumps
//!   far beyond the cap are common. Swap cap: 0 (20 %), 1 (20 %), 2 (40 %),
//!   G (20 %). `prev=` (30 % of apps): a random set of 0..=G GPUs, which may
//!   overlap other apps' sets or running blocks, or be too large to shed.
//! * Jobs: size a power of two up to G; duration 1..=T+3 (past the horizon
//!   happens), 3 % huge (up to 1,000,000); priority 1..=10, 3 % up to
//!   1,000,000; arrival 0..=T+2. 20 % are inherited (`running=` at a random
//!   legal offset, arrival 0), so running blocks may overlap.
//! * Options: `align` 30 %, `past_horizon forbid` 30 %, gamma 1 (60 %), 0.9
//!   or 0.5; rt_penalty 5 (60 %), 0.5, 10 or 1,000,000.
//!
//! Overlaps and unsheddable `prev=` sets make some scenarios infeasible on
//! purpose (about 30 %); [`crate::feasible::check`] must say why.
//! [`sized`] makes the benchmark instances (G GPUs, n jobs, spiky RT).

use crate::model::{Config, Job, JobKind, PastHorizon, RtApp, Scenario};
use crate::rng::Rng;

/// The size class of a generated scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// G, T <= 4, at most 3 jobs and 2 apps: every plan can be enumerated.
    Small,
    /// Up to 64 GPUs and 48 steps.
    Medium,
    /// Degenerate or large shapes.
    Extreme,
}

fn draw_class(rng: &mut Rng) -> Class {
    match rng.below(100) {
        0..=59 => Class::Small,
        60..=94 => Class::Medium,
        _ => Class::Extreme,
    }
}

/// The class `scenario(seed)` draws.
pub fn class(seed: u64) -> Class {
    draw_class(&mut Rng::new(seed))
}

fn pow2_up_to(rng: &mut Rng, hi: u32) -> u32 {
    let top = 31 - hi.max(1).leading_zeros();
    1 << rng.range(0, top)
}

fn spiky(rng: &mut Rng, gpus: u32, steps: u32) -> Vec<u32> {
    let mut d = rng.range(0, gpus);
    (0..steps)
        .map(|_| {
            match rng.below(4) {
                0 | 1 => {}
                2 => d = (d + rng.range(0, 4)).saturating_sub(2).min(gpus),
                _ => d = rng.range(0, gpus),
            }
            d
        })
        .collect()
}

fn rt_app(rng: &mut Rng, id: u32, gpus: u32, steps: u32) -> RtApp {
    let demand = spiky(rng, gpus, steps);
    let swap_cap = match rng.below(5) {
        0 => 0,
        1 => 1,
        2 | 3 => 2,
        _ => gpus,
    };
    let previous = (rng.below(10) < 3).then(|| {
        let mut all: Vec<u32> = (0..gpus).collect();
        rng.shuffle(&mut all);
        all.truncate(rng.range(0, gpus) as usize);
        all
    });
    RtApp {
        id,
        demand,
        swap_cap,
        previous,
    }
}

fn job(rng: &mut Rng, id: u32, gpus: u32, steps: u32, align: bool) -> Job {
    let kind = [
        JobKind::Train,
        JobKind::BatchInf,
        JobKind::Quant,
        JobKind::Eval,
    ][rng.below(4) as usize];
    let size = pow2_up_to(rng, gpus);
    let duration = if rng.below(100) < 3 {
        rng.range(1, 1_000_000)
    } else {
        rng.range(1, steps + 3)
    };
    let priority = if rng.below(100) < 3 {
        rng.range(1, 1_000_000)
    } else {
        rng.range(1, 10)
    };
    let running = (rng.below(5) == 0).then(|| {
        let slots = gpus - size;
        let g = rng.range(0, slots);
        if align {
            g / size * size
        } else {
            g
        }
    });
    Job {
        id,
        kind,
        size,
        duration,
        priority,
        arrival: if running.is_some() {
            0
        } else {
            rng.range(0, steps + 2)
        },
        running,
    }
}

fn build(rng: &mut Rng, name: String, gpus: u32, steps: u32, apps: u32, jobs: u32) -> Scenario {
    let config = Config {
        align: rng.below(10) < 3,
        past_horizon: if rng.below(10) < 3 {
            PastHorizon::Forbid
        } else {
            PastHorizon::ProRata
        },
        gamma: [1.0, 1.0, 1.0, 0.9, 0.5][rng.below(5) as usize],
        rt_penalty: [5.0, 5.0, 5.0, 0.5, 10.0, 1e6][rng.below(6) as usize],
    };
    let rt = (0..apps).map(|id| rt_app(rng, id, gpus, steps)).collect();
    let jobs = (0..jobs)
        .map(|id| job(rng, id, gpus, steps, config.align))
        .collect();
    Scenario {
        name,
        gpus,
        steps,
        rt,
        jobs,
        config,
    }
}

/// One stress scenario from `seed` (see the module docs for the
/// distributions).
pub fn scenario(seed: u64) -> Scenario {
    let mut rng = Rng::new(seed);
    let class = draw_class(&mut rng);
    let name = format!("stress-{seed}");
    match class {
        Class::Small => {
            let (g, t) = (rng.range(1, 4), rng.range(1, 4));
            let (a, n) = (rng.range(0, 2), rng.range(0, 3));
            build(&mut rng, name, g, t, a, n)
        }
        Class::Medium => {
            let g = [8, 16, 32, 64][rng.below(4) as usize];
            let t = rng.range(1, 48);
            let (a, n) = (rng.range(0, 4), rng.range(0, g + 4));
            build(&mut rng, name, g, t, a, n)
        }
        Class::Extreme => {
            let (g, t, n) = match rng.below(3) {
                0 => (1, 1_024, rng.range(0, 4)),
                1 => (4_096, 1, rng.range(0, 64)),
                _ => (1_024, 24, rng.range(0, 64)),
            };
            let a = rng.range(0, 3);
            build(&mut rng, name, g, t, a, n)
        }
    }
}

/// A feasible benchmark instance: `gpus` GPUs, `jobs` jobs, 24 steps,
/// `max(1, gpus / 64)` spiky RT apps (at most 16) whose demand, up to
/// `G / 4 / apps` each, jumps like [`scenario`]'s (cap 2), and the note's job
/// sizes up to G/16, priorities 1-10 (3 % up to 10^6), no inherited work.
pub fn sized(seed: u64, gpus: u32, jobs: u32) -> Scenario {
    let mut rng = Rng::new(seed);
    let steps = 24;
    let apps = (gpus / 64).clamp(1, 16);
    let rt = (0..apps)
        .map(|id| RtApp {
            id,
            demand: spiky(&mut rng, (gpus / 4 / apps).max(1), steps),
            swap_cap: 2,
            previous: None,
        })
        .collect();
    let name = format!("stress-{gpus}x{jobs}-{seed}");
    let jobs = (0..jobs)
        .map(|id| Job {
            running: None,
            arrival: rng.range(0, steps - 1),
            ..job(&mut rng, id, (gpus / 16).max(1), steps, false)
        })
        .collect();
    Scenario {
        name,
        gpus,
        steps,
        rt,
        jobs,
        config: Config::default(),
    }
}
