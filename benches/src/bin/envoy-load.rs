//! Envoy under a fixed load, three ways: plain Envoy, Envoy with a no-op
//! Wasm filter, and Envoy with ACE, so that ACE's own share of the latency
//! is the difference between the last two.
//!
//! ```sh
//! make wasm   # or let this build the filters
//! cargo run --release -p ace-benches --bin envoy-load -- [SECONDS] [CONNECTIONS]
//! ```
//!
//! Each variant runs Envoy with one worker in front of the same in-process
//! upstream; `wrk` (closed loop, one thread, CONNECTIONS connections, default
//! 10 s and 8) drives it after a 2 s warm-up. Prints requests/s, p50 and p99.

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
    p50_us: f64,
    p99_us: f64,
    errors: u64,
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
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
    let variants: [(&str, EnvoyBuilder); 3] = [
        ("plain Envoy", base().route(fixed_route.clone())),
        (
            "no-op Wasm filter",
            base().route(fixed_route).wasm_filter(&noop, ""),
        ),
        ("ACE filter", base().wasm_filter(&ace, &ace_config)),
    ];
    println!("Envoy 1.40, 1 worker, wrk -t1 -c{conns} -d{secs}s, POST of a 200-byte JSON body\n");
    println!(
        "{:<20} {:>10} {:>10} {:>10} {:>8}",
        "variant", "req/s", "p50 µs", "p99 µs", "errors"
    );
    let mut rows = Vec::new();
    for (name, builder) in variants {
        let envoy = builder.start().map_err(|e| e.to_string())?;
        let _warm = wrk(envoy.port(), 2, conns)?;
        let s = wrk(envoy.port(), secs, conns)?;
        println!(
            "{:<20} {:>10.0} {:>10.0} {:>10.0} {:>8}",
            name, s.rps, s.p50_us, s.p99_us, s.errors
        );
        rows.push((name, s));
    }
    if let [_, (_, noop), (_, ace)] = rows.as_slice() {
        println!(
            "\nACE's own share over the no-op filter: p50 {:+.0} µs, p99 {:+.0} µs",
            ace.p50_us - noop.p50_us,
            ace.p99_us - noop.p99_us
        );
    }
    Ok(())
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
    let mut errors = 0;
    for line in text.lines() {
        let l = line.trim();
        if let Some(v) = l.strip_prefix("50%") {
            p50 = dur_us(v);
        } else if let Some(v) = l.strip_prefix("99%") {
            p99 = dur_us(v);
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
        p50_us: p50?,
        p99_us: p99?,
        errors,
    })
}
