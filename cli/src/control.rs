//! `ace control`: run the out-of-band control service (`serve`), or fetch
//! one snapshot from it and print it (`snapshot`).
//!
//! All logic lives in `ace-control`; this module parses flags, reads the
//! token, hands the service the ledger's store (`ace_cli::spend`) and
//! prints. `control/README.md` is the operator's guide.
use ace_cli::spend::LedgerSpend;
use ace_control::{Config, FeedSource, Fetched, PlanSource};
use ace_snapshot::Snapshot;
use anyhow::{bail, Context as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use ace_cli::outln;

/// The environment variable that may hold the token.
const TOKEN_ENV: &str = "ACE_CONTROL_TOKEN";

fn duration(s: &str) -> Result<Duration, String> {
    ace_control::parse_duration(s)
}

/// `ace control` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Run the control service: poll every destination's control sources
    /// from the fleet manifest and serve snapshots on /v1/snapshot.
    Serve(Box<ServeArgs>),
    /// Fetch one snapshot from a running service, decode it and print it.
    Snapshot(SnapshotArgs),
}

/// Arguments of `ace control serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// The fleet manifest (its `[destinations.control]` tables say what to
    /// poll).
    #[arg(long, default_value = "policies/fleet.toml")]
    manifest: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9911")]
    listen: SocketAddr,
    /// Poll period of every source, e.g. 1s, 500ms.
    #[arg(long, default_value = "1s", value_parser = duration)]
    interval: Duration,
    /// A load older than this is stale (default: three intervals).
    #[arg(long, value_parser = duration)]
    stale_after: Option<Duration>,
    /// Per-request timeout of every poll (default: the interval).
    #[arg(long, value_parser = duration)]
    timeout: Option<Duration>,
    /// How long past its eviction time a notice keeps a destination
    /// drained (a definite "no notice" lifts it sooner).
    #[arg(long, default_value = "1h", value_parser = duration)]
    eviction_hold: Duration,
    /// File holding the bearer token clients must send (else the
    /// ACE_CONTROL_TOKEN environment variable).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Serve without a token (tests and local demos only).
    #[arg(long)]
    insecure_no_auth: bool,
    /// Per-token prices: a file in LiteLLM's
    /// model_prices_and_context_window.json format.
    #[arg(long)]
    prices: Option<PathBuf>,
    /// GPU-hour prices: a file path or an http(s) URL of the feed
    /// described in control/README.md.
    #[arg(long)]
    gpu_prices: Option<String>,
    /// The JSON lines of `ace plan roll --json`.
    #[arg(long, requires = "plan_start")]
    plan: Option<PathBuf>,
    /// When the plan's step 0 begins (RFC 3339).
    #[arg(long, requires = "plan")]
    plan_start: Option<String>,
    /// How long one plan step lasts.
    #[arg(long, default_value = "1h", value_parser = duration)]
    plan_step: Duration,
    /// Connections open at once, all clients together (default: what
    /// `ulimit -n` leaves once the service's own needs are kept aside, at
    /// most 4096; a number the limit cannot hold refuses to start).
    #[arg(long)]
    max_connections: Option<usize>,
    /// Connections open at once from one client address.
    #[arg(long, default_value_t = 256)]
    max_connections_per_ip: usize,
    /// How long a connection may wait for a request's headers, and stay
    /// idle between requests (above the filters' poll interval).
    #[arg(long, default_value = "30s", value_parser = duration)]
    idle_timeout: Duration,
    /// The ledger's store (a SQLite file or a postgres:// URL, as `ace
    /// ledger ingest --store`): read each tenant budget's spend from it
    /// and publish the readings.
    #[arg(long, env = "ACE_LEDGER_STORE", value_name = "URL")]
    ledger_store: Option<String>,
    /// How often the ledger's store is read (default: the interval).
    #[arg(long, value_parser = duration, requires = "ledger_store")]
    ledger_interval: Option<Duration>,
}

/// Arguments of `ace control snapshot`.
#[derive(Debug, clap::Args)]
pub struct SnapshotArgs {
    /// The service's snapshot URL, e.g. http://127.0.0.1:9911/v1/snapshot.
    #[arg(long)]
    url: String,
    /// File holding the bearer token (else ACE_CONTROL_TOKEN; none sent
    /// if neither is set).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Print the decoded snapshot as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `ace control`.
pub fn run(c: Command) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    match c {
        Command::Serve(a) => rt.block_on(serve(*a)),
        Command::Snapshot(a) => rt.block_on(snapshot(a)),
    }
}

