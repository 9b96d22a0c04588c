//! ace-control: the out-of-band control service (`ace control serve`).
//!
//! It reads the fleet manifest (the same file `ace plugin-config` reads)
//! and keeps pulling, per destination, what its `[destinations.control]`
//! table names: load from the model server's Prometheus metrics
//! ([`load`]), resident models and adapters ([`models`]), per-token and
//! GPU-hour prices ([`prices`]), spot eviction notices ([`eviction`], and
//! pushed ones on `POST /v1/notice`) and owned capacity from the
//! planner's rolling horizon ([`plan`]); given a [`Spend`] (the `ace`
//! command's `--ledger-store`), it also reads each tenant budget's spend
//! from the books. It serves what it knows as an
//! [`ace_snapshot`] on `GET /v1/snapshot`, with an ETag so that an
//! unchanged snapshot costs a 304; `control/README.md` is the operator's
//! guide.
//!
//! Entry points: [`start`] (bind, load the inputs, spawn the pollers;
//! returns the bound address), [`run`] (the same until a shutdown future
//! completes) and [`fetch`] (a client for one snapshot).
#![forbid(unsafe_code)]
// The no-panic lints of product code (tests/tests/lints.rs checks them;
// tests may still unwrap and index: clippy.toml).
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![deny(clippy::panic, clippy::indexing_slicing)]

/// A file from `tests/fixtures/`, for the unit tests (each fixture cites
/// the engine, cloud or provider and version it follows:
/// `tests/fixtures/README.md`).
#[cfg(test)]
macro_rules! fixture {
    ($name:literal) => {
        include_str!(concat!("../tests/fixtures/", $name))
    };
}

mod budgets;
pub mod eviction;
pub mod listen;
pub mod load;
pub mod models;
pub mod plan;
pub mod prices;
pub mod prom;
mod server;
mod sources;
mod state;

pub use budgets::Spend;

use ace_snapshot::Snapshot;
use state::{Dest, Inputs, Service, Settings};
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;

/// An error, as one line naming the input and the fix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error(pub String);

impl Error {
    fn new(msg: impl Into<String>) -> Error {
        Error(msg.into())
    }

    /// An error that may carry a peer's bytes, through [`logged`].
    fn peer(msg: impl Into<String>) -> Error {
        Error(logged(&msg.into()))
    }

    fn http(url: &str, e: reqwest::Error) -> Error {
        let what = if e.is_timeout() {
            "timed out".to_string()
        } else if e.is_connect() {
            "cannot connect".to_string()
        } else {
            // reqwest's chain carries the cause (e.g. the hyper error).
            let mut s = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(c) = src {
                s.push_str(": ");
                s.push_str(&c.to_string());
                src = c.source();
            }
            s
        };
        Error::peer(format!("{url}: {what}"))
    }
}

/// How many characters of a message a log line or an error keeps.
pub const MAX_LOGGED: usize = 400;

/// `s` made safe to log: one line, control characters escaped (`\n`,
/// `\u{1b}`), cut to [`MAX_LOGGED`] characters with a note of how much
/// was left out. Every log line and error of the service passes through
/// it, because they carry what peers sent (a metadata service's `action`,
/// a scrape's malformed line, a webhook's destination): a newline there
/// must not forge a line of its own, nor a megabyte answer grow the log.
pub fn logged(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(MAX_LOGGED + 32));
    for (kept, (i, c)) in s.char_indices().enumerate() {
        if kept == MAX_LOGGED {
            out.push_str(&format!("... ({} more bytes)", s.len() - i));
            break;
        }
        if c.is_control() || c == '\u{2028}' || c == '\u{2029}' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// One line on standard error, `ace control: ` and `msg` through
/// [`logged`].
pub(crate) fn log(msg: &str) {
    eprintln!("ace control: {}", logged(msg));
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

/// Where the GPU price feed comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FeedSource {
    /// A file, re-read when it changes.
    File(PathBuf),
    /// An http(s) URL, fetched every interval.
    Url(String),
}

impl FeedSource {
    /// A URL when `s` starts with `http://` or `https://`, else a path.
    pub fn parse(s: &str) -> FeedSource {
        if s.starts_with("http://") || s.starts_with("https://") {
            FeedSource::Url(s.to_string())
        } else {
            FeedSource::File(PathBuf::from(s))
        }
    }
}

/// The planner's rolling horizon and its clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanSource {
    /// The JSON lines of `ace plan roll --json`.
    pub path: PathBuf,
    /// When step 0 begins, Unix ms.
    pub start_ms: u64,
    /// How long a step lasts.
    pub step: Duration,
}

