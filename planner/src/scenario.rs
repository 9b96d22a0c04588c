//! The scenario text format (documented in `planner/README.md`).
//!
//! Why a line format of our own rather than TOML or JSON: scenarios are
//! written by hand from the note's tuples, one job per line in the note's own
//! order `(id, kind, size, duration, priority, arrival)`, and every error can
//! name the line and the field to fix. Tokens containing `=` are options;
//! everything else is positional.
//!
//! ```text
//! name S1 training-heavy
//! gpus 8
//! steps 24
//! align false            # optional, default false
//! past_horizon prorata   # or forbid
//! gamma 1                # time decay per step, 0 < gamma <= 1
//! rt_penalty 5           # x the top batch priority
//! rt 0 0 0 0 0 0 0 0 0 1 2 4 4 4 4 4 4 4 4 2 1 0 0 0 0 cap=2
//! job 0 train 1 13 9 0
//! job 7 eval 2 1 10 6 running=4   # pinned at step 0 on GPUs 4..5
//! ```

use crate::feasible::Item;
use crate::model::{Config, Job, JobKind, PastHorizon, RtApp, Scenario};
use std::fmt;

/// Largest accepted `gpus`.
pub const MAX_GPUS: u32 = 65_536;
/// Largest accepted `steps` (a year of hourly steps).
pub const MAX_STEPS: u32 = 8_760;
/// Largest accepted grid, `gpus x steps` cells (32 MiB per plan grid).
pub const MAX_CELLS: u64 = 1 << 22;
/// Largest accepted job duration and arrival, in steps.
pub const MAX_DURATION: u32 = 1_000_000;
/// Most RT apps in one scenario.
pub const MAX_RT_APPS: usize = 1_024;
/// Most jobs in one scenario.
pub const MAX_JOBS: usize = 100_000;
/// Largest accepted `rt_penalty` (keeps every objective finite).
pub const MAX_RT_PENALTY: f64 = 1e6;

/// A scenario file error: the 1-based line (0 for whole-file problems) and a
/// message that says what is wrong and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line number, 0 when the problem is not tied to one line.
    pub line: usize,
    /// What is wrong and how to fix it.
    pub message: String,
    /// The file is well formed but no plan can satisfy it (see
    /// [`crate::feasible`]); the message says why.
    pub infeasible: bool,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}", self.message)
        } else {
            write!(f, "line {}: {}", self.line, self.message)
        }
    }
}

impl std::error::Error for ParseError {}

fn err(line: usize, message: impl Into<String>) -> ParseError {
    ParseError {
        line,
        message: message.into(),
        infeasible: false,
    }
}

fn num<T: std::str::FromStr>(line: usize, field: &str, tok: &str) -> Result<T, ParseError> {
    tok.parse::<T>().map_err(|_| {
        err(
            line,
            format!("field `{field}`: `{tok}` is not a valid number"),
        )
    })
}

/// A whole number within `lo..=hi`.
fn bounded(line: usize, field: &str, tok: &str, lo: u32, hi: u32) -> Result<u32, ParseError> {
    let v: u64 = tok.parse().map_err(|_| {
        err(
            line,
            format!("field `{field}`: `{tok}` is not a whole number from {lo} to {hi}"),
        )
    })?;
    if v < u64::from(lo) || v > u64::from(hi) {
        return Err(err(
            line,
            format!("field `{field}`: {v} is outside {lo}..={hi}"),
        ));
    }
    Ok(v as u32)
}

/// A finite real number within `(lo, hi]`.
fn real(
    line: usize,
    field: &str,
    tok: &str,
    lo: f64,
    hi: f64,
    hint: &str,
) -> Result<f64, ParseError> {
    let v: f64 = num(line, field, tok)?;
    if !(v > lo && v <= hi) {
        return Err(err(
            line,
            format!("field `{field}`: {tok} must be in ({lo}, {hi}]; {hint}"),
        ));
    }
    Ok(v)
}

fn boolean(line: usize, field: &str, tok: &str) -> Result<bool, ParseError> {
    match tok {
        "true" | "yes" | "1" => Ok(true),
        "false" | "no" | "0" => Ok(false),
        _ => Err(err(
            line,
            format!("field `{field}`: expected true or false, got `{tok}`"),
        )),
    }
}

