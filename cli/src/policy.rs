//! `ace policy` (being built in this session).
use std::process::ExitCode;

/// Subcommands of `ace policy`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {}

pub fn run(c: Command) -> anyhow::Result<ExitCode> {
    match c {}
}
