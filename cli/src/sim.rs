//! `ace sim`: run ACE and the gateways' and packers' strategies over the
//! same fleet and trace, and compare cost, SLO attainment, served
//! fraction, owned-GPU utilisation and compliance (see the `ace-sim`
//! crate).

use ace_cli::out;
use ace_sim::report::{Comparison, PolicyFigures, Setting};
use ace_sim::slo::Targets;
use ace_sim::trace::{self, Shape, Trace};
use ace_sim::{PolicyKind, Simulation, MAX_RUN_MS};
use anyhow::{anyhow, bail, Context};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// The shared Azure trace, where a checkout of this repository finds it.
pub const DEFAULT_TRACE: &str = "../shared/traces/AzureLLMInferenceTrace_conv_2023.csv";

/// Arguments of `ace sim`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Policy directory (schema, policies, fleet manifest).
    #[arg(long, default_value = "policies")]
    policies: PathBuf,
    /// Request trace: a CSV with TIMESTAMP, ContextTokens and
    /// GeneratedTokens columns, or the Mooncake format (JSON lines with
    /// timestamp, input_length, output_length and hash_ids, the prompt's
    /// 512-token blocks): a file ending .jsonl or .ndjson, or whose first
    /// non-blank character is `{`, is read as JSON lines. A trace with
    /// blocks brings the prompt caches into play, adds ace-locality and
    /// sglang-cache-aware to the policies, and is replayed as recorded
    /// unless --copies or --replay says otherwise.
    #[arg(long, default_value = DEFAULT_TRACE)]
    trace: PathBuf,
    /// Use a synthetic trace of this many requests instead (Poisson
    /// arrivals, Azure-like sizes).
    #[arg(long, value_name = "N", conflicts_with = "trace")]
    synthetic: Option<usize>,
    /// Spread the trace over a day with the diurnal curve, repeated this
    /// many times (default 48: 48 copies of the Azure hour, about 930,000
    /// requests; a trace with prompt blocks is replayed as recorded unless
    /// this is given).
    #[arg(long)]
    copies: Option<u32>,
    /// Replay the trace as recorded, sped up by this factor, instead of
    /// spreading it over a day.
    #[arg(long, value_name = "FACTOR")]
    replay: Option<f64>,
    /// How many seeds (runs per policy).
    #[arg(long, default_value_t = 5)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Only these policies (repeatable): ace, ace-no-model-routing
    /// (dispatch alone: no model substitution), all-payg,
    /// litellm-simple-shuffle, litellm-least-busy, litellm-usage-based,
    /// litellm-latency-based, litellm-cost-based, LiteLLM as an operator
    /// would configure it (litellm-cost-based-knee,
    /// litellm-cost-based-compliant, litellm-cost-based-team-alias,
    /// litellm-cost-based-team-alias-split, litellm-cost-based-order,
    /// litellm-cost-based-order-split),
    /// priority-gateway, owned-first; on a trace with prompt blocks also
    /// ace-locality (ACE with prefix locality) and sglang-cache-aware (an
    /// engine-side prefix-aware router). Default: all of them.
    #[arg(long = "policy", value_name = "NAME")]
    policy: Vec<String>,
    /// The request mix (tenants, classes, models): a TOML file like the
    /// crate's `mix.toml`, the default.
    #[arg(long, value_name = "FILE")]
    mix: Option<PathBuf>,
    /// SLO targets per latency class, a TOML file (`[[classes]]` with
    /// class, ttft_ms, e2e_base_ms, e2e_per_token_ms), instead of the fleet
    /// manifest's `[slo]`. ACE ranks by the same targets it is judged by.
    #[arg(long, value_name = "FILE")]
    slo: Option<PathBuf>,
    /// The attainment (and served fraction) a policy must reach in every
    /// latency class to count as meeting the SLO.
    #[arg(long, default_value_t = 0.95)]
    slo_bar: f64,
    /// Write the comparison as JSON here.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Draw the charts (SVG) into this directory.
    #[arg(long, value_name = "DIR")]
    charts: Option<PathBuf>,
    /// Write every run's events (the filter's access-log line format, one
    /// per request; ACE's written by the filter's own code) into this
    /// directory, with the plugin configurations that `ace ledger ingest
    /// --config` needs (`plugin-config.json`, and for ACE without model
    /// routing `plugin-config-ace-no-model-routing.json`).
    #[arg(long, value_name = "DIR")]
    events: Option<PathBuf>,
    /// Inject this failure instead of the default set (repeatable):
    /// `DESTINATION:KIND:FROM-TO` with KIND `outage`, `errors=FRACTION` or
    /// `slowdown=FACTOR` and FROM-TO in minutes into the run, e.g.
    /// `mistral-eu:outage:0-1440`.
    #[arg(long = "fault", value_name = "SPEC")]
    faults: Vec<String>,
    /// Inject no failures.
    #[arg(long, conflicts_with = "faults")]
    no_faults: bool,
    /// Run ACE without the control service's snapshots.
    #[arg(long)]
    no_control: bool,
    /// Worker threads (default: the machine's cores).
    #[arg(long)]
    threads: Option<usize>,
    /// What the simulated engines and APIs do, apart from the manifest: a
    /// TOML file with any of knee_factor, knee_wait_ms, batch_slowdown,
    /// past_knee_slowdown, prefill_tps, api_ttft_median_ms,
    /// api_ttft_sigma, api_tokens_per_s (`ace_sim::fleet::FleetModel`;
    /// the rest keep their defaults).
    #[arg(long, value_name = "FILE")]
    fleet_model: Option<PathBuf>,
    /// Shadow mode: replay the requests a real Envoy logged (the access
    /// log the filter writes its `ace.event` lines into; repeatable) under
    /// every policy, instead of a trace and a mix: what each would have
    /// cost on this traffic, as it arrived.
    #[arg(long, value_name = "LOG", conflicts_with_all = ["trace", "synthetic", "copies", "replay", "mix"])]
    shadow: Vec<PathBuf>,
    /// The engines' true knee as a multiple of the manifest's (1: the
    /// manifest is right; 0.75: latency climbs from three quarters of the
    /// utilisation ACE prices and operators cap by). Overrides the fleet
    /// model file's knee_factor.
    #[arg(long, value_name = "FACTOR")]
    fleet_knee: Option<f64>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut sim = build(&args)?;
    let kinds: Vec<PolicyKind> = if args.policy.is_empty() {
        PolicyKind::defaults(!sim.block_ids.is_empty())
    } else {
        args.policy
            .iter()
            .map(|n| {
                PolicyKind::parse(n).ok_or_else(|| {
                    anyhow!(
                        "no policy `{n}`; the policies are {}",
                        PolicyKind::every()
                            .map(PolicyKind::name)
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })
            })
            .collect::<anyhow::Result<_>>()?
    };
    if args.seeds == 0 {
        bail!("--seeds must be at least 1");
    }
    let Some(end) = args.seed.checked_add(args.seeds) else {
        bail!(
            "--seed {} with --seeds {} runs past the last seed ({})",
            args.seed,
            args.seeds,
            u64::MAX
        );
    };
    let seeds: Vec<u64> = (args.seed..end).collect();
    sim.draw_mix(&seeds);
    if let Some(dir) = &args.events {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create `{}`", dir.display()))?;
        std::fs::write(dir.join("plugin-config.json"), &sim.config_json)
            .with_context(|| format!("cannot write into `{}`", dir.display()))?;
        // ACE as dispatch alone, and ACE with locality, run (and their
        // lines name) their own.
        for kind in [PolicyKind::AceNoRouting, PolicyKind::AceLocality] {
            if kinds.contains(&kind) {
                let name = format!("plugin-config-{}.json", kind.name());
                std::fs::write(dir.join(&name), sim.config_json_of(kind)?)
                    .with_context(|| format!("cannot write `{name}` into `{}`", dir.display()))?;
            }
        }
    }
    let runs = run_all(&sim, &kinds, &seeds, args.events.as_deref(), args.threads)?;
    let policies = kinds
        .iter()
        .zip(runs)
        .map(|(k, runs)| PolicyFigures::new(k.name(), k.substitutes(), runs))
        .collect();
    let comparison = Comparison {
        setting: Setting {
            trace: match args.synthetic {
                _ if !args.shadow.is_empty() => format!(
                    "shadow: {}",
                    args.shadow
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                Some(n) => format!("synthetic ({n} requests)"),
                None => args.trace.display().to_string(),
            },
            requests: sim.reqs.len(),
            seeds,
            shape: match shape_of(&args, !sim.block_ids.is_empty()) {
                _ if !args.shadow.is_empty() => "as logged".to_string(),
                Ok(Shape::Replay { speedup }) => format!("replayed at {speedup}x"),
                Ok(Shape::Day { copies }) => {
                    format!("{copies} copies over a day (diurnal curve)")
                }
                Err(e) => return Err(e),
            },
            fleet_model: sim.fleet_model(),
        },
        policies,
        slo_bar: args.slo_bar,
    };
    out!("{}", comparison.table());
    if let Some(p) = &args.json {
        let text = serde_json::to_string_pretty(&comparison)? + "\n";
        std::fs::write(p, text).with_context(|| format!("cannot write `{}`", p.display()))?;
    }
    if let Some(dir) = &args.charts {
        for f in ace_sim::chart::write_all(&comparison, dir).map_err(|e| anyhow!(e))? {
            eprintln!("wrote {}", f.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The most requests one run may hold: every simulated request stays in
/// memory for the run, on each thread.
const MAX_REQUESTS: u64 = 100_000_000;

/// The simulation `args` describe.
pub fn build(args: &Args) -> anyhow::Result<Simulation> {
    let targets = match &args.slo {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("cannot read `{}`", p.display()))?;
            toml::from_str::<Targets>(&text)
                .with_context(|| format!("`{}` is not an SLO file", p.display()))?
        }
        // The manifest's, which the filter ranks by; else ordinary chat
        // targets.
        None => ace_policy::load_dir(&args.policies)
            .ok()
            .and_then(|p| Targets::from_manifest(&p.manifest.manifest))
            .unwrap_or_default(),
    };
    if !(0.0..=1.0).contains(&args.slo_bar) {
        bail!("--slo-bar {}: a fraction between 0 and 1", args.slo_bar);
    }
    let mut sim = if args.shadow.is_empty() {
        from_trace(args, targets)?
    } else {
        let (sim, read) =
            ace_cli::shadow::simulation(&args.policies, &args.shadow, targets, args.seed)?;
        if let Some(first) = &read.first_skipped {
            eprintln!(
                "shadow: {} requests; {} lines were not events (the first: {first})",
                read.logged.len(),
                read.skipped
            );
        }
        sim
    };
    sim.control = !args.no_control;
    let mut model = match &args.fleet_model {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("cannot read `{}`", p.display()))?;
            toml::from_str::<ace_sim::fleet::FleetModel>(&text)
                .with_context(|| format!("`{}` is not a fleet model", p.display()))?
        }
        None => ace_sim::fleet::FleetModel::default(),
    };
    if let Some(k) = args.fleet_knee {
        model.knee_factor = k;
    }
    sim.set_fleet_model(model).map_err(|e| {
        anyhow!(
            "{e}{}",
            match (&args.fleet_model, args.fleet_knee) {
                (_, Some(k)) if !(k.is_finite() && k > 0.0) => format!(" (--fleet-knee {k})"),
                (Some(p), _) => format!(" (in `{}`)", p.display()),
                _ => String::new(),
            }
        )
    })?;
    if args.no_faults {
        sim.faults = Some(Vec::new());
    } else if !args.faults.is_empty() {
        let names: Vec<&str> = sim.params.iter().map(|p| p.name.as_str()).collect();
        sim.faults = Some(
            args.faults
                .iter()
                .map(|f| parse_fault(f, &names))
                .collect::<anyhow::Result<_>>()?,
        );
    }
    Ok(sim)
}

/// How the trace is played: `--replay`, else `--copies` (default 48), but
/// a trace with prompt `blocks` as recorded unless `--copies` is given (a
/// conversation's turns keep their real spacing, and no copy replays
/// another's conversations).
fn shape_of(args: &Args, blocks: bool) -> anyhow::Result<Shape> {
    Ok(match (args.replay, args.copies) {
        (Some(f), _) if f.is_finite() && f > 0.0 => Shape::Replay { speedup: f },
        (Some(f), _) => bail!("--replay {f}: the speed-up must be a number > 0"),
        (None, Some(0)) => bail!("--copies must be at least 1"),
        (None, Some(copies)) => Shape::Day { copies },
        (None, None) if blocks => Shape::Replay { speedup: 1.0 },
        (None, None) => Shape::Day { copies: 48 },
    })
}

/// The simulation of a trace and a mix.
fn from_trace(args: &Args, targets: Targets) -> anyhow::Result<Simulation> {
    let project = ace_policy::load_dir(&args.policies).map_err(|e| anyhow!("{e}"))?;
    let config = ace_cli::plugin::project_config(&project, false, true)?;
    let config_json = serde_json::to_vec(&config)?;
    let trace = match args.synthetic {
        Some(0) => bail!("--synthetic 0: give at least one request"),
        Some(n) => Trace::synthetic(args.seed, n, 20.0),
        None => Trace::read(&args.trace).map_err(|e| {
            anyhow!("{e}").context(if args.trace.as_os_str() == DEFAULT_TRACE {
                "the default trace is the shared Azure trace next to this checkout; give --trace FILE or --synthetic N"
            } else {
                "give a CSV with TIMESTAMP, ContextTokens and GeneratedTokens columns, or Mooncake JSON lines (timestamp, input_length, output_length, hash_ids)"
            })
        })?,
    };
    let shape = shape_of(args, trace.has_blocks())?;
    if let Shape::Day { copies } = shape {
        let requests = trace.rows.len() as u64 * u64::from(copies);
        if requests > MAX_REQUESTS {
            bail!(
                "--copies {copies}: {requests} requests per run; at most {MAX_REQUESTS} (each \
                 simulated request is held in memory for the run)"
            );
        }
    }
    let arrivals = trace::arrivals(&trace, shape);
    // Times within a run are kept in u32 milliseconds (49 days); a day
    // spread, or a replay at most about 40 days long, fits.
    let last = arrivals.last().map_or(0, |r| r.at_ms);
    if last > MAX_RUN_MS {
        bail!(
            "the run would last {:.0} days (the trace replayed at {}x); at most {} days: give \
             --replay a larger factor",
            last as f64 / 86_400_000.0,
            args.replay.unwrap_or(1.0),
            MAX_RUN_MS / 86_400_000
        );
    }
    let (mix_source, mix_text) = match &args.mix {
        Some(p) => (
            p.display().to_string(),
            std::fs::read_to_string(p).with_context(|| format!("cannot read `{}`", p.display()))?,
        ),
        None => (
            "the default mix".to_string(),
            ace_sim::mix::DEFAULT.to_string(),
        ),
    };
    let mut sim = Simulation::with_blocks(
        config_json,
        &ace_sim::Placement::of(&project),
        &ace_sim::model_tp(&project),
        &arrivals,
        trace.block_ids,
        &mix_source,
        &mix_text,
        targets,
        args.seed,
    )
    .map_err(|e| anyhow!("{e}"))?;
    sim.add_dispatch_only(&project.sources)
        .map_err(|e| anyhow!("{e}"))?;
    Ok(sim)
}

/// A `--fault` spec against the fleet's destination `names`.
fn parse_fault(spec: &str, names: &[&str]) -> anyhow::Result<ace_sim::fleet::Fault> {
    use ace_sim::fleet::{Fault, FaultKind};
    let usage = "expected DESTINATION:KIND:FROM-TO, KIND one of outage, errors=FRACTION, slowdown=FACTOR, FROM-TO in minutes";
    let mut parts = spec.splitn(3, ':');
    let (Some(dest), Some(kind), Some(span)) = (parts.next(), parts.next(), parts.next()) else {
        bail!("--fault {spec}: {usage}");
    };
    let d = names.iter().position(|n| *n == dest).ok_or_else(|| {
        anyhow!(
            "--fault {spec}: no destination `{dest}` in the fleet ({})",
            names.join(", ")
        )
    })?;
    let kind = match kind.split_once('=') {
        None if kind == "outage" => FaultKind::Outage,
        Some(("errors", v)) => match v.parse::<f64>() {
            Ok(p) if (0.0..=1.0).contains(&p) => FaultKind::Errors(p),
            _ => bail!("--fault {spec}: errors={v} is not a fraction between 0 and 1"),
        },
        Some(("slowdown", v)) => match v.parse::<f64>() {
            Ok(f) if f.is_finite() && f >= 1.0 => FaultKind::Slowdown(f),
            _ => bail!("--fault {spec}: slowdown={v} is not a factor >= 1"),
        },
        _ => bail!("--fault {spec}: unknown kind `{kind}`; {usage}"),
    };
    let (from, to) = span
        .split_once('-')
        .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)))
        .filter(|(a, b)| a < b)
        .ok_or_else(|| anyhow!("--fault {spec}: `{span}` is not FROM-TO minutes with FROM < TO"))?;
    let ms = |m: u64| m.checked_mul(60_000);
    let (Some(from_ms), Some(to_ms)) = (ms(from), ms(to)) else {
        bail!("--fault {spec}: `{span}` is more minutes than a run can last");
    };
    Ok(Fault {
        dest: d,
        from_ms,
        to_ms,
        kind,
    })
}