fn read_token(file: Option<&Path>) -> anyhow::Result<Option<String>> {
    let from_env = std::env::var(TOKEN_ENV)
        .ok()
        .filter(|t| !t.trim().is_empty());
    let token = match (file, from_env) {
        (Some(_), Some(_)) => {
            bail!("both --token-file and {TOKEN_ENV} are set: give the token one way")
        }
        (Some(f), None) => Some(
            std::fs::read_to_string(f)
                .with_context(|| format!("cannot read the token file {}", f.display()))?,
        ),
        (None, t) => t,
    };
    let token = token.map(|t| t.trim().to_string());
    if token.as_deref() == Some("") {
        bail!("the token file is empty: put a secret in it (e.g. `openssl rand -hex 32`)");
    }
    Ok(token)
}

async fn serve(a: ServeArgs) -> anyhow::Result<ExitCode> {
    let token = read_token(a.token_file.as_deref())?;
    match (&token, a.insecure_no_auth) {
        (None, false) => bail!(
            "no token: give --token-file FILE or set {TOKEN_ENV} (or --insecure-no-auth for a local test)"
        ),
        (Some(_), true) => bail!("a token is given and --insecure-no-auth too: drop one"),
        _ => {}
    }
    let plan = match (a.plan, a.plan_start) {
        (Some(path), Some(start)) => Some(PlanSource {
            path,
            start_ms: ace_control::rfc3339_ms(&start)
                .map_err(|e| anyhow::anyhow!("--plan-start: {e}"))?,
            step: a.plan_step,
        }),
        _ => None,
    };
    let config = Config {
        listen: a.listen,
        interval: a.interval,
        stale_after: a.stale_after,
        timeout: a.timeout,
        eviction_hold: a.eviction_hold,
        token,
        prices: a.prices,
        gpu_prices: a.gpu_prices.as_deref().map(FeedSource::parse),
        plan,
        limits: ace_control::listen::Limits {
            max_connections: a.max_connections,
            max_per_ip: a.max_connections_per_ip,
            idle_timeout: a.idle_timeout,
            ..Default::default()
        },
        spend: match a.ledger_store.as_deref() {
            Some(url) => Some(Box::new(LedgerSpend::new(url)?)),
            None => None,
        },
        spend_interval: a.ledger_interval,
        ..Config::new(a.manifest)
    };
    ace_control::run(config, shutdown()).await?;
    Ok(ExitCode::SUCCESS)
}

/// Completes on Ctrl-C or SIGTERM.
async fn shutdown() {
    let term = async {
        #[cfg(unix)]
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            s.recv().await;
            return;
        }
        std::future::pending::<()>().await
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

async fn snapshot(a: SnapshotArgs) -> anyhow::Result<ExitCode> {
    let token = read_token(a.token_file.as_deref())?;
    let client = ace_control::http_client(Duration::from_secs(10))?;
    let Fetched::Snapshot(s, etag) =
        ace_control::fetch(&client, &a.url, token.as_deref(), None).await?
    else {
        bail!("{}: answered 304 to a request without an ETag", a.url);
    };
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print_human(&s, &etag);
    }
    Ok(ExitCode::SUCCESS)
}

fn time(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map_or_else(
            || format!("{ms} ms"),
            |t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        )
}

fn print_human(s: &Snapshot, etag: &str) {
    outln!(
        "snapshot version {} generated {} ({} destinations, {} budgets, ETag {etag})",
        s.version,
        time(s.generated_ms),
        s.reports.len(),
        s.budgets.len()
    );
    for r in &s.reports {
        let mut parts = Vec::new();
        if let Some(l) = r.load {
            parts.push(format!(
                "load {} running, {} waiting, KV {:.1}%{}",
                l.running,
                l.waiting,
                f64::from(l.kv_permille) / 10.0,
                if l.stale {
                    " (STALE: last good figures)"
                } else {
                    ""
                }
            ));
        }
        if let Some(c) = r.capacity {
            parts.push(format!("capacity {c}"));
        }
        if let Some(p) = r.price {
            parts.push(format!(
                "${:.2}/${:.2} per Mtok in/out",
                p.usd_per_input_token * 1e6,
                p.usd_per_output_token * 1e6
            ));
        }
        if let Some(h) = r.usd_per_hour {
            parts.push(format!("${h:.2}/h"));
        }
        if let Some(d) = r.drain {
            parts.push(format!(
                "DRAINED until {} ({})",
                time(d.until_ms),
                d.reason.as_str()
            ));
        }
        if let Some(w) = &r.warm {
            parts.push(format!("warm [{}]", w.join(", ")));
        }
        outln!("  {}: {}", r.name, parts.join("; "));
    }
    for b in &s.budgets {
        let resets = match b.resets_ms {
            0 => "rolling window".to_string(),
            ms => format!("resets {}", time(ms)),
        };
        outln!(
            "  budget {}: {} (${:.2} spent; read {}; {resets})",
            b.name,
            b.state.as_str(),
            b.spent_usd,
            time(b.read_ms)
        );
    }
}
