//! The end of the demo: the ledger books Envoy's access log of ACE events.

use ace_cli::ingest_summary::print_summary;
use ace_cli::outln;
use ace_ledger::book::Ledger;
use ace_ledger::ingest::Options;
use ace_ledger::window::Rules;
use anyhow::Context;

/// The end of the demo: book what each part of the demo served, from
/// Envoy's real access log, in a throwaway ledger, and print the report.
/// Each part is (name, the plugin configuration Envoy loaded, the log's
/// lines).
pub fn summary(parts: &[(&str, &serde_json::Value, &Vec<String>)]) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("ace-demo-ledger-")
        .tempdir()
        .context("cannot make a temp dir for the demo's ledger")?;
    let mut ledger = Ledger::open(&dir.path().join("ledger.sqlite").display().to_string())?;
    outln!("\nthe ledger: Envoy's access log of ACE events, booked and re-priced");
    for (name, config, lines) in parts {
        let id = ledger.register(config.to_string().as_bytes(), name)?;
        let opts = Options {
            v1_config: Some(id),
            ..Options::default()
        };
        let mut bytes = lines.join("\n").into_bytes();
        bytes.push(b'\n');
        print_summary(&ledger.ingest_bytes(name, &bytes, &opts)?);
    }
    let rules = Rules {
        window_ms: 60_000,
        ..Rules::default()
    };
    outln!("\n{}", ledger.report(&rules)?.table());
    Ok(())
}
