//! Tenant budgets end to end: a real Envoy with ACE (both builds), a real
//! `ace control serve` reading spend from a real PostgreSQL ledger store,
//! and `ace ledger ingest --follow` (in process) feeding that store from
//! Envoy's access log, as an operator runs them.
//!
//! What must hold: a tenant past its soft threshold is served only on the
//! rungs its budget allows, and told so; past its amount it gets the 429
//! naming the budget; another tenant is unaffected; the limit lifts when
//! the period moves on; and killing the store, then the control service,
//! never lifts it. Under load, two Envoys sharing one store overshoot a
//! limit by no more than the bound `control/README.md` documents; the
//! test prints what it measured.

use ace_harness::client::{Request, Response};
use ace_harness::envoy::{Envoy, EnvoyBuilder};
use ace_harness::pg::Pg;
use ace_harness::upstream::{Behavior, Upstream};
use ace_ledger::book::Ledger;
use ace_ledger::ingest::Options;
use ace_tests::{require_envoy, start, upstream, Filter};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

pub(crate) const TOKEN: &str = "budget-token";
/// The control service's poll of the store, and the filter's of it.
pub(crate) const INTERVAL: Duration = Duration::from_millis(300);
/// `northbank`'s rolling window.
const WINDOW: Duration = Duration::from_secs(6);

/// The fleet: owned GPUs in the EU serving the small model, a
/// pay-as-you-go API serving both; tenants `globex` (soft at half of USD
/// 0.05 a day: then only the owned GPUs), `northbank` (USD 0.05 over a
/// rolling six seconds, no soft step) and `acme-health` (no budget).
pub(crate) fn fleet_toml() -> String {
    r#"version = 1
[request.data_class]
values = ["public"]
[request.latency_class]
values = ["interactive"]
[request.tp_degree]
values = [1]
[[tenants]]
id = "globex"
[[tenants]]
id = "northbank"
[[tenants]]
id = "acme-health"
[[models]]
id = "llama-3.1-8b"
vram_gb = 16
tp_degree = 1
accelerators = ["h100", "api"]
[[models]]
id = "gpt-4o"
vram_gb = 0
tp_degree = 1
accelerators = ["api"]

[[destinations]]
name = "eu-owned"
cluster = "eu_owned"
pools = ["eu"]
provider = "inhouse"
tier = "inhouse"
jurisdiction = "EU"
region = "eu-central-1"
accelerator = "h100"
vram_gb = 80
interconnect = "nvlink"
models = ["llama-3.1-8b"]
[destinations.cost]
input_usd_per_mtok = 0.05
output_usd_per_mtok = 0.15
capacity = 64

[[destinations]]
name = "us-api"
cluster = "us_api"
pools = ["us"]
provider = "openai"
tier = "payg"
jurisdiction = "US"
region = "us-east"
accelerator = "api"
vram_gb = 0
interconnect = "none"
models = ["llama-3.1-8b", "gpt-4o"]
[destinations.cost]
input_usd_per_mtok = 2.5
output_usd_per_mtok = 10.0

[[budgets]]
name = "globex"
tenants = ["globex"]
usd = 0.05
period = "day"
soft_at = 0.5

[[budgets]]
name = "northbank"
tenants = ["northbank"]
usd = 0.05
period = "rolling"
window_s = 6
soft_at = 1.0
"#
    .to_string()
}

/// What each upstream answers: the API 2,000 tokens in and 1,000 out
/// (USD 0.015 a request), the owned GPUs 100 and 50.
pub(crate) fn answering(u: &Upstream, prompt: u32, completion: u32) {
    u.set_behavior(Behavior::Respond {
        status: 200,
        headers: vec![("content-type".into(), "application/json".into())],
        body: json!({"choices": [], "usage": {"prompt_tokens": prompt,
            "completion_tokens": completion}})
        .to_string()
        .into_bytes(),
    });
}

/// A policy directory in a temp dir: the example schema, the capability
/// permit and the no-spot rule, the example's policies named in `extra`,
/// and `fleet` as its manifest.
pub(crate) fn policy_dir_with(fleet: &str, extra: &[&str]) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let dir = tmp.path();
    let policies = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
    let base = [
        "ace.cedarschema",
        "model_capability.cedar",
        "tenant_no_spot.cedar",
    ];
    for f in base.iter().chain(extra) {
        std::fs::copy(policies.join(f), dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
    }
    std::fs::write(dir.join("fleet.toml"), fleet).unwrap_or_else(|e| panic!("{e}"));
    tmp
}

/// [`policy_dir_with`] and no more policies.
pub(crate) fn policy_dir(fleet: &str) -> tempfile::TempDir {
    policy_dir_with(fleet, &[])
}

