//! Shadow mode (`ace sim --shadow LOG`): the requests a real Envoy logged,
//! replayed under every policy, so that an operator sees what LiteLLM or a
//! priority gateway would have cost on their own traffic rather than on a
//! public trace and an invented mix.
//!
//! A log is read as `ace ledger ingest` reads it (`ace_ledger::event`):
//! one `ace.event` line per request, with its arrival time, its tenant,
//! data class, latency class and model as sent, and its token counts.
//! Lines that are not events (Envoy writes `-` where a filter set none)
//! are counted and named, never fatal; a schema the ledger does not read
//! is.

use ace_ledger::event::{self, LineError};
use ace_sim::Logged;
use anyhow::{bail, Context};
use std::io::BufRead;
use std::path::{Path, PathBuf};

/// The requests of the logs at `paths`, and what was passed over.
#[derive(Debug, Default)]
pub struct Read {
    /// One per event line.
    pub logged: Vec<Logged>,
    /// Lines that were not events.
    pub skipped: u64,
    /// The first of them: file, line number and why.
    pub first_skipped: Option<String>,
}

/// Read the logs at `paths`.
pub fn read(paths: &[PathBuf]) -> anyhow::Result<Read> {
    let mut out = Read::default();
    for path in paths {
        read_one(path, &mut out)?;
    }
    if out.logged.is_empty() {
        bail!(
            "--shadow: no ace.event line in {} ({} other lines{}); give the access log the \
             filter writes its events into",
            paths
                .iter()
                .map(|p| format!("`{}`", p.display()))
                .collect::<Vec<_>>()
                .join(", "),
            out.skipped,
            out.first_skipped
                .as_ref()
                .map(|f| format!(", the first: {f}"))
                .unwrap_or_default()
        );
    }
    Ok(out)
}

fn read_one(path: &Path, out: &mut Read) -> anyhow::Result<()> {
    let file = std::fs::File::open(path)
        .with_context(|| format!("--shadow: cannot open `{}`", path.display()))?;
    let mut reader = std::io::BufReader::new(file);
    let mut line = Vec::new();
    let mut n = 0u64;
    loop {
        line.clear();
        let read = reader
            .read_until(b'\n', &mut line)
            .with_context(|| format!("--shadow: cannot read `{}`", path.display()))?;
        if read == 0 {
            return Ok(());
        }
        n += 1;
        let text = line.strip_suffix(b"\n").unwrap_or(&line);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        if text.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match event::parse(text, None) {
            Ok(e) => out.logged.push(Logged {
                time_ms: e.time_ms,
                prompt: e.tokens_in,
                output: e.tokens_out,
                tenant: e.tenant.unwrap_or_default(),
                data_class: e.data_class.unwrap_or_default(),
                latency_class: e.latency_class.unwrap_or_default(),
                model: e.model_requested.unwrap_or_default(),
            }),
            Err(LineError::UnknownSchema(s)) => {
                bail!(
                    "--shadow: `{}` line {n}: {}",
                    path.display(),
                    LineError::UnknownSchema(s)
                )
            }
            Err(e) => {
                out.skipped += 1;
                if out.first_skipped.is_none() {
                    out.first_skipped = Some(format!("`{}` line {n}: {e}", path.display()));
                }
            }
        }
    }
}

/// The shadow simulation of the logs at `logs` over the policy directory
/// `policies` (its manifest is the fleet, its policies the rules), with
/// ACE as dispatch alone beside ACE.
pub fn simulation(
    policies: &Path,
    logs: &[PathBuf],
    targets: ace_sim::slo::Targets,
    seed: u64,
) -> anyhow::Result<(ace_sim::Simulation, Read)> {
    let project = ace_policy::load_dir(policies).map_err(|e| anyhow::anyhow!("{e}"))?;
    let config = crate::plugin::project_config(&project, false, true)?;
    let read = read(logs)?;
    let mut sim = ace_sim::Simulation::shadow(
        serde_json::to_vec(&config)?,
        &ace_sim::Placement::of(&project),
        &ace_sim::model_tp(&project),
        &read.logged,
        targets,
        seed,
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    sim.add_dispatch_only(&project.sources)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok((sim, read))
}
