//! `ace demo` (being built in this session).
use std::process::ExitCode;

/// Arguments of `ace demo`.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`ace demo` is not built yet")
}