/// Service-wide settings (the command line's flags).
#[derive(Clone, Debug)]
pub struct Config {
    /// The fleet manifest (`fleet.toml`).
    pub manifest: PathBuf,
    /// Where to listen.
    pub listen: SocketAddr,
    /// How often each source is polled and the snapshot rebuilt.
    pub interval: Duration,
    /// After how long without a good scrape a load is stale (default
    /// three intervals).
    pub stale_after: Option<Duration>,
    /// Per-request timeout of every poll (default: the interval).
    pub timeout: Option<Duration>,
    /// How long past its eviction time a notice keeps a destination
    /// drained (default one hour).
    pub eviction_hold: Duration,
    /// The bearer token snapshot and notice requests must carry; `None`
    /// serves anyone (`--insecure-no-auth`).
    pub token: Option<String>,
    /// The LiteLLM-format per-token price file.
    pub prices: Option<PathBuf>,
    /// The GPU price feed.
    pub gpu_prices: Option<FeedSource>,
    /// The planner's rolling horizon.
    pub plan: Option<PlanSource>,
    /// The bounds of the server's connections.
    pub limits: listen::Limits,
    /// Where tenant budgets' spend is read from (`--ledger-store`: the
    /// `ace` command gives the ledger's store); none: no budget readings.
    pub spend: Option<Box<dyn Spend>>,
    /// How often it is read (`--ledger-interval`; default: the interval).
    pub spend_interval: Option<Duration>,
}

impl Config {
    /// A configuration with the defaults: listen on 127.0.0.1:9911, poll
    /// every second, no token (set one), no price or plan inputs.
    pub fn new(manifest: PathBuf) -> Config {
        Config {
            manifest,
            listen: SocketAddr::from(([127, 0, 0, 1], 9911)),
            interval: Duration::from_secs(1),
            stale_after: None,
            timeout: None,
            eviction_hold: Duration::from_secs(3600),
            token: None,
            prices: None,
            gpu_prices: None,
            plan: None,
            limits: listen::Limits::default(),
            spend: None,
            spend_interval: None,
        }
    }
}

/// A running service.
#[derive(Debug)]
pub struct Running {
    /// The address it listens on (useful with port 0).
    pub addr: SocketAddr,
    tasks: JoinSet<()>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Running {
    /// Stops the pollers and the server.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
    }
}

/// Runs the service until `shutdown` completes.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
    let running = start(config).await?;
    eprintln!("ace control: serving on http://{}", running.addr);
    shutdown.await;
    running.stop().await;
    Ok(())
}

/// The most bytes read of a metrics scrape (a vLLM server's is tens of
/// KiB; parsing takes a small multiple of what is read).
pub const MAX_METRICS_BYTES: usize = 4 << 20;
/// The most bytes read of a `/v1/models` answer.
pub const MAX_MODELS_BYTES: usize = 1 << 20;
/// The most bytes read of a GPU price feed.
pub const MAX_FEED_BYTES: usize = 8 << 20;
/// The most bytes read of a cloud metadata answer (a notice is a line).
pub const MAX_METADATA_BYTES: usize = 64 << 10;
/// How many redirects a poll follows, each to the same origin.
pub const MAX_REDIRECTS: usize = 5;

/// Follows a redirect only to the origin (scheme, host, port) the request
/// was sent to: a redirect elsewhere (a cloud's metadata credentials path,
/// an internal service) is refused, naming both.
fn same_origin(a: reqwest::redirect::Attempt<'_>) -> reqwest::redirect::Action {
    let first = a.previous().first().cloned();
    let Some(first) = first else {
        return a.stop();
    };
    if a.previous().len() > MAX_REDIRECTS {
        let msg = format!("more than {MAX_REDIRECTS} redirects from {first}");
        return a.error(logged(&msg));
    }
    let to = a.url();
    let same = to.scheme() == first.scheme()
        && to.host_str() == first.host_str()
        && to.port_or_known_default() == first.port_or_known_default();
    if same {
        a.follow()
    } else {
        let msg = format!(
            "a redirect to {to}, another origin than {first}, is refused: point the \
             manifest or flag at the final URL"
        );
        a.error(logged(&msg))
    }
}

