//! `ace`: the command-line front door to every part of ACE.
//!
//! Each subcommand lives in its own module and owns its arguments; this file
//! only dispatches. Errors print as `error: ...` with their causes and exit 1;
//! a subcommand that finds a problem in its input (a mismatch, an invalid
//! plan) returns its own non-zero exit code.
#![forbid(unsafe_code)]
// The no-panic lints of product code (tests/tests/lints.rs checks them;
// tests may still unwrap and index: clippy.toml).
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![deny(clippy::panic, clippy::indexing_slicing)]

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod control;
mod ledger;
mod plan;
mod playground;
mod policy;
mod sim;

use ace_cli::plugin;

#[derive(Debug, Parser)]
#[command(
    name = "ace",
    version,
    about = "Merit-order dispatch for GPU and API fleets, inside Envoy"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Compile, verify and explain Cedar feasibility policies.
    #[command(subcommand)]
    Policy(policy::Command),
    /// Plan owned GPUs over a 24 h horizon and compare with baselines.
    Plan(plan::Args),
    /// Print the filter's plugin configuration for a policy directory:
    /// destinations with cost curves, and the compiled tables.
    PluginConfig(plugin::Args),
    /// The out-of-band control service: `serve` pulls load, warm models,
    /// prices, spot evictions and planned capacity and serves snapshots;
    /// `snapshot` fetches and prints one.
    #[command(subcommand)]
    Control(control::Command),
    /// Book ACE's access-log events and report costs, savings and
    /// chargeback.
    #[command(subcommand)]
    Ledger(ledger::Command),
    /// Serve the policy playground locally: edit, compile, explain and
    /// verify Cedar policies in the browser, from the shipped examples.
    Playground(playground::Args),
    /// Simulate a fleet serving a request trace under ACE and the
    /// gateways' and packers' strategies, and compare cost, SLO, served
    /// fraction, utilisation and compliance.
    Sim(sim::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Policy(c) => policy::run(c),
        Command::Plan(a) => plan::run(a),
        Command::PluginConfig(a) => plugin::run(a),
        Command::Ledger(c) => ledger::run(c),
        Command::Control(c) => control::run(c),
        Command::Playground(a) => playground::run(a),
        Command::Sim(a) => sim::run(a),
    };
    ace_cli::output::exit_code(result)
}
