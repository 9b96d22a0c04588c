//! `ace control serve` in process, against fake model servers, fake
//! instance metadata services (AWS, GCP and Azure shapes), a price file, a
//! GPU price feed and a plan file; every assertion is on decoded
//! snapshots (or the service's own /metrics).

use ace_control::{fetch, Config, FeedSource, Fetched, PlanSource, Running};
use ace_snapshot::{DrainReason, Snapshot};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, put};
use axum::Router;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{metrics, now_ms, rfc3339, serve, snapshot_and_etag, wait_for, TOKEN};

const HOLD_MS: u64 = 3_600_000;

/// A vLLM-like model server whose figures the test sets.
#[derive(Clone, Debug)]
struct Engine {
    running: u32,
    waiting: u32,
    kv: f64,
    fail: bool,
    adapters: &'static str,
}

async fn fake_vllm(e: Arc<Mutex<Engine>>) -> String {
    let m = e.clone();
    let app = Router::new()
        .route(
            "/metrics",
            get(move || async move {
                let e = m.lock().unwrap().clone();
                if e.fail {
                    return (StatusCode::INTERNAL_SERVER_ERROR, String::new());
                }
                (
                    StatusCode::OK,
                    format!(
                        "# TYPE vllm:num_requests_running gauge\n\
                         vllm:num_requests_running{{engine=\"0\",model_name=\"llama\"}} {}\n\
                         vllm:num_requests_running{{engine=\"1\",model_name=\"llama\"}} 0\n\
                         vllm:num_requests_waiting{{engine=\"0\",model_name=\"llama\"}} {}\n\
                         vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"llama\"}} {}\n\
                         vllm:lora_requests_info{{max_lora=\"4\",running_lora_adapters=\"{}\",waiting_lora_adapters=\"\"}} 1.7e9\n",
                        e.running, e.waiting, e.kv, e.adapters
                    ),
                )
            }),
        )
        .route(
            "/v1/models",
            get(|| async {
                r#"{"object":"list","data":[{"id":"llama","parent":null},{"id":"sql-lora","parent":"llama"}]}"#
            }),
        );
    serve(app).await
}

/// A manifest with the given destination tables, in a temp dir.
fn manifest(dir: &Path, dests: &[String]) -> PathBuf {
    let mut text = String::from(
        "version = 1\n[[models]]\nid = \"llama\"\nvram_gb = 16\n[[models]]\nid = \"gpt-4o\"\nvram_gb = 0\n",
    );
    for d in dests {
        text.push_str(d);
    }
    let p = dir.join("fleet.toml");
    std::fs::write(&p, text).unwrap();
    p
}

fn dest(name: &str, tier: &str, cost: &str, control: &str) -> String {
    format!(
        "[[destinations]]\nname = \"{name}\"\ncluster = \"{name}\"\nprovider = \"p\"\ntier = \"{tier}\"\n\
         jurisdiction = \"US\"\nregion = \"r\"\naccelerator = \"h100\"\nvram_gb = 80\ninterconnect = \"nvlink\"\n\
         models = [\"llama\"]\n[destinations.cost]\n{cost}\n[destinations.control]\n{control}\n"
    )
}

/// The control line polling `provider`'s metadata shape at `url`.
fn eviction(provider: &str, url: &str) -> String {
    format!("eviction = {{ provider = \"{provider}\", url = \"{url}\" }}")
}

fn config(manifest: PathBuf) -> Config {
    let mut c = Config::new(manifest);
    c.listen = "127.0.0.1:0".parse().unwrap();
    c.interval = Duration::from_millis(100);
    c.stale_after = Some(Duration::from_millis(300));
    c.token = Some(TOKEN.into());
    c.eviction_hold = Duration::from_millis(HOLD_MS);
    c
}

fn client() -> reqwest::Client {
    ace_control::http_client(Duration::from_secs(2)).unwrap()
}

fn url(r: &Running) -> String {
    format!("http://{}/v1/snapshot", r.addr)
}

async fn snapshot(r: &Running) -> (Snapshot, String) {
    snapshot_and_etag(r).await
}

