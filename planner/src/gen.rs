//! The random scenario generator behind the 1,000-scenario checks.
//!
//! Why these distributions: they follow the note's own fixtures so that
//! random scenarios look like the seven golden ones, only more varied.
//!
//! * GPUs: 8, 16, 32 or 64 (uniform); 24 hourly steps.
//! * RT apps: 1 to 4 (at most G/8 + 1). Each has a business-hours curve: a
//!   floor `low` in 0..=2, a plateau `peak` above it, a ramp-up from a start
//!   hour in 5..=9 and back to `low` by an end hour in 18..=22, changing by at
//!   most 2 GPUs a step (so the swap cap K = 2 can be met). The sum of peaks
//!   stays at or below G/2, so the FIFO reservation always fits.
//! * Jobs: drawn until their total GPU-hours reach a load factor, uniform in
//!   0.5..1.5, of the GPU-hours RT leaves free (at most G + 4 jobs), so most
//!   scenarios are contended like the golden ones. Kinds and ranges are the note's: `train` 1-8 GPUs,
//!   4-20 h; `batchinf` 1-4, 2-8 h; `quant` 1-4, 1-3 h; `eval` 1-2, 1-4 h;
//!   sizes are powers of two no larger than G/2; priority 1..=10; arrival
//!   0..=16.
//!
//! [`shuffle_arrivals`] permutes the arrival times among a scenario's jobs,
//! the "random arrival orders" over which FIFO's luck is measured.

use crate::model::{Config, Job, JobKind, RtApp, Scenario};
use crate::rng::Rng;

fn curve(rng: &mut Rng, low: u32, peak: u32, steps: u32) -> Vec<u32> {
    let start = rng.range(5, 9);
    let end = rng.range(18, 22);
    let mut d = vec![low; steps as usize];
    let mut level = low;
    for t in start..end.min(steps) {
        level = (level + 2).min(peak);
        d[t as usize] = level;
    }
    // Ramp down to `low` by `end`, at most 2 per step, walking backwards.
    let mut t = end.min(steps) as usize;
    let mut cap = low;
    while t > 0 {
        t -= 1;
        cap += 2;
        if d[t] <= cap {
            break;
        }
        d[t] = cap;
    }
    d
}

fn pow2_at_most(rng: &mut Rng, lo: u32, hi: u32) -> u32 {
    let hi = hi.max(lo);
    let mut options = Vec::new();
    let mut p = 1;
    while p <= hi {
        if p >= lo {
            options.push(p);
        }
        p *= 2;
    }
    options[rng.below(options.len() as u64) as usize]
}

/// One job of the note's kinds and ranges; training blocks up to
/// `train_max` GPUs, other kinds capped at `cap`.
fn job(rng: &mut Rng, id: u32, train_max: u32, cap: u32) -> Job {
    let (kind, size, duration) = match rng.below(4) {
        0 => (
            JobKind::Train,
            pow2_at_most(rng, 1, train_max),
            rng.range(4, 20),
        ),
        1 => (
            JobKind::BatchInf,
            pow2_at_most(rng, 1, 4.min(cap)),
            rng.range(2, 8),
        ),
        2 => (
            JobKind::Quant,
            pow2_at_most(rng, 1, 4.min(cap)),
            rng.range(1, 3),
        ),
        _ => (
            JobKind::Eval,
            pow2_at_most(rng, 1, 2.min(cap)),
            rng.range(1, 4),
        ),
    };
    Job {
        id,
        kind,
        size,
        duration,
        priority: rng.range(1, 10),
        arrival: rng.range(0, 16),
        running: None,
    }
}

/// One random scenario from `seed`.
pub fn scenario(seed: u64) -> Scenario {
    let mut rng = Rng::new(seed);
    let gpus = [8, 16, 32, 64][rng.below(4) as usize];
    let steps = 24;
    let apps = rng.range(1, (gpus / 8 + 1).min(4));
    let mut budget = gpus / 2;
    let mut rt = Vec::new();
    for id in 0..apps {
        let left = apps - id;
        let share = (budget / left).max(1);
        let low = rng.range(0, 2.min(share - 1));
        let peak = rng.range(low + 1, share.max(low + 1));
        budget = budget.saturating_sub(peak);
        rt.push(RtApp {
            id,
            demand: curve(&mut rng, low, peak, steps),
            swap_cap: 2,
            previous: None,
        });
    }
    // Batch load: total job GPU-hours between 0.5x and 1.5x what RT leaves.
    let rt_gpu_h: u32 = rt.iter().map(|r| r.demand.iter().sum::<u32>()).sum();
    let room = f64::from(gpus * steps - rt_gpu_h);
    let target = room * (0.5 + rng.unit());
    let cap = gpus / 2;
    let mut work = 0.0;
    let mut id = 0;
    let jobs = std::iter::from_fn(|| {
        if work >= target || id >= 4 + gpus {
            return None;
        }
        let j = job(&mut rng, id, 8.min(cap), cap);
        work += f64::from(j.size * j.duration);
        id += 1;
        Some(j)
    })
    .collect();
    Scenario {
        name: format!("random-{seed}"),
        gpus,
        steps,
        rt,
        jobs,
        config: Config::default(),
    }
}

/// A scenario of a given size for benchmarks: `gpus` GPUs, `jobs` jobs,
/// `max(1, gpus / 64)` RT apps (at most 16) whose peaks sum to about G/4, and
/// the note's job kinds with sizes scaled up to G/16 for training.
pub fn sized(seed: u64, gpus: u32, jobs: u32) -> Scenario {
    let mut rng = Rng::new(seed);
    let steps = 24;
    let apps = (gpus / 64).clamp(1, 16);
    let share = (gpus / 4 / apps).max(1);
    let rt = (0..apps)
        .map(|id| {
            let peak = rng.range((share / 2).max(1), share);
            let low = rng.range(0, peak / 3);
            RtApp {
                id,
                demand: curve(&mut rng, low, peak, steps),
                swap_cap: 2,
                previous: None,
            }
        })
        .collect();
    let train_max = (gpus / 16).clamp(1, 64);
    let jobs: Vec<Job> = (0..jobs)
        .map(|id| job(&mut rng, id, train_max, gpus))
        .collect();
    Scenario {
        name: format!("sized-{gpus}x{}-{seed}", jobs.len()),
        gpus,
        steps,
        rt,
        jobs,
        config: Config::default(),
    }
}

/// The same jobs with their arrival times permuted (seeded).
pub fn shuffle_arrivals(s: &Scenario, seed: u64) -> Scenario {
    let mut rng = Rng::new(seed);
    let mut arrivals: Vec<u32> = s.jobs.iter().map(|j| j.arrival).collect();
    rng.shuffle(&mut arrivals);
    let mut out = s.clone();
    for (j, a) in out.jobs.iter_mut().zip(arrivals) {
        if j.running.is_none() {
            j.arrival = a;
        }
    }
    out.name = format!("{}-order{seed}", s.name);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_scenarios_are_well_formed() {
        for seed in 0..300 {
            let s = scenario(seed);
            let text = crate::scenario::to_text(&s);
            let back = crate::parse(&text, "x").unwrap();
            assert_eq!(back, s, "seed {seed} does not round-trip");
            let peaks: u32 = s.rt.iter().map(|r| *r.demand.iter().max().unwrap()).sum();
            assert!(peaks <= s.gpus / 2, "seed {seed}");
            for r in &s.rt {
                for w in r.demand.windows(2) {
                    assert!(w[0].abs_diff(w[1]) <= 2, "seed {seed} app {} jumps", r.id);
                }
            }
        }
    }
}
