//! `ace ledger`: book Envoy's access log of ACE events and report what
//! the fleet cost, what all pay-as-you-go would have charged, and which
//! savings were earned (see the `ace-ledger` crate and its README).

use ace_cli::ingest_summary::print_summary;
use ace_cli::{out, outln};
use ace_ledger::book::Ledger;
use ace_ledger::ingest::Options;
use ace_ledger::report::terminal;
use ace_ledger::trace::{self, Select};
use ace_ledger::window::Rules;
use anyhow::{anyhow, Context};
use std::path::PathBuf;
use std::process::ExitCode;

/// The store every subcommand opens.
#[derive(Debug, clap::Args)]
pub struct StoreArg {
    /// The ledger: a SQLite file (created if missing) or a PostgreSQL URL
    /// (`postgres://user@host/db`) shared by many proxies.
    #[arg(long, env = "ACE_LEDGER_STORE", default_value = "ace-ledger.sqlite")]
    store: String,
}

/// The anti-gaming bounds a window must hold to keep its savings.
#[derive(Debug, clap::Args)]
pub struct RulesArgs {
    /// Window length per tenant: `300s`, `5m`, `1h` or milliseconds.
    #[arg(long, default_value = "5m", value_parser = duration_ms)]
    window: i64,
    /// Least fraction of a window's requests that must be served.
    #[arg(long, default_value_t = 0.99)]
    min_served: f64,
    /// Least SLO attainment per latency class.
    #[arg(long, default_value_t = 0.95)]
    min_slo: f64,
    /// A latency class's own SLO bound, `CLASS=FRACTION` (repeatable).
    #[arg(long = "min-slo-class", value_parser = class_bound)]
    min_slo_class: Vec<(String, f64)>,
    /// Most cache false-hit rate.
    #[arg(long, default_value_t = 0.01)]
    max_cache_false_hit: f64,
}

impl RulesArgs {
    fn rules(&self) -> Rules {
        Rules {
            window_ms: self.window,
            min_served: self.min_served,
            min_slo: self.min_slo,
            min_slo_by_class: self.min_slo_class.iter().cloned().collect(),
            max_false_hit: self.max_cache_false_hit,
        }
    }
}

fn duration_ms(s: &str) -> Result<i64, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: i64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration; write e.g. 300s, 5m, 1h or 300000"))?;
    let ms = match unit {
        "" | "ms" => n,
        "s" => n * 1000,
        "m" => n * 60_000,
        "h" => n * 3_600_000,
        _ => return Err(format!("{s:?}: unknown unit {unit:?}; use ms, s, m or h")),
    };
    if ms <= 0 {
        return Err("a window must be longer than 0".into());
    }
    Ok(ms)
}

fn class_bound(s: &str) -> Result<(String, f64), String> {
    let (c, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: write CLASS=FRACTION, e.g. interactive=0.99"))?;
    let v: f64 = v
        .parse()
        .map_err(|_| format!("{s:?}: {v:?} is not a fraction"))?;
    Ok((c.to_string(), v))
}

/// `ace ledger` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Book access-log files (`-` for standard input): idempotent, so a
    /// file may be ingested again as it grows.
    Ingest(IngestArgs),
    /// Costs, savings (split four ways, earned and forfeited), goodput and
    /// chargeback: a terminal table, JSON, or one HTML page with charts.
    Report(ReportArgs),
    /// Export every booked request, and each standing pool's commitment, as
    /// FOCUS 1.3 CSV for FinOps tools.
    Export(ExportArgs),
    /// The requests behind a figure: their ids, costs and savings.
    Trace(TraceArgs),
    /// Import what providers say they charged (OpenAI costs and
    /// completions usage answers, Anthropic usage and cost reports, a
    /// FOCUS CSV export): idempotent, each bad row named; `ace ledger
    /// report` sets it against the books.
    ImportBill(ImportBillArgs),
    /// Migrate a store an earlier `ace` wrote to this release's tables, in
    /// place, and say what was done (every subcommand also migrates the
    /// store it opens; this does it alone, e.g. before upgrading a fleet).
    Migrate(MigrateArgs),
}