#[tokio::test]
async fn load_follows_the_server_and_a_failing_scrape_is_held_stale() {
    let engine = Arc::new(Mutex::new(Engine {
        running: 3,
        waiting: 1,
        kv: 0.25,
        fail: false,
        adapters: "chat-lora",
    }));
    let base = fake_vllm(engine.clone()).await;
    // A port nobody listens on: never scraped.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let dir = tempfile::tempdir().unwrap();
    let m = manifest(
        dir.path(),
        &[
            dest("gpu", "inhouse", "", &format!("url = \"{base}\"")),
            dest("gone", "inhouse", "", &format!("url = \"{dead}\"")),
        ],
    );
    let r = ace_control::start(config(m)).await.unwrap();

    let s = wait_for(&r, 5, "the first load", |s| {
        s.report("gpu")
            .and_then(|r| r.load)
            .is_some_and(|l| l.running == 3 && !l.stale)
    })
    .await;
    let g = s.report("gpu").unwrap();
    let l = g.load.unwrap();
    assert_eq!((l.waiting, l.kv_permille, l.stale), (1, 250, false));
    assert_eq!(
        g.warm.as_deref(),
        Some(&["chat-lora".to_string(), "llama".into(), "sql-lora".into()][..])
    );
    assert!(s.report("gone").is_none(), "never scraped: no load figure");

    engine.lock().unwrap().running = 7;
    wait_for(&r, 5, "the load to follow", |s| {
        s.report("gpu")
            .and_then(|r| r.load)
            .is_some_and(|l| l.running == 7 && !l.stale)
    })
    .await;

    engine.lock().unwrap().fail = true;
    let s = wait_for(&r, 5, "a stale load", |s| {
        s.report("gpu")
            .and_then(|r| r.load)
            .is_some_and(|l| l.stale)
    })
    .await;
    let l = s.report("gpu").unwrap().load.unwrap();
    assert_eq!(
        (l.running, l.waiting),
        (7, 1),
        "the last good figures are held"
    );
    let m = metrics(&r).await;
    assert!(
        m.contains("ace_control_load_stale{destination=\"gpu\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("ace_control_load_stale{destination=\"gone\"} 1"),
        "{m}"
    );
    assert!(
        !m.contains("ace_control_scrape_failures_total{destination=\"gpu\"} 0"),
        "{m}"
    );

    {
        let mut e = engine.lock().unwrap();
        e.fail = false;
        e.running = 0;
    }
    wait_for(&r, 5, "a fresh load again", |s| {
        s.report("gpu")
            .and_then(|r| r.load)
            .is_some_and(|l| l.running == 0 && !l.stale)
    })
    .await;
    r.stop().await;
}

#[tokio::test]
async fn aws_notice_drains_and_404_lifts() {
    let notice: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let n = notice.clone();
    let imds = serve(
        Router::new()
            .route(
                "/latest/api/token",
                put(|h: HeaderMap| async move {
                    match h.get("x-aws-ec2-metadata-token-ttl-seconds") {
                        Some(_) => (StatusCode::OK, "tok"),
                        None => (StatusCode::BAD_REQUEST, ""),
                    }
                }),
            )
            .route(
                "/latest/meta-data/spot/instance-action",
                get(move |h: HeaderMap| async move {
                    if h.get("x-aws-ec2-metadata-token").map(|v| v.as_bytes()) != Some(b"tok") {
                        return (StatusCode::UNAUTHORIZED, String::new());
                    }
                    match n.lock().unwrap().clone() {
                        None => (StatusCode::NOT_FOUND, String::new()),
                        Some(b) => (StatusCode::OK, b),
                    }
                }),
            ),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let m = manifest(
        dir.path(),
        &[dest("spot", "spot", "gpus = 4", &eviction("aws", &imds))],
    );
    let r = ace_control::start(config(m)).await.unwrap();
    // A few polls of 404: nothing to say.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (s, _) = snapshot(&r).await;
    assert!(s.report("spot").is_none(), "{s:?}");

    let at = now_ms() + 120_000;
    *notice.lock().unwrap() = Some(format!(
        "{{\"action\":\"terminate\",\"time\":\"{}\"}}",
        rfc3339(at)
    ));
    let s = wait_for(&r, 5, "the drain", |s| {
        s.report("spot").is_some_and(|r| r.drain.is_some())
    })
    .await;
    let d = s.report("spot").unwrap().drain.unwrap();
    assert_eq!(d.reason, DrainReason::Eviction);
    assert_eq!(d.until_ms, at + HOLD_MS, "drained past the eviction");
    let m = metrics(&r).await;
    assert!(
        m.contains("ace_control_eviction_notice{destination=\"spot\"} 1"),
        "{m}"
    );
    assert!(m.contains("ace_control_eviction_notices_total 1"), "{m}");

    *notice.lock().unwrap() = None;
    wait_for(&r, 5, "the drain to lift", |s| s.report("spot").is_none()).await;
    r.stop().await;
}

/// A metadata endpoint at `path` answering `body` to requests that carry
/// the `header` the cloud requires, 400 to others.
async fn fake_metadata(
    path: &'static str,
    header: (&'static str, &'static str),
    body: Arc<Mutex<String>>,
) -> String {
    serve(Router::new().route(
        path,
        get(move |h: HeaderMap| async move {
            if h.get(header.0).map(|v| v.as_bytes()) != Some(header.1.as_bytes()) {
                return (StatusCode::BAD_REQUEST, String::new());
            }
            (StatusCode::OK, body.lock().unwrap().clone())
        }),
    ))
    .await
}

#[tokio::test]
async fn gcp_true_and_azure_preempt_drain() {
    let preempted = Arc::new(Mutex::new(String::from("FALSE")));
    let gcp = fake_metadata(
        "/computeMetadata/v1/instance/preempted",
        ("metadata-flavor", "Google"),
        preempted.clone(),
    )
    .await;
    let events = Arc::new(Mutex::new(String::from(
        r#"{"DocumentIncarnation":1,"Events":[]}"#,
    )));
    let azure = fake_metadata(
        "/metadata/scheduledevents",
        ("metadata", "true"),
        events.clone(),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let m = manifest(
        dir.path(),
        &[
            dest("g", "spot", "", &eviction("gcp", &gcp)),
            dest(
                "a",
                "spot",
                "",
                &format!(
                    "eviction = {{ provider = \"azure\", url = \"{azure}\", vm_name = \"vm1\" }}"
                ),
            ),
        ],
    );
    let r = ace_control::start(config(m)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(snapshot(&r).await.0.reports.is_empty());

    let before = now_ms();
    *preempted.lock().unwrap() = "TRUE".into();
    let not_before = "Mon, 19 Sep 2039 18:29:47 GMT";
    *events.lock().unwrap() = format!(
        r#"{{"DocumentIncarnation":2,"Events":[{{"EventId":"e1","EventType":"Preempt","ResourceType":"VirtualMachine","Resources":["vm1"],"EventStatus":"Scheduled","NotBefore":"{not_before}"}}]}}"#
    );
    let s = wait_for(&r, 5, "both drains", |s| {
        s.report("g").is_some_and(|r| r.drain.is_some())
            && s.report("a").is_some_and(|r| r.drain.is_some())
    })
    .await;
    let g = s.report("g").unwrap().drain.unwrap();
    assert_eq!(g.reason, DrainReason::Eviction);
    // First seen TRUE, plus GCP's 30 s, plus the hold.
    assert!(g.until_ms >= before + 30_000 + HOLD_MS && g.until_ms <= now_ms() + 30_000 + HOLD_MS);
    let a = s.report("a").unwrap().drain.unwrap();
    let nb = chrono::DateTime::parse_from_rfc2822(not_before)
        .unwrap()
        .timestamp_millis() as u64;
    assert_eq!(a.until_ms, nb + HOLD_MS);

    // The event is cancelled; GCP's machine is replaced.
    *events.lock().unwrap() = r#"{"DocumentIncarnation":3,"Events":[]}"#.into();
    *preempted.lock().unwrap() = "FALSE".into();
    wait_for(&r, 5, "both lifted", |s| s.reports.is_empty()).await;
    r.stop().await;
}

async fn post_notice(r: &Running, token: Option<&str>, body: String) -> (u16, String) {
    let mut req = client()
        .post(format!("http://{}/v1/notice", r.addr))
        .header("content-type", "application/json")
        .body(body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

#[tokio::test]
async fn the_webhook_drains_and_lifts_and_needs_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let m = manifest(dir.path(), &[dest("spot", "spot", "", "")]);
    let r = ace_control::start(config(m)).await.unwrap();
    let until = now_ms() + 600_000;
    let body = format!(
        r#"{{"destination":"spot","until":"{}","reason":"eviction"}}"#,
        rfc3339(until)
    );
    assert_eq!(post_notice(&r, None, body.clone()).await.0, 401);
    assert_eq!(post_notice(&r, Some("wrong"), body.clone()).await.0, 401);
    let (code, text) = post_notice(&r, Some(TOKEN), body).await;
    assert_eq!(code, 200, "{text}");
    let s = wait_for(&r, 5, "the pushed drain", |s| s.report("spot").is_some()).await;
    let d = s.report("spot").unwrap().drain.unwrap();
    assert_eq!((d.until_ms, d.reason), (until, DrainReason::Eviction));

    let (code, text) = post_notice(
        &r,
        Some(TOKEN),
        r#"{"destination":"nowhere","until":"2030-01-01T00:00:00Z"}"#.into(),
    )
    .await;
    assert_eq!(code, 400);
    assert!(
        text.contains("`destination`: `nowhere` is not in the fleet manifest"),
        "{text}"
    );
    let (code, text) = post_notice(
        &r,
        Some(TOKEN),
        r#"{"destination":"spot","until":"soon"}"#.into(),
    )
    .await;
    assert_eq!(code, 400);
    assert!(text.contains("`until`"), "{text}");

    let (code, _) = post_notice(
        &r,
        Some(TOKEN),
        r#"{"destination":"spot","until":"2000-01-01T00:00:00Z","reason":"operator"}"#.into(),
    )
    .await;
    assert_eq!(code, 200);
    wait_for(&r, 5, "the lift", |s| s.reports.is_empty()).await;
    r.stop().await;
}

#[tokio::test]
async fn prices_version_etag_304_and_401() {
    let dir = tempfile::tempdir().unwrap();
    let prices = dir.path().join("prices.json");
    std::fs::write(
        &prices,
        r#"{"sample_spec":{"input_cost_per_token":"see docs"},
            "openai/gpt-4o":{"input_cost_per_token":2.5e-06,"output_cost_per_token":1e-05}}"#,
    )
    .unwrap();
    let feed = dir.path().join("gpu.json");
    let past = rfc3339(now_ms() - 60_000);
    let soon = now_ms() + 1_500;
    std::fs::write(
        &feed,
        format!(
            r#"{{"prices":[{{"key":"aws/us-east-1/p5/spot","usd_per_gpu_hour":3.0,"from":"{past}"}},
                {{"key":"aws/us-east-1/p5/spot","usd_per_gpu_hour":2.5,"from":"{}"}}]}}"#,
            rfc3339(soon)
        ),
    )
    .unwrap();
    let m = manifest(
        dir.path(),
        &[
            dest("api", "payg", "", "price_key = \"gpt-4o\""),
            dest(
                "spot",
                "spot",
                "gpus = 8",
                "gpu_price_key = \"aws/us-east-1/p5/spot\"",
            ),
        ],
    );
    let mut c = config(m);
    c.prices = Some(prices.clone());
    c.gpu_prices = Some(FeedSource::File(feed));
    let r = ace_control::start(c).await.unwrap();

    let s = wait_for(&r, 5, "prices", |s| s.reports.len() == 2).await;
    let p = s.report("api").unwrap().price.unwrap();
    assert_eq!(
        (p.usd_per_input_token, p.usd_per_output_token),
        (2.5e-6, 1e-5)
    );
    assert_eq!(s.report("spot").unwrap().usd_per_hour, Some(24.0));

    // Unchanged: 304 with the same ETag, and the same version.
    let (s1, etag) = snapshot(&r).await;
    let again = fetch(&client(), &url(&r), Some(TOKEN), Some(&etag))
        .await
        .unwrap();
    if now_ms() < soon {
        assert_eq!(again, Fetched::NotModified);
    }
    // The feed's scheduled change takes effect at its time, as a new version.
    let s2 = wait_for(&r, 5, "the scheduled GPU price", |s| {
        s.report("spot").unwrap().usd_per_hour == Some(20.0)
    })
    .await;
    assert!(s2.version > s1.version);

    // A price file change is a new version.
    std::fs::write(
        &prices,
        r#"{"gpt-4o":{"input_cost_per_token":"1e-06","output_cost_per_token":"4e-06"}}"#,
    )
    .unwrap();
    let s3 = wait_for(&r, 5, "the new price", |s| {
        s.report("api").unwrap().price.unwrap().usd_per_input_token == 1e-6
    })
    .await;
    assert!(s3.version > s2.version);
    let (s4, etag) = snapshot(&r).await;
    assert_eq!(s4, s3);
    assert_eq!(
        fetch(&client(), &url(&r), Some(TOKEN), Some(&etag))
            .await
            .unwrap(),
        Fetched::NotModified
    );
    // A broken price file keeps the last good prices.
    std::fs::write(&prices, "{ not json").unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (s5, _) = snapshot(&r).await;
    assert_eq!(s5.version, s4.version);

    // Without the token, or with another: 401.
    let e = fetch(&client(), &url(&r), None, None).await.unwrap_err();
    assert!(e.0.contains("401"), "{e}");
    assert!(fetch(&client(), &url(&r), Some("s3cret-tokem"), None)
        .await
        .is_err());
    // JSON for humans.
    let j = client()
        .get(format!("{}?format=json", url(&r)))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let j: serde_json::Value = serde_json::from_str(&j).unwrap();
    assert_eq!(j["version"], s4.version);
    let m = metrics(&r).await;
    assert!(
        m.contains("ace_control_snapshot_requests_total{code=\"401\"} 2"),
        "{m}"
    );
    assert!(
        m.contains("ace_control_snapshot_requests_total{code=\"304\"}"),
        "{m}"
    );
    assert!(
        m.contains("ace_control_source_errors_total{source=\"prices\"}"),
        "{m}"
    );
    assert!(
        m.contains(&format!("ace_control_snapshot_version {}", s4.version)),
        "{m}"
    );
    r.stop().await;
}

#[tokio::test]
async fn the_plan_step_sets_capacity() {
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.jsonl");
    std::fs::write(
        &plan,
        "{\"step\":0,\"owned\":[{\"app\":0,\"gpus\":2,\"gpu_ids\":[0,1]}],\"started\":[],\"valid\":true}\n\
         {\"step\":1,\"owned\":[{\"app\":1,\"gpus\":4}],\"started\":[7],\"valid\":true}\n\
         {\"step\":2,\"owned\":[{\"app\":0,\"gpus\":3}],\"started\":[],\"valid\":true}\n",
    )
    .unwrap();
    let m = manifest(
        dir.path(),
        &[dest(
            "owned",
            "inhouse",
            "",
            "plan_app = 0\nslots_per_gpu = 4",
        )],
    );
    let mut c = config(m);
    c.plan = Some(PlanSource {
        path: plan,
        start_ms: now_ms(),
        step: Duration::from_millis(1000),
    });
    let r = ace_control::start(c).await.unwrap();
    let cap = |s: &Snapshot| s.report("owned").and_then(|r| r.capacity);
    wait_for(&r, 5, "step 1: the GPUs went to batch work", |s| {
        cap(s) == Some(0)
    })
    .await;
    wait_for(&r, 5, "step 2: 3 GPUs x 4 slots", |s| cap(s) == Some(12)).await;
    // Past the plan's last step: nothing to say.
    wait_for(&r, 5, "the end of the plan", |s| cap(s).is_none()).await;
    r.stop().await;
}

#[tokio::test]
async fn bad_inputs_refuse_to_start_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let m = manifest(
        dir.path(),
        &[dest(
            "owned",
            "inhouse",
            "",
            "plan_app = 0\nslots_per_gpu = 4",
        )],
    );
    let plan = dir.path().join("plan.jsonl");
    std::fs::write(
        &plan,
        "{\"step\":0,\"owned\":[]}\n{\"step\":1,\"owned\":[{\"app\":0}]}\n",
    )
    .unwrap();
    let mut c = config(m.clone());
    c.plan = Some(PlanSource {
        path: plan,
        start_ms: 0,
        step: Duration::from_secs(3600),
    });
    let e = ace_control::start(c).await.unwrap_err();
    assert!(e.0.contains("plan.jsonl: line 2, field `gpus`"), "{e}");

    let mut c = config(m.clone());
    c.prices = Some(dir.path().join("missing.json"));
    let e = ace_control::start(c).await.unwrap_err();
    assert!(
        e.0.contains("cannot read") && e.0.contains("missing.json"),
        "{e}"
    );

    std::fs::write(&m, "version = 1\n[[destinations]]\nname = \"x\"\n").unwrap();
    let e = ace_control::start(config(m)).await.unwrap_err();
    assert!(e.0.contains("fleet.toml"), "{e}");
}