/// A real PostgreSQL ledger store, `ace control serve --ledger-store` on
/// it, the fleet's two upstreams, and the plugin configuration polling the
/// service; Envoys added by [`World::envoy`].
pub(crate) struct World {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    pg: Option<Pg>,
    /// The store's URL.
    pub(crate) store: String,
    pub(crate) owned: Upstream,
    pub(crate) api: Upstream,
    runtime: tokio::runtime::Runtime,
    service: Option<ace_control::Running>,
    control_port: u16,
    /// The plugin configuration, as JSON text.
    pub(crate) plugin: String,
    stop: Arc<AtomicBool>,
    ingests: Vec<std::thread::JoinHandle<()>>,
}

impl World {
    pub(crate) fn new(database: &str, fleet: &str) -> World {
        World::new_with(database, fleet, &[])
    }

    /// [`World::new`] with the example's policies named in `extra` too.
    pub(crate) fn new_with(database: &str, fleet: &str, extra: &[&str]) -> World {
        require_envoy();
        let pg = Pg::start();
        let store = pg.database(database);
        let tmp = policy_dir_with(fleet, extra);
        let dir = tmp.path().to_path_buf();
        let (owned, api) = (upstream("eu_owned"), upstream("us_api"));
        answering(&owned, 100, 50);
        answering(&api, 2_000, 1_000);
        let mut plugin =
            ace_cli::plugin::build(&dir, false, false).unwrap_or_else(|e| panic!("{e:#}"));
        plugin["response_headers"] = json!(true);
        plugin["control"] = json!({"cluster": "ace_control", "token": TOKEN,
            "interval_ms": INTERVAL.as_millis() as u64, "stale_after_ms": 1000});
        let plugin = plugin.to_string();
        // The configuration is registered before any event arrives.
        let mut ledger = Ledger::open(&store).unwrap_or_else(|e| panic!("{e:#}"));
        ledger
            .register(plugin.as_bytes(), "plugin-config")
            .unwrap_or_else(|e| panic!("{e:#}"));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let mut config = ace_control::Config::new(dir.join("fleet.toml"));
        config.listen = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        config.interval = INTERVAL;
        config.token = Some(TOKEN.to_string());
        let spend = ace_cli::spend::LedgerSpend::new(&store).unwrap_or_else(|e| panic!("{e}"));
        config.spend = Some(Box::new(spend));
        let service = runtime
            .block_on(ace_control::start(config))
            .unwrap_or_else(|e| panic!("ace control serve: {e}"));
        let control_port = service.addr.port();
        World {
            _dir: tmp,
            dir,
            pg: Some(pg),
            store,
            owned,
            api,
            runtime,
            service: Some(service),
            control_port,
            plugin,
            stop: Arc::new(AtomicBool::new(false)),
            ingests: Vec::new(),
        }
    }

    /// A real Envoy with this world's filter, and its access log followed
    /// into the store.
    pub(crate) fn envoy(&mut self, filter: Filter) -> Envoy {
        let control = json!({"cluster": "ace_control", "token": TOKEN,
            "interval_ms": INTERVAL.as_millis() as u64, "stale_after_ms": 1000});
        let mut b = EnvoyBuilder::new();
        if filter == Filter::Dynamic {
            b = b.bootstrap_extension(ace_harness::dylib::control_poller_json(
                &ace_tests::ace_dynamic_lib(),
                &control,
            ));
        }
        let envoy = start(
            &filter
                .add_reading_body(b, &self.plugin)
                .concurrency(2)
                .cluster("eu_owned", self.owned.port())
                .cluster("us_api", self.api.port())
                .cluster("ace_control", self.control_port)
                .access_log_line(filter.event_log_line()),
        );
        self.follow(envoy.access_log_path().to_path_buf());
        envoy
    }

    /// `ace ledger ingest --follow LOG --store STORE`, in process.
    fn follow(&mut self, log: PathBuf) {
        let (store, stop) = (self.store.clone(), self.stop.clone());
        self.ingests.push(std::thread::spawn(move || {
            // Envoy creates the file with its first line.
            while !log.exists() && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let Ok(mut ledger) = Ledger::open(&store) else {
                return;
            };
            let opts = Options {
                follow: true,
                stop: Some(stop),
                ..Options::default()
            };
            let _ = ledger.ingest_path(&log.display().to_string(), &opts);
        }));
    }

    fn stop_store(&mut self) {
        self.pg = None;
    }

    fn stop_service(&mut self) {
        if let Some(s) = self.service.take() {
            self.runtime.block_on(s.stop());
        }
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.ingests.drain(..) {
            let _ = t.join();
        }
        self.stop_service();
        let _ = &self.dir;
    }
}