/// Reads `r`'s body in chunks, at most `cap` bytes: an answer that says
/// or turns out to be larger is an error naming `url` and the cap, and no
/// more of it is read (nor held).
pub async fn read_capped(
    mut r: reqwest::Response,
    url: &str,
    cap: usize,
) -> Result<Vec<u8>, Error> {
    let too_large = || {
        Error::new(format!(
            "{url}: the answer is larger than the {cap}-byte cap for it; point at the right \
             endpoint, or make the answer smaller"
        ))
    };
    if r.content_length().is_some_and(|n| n > cap as u64) {
        return Err(too_large());
    }
    let mut out = Vec::new();
    while let Some(chunk) = r.chunk().await.map_err(|e| Error::http(url, e))? {
        if out.len() + chunk.len() > cap {
            return Err(too_large());
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// A cloud metadata answer as text (at most [`MAX_METADATA_BYTES`]).
pub(crate) async fn read_text(r: reqwest::Response, url: &str) -> Result<String, Error> {
    let b = read_capped(r, url, MAX_METADATA_BYTES).await?;
    Ok(String::from_utf8_lossy(&b).into_owned())
}

/// An HTTP client with `timeout` per request (rustls with ring for https),
/// following redirects to the same origin only.
pub fn http_client(timeout: Duration) -> Result<reqwest::Client, Error> {
    // ring, not rustls's default aws-lc-rs: no C/cmake build of aws-lc on
    // every fresh machine. rustls 0.23.48 deprecates ring's provider for
    // its lack of post-quantum key exchange; the service's outbound calls
    // (metrics, metadata, price feeds) stay inside the operator's network.
    // Only the first install wins; later calls find it installed.
    #[allow(deprecated)]
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        .redirect(reqwest::redirect::Policy::custom(same_origin))
        .build()
        .map_err(|e| Error::new(format!("cannot build the HTTP client: {e}")))
}

/// `GET url`, its body of at most `cap` bytes, with `bearer` as its
/// `Authorization: Bearer` token when given (a model server started with
/// an API key); the key never appears in an error.
async fn get_bytes(
    client: &reqwest::Client,
    url: &str,
    cap: usize,
    bearer: Option<&str>,
) -> Result<Vec<u8>, Error> {
    let mut req = client.get(url);
    if let Some(k) = bearer {
        req = req.bearer_auth(k);
    }
    let r = req.send().await.map_err(|e| Error::http(url, e))?;
    if r.status() == reqwest::StatusCode::UNAUTHORIZED {
        let fix = if bearer.is_some() {
            "the key in the destination's `api_key_file` was refused"
        } else {
            "the server wants an API key: name a file holding it in the destination's `control.api_key_file`"
        };
        return Err(Error::new(format!(
            "{url}: answered 401 Unauthorized: {fix}"
        )));
    }
    if !r.status().is_success() {
        return Err(Error::new(format!("{url}: answered {}", r.status())));
    }
    read_capped(r, url, cap).await
}

/// `GET url`, its UTF-8 body of at most `cap` bytes (`bearer` as in
/// [`get_bytes`]).
async fn get_text(
    client: &reqwest::Client,
    url: &str,
    cap: usize,
    bearer: Option<&str>,
) -> Result<String, Error> {
    let b = get_bytes(client, url, cap, bearer).await?;
    String::from_utf8(b).map_err(|_| Error::new(format!("{url}: the body is not UTF-8")))
}

/// An RFC 3339 time as Unix ms.
pub fn rfc3339_ms(s: &str) -> Result<u64, String> {
    let t = chrono::DateTime::parse_from_rfc3339(s.trim())
        .map_err(|e| format!("`{s}` is not an RFC 3339 time ({e}), e.g. `2026-12-05T10:00:00Z`"))?;
    u64::try_from(t.timestamp_millis()).map_err(|_| format!("`{s}` is before 1970"))
}

/// A duration such as `500ms`, `1s`, `2m` or `1h`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: f64 = n.parse().map_err(|_| {
        format!("`{s}` is not a duration: give a number and a unit, e.g. `1s`, `500ms`, `1h`")
    })?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("`{s}`: the unit must be ms, s, m or h")),
    };
    if !(secs.is_finite() && secs > 0.0 && secs < 1e9) {
        return Err(format!("`{s}` must be a positive duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// The destinations of the manifest at `path`, resolved for polling, and
/// its tenant budgets.
fn destinations(path: &std::path::Path) -> Result<(Vec<Dest>, ace_config::Budgets), Error> {
    let m = ace_policy::manifest::load(path).map_err(|e| Error::new(e.to_string()))?;
    // The loader validated them, naming the line; this only builds them.
    let budgets = ace_config::Budgets::validate(&m.budgets())
        .map_err(|e| Error::new(format!("{}: `{}` {}", path.display(), e.field, e.message)))?;
    let resolved = m.resolved();
    let mut out = Vec::with_capacity(resolved.len());
    for (r, d) in resolved.into_iter().zip(&m.manifest.destinations) {
        let c = d
            .get_ref()
            .control
            .as_ref()
            .map(|c| c.get_ref().clone())
            .unwrap_or_default();
        // The manifest loader validated engine and provider names.
        let engine = load::Engine::parse(c.engine()).unwrap_or(load::Engine::Vllm);
        let eviction = c.eviction.as_ref().and_then(|e| {
            eviction::Cloud::parse(&e.provider)
                .map(|cloud| (cloud, e.base_url(), e.vm_name.clone()))
        });
        out.push(Dest {
            name: r.name,
            gpus: r.gpus,
            engine,
            metrics: c.metrics_url(),
            models: c.models_url(),
            eviction,
            price_key: c.price_key.clone(),
            gpu_price_key: c.gpu_price_key.clone(),
            plan: c.plan_app.zip(c.slots_per_gpu),
            api_key_file: c.api_key_file.as_ref().map(|f| m.resolve_path(f)),
            kv_token_budget: c.kv_token_budget,
        });
    }
    Ok((out, budgets))
}

/// Loads the manifest and inputs, binds, spawns the pollers and the
/// server, and returns. Bad inputs at start are errors (the service
/// refuses to start); inputs that go bad later are logged and the last
/// good ones kept. It reads as the list of the service's inputs, each a
/// source read at start and then kept up to date on a task of its own.
pub async fn start(mut config: Config) -> Result<Running, Error> {
    let (dests, tenant_budgets) = destinations(&config.manifest)?;
    let interval = config.interval;
    if interval.is_zero() {
        return Err(Error::new("--interval must be above 0"));
    }
    let spend_interval = config.spend_interval.unwrap_or(interval);
    let spend = budgets::Source::new(config.spend.take(), tenant_budgets, spend_interval)?;
    let limits = connection_limits(&config.limits, dests.len())?;
    let ledger = spend.as_ref().map(budgets::Source::shown);
    let settings = settings(&config, ledger)?;
    let client = http_client(config.timeout.unwrap_or(interval))?;
    let (engines, keys) = sources::Engines::load(&dests)?;
    let inputs = Inputs {
        live: vec![Default::default(); dests.len()],
        keys,
        ..Inputs::default()
    };
    let svc = Arc::new(Service::new(dests, settings, inputs));
    let gpu = config.gpu_prices.as_ref();
    let prices = sources::Prices::load(config.prices.as_deref(), gpu, &svc, &client).await?;
    let plan = sources::Plan::load(config.plan.as_ref().map(|p| p.path.as_path()), &svc)?;
    let (listener, addr) = bind(config.listen).await?;

    let mut tasks = JoinSet::new();
    engines.spawn(&mut tasks, &svc, &client, interval);
    sources::Notices::spawn(&mut tasks, &svc, &client, interval);
    prices.spawn(&mut tasks, &svc, &client, interval);
    if let Some(plan) = plan {
        plan.spawn(&mut tasks, &svc, interval);
    }
    if let Some(spend) = spend {
        spend.spawn(&mut tasks, svc.clone());
    }
    publisher(&mut tasks, &svc, interval);
    let stop = server(&mut tasks, &svc, listener, limits);
    Ok(Running {
        addr,
        tasks,
        stop: Some(stop),
    })
}

/// The bounds of the server's connections: what the file descriptor
/// limit leaves once the service's own are kept aside, its polls (three
/// per destination at most: metrics, models, eviction notices) and the
/// rest.
fn connection_limits(limits: &listen::Limits, dests: usize) -> Result<listen::Limits, Error> {
    let reserved = listen::RESERVED_FDS + 3 * dests;
    let cap =
        listen::connection_cap(limits, listen::fd_soft_limit(), reserved).map_err(Error::new)?;
    Ok(listen::Limits {
        max_connections: Some(cap),
        ..limits.clone()
    })
}

/// The service-wide settings of `config`; `ledger` is the budgets'
/// store as logs show it, when they are read.
fn settings(config: &Config, ledger: Option<String>) -> Result<Settings, Error> {
    if config.token.as_ref().is_some_and(String::is_empty) {
        return Err(Error::new(
            "the token is empty: put a secret in the token file or ACE_CONTROL_TOKEN",
        ));
    }
    let stale_after = config.stale_after.unwrap_or(config.interval * 3);
    Ok(Settings {
        stale_after_ms: stale_after.as_millis() as u64,
        eviction_hold_ms: config.eviction_hold.as_millis() as u64,
        token: config.token.clone(),
        plan_clock: config
            .plan
            .as_ref()
            .map(|p| (p.start_ms, (p.step.as_millis() as u64).max(1))),
        ledger,
    })
}

/// Binds `at`: the listener and the address it got.
async fn bind(at: SocketAddr) -> Result<(tokio::net::TcpListener, SocketAddr), Error> {
    let listener = tokio::net::TcpListener::bind(at).await.map_err(|e| {
        Error::new(format!(
            "cannot listen on {at}: {e} (pick another --listen)"
        ))
    })?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::new(format!("cannot listen on {at}: {e}")))?;
    Ok((listener, addr))
}

/// Rebuilds the snapshot every interval, and at once when woken (a
/// pushed notice).
fn publisher(tasks: &mut JoinSet<()>, svc: &Arc<Service>, interval: Duration) {
    let (svc, mut tick) = (svc.clone(), sources::every(interval));
    tasks.spawn(async move {
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = svc.wake.notified() => {}
            }
            // A failure is counted and logged by publish itself.
            let _ = svc.publish(state::now_ms());
        }
    });
}

