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

use crate::model::{Config, Job, JobKind, PastHorizon, RtApp, Scenario};
use std::fmt;

/// A scenario file error: the 1-based line (0 for whole-file problems) and a
/// message that says what is wrong and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line number, 0 when the problem is not tied to one line.
    pub line: usize,
    /// What is wrong and how to fix it.
    pub message: String,
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

struct RawRt {
    line: usize,
    app: RtApp,
}

/// Parses a scenario file. `name` is used when the file has no `name` line.
pub fn parse(text: &str, name: &str) -> Result<Scenario, ParseError> {
    let mut s = Scenario {
        name: name.to_string(),
        gpus: 0,
        steps: 24,
        rt: Vec::new(),
        jobs: Vec::new(),
        config: Config::default(),
    };
    let mut rts: Vec<RawRt> = Vec::new();
    let mut job_lines: Vec<usize> = Vec::new();
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
            "gpus" => s.gpus = num(line, "gpus", one("gpus")?)?,
            "steps" => s.steps = num(line, "steps", one("steps")?)?,
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
            "gamma" => s.config.gamma = num(line, "gamma", one("gamma")?)?,
            "rt_penalty" => s.config.rt_penalty = num(line, "rt_penalty", one("rt_penalty")?)?,
            "rt" => rts.push(RawRt {
                line,
                app: parse_rt(line, &rest)?,
            }),
            "job" => {
                s.jobs.push(parse_job(line, &rest)?);
                job_lines.push(line);
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
        return Err(err(0, "the scenario needs a `gpus N` line with N >= 1"));
    }
    if s.steps == 0 {
        return Err(err(0, "`steps` must be at least 1"));
    }
    if !(s.config.gamma > 0.0 && s.config.gamma <= 1.0) {
        return Err(err(0, "`gamma` must be in (0, 1]; use 1 for no decay"));
    }
    if !(s.config.rt_penalty > 0.0 && s.config.rt_penalty.is_finite()) {
        return Err(err(
            0,
            "`rt_penalty` must be a positive number (the post uses 5 to 10)",
        ));
    }
    for r in &rts {
        validate_rt(&s, r)?;
    }
    s.rt = rts.into_iter().map(|r| r.app).collect();
    for (j, line) in s.jobs.iter().zip(&job_lines) {
        validate_job(&s, j, *line)?;
    }
    let mut ids: Vec<u32> = s.jobs.iter().map(|j| j.id).collect();
    ids.sort_unstable();
    if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
        return Err(err(
            0,
            format!("job id {} appears twice; give every job its own id", w[0]),
        ));
    }
    let mut rids: Vec<u32> = s.rt.iter().map(|r| r.id).collect();
    rids.sort_unstable();
    if let Some(w) = rids.windows(2).find(|w| w[0] == w[1]) {
        return Err(err(
            0,
            format!(
                "rt app id {} appears twice; give every app its own id",
                w[0]
            ),
        ));
    }
    if s.rt.len() > usize::from(u16::MAX) {
        return Err(err(0, "at most 65535 rt apps are supported"));
    }
    Ok(s)
}

fn parse_rt(line: usize, rest: &[&str]) -> Result<RtApp, ParseError> {
    let mut pos = Vec::new();
    let mut swap_cap = 2;
    let mut previous = None;
    for tok in rest {
        if let Some((k, v)) = tok.split_once('=') {
            match k {
                "cap" => swap_cap = num(line, "cap", v)?,
                "prev" => {
                    let mut gs = Vec::new();
                    for g in v.split(',').filter(|g| !g.is_empty()) {
                        gs.push(num(line, "prev", g)?);
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
    let mut d = Vec::with_capacity(demand.len());
    for (t, v) in demand.iter().enumerate() {
        d.push(num(line, &format!("demand[{t}]"), v)?);
    }
    Ok(RtApp {
        id,
        demand: d,
        swap_cap,
        previous,
    })
}

fn validate_rt(s: &Scenario, r: &RawRt) -> Result<(), ParseError> {
    let line = r.line;
    let app = &r.app;
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
                "rt app {} wants {d} GPUs at step {t} but there are only {} GPUs",
                app.id, s.gpus
            ),
        ));
    }
    if let Some(prev) = &app.previous {
        if let Some(g) = prev.iter().find(|g| **g >= s.gpus) {
            return Err(err(
                line,
                format!("prev= names GPU {g}, but GPUs are 0..{}", s.gpus),
            ));
        }
        let mut p = prev.clone();
        p.sort_unstable();
        p.dedup();
        if p.len() != prev.len() {
            return Err(err(line, "prev= lists a GPU twice"));
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
                "running" => running = Some(num(line, "running", v)?),
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
        size: num(line, "size", size)?,
        duration: num(line, "duration", dur)?,
        priority: num(line, "priority", prio)?,
        arrival: num(line, "arrival", arrival)?,
        running,
    })
}

fn validate_job(s: &Scenario, j: &Job, line: usize) -> Result<(), ParseError> {
    if j.size == 0 || !j.size.is_power_of_two() {
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
            format!("job {}: size {} exceeds the {} GPUs", j.id, j.size, s.gpus),
        ));
    }
    if j.duration == 0 {
        return Err(err(
            line,
            format!("job {}: duration must be at least 1 step", j.id),
        ));
    }
    if j.priority == 0 {
        return Err(err(
            line,
            format!("job {}: priority must be at least 1", j.id),
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
                format!("job {}: a running job must have arrival 0", j.id),
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