/// Every (policy, seed) run, on `threads` threads; per policy, its runs in
/// seed order (so the output never depends on scheduling).
pub fn run_all(
    sim: &Simulation,
    kinds: &[PolicyKind],
    seeds: &[u64],
    events: Option<&std::path::Path>,
    threads: Option<usize>,
) -> anyhow::Result<Vec<Vec<ace_sim::metrics::Metrics>>> {
    let jobs: Vec<(usize, usize)> = (0..kinds.len())
        .flat_map(|k| (0..seeds.len()).map(move |s| (k, s)))
        .collect();
    let total = jobs.len() as u64 * sim.reqs.len() as u64;
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(total),
        indicatif::ProgressDrawTarget::stderr_with_hz(4),
    );
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:40}] {percent}% {human_pos}/{human_len} simulated requests, eta {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let done = AtomicU64::new(0);
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<anyhow::Result<ace_sim::metrics::Metrics>>>> =
        Mutex::new((0..jobs.len()).map(|_| None).collect());
    let threads = threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, jobs.len().max(1));
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(k, si)) = jobs.get(i) else { break };
                let (Some(&kind), Some(&seed)) = (kinds.get(k), seeds.get(si)) else {
                    break;
                };
                // Each run reports how far it is; the bar shows the sum.
                let reported = std::cell::Cell::new(0u64);
                let counter = |n: u64| {
                    let delta = n.saturating_sub(reported.replace(n));
                    let all = done.fetch_add(delta, Ordering::Relaxed) + delta;
                    bar.set_position(all);
                };
                let result = (|| -> anyhow::Result<ace_sim::metrics::Metrics> {
                    let mut file = match events {
                        Some(dir) => {
                            let p = dir.join(format!("{}-seed{seed}.log", kind.name()));
                            Some(std::io::BufWriter::new(
                                std::fs::File::create(&p)
                                    .with_context(|| format!("cannot create `{}`", p.display()))?,
                            ))
                        }
                        None => None,
                    };
                    let m = sim
                        .run(
                            kind,
                            seed,
                            file.as_mut().map(|f| f as &mut dyn Write),
                            &counter,
                        )
                        .map_err(|e| anyhow!("{} seed {seed}: {e}", kind.name()))?;
                    if let Some(f) = file.as_mut() {
                        f.flush().context("cannot write the events")?;
                    }
                    Ok(m)
                })();
                if let Ok(mut r) = results.lock() {
                    if let Some(slot) = r.get_mut(i) {
                        *slot = Some(result);
                    }
                }
            });
        }
    });
    bar.finish_and_clear();
    let results = results
        .into_inner()
        .map_err(|_| anyhow!("a simulation thread panicked"))?;
    let mut out: Vec<Vec<ace_sim::metrics::Metrics>> = kinds.iter().map(|_| Vec::new()).collect();
    for ((k, _), r) in jobs.into_iter().zip(results) {
        let m = r.ok_or_else(|| anyhow!("a simulation thread stopped early"))??;
        if let Some(v) = out.get_mut(k) {
            v.push(m);
        }
    }
    Ok(out)
}