/// Serves the snapshot, notices and metrics on `listener` until the
/// sender returned is used (or dropped).
fn server(
    tasks: &mut JoinSet<()>,
    svc: &Arc<Service>,
    listener: tokio::net::TcpListener,
    limits: listen::Limits,
) -> tokio::sync::oneshot::Sender<()> {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let app = server::router(svc.clone());
    let stats = svc.conns.clone();
    tasks.spawn(async move {
        let stopped = async {
            let _ = stopped.await;
        };
        listen::serve(listener, app, limits, stats, stopped, log).await;
    });
    stop
}

/// What a snapshot request got.
#[derive(Clone, Debug, PartialEq)]
pub enum Fetched {
    /// The snapshot and its ETag.
    Snapshot(Snapshot, String),
    /// 304: the snapshot with the ETag sent is still current.
    NotModified,
}

/// Fetches and decodes one snapshot from `url` (the service's
/// `/v1/snapshot`), with a bearer `token` and, if given, `If-None-Match`.
pub async fn fetch(
    client: &reqwest::Client,
    url: &str,
    token: Option<&str>,
    etag: Option<&str>,
) -> Result<Fetched, Error> {
    let mut req = client.get(url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(e) = etag {
        req = req.header(reqwest::header::IF_NONE_MATCH, e);
    }
    let r = req.send().await.map_err(|e| Error::http(url, e))?;
    match r.status().as_u16() {
        304 => Ok(Fetched::NotModified),
        401 => Err(Error::new(format!(
            "{url}: 401 unauthorized: give the service's token (--token-file or ACE_CONTROL_TOKEN)"
        ))),
        200 => {
            let tag = r
                .headers()
                .get(reqwest::header::ETAG)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let body = read_capped(r, url, ace_snapshot::MAX_BYTES).await?;
            let s = ace_snapshot::decode(&body).map_err(|e| Error::peer(format!("{url}: {e}")))?;
            Ok(Fetched::Snapshot(s, tag))
        }
        s => Err(Error::new(format!("{url}: answered HTTP {s}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logged_is_one_escaped_bounded_line() {
        assert_eq!(
            logged("terminate\nace control: x"),
            "terminate\\nace control: x"
        );
        assert_eq!(logged("a\r\u{1b}[2Jb\u{2028}"), "a\\r\\u{1b}[2Jb\\u{2028}");
        let long = logged(&"é".repeat(1000));
        assert!(long.starts_with(&"é".repeat(MAX_LOGGED)));
        assert!(long.ends_with("... (1200 more bytes)"), "{long}");
        assert_eq!(logged("plain"), "plain");
    }

    #[test]
    fn durations_and_times() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        for bad in ["", "1", "s", "0s", "-1s", "1d"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(rfc3339_ms("1970-01-01T00:00:01Z"), Ok(1000));
        assert_eq!(rfc3339_ms("1970-01-01T01:00:01+01:00"), Ok(1000));
        assert!(rfc3339_ms("1969-12-31T00:00:00Z").is_err());
        assert!(rfc3339_ms("tomorrow").unwrap_err().contains("RFC 3339"));
        assert_eq!(
            FeedSource::parse("https://x/y"),
            FeedSource::Url("https://x/y".into())
        );
        assert_eq!(
            FeedSource::parse("feed.json"),
            FeedSource::File("feed.json".into())
        );
    }
}
