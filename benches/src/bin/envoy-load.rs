//! Envoy under a fixed load, three ways: plain Envoy, Envoy with a no-op
//! Wasm filter, and Envoy with ACE, so that ACE's own share of the latency
//! is the difference between the last two.
//!
//! ```sh
//! make wasm   # or let this build the filters
//! cargo run --release -p ace-benches --bin envoy-load -- [SECONDS] [CONNECTIONS]
//! cargo run --release -p ace-benches --bin envoy-load -- --calibrate [SECONDS] [CONNECTIONS]
//! ```
//!
//! `--calibrate` prices Envoy's host calls instead: the no-op filter making
//! 20 calls of one kind per request, against the plain no-op, so the
//! difference in Envoy CPU per request over 20 is the cost of one call.
//!
//! Each variant runs Envoy with one worker in front of the same in-process
//! upstream; `wrk` (closed loop, one thread, CONNECTIONS connections, default
//! 10 s and 8) drives it after a 2 s warm-up. Prints requests/s, p50 and p99,
//! and Envoy's own CPU time per request (from `/proc`): on a shared machine
//! latency and throughput move with everything else that runs, but the CPU
//! Envoy spends per request does not, so ACE's share is read from that.

use ace_harness::envoy::EnvoyBuilder;
use ace_harness::upstream::Upstream;
use serde_json::json;
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

fn run() -> Result<(), String> {
    let mut args: Vec<String> = std::env::args().collect();
    let calibrate = args.iter().any(|a| a == "--calibrate");
    args.retain(|a| a != "--calibrate");
    let secs: u32 = args
        .get(1)
        .map_or(Ok(10), |s| s.parse())
        .map_err(|e| format!("SECONDS: {e}"))?;
    let conns: u32 = args
        .get(2)
        .map_or(Ok(8), |s| s.parse())
        .map_err(|e| format!("CONNECTIONS: {e}"))?;
    if Command::new("wrk").arg("--version").output().is_err() {
        return Err("wrk is not installed; run `make setup`".into());
    }
    let ace = ace_harness::wasm::build("ace-filter")?;
    let noop = ace_harness::wasm::build("ace-bench-noop-filter")?;
    let up = Upstream::start("upstream").map_err(|e| e.to_string())?;
    let fixed_route = json!({"cluster": "owned", "timeout": "30s"});
    let ace_config = json!({"destinations": [
        {"name": "payg", "cluster": "payg", "tier": "payg",
         "usd_per_input_token": 2.5e-6, "usd_per_output_token": 1e-5},
        {"name": "reserved", "cluster": "reserved", "tier": "reserved", "capacity": 100000,
         "usd_per_input_token": 1e-9, "usd_per_output_token": 1e-9},
        {"name": "owned", "cluster": "owned", "tier": "inhouse", "capacity": 100000,
         "usd_per_input_token": 1e-10, "usd_per_output_token": 1e-10}
    ]})
    .to_string();
    let base = || {
        EnvoyBuilder::new()
            .concurrency(1)
            .log_level("warn")
            .cluster("owned", up.port())
            .cluster("reserved", up.port())
            .cluster("payg", up.port())
    };
    if calibrate {
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
        let rows = measure(variants, secs, conns)?;
        if let Some((_, _, base_cpu)) = rows.first() {
            println!("\nEnvoy CPU per host call (difference over the no-op, / {CALLS}):");
            for (name, _, cpu) in rows.iter().skip(1) {
                println!(
                    "  {name:<24} {:>6.2} µs",
                    (cpu - base_cpu) / f64::from(CALLS)
                );
            }
        }
        return Ok(());
    }
    let variants = vec![
        ("plain Envoy".to_string(), base().route(fixed_route.clone())),
        (
            "no-op Wasm filter".to_string(),
            base().route(fixed_route).wasm_filter(&noop, ""),
        ),
        (
            "ACE filter".to_string(),
            base().wasm_filter(&ace, &ace_config),
        ),
    ];
    let rows = measure(variants, secs, conns)?;
    if let [_, (_, noop, noop_cpu), (_, ace, ace_cpu)] = rows.as_slice() {
        println!(
            "\nACE's own share over the no-op filter: p50 {:+.0} µs, p99 {:+.0} µs, Envoy CPU {:+.1} µs per request",
            ace.p50_us - noop.p50_us,
            ace.p99_us - noop.p99_us,
            ace_cpu - noop_cpu
        );
    }
    Ok(())
}

/// Host calls per request in a calibration variant.
const CALLS: u32 = 20;

/// Run each variant (a warm-up, then the measured run) and print its row.
fn measure(
    variants: Vec<(String, EnvoyBuilder)>,
    secs: u32,
    conns: u32,
) -> Result<Vec<(String, Stats, f64)>, String> {
    println!("Envoy 1.40, 1 worker, wrk -t1 -c{conns} -d{secs}s, POST of a 200-byte JSON body\n");
    println!(
        "{:<24} {:>10} {:>10} {:>10} {:>8} {:>16}",
        "variant", "req/s", "p50 µs", "p99 µs", "errors", "Envoy CPU µs/req"
    );
    let mut rows = Vec::new();
    for (name, builder) in variants {
        let envoy = builder.start().map_err(|e| e.to_string())?;
        let _warm = wrk(envoy.port(), 2, conns)?;
        let before = envoy.cpu_time();
        let s = wrk(envoy.port(), secs, conns)?;
        let cpu_us = match (before, envoy.cpu_time()) {
            (Some(a), Some(b)) if s.requests > 0 => {
                (b.saturating_sub(a)).as_secs_f64() * 1e6 / s.requests as f64
            }
            _ => f64::NAN,
        };
        println!(
            "{:<24} {:>10.0} {:>10.0} {:>10.0} {:>8} {:>16.1}",
            name, s.rps, s.p50_us, s.p99_us, s.errors, cpu_us
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
        rows.push((name, s, cpu_us));
    }
    Ok(rows)
}

const SCRIPT: &str = r#"
wrk.method = "POST"
wrk.headers["content-type"] = "application/json"
wrk.body = '{"model":"llama-3.1-70b","max_tokens":128,"messages":[{"role":"user","content":"Summarise the quarterly report in three bullet points, please, for the board."}]}'
"#;

fn wrk(port: u16, secs: u32, conns: u32) -> Result<Stats, String> {
    let dir = std::env::temp_dir().join(format!("ace-wrk-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let script = dir.join("post.lua");
    std::fs::write(&script, SCRIPT).map_err(|e| e.to_string())?;
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