/// Where each item came from, for error messages.
#[derive(Debug, Clone, Default)]
struct Lines {
    gpus: usize,
    steps: usize,
    rt: Vec<usize>,
    jobs: Vec<usize>,
}

impl Lines {
    fn of(&self, item: Item) -> usize {
        match item {
            Item::Job(j) => self.jobs[j],
            Item::Rt(r) => self.rt[r],
        }
    }
}

/// The second line of a repeated id, with the first.
fn repeated(ids: impl Iterator<Item = (u32, usize)>) -> Option<(u32, usize, usize)> {
    let mut v: Vec<(u32, usize)> = ids.collect();
    v.sort_unstable();
    v.windows(2)
        .find(|w| w[0].0 == w[1].0)
        .map(|w| (w[0].0, w[0].1, w[1].1))
}

/// Parses a scenario file. `name` is used when the file has no `name` line.
/// Besides syntax and bounds, it rejects scenarios that admit no valid plan
/// ([`crate::feasible::check`]) with `infeasible` set and the line of the
/// item to fix.
pub fn parse(text: &str, name: &str) -> Result<Scenario, ParseError> {
    let mut s = Scenario {
        name: name.to_string(),
        gpus: 0,
        steps: 24,
        rt: Vec::new(),
        jobs: Vec::new(),
        config: Config::default(),
    };
    let mut lines = Lines::default();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let content = raw.split('#').next().unwrap_or("").trim();
        if content.is_empty() {
            continue;
        }
        let mut toks = content.split_whitespace();
        let key = toks.next().unwrap_or("");
        let rest: Vec<&str> = toks.collect();
        let one = |field: &str| -> Result<&str, ParseError> {
            match rest.as_slice() {
                [v] => Ok(*v),
                _ => Err(err(
                    line,
                    format!("`{field}` takes exactly one value, e.g. `{field} 8`"),
                )),
            }
        };
        match key {
            "name" => s.name = rest.join(" "),
            "gpus" => {
                s.gpus = bounded(line, "gpus", one("gpus")?, 1, MAX_GPUS)?;
                lines.gpus = line;
            }
            "steps" => {
                s.steps = bounded(line, "steps", one("steps")?, 1, MAX_STEPS)?;
                lines.steps = line;
            }
            "align" => s.config.align = boolean(line, "align", one("align")?)?,
            "past_horizon" => {
                s.config.past_horizon = match one("past_horizon")? {
                    "prorata" => PastHorizon::ProRata,
                    "forbid" => PastHorizon::Forbid,
                    other => {
                        return Err(err(
                            line,
                            format!("field `past_horizon`: `{other}` is not prorata or forbid"),
                        ))
                    }
                }
            }
            "gamma" => {
                s.config.gamma = real(line, "gamma", one("gamma")?, 0.0, 1.0, "use 1 for no decay")?
            }
            "rt_penalty" => {
                s.config.rt_penalty = real(
                    line,
                    "rt_penalty",
                    one("rt_penalty")?,
                    0.0,
                    MAX_RT_PENALTY,
                    "the post uses 5 to 10",
                )?
            }
            "rt" => {
                if s.rt.len() == MAX_RT_APPS {
                    return Err(err(
                        line,
                        format!("at most {MAX_RT_APPS} rt apps are supported; merge some apps"),
                    ));
                }
                s.rt.push(parse_rt(line, &rest)?);
                lines.rt.push(line);
            }
            "job" => {
                if s.jobs.len() == MAX_JOBS {
                    return Err(err(
                        line,
                        format!("at most {MAX_JOBS} jobs are supported; split the scenario"),
                    ));
                }
                s.jobs.push(parse_job(line, &rest)?);
                lines.jobs.push(line);
            }
            other => {
                return Err(err(
                    line,
                    format!(
                        "unknown keyword `{other}`; expected one of name, gpus, steps, align, \
                         past_horizon, gamma, rt_penalty, rt, job"
                    ),
                ))
            }
        }
    }
    if s.gpus == 0 {
        return Err(err(
            0,
            "the file has no `gpus` line; add `gpus N` (N from 1 to 65536)",
        ));
    }
    let cells = u64::from(s.gpus) * u64::from(s.steps);
    if cells > MAX_CELLS {
        return Err(err(
            lines.gpus.max(lines.steps),
            format!(
                "fields `gpus` x `steps`: {} x {} = {cells} GPU-steps, above the {MAX_CELLS} a \
                 plan may have; plan fewer GPUs or a shorter horizon",
                s.gpus, s.steps
            ),
        ));
    }
    for (app, line) in s.rt.iter().zip(&lines.rt) {
        validate_rt(&s, app, *line)?;
    }
    for (j, line) in s.jobs.iter().zip(&lines.jobs) {
        validate_job(&s, j, *line)?;
    }
    if let Some((id, first, line)) =
        repeated(s.jobs.iter().map(|j| j.id).zip(lines.jobs.iter().copied()))
    {
        return Err(err(
            line,
            format!("field `id`: job id {id} is already used on line {first}; give every job its own id"),
        ));
    }
    if let Some((id, first, line)) =
        repeated(s.rt.iter().map(|r| r.id).zip(lines.rt.iter().copied()))
    {
        return Err(err(
            line,
            format!("field `id`: rt app id {id} is already used on line {first}; give every app its own id"),
        ));
    }
    if let Err(e) = crate::feasible::check(&s) {
        let mut message = e.to_string();
        if let Some(o) = e.other {
            message.push_str(&format!(" (the other is on line {})", lines.of(o)));
        }
        return Err(ParseError {
            line: lines.of(e.item),
            message,
            infeasible: true,
        });
    }
    Ok(s)
}

