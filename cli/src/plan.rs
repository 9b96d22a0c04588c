//! `ace plan` (being built in this session).
use std::process::ExitCode;

/// Arguments of `ace plan`.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`ace plan` is not built yet")
}
