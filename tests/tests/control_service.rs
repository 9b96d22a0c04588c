//! The control service end to end: a real `ace control serve` (in
//! process) pulling from vLLM-like model servers, a GCP-shaped eviction
//! endpoint, a GPU price feed and a planner file, and a real Envoy whose
//! ACE filter polls it through a cluster. What the service learns moves
//! traffic; what it cannot change (feasibility) never moves: EU personal
//! data stays in the EU whatever the prices. Losing the service keeps
//! traffic flowing and marks the snapshot stale; a restarted one is
//! picked up without touching Envoy.

use ace_harness::client::{Request, Response};
use ace_harness::envoy::{Envoy, EnvoyBuilder};
use ace_harness::model_server::ModelServer;
use ace_harness::upstream::{Behavior, Upstream};
use ace_tests::{now_ms, require_envoy, start, upstream, Filter};
use serde_json::json;
use std::path::Path;
use std::time::{Duration, Instant};

const TOKEN: &str = "e2e-token";
const INTERVAL: Duration = Duration::from_millis(500);
/// How long the filter prices one destination's held (stale) load.
const HELD_LOAD: Duration = Duration::from_millis(1500);

use ace_demo::control_fleet::{gpu_feed, plan_line};

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}

struct World {
    _dir: tempfile::TempDir,
    dir: std::path::PathBuf,
    owned: ModelServer,
    spot: ModelServer,
    api: Upstream,
    imds: Upstream,
    runtime: tokio::runtime::Runtime,
    service: Option<ace_control::Running>,
    config: ace_control::Config,
}

impl World {
    fn new() -> World {
        let owned = ModelServer::start("eu_owned", "llama-3.1-8b").unwrap();
        let spot = ModelServer::start("us_spot", "llama-3.1-8b").unwrap();
        let api = upstream("us_api");
        let imds = upstream("imds");
        imds.set_behavior(Behavior::Respond {
            status: 200,
            headers: vec![],
            body: b"FALSE".to_vec(),
        });
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let policies = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
        let ports = (owned.port(), spot.port(), imds.port());
        ace_demo::control_fleet::write(&dir, &policies, ports).unwrap();
        let config = ace_demo::control_fleet::service_config(&dir, INTERVAL, TOKEN, now_ms());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let mut w = World {
            _dir: tmp,
            dir,
            owned,
            spot,
            api,
            imds,
            runtime,
            service: None,
            config,
        };
        w.start_service();
        // Keep the port: a restart listens where Envoy's cluster points.
        w.config.listen = w.service.as_ref().unwrap().addr;
        w
    }

    fn start_service(&mut self) {
        let running = self
            .runtime
            .block_on(ace_control::start(self.config.clone()))
            .unwrap_or_else(|e| panic!("ace control serve: {e}"));
        self.service = Some(running);
    }

    fn stop_service(&mut self) {
        if let Some(s) = self.service.take() {
            self.runtime.block_on(s.stop());
        }
    }

    fn control_port(&self) -> u16 {
        self.config.listen.port()
    }

    fn envoy(&self, filter: Filter) -> Envoy {
        start(&self.envoy_builder(filter))
    }

    /// The plugin configuration the filter loads (`ace plugin-config` of
    /// the fleet, with the control service and response headers on).
    fn plugin(&self) -> String {
        let mut plugin =
            ace_cli::plugin::build(&self.dir, false, false).unwrap_or_else(|e| panic!("{e:#}"));
        plugin["response_headers"] = json!(true);
        plugin["control"] = json!({"cluster": "ace_control", "token": TOKEN,
            "interval_ms": INTERVAL.as_millis() as u64, "stale_after_ms": 2000,
            "held_load_ms": HELD_LOAD.as_millis() as u64});
        plugin.to_string()
    }