/// Largest accepted job priority.
pub const MAX_PRIORITY: u32 = 1_000_000;

fn parse_rt(line: usize, rest: &[&str]) -> Result<RtApp, ParseError> {
    let mut pos = Vec::new();
    let mut swap_cap = 2;
    let mut previous = None;
    for tok in rest {
        if let Some((k, v)) = tok.split_once('=') {
            match k {
                "cap" => swap_cap = bounded(line, "cap", v, 0, MAX_GPUS)?,
                "prev" => {
                    let mut gs = Vec::new();
                    for g in v.split(',').filter(|g| !g.is_empty()) {
                        gs.push(bounded(line, "prev", g, 0, MAX_GPUS - 1)?);
                    }
                    previous = Some(gs);
                }
                _ => {
                    return Err(err(
                        line,
                        format!("unknown rt option `{k}`; expected cap= or prev="),
                    ))
                }
            }
        } else {
            pos.push(*tok);
        }
    }
    let Some((id, demand)) = pos.split_first() else {
        return Err(err(
            line,
            "`rt` needs an id then one demand value per step: `rt 0 1 1 2 ...`",
        ));
    };
    let id = num(line, "rt id", id)?;
    if demand.len() > MAX_STEPS as usize {
        return Err(err(
            line,
            format!(
                "rt app {id} has {} demand values, more than the {MAX_STEPS} steps a horizon \
                 may have",
                demand.len()
            ),
        ));
    }
    let mut d = Vec::with_capacity(demand.len());
    for (t, v) in demand.iter().enumerate() {
        d.push(bounded(line, &format!("demand[{t}]"), v, 0, MAX_GPUS)?);
    }
    Ok(RtApp {
        id,
        demand: d,
        swap_cap,
        previous,
    })
}

fn validate_rt(s: &Scenario, app: &RtApp, line: usize) -> Result<(), ParseError> {
    if app.demand.len() != s.steps as usize {
        return Err(err(
            line,
            format!(
                "rt app {} has {} demand values but the horizon has {} steps; give exactly one \
                 value per step (declare `steps` before changing it)",
                app.id,
                app.demand.len(),
                s.steps
            ),
        ));
    }
    if let Some((t, d)) = app.demand.iter().enumerate().find(|(_, d)| **d > s.gpus) {
        return Err(err(
            line,
            format!(
                "field `demand[{t}]`: rt app {} wants {d} GPUs at step {t} but there are only {} \
                 GPUs",
                app.id, s.gpus
            ),
        ));
    }
    if let Some(prev) = &app.previous {
        if let Some(g) = prev.iter().find(|g| **g >= s.gpus) {
            return Err(err(
                line,
                format!(
                    "field `prev`: rt app {} names GPU {g}, but GPUs are 0..{}",
                    app.id, s.gpus
                ),
            ));
        }
        let mut p = prev.clone();
        p.sort_unstable();
        if let Some(w) = p.windows(2).find(|w| w[0] == w[1]) {
            return Err(err(
                line,
                format!("field `prev`: rt app {} lists GPU {} twice", app.id, w[0]),
            ));
        }
    }
    Ok(())
}

