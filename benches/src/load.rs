//! The load generators: `wrk` (closed loop) and `h2load` (open loop, a
//! fixed rate), the requests they send, and reading what they report.

use crate::variant::Request;
use std::path::PathBuf;
use std::process::Command;

/// What one measured run of the load generator saw.
#[derive(Debug)]
pub struct Stats {
    pub rps: f64,
    pub requests: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub errors: u64,
}

/// The request body every run sends.
pub const BODY: &str = r#"{"model":"llama-3.1-70b","max_tokens":128,"messages":[{"role":"user","content":"Summarise the quarterly report in three bullet points, please, for the board."}]}"#;

/// The example fleet's request (the `acepol` family): a deterministic chat
/// completion for gpt-4o, which the manifest's class `chat-large` lets a
/// cheaper model serve, from a tenant opted in to the cache.
pub const FLEET_BODY: &str = r#"{"model":"gpt-4o","temperature":0,"max_tokens":128,"messages":[{"role":"user","content":"Summarise the quarterly report in three bullet points, please, for the board."}]}"#;

/// Its policy headers.
pub const FLEET_HEADERS: [(&str, &str); 4] = [
    ("x-ace-tenant", "globex"),
    ("x-ace-data-class", "public"),
    ("x-ace-latency-class", "interactive"),
    ("x-ace-tp-degree", "1"),
];

/// The headers of `request` besides `content-type`.
pub fn request_headers(request: Request) -> Vec<(&'static str, &'static str)> {
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
pub fn request_body(request: Request) -> &'static str {
    match request {
        Request::Bench => BODY,
        Request::Fleet | Request::FleetModelHeader => FLEET_BODY,
    }
}

/// wrk's script: a POST of `request`.
pub fn wrk_script(request: Request) -> String {
    let mut script = String::from(
        "wrk.method = \"POST\"\nwrk.headers[\"content-type\"] = \"application/json\"\n",
    );
    for (k, v) in request_headers(request) {
        script.push_str(&format!("wrk.headers[\"{k}\"] = \"{v}\"\n"));
    }
    script.push_str(&format!("wrk.body = '{}'\n", request_body(request)));
    script
}

/// Write `contents` to `name` in this process's scratch directory.
pub fn scratch_file(name: &str, contents: &str) -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("ace-envoy-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(name);
    std::fs::write(&path, contents).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

pub fn wrk(port: u16, secs: u32, conns: u32, request: Request) -> Result<Stats, String> {
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
pub fn h2load(
    port: u16,
    secs: u32,
    conns: u32,
    rate: u32,
    request: Request,
) -> Result<Stats, String> {
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
pub fn parse_wrk(text: &str) -> Option<Stats> {
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