    fn envoy_builder(&self, filter: Filter) -> EnvoyBuilder {
        require_envoy();
        let plugin = self.plugin();
        let control = json!({"cluster": "ace_control", "token": TOKEN,
            "interval_ms": INTERVAL.as_millis() as u64, "stale_after_ms": 2000});
        let mut b = EnvoyBuilder::new();
        if filter == Filter::Dynamic {
            // The dynamic module polls from Envoy's main thread (its
            // bootstrap extension); its filter only reads what it
            // published, so the filter's copy needs no token.
            b = b.bootstrap_extension(ace_harness::dylib::control_poller_json(
                &ace_tests::ace_dynamic_lib(),
                &control,
            ));
        }
        // The tables decide on the model, so the filter reads the body.
        filter
            .add_reading_body(b, &plugin)
            .concurrency(2)
            .cluster("eu_owned", self.owned.port())
            .cluster("us_spot", self.spot.port())
            .cluster("us_api", self.api.port())
            .cluster("ace_control", self.control_port())
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.stop_service();
    }
}

fn ask(envoy: &Envoy, data_class: &str) -> Response {
    ace_demo::control_fleet::request(data_class)
        .send(envoy.port())
        .unwrap_or_else(|e| panic!("request failed: {e}"))
}

/// Wait (at most `limit`) until `data_class` requests go to `want` (or
/// are refused: `want` = "refused 503") six times in a row: every worker
/// has the news, not just the first to tick.
fn until_served(envoy: &Envoy, data_class: &str, want: &str, limit: Duration) -> Duration {
    let t0 = Instant::now();
    let mut in_a_row = 0;
    loop {
        let got = ask(envoy, data_class).served();
        in_a_row = if got == want { in_a_row + 1 } else { 0 };
        if in_a_row == 6 {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < limit,
            "{data_class} requests still go to {got}, not {want}, after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(30));
    }
}

fn until_public_goes_to(envoy: &Envoy, want: &str, limit: Duration) -> Duration {
    until_served(envoy, "public", want, limit)
}

/// EU personal data may only go to `eu-owned`: served there or refused.
fn eu_data_stays_in_the_eu(envoy: &Envoy) {
    let r = ask(envoy, "personal_eu");
    let got = r.served();
    assert!(
        got == "eu-owned" || got.starts_with("refused 503"),
        "EU personal data went to {got}"
    );
}

fn the_control_service_moves_traffic_and_never_feasibility(filter: Filter) {
    let mut w = World::new();
    let envoy = w.envoy(filter);
    let two_polls = 2 * INTERVAL + Duration::from_millis(1500);
    until_public_goes_to(&envoy, "eu-owned", two_polls);
    eu_data_stays_in_the_eu(&envoy);

    // A spot price cut below the owned pool's cost: traffic moves within
    // two poll intervals (plus the service's own file poll).
    write(&w.dir.join("gpu.json"), &gpu_feed(0.01));
    until_public_goes_to(&envoy, "us-spot", two_polls + INTERVAL);
    // Then free: the spot pool, forbidden for EU personal data, priced at
    // zero. That data stays home.
    write(&w.dir.join("gpu.json"), &gpu_feed(0.0));
    let t0 = Instant::now();
    while ask(&envoy, "public").header("x-ace-cost-usd") != Some("0") {
        assert!(t0.elapsed() < two_polls * 2, "the zero price never arrived");
        std::thread::sleep(Duration::from_millis(30));
    }
    for _ in 0..6 {
        eu_data_stays_in_the_eu(&envoy);
    }

    // An eviction notice on the spot VM: drained at once.
    w.imds.set_behavior(Behavior::Respond {
        status: 200,
        headers: vec![],
        body: b"TRUE".to_vec(),
    });
    until_public_goes_to(&envoy, "eu-owned", two_polls + INTERVAL);

    // The owned pool's queue passes its capacity (the server reports 8
    // running and 12 waiting): it loses the traffic to the API.
    w.owned.set_reported_load(8, 12);
    until_public_goes_to(&envoy, "us-api", two_polls + INTERVAL);
    eu_data_stays_in_the_eu(&envoy);
    w.owned.clear_reported_load();
    until_public_goes_to(&envoy, "eu-owned", two_polls + INTERVAL);

    // The planner hands the owned GPUs to batch work this step: the pool
    // has no capacity for inference, and EU personal data is refused,
    // never sent abroad.
    write(&w.dir.join("plan.jsonl"), &plan_line(0, 0));
    until_public_goes_to(&envoy, "us-api", two_polls + INTERVAL);
    until_served(&envoy, "personal_eu", "refused 503", two_polls);
    write(&w.dir.join("plan.jsonl"), &plan_line(0, 2));
    until_public_goes_to(&envoy, "eu-owned", two_polls + INTERVAL);

    // The control service dies: traffic keeps flowing on the last
    // snapshot, and the staleness gauge rises.
    w.stop_service();
    std::thread::sleep(Duration::from_millis(3000));
    for _ in 0..5 {
        assert_eq!(ask(&envoy, "public").served(), "eu-owned");
    }
    let stale = envoy.stat(&filter.stat("ace.control.stale"));
    assert_eq!(stale, Some(1), "the stale gauge");
    assert!(envoy.stat(&filter.stat("ace.control.age_ms")).unwrap_or(0) >= 2000);
    // Restarted on the same port: picked up, no Envoy restart.
    w.start_service();
    let t0 = Instant::now();
    while envoy.stat(&filter.stat("ace.control.stale")) != Some(0) {
        assert!(
            t0.elapsed() < two_polls * 2,
            "the restarted service was not picked up"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    write(&w.dir.join("gpu.json"), &gpu_feed(0.01));
    w.imds.set_behavior(Behavior::Respond {
        status: 200,
        headers: vec![],
        body: b"FALSE".to_vec(),
    });
    until_public_goes_to(&envoy, "us-spot", two_polls * 2);
    eu_data_stays_in_the_eu(&envoy);
}

/// A spot price moved through the control service mid-run: each event
/// carries the price its request was decided on, and the ledger, reading
/// Envoy's access log, books every request at exactly the filter's own
/// figure (no disagreement), at the price the decision saw rather than the
/// configuration's.
fn the_ledger_books_the_spot_price_the_filter_decided_on(filter: Filter) {
    let w = World::new();
    let plugin = w.plugin();
    let envoy = start(
        &w.envoy_builder(filter)
            .access_log_line(filter.event_log_line()),
    );
    let two_polls = 2 * INTERVAL + Duration::from_millis(1500);
    until_public_goes_to(&envoy, "eu-owned", two_polls);
    write(&w.dir.join("gpu.json"), &gpu_feed(0.01));
    until_public_goes_to(&envoy, "us-spot", two_polls + INTERVAL);
    let first = ask(&envoy, "public")
        .header("x-ace-cost-usd")
        .map(str::to_string);
    // Cheaper still: the booked cost follows.
    write(&w.dir.join("gpu.json"), &gpu_feed(0.004));
    let t0 = Instant::now();
    while ask(&envoy, "public")
        .header("x-ace-cost-usd")
        .map(str::to_string)
        == first
    {
        assert!(
            t0.elapsed() < two_polls * 2,
            "the new spot price never arrived"
        );
        std::thread::sleep(Duration::from_millis(30));
    }
    // Envoy flushes its access log about once a second.
    std::thread::sleep(Duration::from_millis(1500));
    let before = envoy.access_log_lines().len();
    for _ in 0..10 {
        assert_eq!(ask(&envoy, "public").served(), "us-spot");
    }
    let lines = envoy.wait_access_log(before + 10, Duration::from_secs(10));
    assert!(lines.len() >= before + 10, "{} lines", lines.len());

    let spot_prices: std::collections::BTreeSet<String> = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["destination"] == "us-spot")
        .filter_map(|e| e.get("live_usd_per_hour").map(|p| p.to_string()))
        .collect();
    assert!(
        spot_prices.len() >= 2,
        "the spot events carry both prices they were decided on: {spot_prices:?}"
    );
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut ledger =
        ace_ledger::book::Ledger::open(&dir.path().join("l.sqlite").display().to_string())
            .unwrap_or_else(|e| panic!("{e:#}"));
    ledger
        .register(plugin.as_bytes(), "plugin config")
        .unwrap_or_else(|e| panic!("{e:#}"));
    let log = lines.join("\n") + "\n";
    let s = ledger
        .ingest_bytes(
            "access.log",
            log.as_bytes(),
            &ace_ledger::ingest::Options::default(),
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(
        (s.new as usize, s.rejected.len(), s.disagreements),
        (lines.len(), 0, 0),
        "every event booked at the filter's own figure: {s:?}"
    );
    let report = ledger
        .report(&ace_ledger::window::Rules::default())
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(
        report.by_tier.contains_key("spot"),
        "{:?}",
        report.by_tier.keys()
    );
}

/// One model server stops answering its scrapes: the service holds its
/// last figures, marked stale, and the filter prices them for
/// `control.held_load_ms` from their scrape, then drops them, while the
/// other destinations keep their live load.
fn a_hung_scrape_stops_being_priced_after_the_bound(filter: Filter) {
    use ace_harness::model_server::EndpointBehavior;
    let w = World::new();
    let envoy = w.envoy(filter);
    let two_polls = 2 * INTERVAL + Duration::from_millis(1500);
    until_public_goes_to(&envoy, "eu-owned", two_polls);
    // Both GPU pools report themselves full (owned: 20 in 8 slots; spot:
    // 80 in 64): public traffic goes to the API.
    w.owned.set_reported_load(8, 12);
    w.spot.set_reported_load(60, 20);
    until_public_goes_to(&envoy, "us-api", two_polls + INTERVAL);
    // The spot server's metrics hang. Its 80 requests are held, then no
    // longer priced: it is cheaper than the API again, while the owned
    // pool, cheaper still, keeps its live (full) load and gets nothing.
    w.spot.set_metrics_behavior(EndpointBehavior::Hang);
    let bound = HELD_LOAD + 3 * INTERVAL + two_polls;
    let took = until_public_goes_to(&envoy, "us-spot", bound);
    println!("{filter:?}: the held load stopped being priced {took:?} after the scrape hung");
    eu_data_stays_in_the_eu(&envoy);
    // The server answers again, still full: its live load is priced.
    w.spot.set_metrics_behavior(EndpointBehavior::Serve);
    until_public_goes_to(&envoy, "us-api", two_polls + INTERVAL);
    // And the owned pool empties: back home.
    w.owned.clear_reported_load();
    until_public_goes_to(&envoy, "eu-owned", two_polls + INTERVAL);
}

/// Snapshot requests the service has answered, every status together,
/// from its own `/metrics`.
fn service_polls(port: u16) -> u64 {
    let r = Request::get("/metrics")
        .send(port)
        .unwrap_or_else(|e| panic!("control /metrics: {e}"));
    r.text()
        .lines()
        .filter(|l| l.starts_with("ace_control_snapshot_requests_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

fn one_poll_per_interval_per_envoy_with_four_workers(filter: Filter) {
    let w = World::new();
    let envoy = {
        let b = w.envoy_builder(filter).concurrency(4);
        start(&b)
    };
    std::thread::sleep(Duration::from_secs(2));
    let before = service_polls(w.control_port());
    let window = Duration::from_secs(6);
    std::thread::sleep(window);
    let polls = service_polls(w.control_port()) - before;
    let intervals = (window.as_millis() / INTERVAL.as_millis()) as u64;
    println!("{filter:?}: {polls} polls in {window:?} at one per {INTERVAL:?}, four workers");
    assert!(
        (intervals - 3..=intervals + 1).contains(&polls),
        "{polls} polls in {intervals} intervals: one per interval per Envoy, not per worker"
    );
    assert_eq!(ask(&envoy, "public").served(), "eu-owned");
}

ace_tests::for_each_filter!(
    the_control_service_moves_traffic_and_never_feasibility,
    the_ledger_books_the_spot_price_the_filter_decided_on,
    a_hung_scrape_stops_being_priced_after_the_bound,
    one_poll_per_interval_per_envoy_with_four_workers,
);
