//! One variant's measured run: Envoy started (pinned to its own CPU with
//! `--pin`) and warmed up, then loaded for the run's length; its latency,
//! throughput, Envoy's CPU time per request (from
//! `/proc/PID/task/*/schedstat`) and, under `--callgrind`, instructions
//! per request. `ENVOY_LOAD_PROBE` attaches a tool for each run.

use crate::callgrind::{callgrind_control, callgrind_total, IDLE_SECS};
use crate::load::{h2load, wrk, Stats};
use crate::variant::Request;
use ace_harness::envoy::EnvoyBuilder;
use std::path::PathBuf;
use std::process::Command;

/// One measured run of one variant.
#[derive(Debug)]
pub struct Row {
    pub name: String,
    pub stats: Stats,
    /// Envoy CPU per request, µs.
    pub cpu_us: f64,
    /// Envoy's instructions per request (`--callgrind`; NaN otherwise).
    pub instructions: f64,
}

/// The CPUs to pin to: (Envoy's, everyone else's), as `taskset` lists.
pub fn cpu_split() -> Result<(String, String), String> {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    if n < 2 {
        return Err("--pin needs at least 2 CPUs".into());
    }
    Ok(((n - 1).to_string(), format!("0-{}", n - 2)))
}

/// Pin every thread of `pid` to `cpus` (a `taskset` list).
pub fn pin(pid: u32, cpus: &str) -> Result<(), String> {
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

/// How each variant is driven.
#[derive(Debug)]
pub struct Bench {
    pub secs: u32,
    pub conns: u32,
    pub rate: Option<u32>,
    /// Envoy's CPUs, when pinning.
    pub pin: Option<String>,
    /// Where callgrind writes its dumps (`--callgrind`).
    pub callgrind: Option<PathBuf>,
}

impl Bench {
    pub fn heading(&self) {
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
    pub fn load(&self, port: u16, secs: u32, request: Request) -> Result<Stats, String> {
        match self.rate {
            Some(rate) => h2load(port, secs, self.conns, rate, request),
            None => wrk(port, secs, self.conns, request),
        }
    }

    /// Start Envoy (pinned, if pinning) and warm it up.
    pub fn start(
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
    pub fn run(&self, r: &Running) -> Result<Row, String> {
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
#[derive(Debug)]
pub struct Running {
    pub name: String,
    pub envoy: ace_harness::envoy::Envoy,
    /// What it is driven with.
    pub request: Request,
}

/// Start `ENVOY_LOAD_PROBE` (if set) against Envoy's process.
pub fn start_probe(pid: u32) -> Result<Option<std::process::Child>, String> {
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
pub fn stop_probe(probe: Option<std::process::Child>) {
    if let Some(mut child) = probe {
        let _ = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status();
        let _ = child.wait();
    }
}