#[tokio::test]
async fn a_gpu_price_feed_over_http_is_fetched_every_interval() {
    let feed = Arc::new(Mutex::new(String::new()));
    let f = feed.clone();
    let base = serve(Router::new().route(
        "/gpu.json",
        get(move || async move {
            let body = f.lock().unwrap().clone();
            if body.is_empty() {
                (StatusCode::SERVICE_UNAVAILABLE, body)
            } else {
                (StatusCode::OK, body)
            }
        }),
    ))
    .await;
    let change = |usd: f64| {
        format!(
            r#"{{"prices":[{{"key":"gcp/l4/spot","usd_per_gpu_hour":{usd},"from":"2020-01-01T00:00:00Z"}}]}}"#
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let m = manifest(
        dir.path(),
        &[dest(
            "spot",
            "spot",
            "gpus = 2",
            "gpu_price_key = \"gcp/l4/spot\"",
        )],
    );
    let mut c = config(m);
    c.gpu_prices = Some(FeedSource::parse(&format!("{base}/gpu.json")));
    // The feed is down at start: the service starts, and picks it up.
    let r = ace_control::start(c).await.unwrap();
    let hourly = |s: &Snapshot| s.report("spot").and_then(|r| r.usd_per_hour);
    assert_eq!(hourly(&snapshot(&r).await.0), None);
    *feed.lock().unwrap() = change(0.5);
    wait_for(&r, 5, "the feed's price", |s| hourly(s) == Some(1.0)).await;
    *feed.lock().unwrap() = change(0.75);
    wait_for(&r, 5, "the feed's new price", |s| hourly(s) == Some(1.5)).await;
    // Down again: the last good price stays.
    feed.lock().unwrap().clear();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(hourly(&snapshot(&r).await.0), Some(1.5));
    r.stop().await;
}

/// A page or answer from `tests/fixtures/` (each cites the engine, cloud
/// or provider and version it follows: `tests/fixtures/README.md`).
macro_rules! fixture {
    ($name:literal) => {
        include_str!(concat!("fixtures/", $name))
    };
}

/// A model server serving whatever page the test sets at `path`.
async fn fake_engine(path: &'static str, page: Arc<Mutex<Option<&'static str>>>) -> String {
    serve(Router::new().route(
        path,
        get(move || async move {
            match *page.lock().unwrap() {
                Some(p) => (StatusCode::OK, p),
                None => (StatusCode::SERVICE_UNAVAILABLE, ""),
            }
        }),
    ))
    .await
}

#[tokio::test]
async fn restarted_and_fresh_engines_report_no_phantom_load() {
    let tgi_page = Arc::new(Mutex::new(Some(fixture!("tgi-busy.prom"))));
    let trt_page = Arc::new(Mutex::new(Some(fixture!("trtllm-busy.prom"))));
    let fresh_page = Arc::new(Mutex::new(Some(fixture!("tgi-fresh.prom"))));
    let tgi = fake_engine("/metrics", tgi_page.clone()).await;
    let trt = fake_engine("/prometheus/metrics", trt_page.clone()).await;
    let fresh = fake_engine("/metrics", fresh_page).await;
    let dir = tempfile::tempdir().unwrap();
    let m = manifest(
        dir.path(),
        &[
            dest(
                "tgi",
                "inhouse",
                "",
                &format!("url = \"{tgi}\"\nengine = \"tgi\"\nkv_token_budget = 16384\nmodels = \"{tgi}/none\""),
            ),
            dest(
                "trt",
                "inhouse",
                "",
                &format!("url = \"{trt}\"\nengine = \"trtllm\"\nmodels = \"{trt}/none\""),
            ),
            dest(
                "fresh",
                "inhouse",
                "",
                &format!("url = \"{fresh}\"\nengine = \"tgi\"\nmodels = \"{fresh}/none\""),
            ),
        ],
    );
    let r = ace_control::start(config(m)).await.unwrap();
    let load = |s: &Snapshot, name: &str| s.report(name).and_then(|r| r.load);
    let s = wait_for(&r, 5, "busy figures", |s| {
        load(s, "tgi").is_some_and(|l| l.running == 3 && !l.stale)
            && load(s, "trt").is_some_and(|l| l.running == 5 && !l.stale)
    })
    .await;
    let t = load(&s, "tgi").unwrap();
    assert_eq!(
        (t.waiting, t.kv_permille),
        (9, 250),
        "TGI KV use: 4096 of 16384 tokens"
    );
    // A TGI that has served nothing yet is up and idle, not failing.
    let f = load(&s, "fresh").expect("a fresh TGI has a load");
    assert_eq!((f.running, f.waiting, f.stale), (0, 0, false));

    // Both go down: their figures are held, stale, with their scrape time.
    *tgi_page.lock().unwrap() = None;
    *trt_page.lock().unwrap() = None;
    let s = wait_for(&r, 5, "held figures", |s| {
        load(s, "tgi").is_some_and(|l| l.stale) && load(s, "trt").is_some_and(|l| l.stale)
    })
    .await;
    let held = load(&s, "tgi").unwrap();
    assert_eq!((held.running, held.waiting), (3, 9));
    assert!(held.scraped_ms > 0 && held.scraped_ms <= now_ms());

    // They come back restarted: TGI's page is empty until its first
    // request, trtllm-serve's has no load gauge until one completes.
    *tgi_page.lock().unwrap() = Some(fixture!("tgi-restarted.prom"));
    *trt_page.lock().unwrap() = Some(fixture!("trtllm-fresh.prom"));
    let s = wait_for(&r, 5, "restarted engines, idle", |s| {
        load(s, "tgi").is_some_and(|l| !l.stale) && load(s, "trt").is_some_and(|l| !l.stale)
    })
    .await;
    for name in ["tgi", "trt"] {
        let l = load(&s, name).unwrap();
        assert_eq!(
            (l.running, l.waiting, l.scraped_ms),
            (0, 0, 0),
            "{name}: no phantom requests after a restart"
        );
    }
    let m = metrics(&r).await;
    assert!(
        m.contains("ace_control_scrape_failures_total{destination=\"fresh\"} 0"),
        "a fresh engine is never a scrape failure: {m}"
    );
    r.stop().await;
}

#[tokio::test]
async fn a_keyed_model_server_is_read_with_the_key_from_its_file() {
    const KEY: &str = "sk-vllm-local-7f3a";
    let app = Router::new()
        .route("/metrics", get(|| async { fixture!("vllm-v1.prom") }))
        .route(
            "/v1/models",
            // vLLM with --api-key: 401 and its body without the bearer.
            get(|h: HeaderMap| async move {
                let ok = h.get("authorization").map(|v| v.as_bytes())
                    == Some(format!("Bearer {KEY}").as_bytes());
                if ok {
                    (StatusCode::OK, fixture!("vllm-models.json"))
                } else {
                    (StatusCode::UNAUTHORIZED, fixture!("vllm-models-401.json"))
                }
            }),
        );
    let base = serve(app).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("vllm.key"), format!("{KEY}\n")).unwrap();
    let m = manifest(
        dir.path(),
        &[
            dest(
                "keyed",
                "inhouse",
                "",
                &format!("url = \"{base}\"\napi_key_file = \"vllm.key\""),
            ),
            dest("keyless", "inhouse", "", &format!("url = \"{base}\"")),
        ],
    );
    let r = ace_control::start(config(m)).await.unwrap();
    let s = wait_for(&r, 5, "the keyed server's warm list", |s| {
        s.report("keyed").is_some_and(|r| r.warm.is_some())
    })
    .await;
    assert_eq!(
        s.report("keyed").unwrap().warm.as_deref(),
        Some(
            &[
                "chat-lora".to_string(),
                "meta-llama/Llama-3.1-8B-Instruct".into(),
                "sql-lora".into()
            ][..]
        )
    );
    // Without the key the list is never read (load still is: vLLM does not
    // guard /metrics).
    let keyless = s.report("keyless").unwrap();
    assert!(keyless.warm.is_none() && keyless.load.is_some());
    r.stop().await;

    // An empty key file refuses to start, naming the destination and file
    // but not printing anything of a key.
    std::fs::write(dir.path().join("vllm.key"), "\n").unwrap();
    let e = ace_control::start(config(dir.path().join("fleet.toml")))
        .await
        .unwrap_err();
    assert!(
        e.0.contains("destination `keyed`, control field `api_key_file`") && e.0.contains("empty"),
        "{e}"
    );
}