pub(crate) fn ask(envoy: &Envoy, tenant: &str, model: &str) -> Response {
    Request::post_json(
        "/v1/chat/completions",
        &json!({"model": model, "max_tokens": 1000,
            "messages": [{"role": "user", "content": "hello"}]}),
    )
    .header("x-ace-tenant", tenant)
    .header("x-ace-data-class", "public")
    .header("x-ace-latency-class", "interactive")
    .header("x-ace-tp-degree", "1")
    .send(envoy.port())
    .unwrap_or_else(|e| panic!("request failed: {e}"))
}

pub(crate) fn error(r: &Response) -> Value {
    serde_json::from_slice::<Value>(&r.body).map_or(Value::Null, |v| v["error"].clone())
}

/// Ask until `want` comes back (a worker may hold the previous reading
/// for a poll), at most `limit`.
pub(crate) fn until(
    envoy: &Envoy,
    tenant: &str,
    model: &str,
    want: &str,
    limit: Duration,
) -> Response {
    let t0 = Instant::now();
    loop {
        let r = ask(envoy, tenant, model);
        let got = if r.status == 200 {
            r.header("x-ace-destination").unwrap_or("?").to_string()
        } else {
            format!("refused {}", r.status)
        };
        if got == want {
            return r;
        }
        assert!(
            t0.elapsed() < limit,
            "{tenant} {model}: still {got} after {limit:?}, wanted {want}: {}",
            r.text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn a_tenant_steps_down_is_refused_and_the_limit_lifts(filter: Filter) {
    let name = match filter {
        Filter::Wasm => "budgets_wasm",
        Filter::Dynamic => "budgets_dynamic",
    };
    let mut w = World::new(name, &fleet_toml());
    let envoy = w.envoy(filter);
    let wait = Duration::from_secs(10);
    // globex: gpt-4o only on the API, USD 0.015 a request; soft after two.
    for _ in 0..2 {
        let r = ask(&envoy, "globex", "gpt-4o");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-ace-budget"), None);
    }
    // Soft: only the owned GPUs, which do not serve gpt-4o.
    let r = until(&envoy, "globex", "gpt-4o", "refused 429", wait);
    assert_eq!(error(&r)["reason"], "budget_soft", "{}", r.text());
    assert_eq!(error(&r)["budget"], "globex", "{}", r.text());
    assert!(r.header("retry-after").is_some(), "{:?}", r.headers);
    // The small model: served on the owned GPUs, and told why.
    let r = ask(&envoy, "globex", "llama-3.1-8b");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-ace-budget"), Some("soft; budget=globex"));
    // Another tenant is unaffected.
    assert_eq!(ask(&envoy, "acme-health", "gpt-4o").status, 200);

    // northbank: exhausted after four (0.06 of 0.05), by this proxy's
    // own count at once, and by the books once they have the lines.
    for _ in 0..4 {
        assert_eq!(ask(&envoy, "northbank", "gpt-4o").status, 200);
    }
    let r = until(&envoy, "northbank", "llama-3.1-8b", "refused 429", wait);
    let e = error(&r);
    assert_eq!(
        (e["type"].as_str(), e["code"].as_str(), e["reason"].as_str()),
        (
            Some("budget_exceeded"),
            Some("budget_exceeded"),
            Some("budget_exhausted")
        ),
        "{}",
        r.text()
    );
    assert_eq!(
        (e["budget"].as_str(), e["period"].as_str()),
        (Some("northbank"), Some("rolling"))
    );
    let retry: u64 = r
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!((1..=60).contains(&retry), "{:?}", r.headers);
    // The window moves on: the books read less, and the limit lifts.
    let r = until(&envoy, "northbank", "gpt-4o", "us-api", WINDOW + wait);
    assert_eq!(r.header("x-ace-budget"), None);

    // Exhausted again; then the store dies, then the control service:
    // the window passes, and the limit stays.
    for _ in 0..4 {
        let _ = ask(&envoy, "northbank", "gpt-4o");
    }
    until(&envoy, "northbank", "gpt-4o", "refused 429", wait);
    // Let the books have the lines, so the service's last good reading
    // holds the spend.
    std::thread::sleep(Duration::from_secs(2));
    w.stop_store();
    std::thread::sleep(WINDOW + Duration::from_secs(1));
    for _ in 0..5 {
        let r = ask(&envoy, "northbank", "gpt-4o");
        assert_eq!(r.served(), "refused 429", "a dead store lifted the limit");
    }
    w.stop_service();
    std::thread::sleep(Duration::from_secs(2));
    for _ in 0..5 {
        let r = ask(&envoy, "northbank", "gpt-4o");
        assert_eq!(r.served(), "refused 429", "a dead service lifted the limit");
    }
    // Others still flow.
    assert_eq!(ask(&envoy, "acme-health", "gpt-4o").status, 200);
}

ace_tests::for_each_filter!(a_tenant_steps_down_is_refused_and_the_limit_lifts,);

/// Two Envoys sharing one store under 2,000 connections: what a tenant
/// books past its limit, against the bound.
#[test]
fn under_load_two_envoys_overshoot_a_limit_within_the_bound() {
    const CONNECTIONS: usize = 2_000;
    const AMOUNT: f64 = 15.0;
    const PER_REQUEST: f64 = 0.015;
    // globex: USD 15 a day, no soft step.
    let fleet = fleet_toml().replacen(
        "usd = 0.05\nperiod = \"day\"\nsoft_at = 0.5",
        "usd = 15.0\nperiod = \"day\"\nsoft_at = 1.0",
        1,
    );
    assert_ne!(fleet, fleet_toml());
    let mut w = World::new("budgets_load", &fleet);
    let envoys = [w.envoy(Filter::Wasm), w.envoy(Filter::Wasm)];
    let ports = [envoys[0].port(), envoys[1].port()];
    let (ok, refused) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let barrier = Barrier::new(CONNECTIONS);
    // A prompt of about 2,000 tokens as ACE estimates them (bytes over
    // four), what the API then reports: the reservation is the cost.
    let prompt = "x".repeat(8_000);
    let prompt = prompt.as_str();
    let t0 = Instant::now();
    std::thread::scope(|scope| {
        for i in 0..CONNECTIONS {
            let (ok, refused, barrier) = (&ok, &refused, &barrier);
            let port = ports[i % 2];
            std::thread::Builder::new()
                .stack_size(128 * 1024)
                .spawn_scoped(scope, move || {
                    let req = Request::post_json(
                        "/v1/chat/completions",
                        &json!({"model": "gpt-4o", "max_tokens": 1000,
                            "messages": [{"role": "user", "content": prompt}]}),
                    )
                    .header("x-ace-tenant", "globex")
                    .header("x-ace-data-class", "public")
                    .header("x-ace-latency-class", "interactive")
                    .header("x-ace-tp-degree", "1");
                    barrier.wait();
                    // Until refused, and a bounded number of times.
                    for _ in 0..20 {
                        match req.send(port) {
                            Ok(r) if r.status == 200 => {
                                ok.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(_) => {
                                refused.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                })
                .unwrap_or_else(|e| panic!("cannot start client {i}: {e}"));
        }
    });
    let took = t0.elapsed();
    let (ok, refused) = (ok.into_inner(), refused.into_inner());
    // Every served request in the books.
    let lines = |e: &Envoy| e.access_log_lines().len();
    let t = Instant::now();
    while lines(&envoys[0]) + lines(&envoys[1]) < ok + refused
        && t.elapsed() < Duration::from_secs(30)
    {
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut store = ace_ledger::store::open(&w.store).unwrap_or_else(|e| panic!("{e:#}"));
    let mut booked = 0.0;
    let t = Instant::now();
    loop {
        let spent = store
            .spend(0, u64::MAX, &["globex"])
            .unwrap_or_else(|e| panic!("{e:#}"));
        let now = spent.first().map_or(0.0, |(_, n)| *n as f64 / 1e9);
        if now == booked && now > 0.0 && t.elapsed() > Duration::from_secs(2) {
            break;
        }
        booked = now;
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the books never settled"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let overshoot = (booked - AMOUNT).max(0.0);
    // The bound (control/README.md, "Budgets"): what the other proxy
    // books before a reading carries it (one poll interval and the
    // ingest's lag), at most the amount itself, plus each proxy's last
    // request and one more per worker admitted in the same instant.
    let bound = AMOUNT + 2.0 * 3.0 * PER_REQUEST;
    println!(
        "budgets under load: {CONNECTIONS} connections over two Envoys for {took:?}: \
         {ok} served ({:.0} a second), {refused} refused; booked USD {booked:.3} against a \
         limit of {AMOUNT:.3}: overshoot USD {overshoot:.3} ({:.1} % of the limit, {:.0} \
         requests), bound USD {bound:.3}",
        ok as f64 / took.as_secs_f64(),
        overshoot / AMOUNT * 100.0,
        overshoot / PER_REQUEST
    );
    assert!(refused > 0, "the limit never bit");
    assert!(
        (ok as f64 * PER_REQUEST - booked).abs() < 1e-6,
        "the books hold every served request: {ok} served, USD {booked}"
    );
    assert!(
        overshoot <= bound,
        "overshoot USD {overshoot} past the bound {bound}"
    );
}
