//! `ace plan`: plan owned GPUs over a 24 h horizon and compare with the
//! baselines; size reserved capacity; replay a rolling horizon; measure fast
//! mode over random scenarios and arrival orders.
//!
//! All logic lives in `ace-planner`; this module parses arguments, reads files
//! and prints. The scenario format is documented in `planner/README.md`.
use ace_planner::commit::{self, Prices, TraceModel};
use ace_planner::compare::{self, Comparison};
use ace_planner::{full, gen, parse, rolling, study, Scenario};
use anyhow::Context as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use ace_cli::{out, outln};

/// Exit code when a plan fails the checker: a planner fault.
const INVALID_PLAN: u8 = 4;

/// Exit code when the scenario is well formed but admits no valid plan.
const NO_VALID_PLAN: u8 = 5;

/// A time limit in seconds: finite and positive.
fn seconds(v: &str) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        _ => Err(format!(
            "`{v}` is not a positive number of seconds, e.g. 60"
        )),
    }
}

/// Arguments of `ace plan`.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Scenario file (see planner/README.md), e.g. planner/scenarios/s1.
    file: Option<PathBuf>,
    /// Print one JSON object with a member per policy (fifo, greedy, fast,
    /// full) instead of the grid and table.
    #[arg(long)]
    json: bool,
    /// Skip full mode (the MILP).
    #[arg(long)]
    no_full: bool,
    /// Full mode's time limit in seconds (positive).
    #[arg(long, default_value_t = 60.0, value_parser = seconds)]
    time_limit: f64,
    /// Which policy's grid to draw: fifo, greedy, fast or full.
    #[arg(long, default_value = "fast")]
    grid: String,
    /// Draw at most this many GPU rows.
    #[arg(long, default_value_t = 128)]
    max_rows: u32,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Recommend reserved capacity with the critical-fractile rule and print
    /// the buy-versus-spill cost curve.
    Commit(CommitArgs),
    /// Replay the rolling horizon over a scenario: plan 24 steps, commit one,
    /// re-plan; print each step's owned RT capacity.
    Roll {
        /// Scenario file.
        file: PathBuf,
        /// Steps to commit.
        #[arg(long, default_value_t = 24)]
        steps: u32,
        /// Print JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Fast mode vs FIFO and the stand-in over random scenarios (the
    /// documented generator) and, with FILE, over random arrival orders.
    Study {
        /// Scenario whose arrival order to permute; random scenarios if absent.
        file: Option<PathBuf>,
        /// Scenarios (or orders) to run.
        #[arg(long, default_value_t = 1000)]
        count: u64,
        /// First seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write a random scenario in the scenario format.
    Gen {
        /// Seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

#[derive(Debug, clap::Args)]
struct CommitArgs {
    /// Demand history: the Azure LLM trace CSV
    /// (TIMESTAMP,ContextTokens,GeneratedTokens) or a file with one GPU count
    /// per line.
    #[arg(long)]
    trace: PathBuf,
    /// Committed price per GPU-hour.
    #[arg(long, default_value_t = 0.6)]
    reserved: f64,
    /// On-demand price per GPU-hour.
    #[arg(long, default_value_t = 1.0)]
    on_demand: f64,
    /// Burst capacity cannot be bought: overflow costs the RT penalty.
    #[arg(long)]
    no_burst: bool,
    /// Cost per unmet GPU-hour when burst cannot be bought.
    #[arg(long, default_value_t = 6.0)]
    penalty: f64,
    /// Tokens (context + generated) one GPU serves per second (trace input).
    #[arg(long, default_value_t = 1000.0)]
    tokens_per_gpu_s: f64,
    /// Peak/trough ratio of the daily shape laid over the one-hour trace
    /// (1 = per-minute samples of the trace hour only).
    #[arg(long, default_value_t = 2.5)]
    diurnal: f64,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

fn load(path: &Path) -> anyhow::Result<Scenario> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read scenario file {}", path.display()))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    parse(&text, &name).with_context(|| format!("{} is not a valid scenario", path.display()))
}

/// Runs `ace plan`. Exit codes: 0 success, 1 unreadable or malformed input,
/// 4 a policy produced a plan the checker rejects (a planner fault), 5 the
/// scenario is well formed but no valid plan exists (the message says why).
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    match run_command(args) {
        Err(e)
            if e.chain().any(|c| {
                c.downcast_ref::<ace_planner::ParseError>()
                    .is_some_and(|p| p.infeasible)
            }) =>
        {
            eprintln!("error: {e:#}");
            Ok(ExitCode::from(NO_VALID_PLAN))
        }
        other => other,
    }
}

fn run_command(args: Args) -> anyhow::Result<ExitCode> {
    match args.command {
        Some(Command::Commit(c)) => return commitment(&c),
        Some(Command::Roll { file, steps, json }) => return roll(&file, steps, json),
        Some(Command::Study {
            file,
            count,
            seed,
            json,
        }) => return run_study(file.as_deref(), count, seed, json),
        Some(Command::Gen { seed }) => {
            out!("{}", ace_planner::scenario::to_text(&gen::scenario(seed)));
            return Ok(ExitCode::SUCCESS);
        }
        None => {}
    }
    let Some(file) = args.file else {
        anyhow::bail!("give a scenario file, e.g. `ace plan planner/scenarios/s1`, or a subcommand (see `ace plan --help`)");
    };
    let s = load(&file)?;
    let full_opts = (!args.no_full).then_some(full::Options {
        time_limit_s: args.time_limit,
        ..full::Options::default()
    });
    let c = compare::compare(&s, full_opts);
    if args.json {
        outln!("{}", serde_json::to_string(&c)?);
    } else {
        print_human(&s, &c, &args.grid, args.max_rows)?;
    }
    let bad = [Some(&c.fast), c.full.as_ref().filter(|f| f.error.is_none())]
        .into_iter()
        .flatten()
        .any(|r| !r.valid);
    Ok(if bad {
        ExitCode::from(INVALID_PLAN)
    } else {
        ExitCode::SUCCESS
    })
}

fn print_human(s: &Scenario, c: &Comparison, which: &str, max_rows: u32) -> anyhow::Result<()> {
    let chosen = match which {
        "fifo" => Some(&c.fifo),
        "greedy" => Some(&c.greedy),
        "fast" => Some(&c.fast),
        "full" => c.full.as_ref(),
        other => anyhow::bail!("--grid {other}: expected fifo, greedy, fast or full"),
    };
    outln!(
        "{}: {} GPUs x {} steps, {} RT apps, {} jobs",
        s.name,
        s.gpus,
        s.steps,
        s.rt.len(),
        s.jobs.len()
    );
    match chosen.and_then(|r| r.plan.as_ref()) {
        Some(plan) => {
            outln!("\n{which} plan (rows = GPUs, columns = hours; R<id> = RT app, number = batch job id, . = idle):");
            out!("{}", compare::grid(s, plan, max_rows));
        }
        None => outln!("\n(no {which} plan to draw)"),
    }
    outln!();
    out!("{}", compare::table(c));
    Ok(())
}

fn commitment(c: &CommitArgs) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(&c.trace)
        .with_context(|| format!("cannot read demand history {}", c.trace.display()))?;
    let demand = if text.starts_with("TIMESTAMP") {
        commit::demand_from_azure_trace(
            &text,
            TraceModel {
                tokens_per_gpu_s: c.tokens_per_gpu_s,
                diurnal_ratio: c.diurnal,
            },
        )
    } else {
        commit::demand_from_lines(&text)
    }
    .map_err(|e| anyhow::anyhow!("{}: {e}", c.trace.display()))?;
    let rec = commit::recommend(
        &demand,
        Prices {
            reserved: c.reserved,
            on_demand: c.on_demand,
            burst_available: !c.no_burst,
            shortfall_penalty: c.penalty,
        },
    )
    .map_err(|e| anyhow::anyhow!(e))?;
    if c.json {
        outln!("{}", serde_json::to_string(&rec)?);
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "demand: {} samples, mean {:.1}, p90 {}, peak {} GPUs",
        rec.samples,
        rec.mean,
        rec.p90,
        rec.peak
    );
    outln!(
        "overflow price {:.2} ({}), ratio r/overflow = {:.3} -> commit to the {:.0}th percentile",
        rec.overflow_price,
        if c.no_burst {
            "RT penalty: burst cannot be bought"
        } else {
            "on-demand"
        },
        rec.ratio,
        rec.quantile * 100.0
    );
    outln!(
        "recommended commitment: {} GPUs (cost-curve minimum at {})",
        rec.commit,
        rec.curve_argmin
    );
    outln!(
        "expected cost/hour: {:.2} at {}, {:.2} at p90 ({}), {:.2} at peak ({}), {:.2} with none",
        rec.cost_at_commit,
        rec.commit,
        rec.cost_at_p90,
        rec.p90,
        rec.cost_at_peak,
        rec.peak,
        rec.cost_all_overflow
    );
    outln!(
        "\n{:>6} {:>10} {:>10} {:>10} {:>6}",
        "commit",
        "reserved",
        "spill",
        "total",
        "util"
    );
    let step = (rec.curve.len() / 25).max(1);
    for p in rec
        .curve
        .iter()
        .filter(|p| (p.commit as usize).is_multiple_of(step) || p.commit == rec.commit)
    {
        outln!(
            "{:>6} {:>10.2} {:>10.2} {:>10.2} {:>5.0}%{}",
            p.commit,
            p.reserved_cost,
            p.spill_cost,
            p.total,
            p.utilization * 100.0,
            if p.commit == rec.commit {
                "  <- c*"
            } else {
                ""
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn roll(file: &Path, steps: u32, json: bool) -> anyhow::Result<ExitCode> {
    let s = load(file)?;
    let mut r = rolling::Rolling::from_scenario(&s).map_err(|e| anyhow::anyhow!(e))?;
    let mut invalid = false;
    for _ in 0..steps {
        let st = r.step();
        invalid |= !st.report.valid();
        if json {
            let line = serde_json::json!({
                "step": st.at,
                "owned": st.owned,
                "started": st.started,
                "valid": st.report.valid(),
                "plan_value": st.report.value,
                "plan_utilization": st.report.utilization,
            });
            outln!("{line}");
        } else {
            let owned: Vec<String> = st
                .owned
                .iter()
                .map(|o| format!("app {}: {} GPUs", o.app, o.gpus))
                .collect();
            outln!(
                "step {:>3}: owned RT [{}]; started {:?}; plan util {:.1}% value {:.0}{}",
                st.at,
                owned.join(", "),
                st.started,
                st.report.utilization * 100.0,
                st.report.value,
                if st.report.valid() { "" } else { " INVALID" }
            );
        }
    }
    Ok(if invalid {
        ExitCode::from(INVALID_PLAN)
    } else {
        ExitCode::SUCCESS
    })
}

fn run_study(file: Option<&Path>, count: u64, seed: u64, json: bool) -> anyhow::Result<ExitCode> {
    let st = match file {
        Some(f) => study::orders(&load(f)?, count, seed),
        None => study::random(count, seed),
    };
    if json {
        outln!("{}", serde_json::to_string(&st)?);
    } else {
        outln!(
            "{} scenarios: fast invalid {}, fast below FIFO value {}, below stand-in value {}",
            st.scenarios,
            st.fast_invalid,
            st.fast_below_fifo_value,
            st.fast_below_greedy_value
        );
        let row = |name: &str, s: &study::Stats| {
            outln!(
                "{name:<28} mean {:>7.1}  p10 {:>7.1}  p50 {:>7.1}  p90 {:>7.1}  min {:>7.1}  max {:>7.1}",
                s.mean, s.p10, s.p50, s.p90, s.min, s.max
            );
        };
        row("value gain vs FIFO (%)", &st.value_gain_vs_fifo_pct);
        row("util gain vs FIFO (pts)", &st.util_gain_vs_fifo_pts);
        row("value gain vs stand-in (%)", &st.value_gain_vs_greedy_pct);
        row("util gain vs stand-in (pts)", &st.util_gain_vs_greedy_pts);
    }
    Ok(if st.fast_invalid > 0 {
        ExitCode::from(INVALID_PLAN)
    } else {
        ExitCode::SUCCESS
    })
}