/// Arguments of `ace ledger import-bill`.
#[derive(Debug, clap::Args)]
pub struct ImportBillArgs {
    #[command(flatten)]
    store: StoreArg,
    /// `openai-costs`, `openai-usage`, `anthropic-usage`, `anthropic-cost`
    /// or `focus-csv`; by default each file's is detected.
    #[arg(long)]
    format: Option<String>,
    /// The bills: saved API answers (one page each) or FOCUS CSV exports.
    files: Vec<PathBuf>,
}

/// Arguments of `ace ledger migrate`.
#[derive(Debug, clap::Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    store: StoreArg,
}

/// Arguments of `ace ledger ingest`.
#[derive(Debug, clap::Args)]
pub struct IngestArgs {
    #[command(flatten)]
    store: StoreArg,
    /// A plugin configuration the events name (the exact JSON the filter
    /// loaded, e.g. `ace plugin-config` output); repeatable.
    #[arg(long = "config")]
    configs: Vec<PathBuf>,
    /// The configuration id that `ace.event/1` lines (which name none) are
    /// priced with; defaults to the one `--config` when exactly one is given.
    #[arg(long)]
    v1_config: Option<String>,
    /// Keep reading the (single) file as Envoy appends to it.
    #[arg(long)]
    follow: bool,
    /// Access logs; `-` reads standard input.
    files: Vec<String>,
}

/// Arguments of `ace ledger report`.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    #[command(flatten)]
    store: StoreArg,
    #[command(flatten)]
    rules: RulesArgs,
    /// `table`, `json` or `html`.
    #[arg(long, default_value = "table")]
    format: String,
    /// Write here instead of standard output.
    #[arg(long, short)]
    out: Option<PathBuf>,
}

/// Arguments of `ace ledger export`.
#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    #[command(flatten)]
    store: StoreArg,
    #[command(flatten)]
    rules: RulesArgs,
    /// Write here instead of standard output.
    #[arg(long, short)]
    out: Option<PathBuf>,
}

/// Arguments of `ace ledger trace`.
#[derive(Debug, clap::Args)]
pub struct TraceArgs {
    #[command(flatten)]
    store: StoreArg,
    #[command(flatten)]
    rules: RulesArgs,
    /// Only this tenant (`(none)` for requests without one).
    #[arg(long)]
    tenant: Option<String>,
    /// Only this tier.
    #[arg(long)]
    tier: Option<String>,
    /// Only this destination.
    #[arg(long)]
    destination: Option<String>,
    /// Only the window starting at this time (ms, as the report prints it).
    #[arg(long)]
    window_start: Option<i64>,
    /// Only requests in forfeited windows.
    #[arg(long)]
    forfeited: bool,
    /// Only requests whose logged costs disagree with the ledger's.
    #[arg(long)]
    flagged: bool,
    /// One JSON object per request instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(c: Command) -> anyhow::Result<ExitCode> {
    match c {
        Command::Ingest(a) => ingest(a),
        Command::Report(a) => report(a),
        Command::Export(a) => export(a),
        Command::Trace(a) => trace(a),
        Command::Migrate(a) => migrate(a),
        Command::ImportBill(a) => import_bill(a),
    }
}

fn import_bill(a: ImportBillArgs) -> anyhow::Result<ExitCode> {
    if a.files.is_empty() {
        return Err(anyhow!("no bill given; pass the files to import"));
    }
    let format = a
        .format
        .as_deref()
        .map(ace_ledger::bill::Format::parse)
        .transpose()?;
    let mut store = ace_ledger::store::open(&a.store.store)?;
    let mut bad = 0;
    for f in &a.files {
        let bytes =
            std::fs::read(f).with_context(|| format!("cannot read the bill `{}`", f.display()))?;
        let name = f.display().to_string();
        let s = ace_ledger::bill::import::file(store.as_mut(), &name, &bytes, format)?;
        outln!(
            "{} ({}): {} lines, {} imported, {} already in the ledger, {} restated, {} not imported",
            terminal(&s.source),
            s.format,
            s.lines,
            s.new,
            s.already,
            s.restated,
            s.rejected.len()
        );
        for r in &s.rejected {
            outln!("  {}", terminal(&r.to_string()));
        }
        bad += s.rejected.len();
    }
    if bad > 0 {
        return Err(anyhow!(
            "{bad} bill rows not imported (named above); the rest are imported"
        ));
    }
    Ok(ExitCode::SUCCESS)
}