fn parse_job(line: usize, rest: &[&str]) -> Result<Job, ParseError> {
    let mut pos = Vec::new();
    let mut running = None;
    for tok in rest {
        if let Some((k, v)) = tok.split_once('=') {
            match k {
                "running" => running = Some(bounded(line, "running", v, 0, MAX_GPUS - 1)?),
                _ => {
                    return Err(err(
                        line,
                        format!("unknown job option `{k}`; expected running="),
                    ))
                }
            }
        } else {
            pos.push(*tok);
        }
    }
    let [id, kind, size, dur, prio, arrival] = pos.as_slice() else {
        return Err(err(
            line,
            format!(
                "a job needs 6 fields `job <id> <kind> <size> <duration> <priority> <arrival>`, \
                 got {}",
                pos.len()
            ),
        ));
    };
    let kind = JobKind::parse(kind).ok_or_else(|| {
        err(
            line,
            format!("field `kind`: `{kind}` is not one of train, batchinf, quant, eval"),
        )
    })?;
    Ok(Job {
        id: num(line, "id", id)?,
        kind,
        size: bounded(line, "size", size, 1, MAX_GPUS)?,
        duration: bounded(line, "duration", dur, 1, MAX_DURATION)?,
        priority: bounded(line, "priority", prio, 1, MAX_PRIORITY)?,
        arrival: bounded(line, "arrival", arrival, 0, MAX_DURATION)?,
        running,
    })
}

fn validate_job(s: &Scenario, j: &Job, line: usize) -> Result<(), ParseError> {
    if !j.size.is_power_of_two() {
        return Err(err(
            line,
            format!(
                "job {}: size {} must be a power of two (1, 2, 4, ...)",
                j.id, j.size
            ),
        ));
    }
    if j.size > s.gpus {
        return Err(err(
            line,
            format!(
                "field `size`: job {}: size {} exceeds the {} GPUs",
                j.id, j.size, s.gpus
            ),
        ));
    }
    if let Some(g) = j.running {
        if !s.offset_ok(j.size, g) {
            return Err(err(
                line,
                format!(
                    "job {}: running={g} puts a block of {} outside GPUs 0..{} or off alignment",
                    j.id, j.size, s.gpus
                ),
            ));
        }
        if j.arrival != 0 {
            return Err(err(
                line,
                format!(
                    "field `arrival`: job {}: a running job must have arrival 0",
                    j.id
                ),
            ));
        }
    }
    Ok(())
}

/// Writes a scenario in the text format (round-trips through [`parse`]).
pub fn to_text(s: &Scenario) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "name {}", s.name);
    let _ = writeln!(out, "gpus {}", s.gpus);
    let _ = writeln!(out, "steps {}", s.steps);
    let _ = writeln!(out, "align {}", s.config.align);
    let ph = match s.config.past_horizon {
        PastHorizon::ProRata => "prorata",
        PastHorizon::Forbid => "forbid",
    };
    let _ = writeln!(out, "past_horizon {ph}");
    let _ = writeln!(out, "gamma {}", s.config.gamma);
    let _ = writeln!(out, "rt_penalty {}", s.config.rt_penalty);
    for r in &s.rt {
        let d: Vec<String> = r.demand.iter().map(u32::to_string).collect();
        let _ = write!(out, "rt {} {} cap={}", r.id, d.join(" "), r.swap_cap);
        if let Some(p) = &r.previous {
            let p: Vec<String> = p.iter().map(u32::to_string).collect();
            let _ = write!(out, " prev={}", p.join(","));
        }
        out.push('\n');
    }
    for j in &s.jobs {
        let _ = write!(
            out,
            "job {} {} {} {} {} {}",
            j.id,
            j.kind.as_str(),
            j.size,
            j.duration,
            j.priority,
            j.arrival
        );
        if let Some(g) = j.running {
            let _ = write!(out, " running={g}");
        }
        out.push('\n');
    }
    out
}