fn migrate(a: MigrateArgs) -> anyhow::Result<ExitCode> {
    let store = ace_ledger::store::open(&a.store.store)?;
    let done = store.migrated();
    if done.is_empty() {
        outln!(
            "{}: already {}, nothing to do",
            terminal(&a.store.store),
            ace_ledger::store::STORE_SCHEMA
        );
    } else {
        outln!(
            "{}: migrated to {}:",
            terminal(&a.store.store),
            ace_ledger::store::STORE_SCHEMA
        );
        for sql in done {
            outln!("  {sql}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn ingest(a: IngestArgs) -> anyhow::Result<ExitCode> {
    if a.files.is_empty() {
        return Err(anyhow!(
            "no access log given; pass files, or `-` for standard input"
        ));
    }
    if a.follow && a.files.len() != 1 {
        return Err(anyhow!("--follow reads one growing file; give exactly one"));
    }
    let mut ledger = Ledger::open(&a.store.store)?;
    let mut ids = Vec::new();
    for c in &a.configs {
        let id = ledger.register_file(c)?;
        outln!("configuration {id} registered from {}", c.display());
        ids.push(id);
    }
    let v1_config = a.v1_config.or_else(|| match ids.as_slice() {
        [only] => Some(only.clone()),
        _ => None,
    });
    let opts = Options {
        v1_config,
        follow: a.follow,
        progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
        ..Options::default()
    };
    let mut unpriced = Vec::new();
    for f in &a.files {
        let s = ledger.ingest_path(f, &opts)?;
        print_summary(&s);
        unpriced.extend(s.rejected.into_iter().filter(|r| r.event_id.is_some()));
    }
    // Every line was read and the rest booked; still, events that wait
    // for their configuration need the operator, so the exit says so.
    if let Some(first) = unpriced.first() {
        return Err(anyhow!(
            "{} events not priced, first {}:{}: {}",
            unpriced.len(),
            terminal(&first.source),
            first.line,
            terminal(&first.error)
        ));
    }
    Ok(ExitCode::SUCCESS)
}

fn write_out(out: &Option<PathBuf>, text: &str) -> anyhow::Result<()> {
    match out {
        Some(p) => {
            std::fs::write(p, text).with_context(|| format!("cannot write `{}`", p.display()))
        }
        None => {
            out!("{text}");
            Ok(())
        }
    }
}

fn report(a: ReportArgs) -> anyhow::Result<ExitCode> {
    let mut ledger = Ledger::open(&a.store.store)?;
    let r = ledger.report(&a.rules.rules())?;
    let text = match a.format.as_str() {
        "table" => r.table(),
        "json" => serde_json::to_string_pretty(&r)? + "\n",
        "html" => ace_ledger::html::page(&r)?,
        other => return Err(anyhow!("--format {other:?}: use table, json or html")),
    };
    write_out(&a.out, &text)?;
    Ok(ExitCode::SUCCESS)
}

fn export(a: ExportArgs) -> anyhow::Result<ExitCode> {
    let mut ledger = Ledger::open(&a.store.store)?;
    let rules = a.rules.rules();
    let r = ledger.report(&rules)?;
    let mut buf = Vec::new();
    let n = ace_ledger::focus::export(ledger.store.as_mut(), &r, &rules, &mut buf)?;
    write_out(&a.out, &String::from_utf8_lossy(&buf))?;
    if a.out.is_some() {
        outln!(
            "{n} FOCUS {} rows written",
            ace_ledger::focus::FOCUS_VERSION
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn trace(a: TraceArgs) -> anyhow::Result<ExitCode> {
    let mut ledger = Ledger::open(&a.store.store)?;
    let rules = a.rules.rules();
    let r = ledger.report(&rules)?;
    let sel = Select {
        tenant: a.tenant,
        tier: a.tier,
        destination: a.destination,
        window_ms: a.window_start,
        forfeited: a.forfeited,
        flagged: a.flagged,
    };
    let (rows, booked, savings) = trace::rows(ledger.store.as_mut(), &r, &rules, &sel)?;
    if a.json {
        for t in &rows {
            outln!("{}", serde_json::to_string(t)?);
        }
        return Ok(ExitCode::SUCCESS);
    }
    out!("{}", trace::table(&rows, booked, &savings));
    Ok(ExitCode::SUCCESS)
}
