//! The service against hostile peers: answers too large to hold, redirects
//! to another origin, bytes that would forge log lines, a fleet whose warm
//! lists outgrow the snapshot, and clients that hold connections open.
//!
//! The memory and log cases run the service in a child process (this test
//! binary again, one test, `ACE_HOSTILE_CHILD=1`) so that its peak RSS and
//! its standard error are its own.

use ace_control::{fetch, Config, FeedSource, Fetched, Running};
use ace_snapshot::Snapshot;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, put};
use axum::Router;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::{idle_from, metrics_with, now_ms, rfc3339, serve_on, TOKEN};

const CHILD: &str = "ACE_HOSTILE_CHILD";

fn manifest(dir: &Path, dests: &[String]) -> PathBuf {
    let mut text = String::from("version = 1\n[[models]]\nid = \"llama\"\nvram_gb = 16\n");
    for d in dests {
        text.push_str(d);
    }
    let p = dir.join("fleet.toml");
    std::fs::write(&p, text).unwrap();
    p
}

fn dest(name: &str, tier: &str, control: &str) -> String {
    format!(
        "[[destinations]]\nname = \"{name}\"\ncluster = \"c-{name}\"\nprovider = \"p\"\ntier = \"{tier}\"\n\
         jurisdiction = \"US\"\nregion = \"r\"\naccelerator = \"h100\"\nvram_gb = 80\ninterconnect = \"nvlink\"\n\
         models = [\"llama\"]\n[destinations.cost]\n\n[destinations.control]\n{control}\n"
    )
}

fn config(manifest: PathBuf) -> Config {
    let mut c = Config::new(manifest);
    c.listen = "127.0.0.1:0".parse().unwrap();
    c.interval = Duration::from_millis(100);
    c.token = Some(TOKEN.into());
    c
}

fn client() -> reqwest::Client {
    ace_control::http_client(Duration::from_secs(5)).unwrap()
}

async fn snapshot(r: &Running) -> Snapshot {
    let url = format!("http://{}/v1/snapshot", r.addr);
    match fetch(&client(), &url, Some(TOKEN), None).await.unwrap() {
        Fetched::Snapshot(s, _) => s,
        Fetched::NotModified => panic!("304 without an ETag sent"),
    }
}

/// The value of the `/metrics` line that starts with `key` (0 if none).
fn metric(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Waits until `ok` holds of `/metrics` (10 s at most).
async fn wait_metrics(r: &Running, what: &str, ok: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = metrics_with(&client(), r).await;
        if ok(&m) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}:\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_snapshot(r: &Running, what: &str, ok: impl Fn(&Snapshot) -> bool) -> Snapshot {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = snapshot(r).await;
        if ok(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A server that answers every request with `total` bytes of metrics
/// lines, announced in `content-length` or not, written as the client
/// reads them (it holds one 64 KiB chunk, never the whole).
async fn flood(total: usize, content_length: bool) -> String {
    let line: &[u8] = b"vllm:num_requests_running{engine=\"0\",model_name=\"llama\"} 1\n\
        vllm:num_requests_waiting{engine=\"0\",model_name=\"llama\"} 0\n";
    let total = total / line.len() * line.len();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let length = if content_length {
                    format!("content-length: {total}\r\n")
                } else {
                    String::new()
                };
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n{length}connection: close\r\n\r\n"
                );
                if s.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = line.repeat((64 << 10) / line.len());
                let mut sent = 0;
                while sent < total {
                    let n = chunk.len().min(total - sent);
                    if s.write_all(&chunk[..n]).await.is_err() {
                        return;
                    }
                    sent += n;
                }
            });
        }
    });
    format!("http://{addr}")
}

/// Peak RSS of this process (`VmHWM`), KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Runs test `name` of this module in a child process with [`CHILD`] set;
/// its standard output and error.
fn child(name: &str) -> (String, String) {
    // The test's full name in the binary: its module path less the crate.
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    let full = format!("{module}::{name}");
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([full.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success(),
        "child {name} failed:\n{stdout}\n{stderr}"
    );
    (stdout, stderr)
}

fn in_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

/// The child of [`huge_answers_are_cut_at_their_caps_and_memory_stays_bounded`].
#[tokio::test]
async fn child_huge_answers() {
    if !in_child() {
        return;
    }
    let before = peak_rss_kib();
    // 60 MB of metrics unannounced, 300 MB of feed announced, 60 MB of
    // "models"; and a scrape just under the metrics cap, which is parsed.
    let metrics_flood = flood(60 << 20, false).await;
    let feed_flood = flood(300 << 20, true).await;
    let near_cap = flood(ace_control::MAX_METRICS_BYTES - (64 << 10), true).await;
    let dir = tempfile::tempdir().unwrap();
    let m = manifest(
        dir.path(),
        &[
            dest(
                "flooded",
                "spot",
                &format!(
                    "metrics = \"{metrics_flood}/metrics\"\nmodels = \"{metrics_flood}/v1/models\"\n\
                     gpu_price_key = \"k\""
                ),
            ),
            dest("big", "inhouse", &format!("metrics = \"{near_cap}/metrics\"")),
        ],
    );
    let mut c = config(m);
    c.gpu_prices = Some(FeedSource::Url(format!("{feed_flood}/feed.json")));
    c.timeout = Some(Duration::from_secs(5));
    let r = ace_control::start(c).await.unwrap();
    wait_metrics(&r, "three refused rounds of each source", |m| {
        ["metrics", "models", "gpu_prices"].iter().all(|s| {
            metric(
                m,
                &format!("ace_control_source_errors_total{{source=\"{s}\"}} "),
            ) >= 3
        })
    })
    .await;
    let s = wait_snapshot(&r, "the near-cap scrape's load", |s| {
        s.report("big").and_then(|r| r.load).is_some()
    })
    .await;
    assert!(s.report("flooded").is_none(), "{s:?}");
    r.stop().await;
    println!("peak_rss_kib {before} {}", peak_rss_kib());
}

/// A 60 MB scrape cost 1.5 GB (parsing takes ~24x what it reads), and a
/// 300 MB feed aborted the service: every answer is now read up to its
/// cap and no further, so the service's peak memory is bounded by the
/// caps, whatever peers send.
#[test]
fn huge_answers_are_cut_at_their_caps_and_memory_stays_bounded() {
    if in_child() {
        return;
    }
    let (out, _) = child("child_huge_answers");
    let line = out
        .lines()
        .find_map(|l| Some(l.split_once("peak_rss_kib ")?.1))
        .unwrap_or_else(|| panic!("no figures from the child:\n{out}"));
    let v: Vec<u64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
    let (before, peak) = (v[0], v[1]);
    eprintln!("peak RSS: {before} KiB at start, {peak} KiB at the end");
    // Answers past their caps are never held whole; what is parsed is at
    // most a cap (one near-cap scrape: measured 52 MiB over the start,
    // about 12 times the 4 MiB it parsed). Bound: 32 metrics caps.
    let bound = before + 32 * (ace_control::MAX_METRICS_BYTES as u64 / 1024);
    assert!(
        peak <= bound,
        "peak RSS {peak} KiB, above the bound of {bound} KiB"
    );
}

/// A redirect to another host (here 127.0.0.2 standing for a metadata
/// service's credentials path) is refused; one within the origin is
/// followed.
#[tokio::test]
async fn redirects_leave_the_origin_never() {
    let hits = Arc::new(AtomicU64::new(0));
    let h = hits.clone();
    let elsewhere = serve_on(
        "127.0.0.2",
        Router::new().fallback(move || {
            h.fetch_add(1, Ordering::Relaxed);
            async { "vllm:num_requests_running 9\nvllm:num_requests_waiting 9\n" }
        }),
    )
    .await;
    let target = format!("{elsewhere}/latest/meta-data/iam/security-credentials/role");
    let origin = serve_on(
        "127.0.0.1",
        Router::new()
            .route(
                "/away",
                get(move || {
                    let t = target.clone();
                    async move { (StatusCode::FOUND, [("location", t)]).into_response() }
                }),
            )
            .route(
                "/moved",
                get(|| async { (StatusCode::FOUND, [("location", "/real")]).into_response() }),
            )
            .route(
                "/real",
                get(|| async { "vllm:num_requests_running 3\nvllm:num_requests_waiting 1\n" }),
            ),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let m = manifest(
        dir.path(),
        &[
            dest("far", "inhouse", &format!("metrics = \"{origin}/away\"")),
            dest("near", "inhouse", &format!("metrics = \"{origin}/moved\"")),
        ],
    );
    let r = ace_control::start(config(m)).await.unwrap();
    let s = wait_snapshot(&r, "the same-origin redirect's load", |s| {
        s.report("near").and_then(|r| r.load).is_some()
    })
    .await;
    assert_eq!(s.report("near").unwrap().load.unwrap().running, 3);
    wait_metrics(&r, "refused redirects", |m| {
        metric(m, "ace_control_scrape_failures_total{destination=\"far\"} ") >= 3
    })
    .await;
    assert!(snapshot(&r).await.report("far").is_none());
    assert_eq!(
        hits.load(Ordering::Relaxed),
        0,
        "the other origin was asked"
    );
    r.stop().await;
}

/// The child of [`peer_bytes_never_forge_or_flood_the_log`].
#[tokio::test]
async fn child_forged_log() {
    if !in_child() {
        return;
    }
    let at = rfc3339(now_ms() + 120_000);
    let action = "terminate\\nace control: forged: everything is fine";
    let aws = serve_on(
        "127.0.0.1",
        Router::new()
            .route("/latest/api/token", put(|| async { "tok" }))
            .route(
                "/latest/meta-data/spot/instance-action",
                get(move || {
                    let body = format!(r#"{{"action":"{action}","time":"{at}"}}"#);
                    async move { body }
                }),
            ),
    )
    .await;
    // A noisy endpoint: a different 200 KB answer, with newlines, each time.
    let n = Arc::new(AtomicU64::new(0));
    let gcp = serve_on(
        "127.0.0.1",
        Router::new().fallback(move || {
            let i = n.fetch_add(1, Ordering::Relaxed);
            async move { format!("{i}\nace control: forged\n{}", "x".repeat(200_000)) }
        }),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let m = manifest(
        dir.path(),
        &[
            dest(
                "spot",
                "spot",
                &format!("eviction = {{ provider = \"aws\", url = \"{aws}\" }}"),
            ),
            dest(
                "noisy",
                "spot",
                &format!("eviction = {{ provider = \"gcp\", url = \"{gcp}\" }}"),
            ),
        ],
    );
    let r = ace_control::start(config(m)).await.unwrap();
    wait_snapshot(&r, "the drain", |s| {
        s.report("spot").and_then(|r| r.drain).is_some()
    })
    .await;
    wait_metrics(&r, "ten noisy answers", |m| {
        metric(m, "ace_control_source_errors_total{source=\"eviction\"} ") >= 10
    })
    .await;
    r.stop().await;
}

/// A cloud's `action` with a newline forged service log lines, and a
/// noisy endpoint's answers, embedded whole in errors, grew the log by
/// hundreds of KB a second: every log line is now one line, escaped, and
/// at most [`ace_control::MAX_LOGGED`] characters of message.
#[test]
fn peer_bytes_never_forge_or_flood_the_log() {
    if in_child() {
        return;
    }
    let (_, err) = child("child_forged_log");
    let ours: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("ace control:"))
        .collect();
    assert!(
        ours.iter()
            .any(|l| l.contains("terminate\\nace control: forged")),
        "the drain is logged with the action escaped:\n{err}"
    );
    assert!(
        ours.iter().any(|l| l.contains("noisy")),
        "the noisy endpoint is logged:\n{err}"
    );
    for l in &ours {
        assert!(!l.starts_with("ace control: forged"), "a forged line: {l}");
        assert!(
            l.chars().count() <= "ace control: ".len() + ace_control::MAX_LOGGED + 32,
            "a line of {} characters: {}",
            l.len(),
            &l[..200]
        );
    }
    assert!(
        err.len() < 64 << 10,
        "the log grew to {} bytes in a few seconds",
        err.len()
    );
}

/// `POST /v1/notice` draining `destination` until `until_ms`: the status
/// and the answer.
async fn notice(r: &Running, destination: &str, until_ms: u64) -> (u16, String) {
    let body = format!(
        r#"{{"destination":"{destination}","until":"{}"}}"#,
        rfc3339(until_ms)
    );
    let resp = client()
        .post(format!("http://{}/v1/notice", r.addr))
        .bearer_auth(TOKEN)
        .body(body)
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

/// 36 model servers with 1,024 loaded adapters of 250-byte names each
/// (9.4 MB of warm lists) made every publish fail, so a drain never
/// reached the snapshot while the webhook answered `drained: true`. Warm
/// lists now give way (64 KiB per destination, the largest left out past
/// the total), and the drain is published.
#[tokio::test]
async fn warm_lists_give_way_to_drains() {
    let ids: Vec<String> = (0..1024)
        .map(|i| format!("{{\"id\":\"adapter-{i:04}-{}\"}}", "a".repeat(238)))
        .collect();
    let list = format!("{{\"object\":\"list\",\"data\":[{}]}}", ids.join(","));
    let models = serve_on(
        "127.0.0.1",
        Router::new().route(
            "/v1/models",
            get(move || {
                let l = list.clone();
                async move { l }
            }),
        ),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let names: Vec<String> = (0..36).map(|i| format!("d{i:02}")).collect();
    let dests: Vec<String> = names
        .iter()
        .map(|n| dest(n, "spot", &format!("models = \"{models}/v1/models\"")))
        .collect();
    let mut c = config(manifest(dir.path(), &dests));
    c.interval = Duration::from_millis(300);
    let r = ace_control::start(c).await.unwrap();
    wait_snapshot(&r, "every warm list", |s| s.reports.len() == 36).await;
    let until = now_ms() + 600_000;
    let (code, text) = notice(&r, "d07", until).await;
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("\"drained\":true"), "{text}");
    // Answered after the publish: the very next fetch carries it.
    let s = snapshot(&r).await;
    assert_eq!(s.report("d07").unwrap().drain.unwrap().until_ms, until);
    for rep in &s.reports {
        let w = rep.warm.as_ref().unwrap();
        let bytes: usize = 2 + w.iter().map(|n| 2 + n.len()).sum::<usize>();
        assert!(
            bytes <= 64 << 10,
            "{}: {bytes} bytes of warm list",
            rep.name
        );
        assert!(!w.is_empty());
    }
    let m = metrics_with(&client(), &r).await;
    assert_eq!(metric(&m, "ace_control_publish_failures_total "), 0, "{m}");
    r.stop().await;
}

/// A snapshot that cannot be published (here a destination name past the
/// snapshot's 256-byte limit) is counted on `/metrics`, and the webhook
/// answers 503 with `drained: false`, never success.
#[tokio::test]
async fn the_webhook_never_claims_an_unpublished_drain() {
    let long = "x".repeat(300);
    let dir = tempfile::tempdir().unwrap();
    let r = ace_control::start(config(manifest(dir.path(), &[dest(&long, "spot", "")])))
        .await
        .unwrap();
    let (code, text) = notice(&r, &long, now_ms() + 600_000).await;
    assert_eq!(code, 503, "{text}");
    assert!(text.contains("\"drained\":false"), "{text}");
    assert!(text.contains("not published"), "{text}");
    let m = metrics_with(&client(), &r).await;
    assert!(
        metric(&m, "ace_control_publish_failures_total ") >= 1,
        "{m}"
    );
    r.stop().await;
}

/// A client bound to the loopback address `127.0.0.{last}`.
fn client_from(last: u8) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, last]))
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// 200 idle connections from one address used to be held for ever, and
/// past the file descriptor limit starved every poller. Now one address
/// gets 16, the service 48, a new connection to a full service closes an
/// idle one, and an idle connection is closed after the idle timeout; a
/// poller from another address is answered while one address floods, and
/// again once idle connections filled the service and timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_capped_and_closed() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(manifest(dir.path(), &[dest("a", "spot", "")]));
    c.limits = ace_control::listen::Limits {
        max_connections: Some(48),
        max_per_ip: 16,
        idle_timeout: Duration::from_millis(1500),
        ..Default::default()
    };
    let r = ace_control::start(c).await.unwrap();
    let url = format!("http://{}/v1/snapshot", r.addr);
    let mut idle = idle_from(r.addr, 1, 200).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let resp = client_from(2).get(&url).bearer_auth(TOKEN).send().await;
    assert_eq!(resp.unwrap().status(), 200, "the poller is starved");
    let m = metrics_with(&client_from(7), &r).await;
    let open = metric(&m, "ace_control_connections_open ");
    assert!(open <= 16 + 2, "{open} connections open:\n{m}");
    let per_ip = metric(&m, "ace_control_connections_refused_total{why=\"per_ip\"} ");
    assert_eq!(per_ip, 184, "{m}");

    // Four more addresses, 16 each: past the service-wide 48.
    for last in 3..7 {
        idle.extend(idle_from(r.addr, last, 16).await);
    }
    // The newest (which no new connection displaced) are closed by the
    // idle timeout.
    let mut first = idle.pop().unwrap();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(10), first.read(&mut buf))
        .await
        .expect("an idle connection is closed by the service")
        .unwrap_or(0);
    assert_eq!(n, 0, "an idle connection got bytes");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let resp = client_from(2).get(&url).bearer_auth(TOKEN).send().await;
    assert_eq!(resp.unwrap().status(), 200);
    let m = metrics_with(&client_from(7), &r).await;
    let closed = metric(&m, "ace_control_connections_closed_idle_total ");
    assert!(
        closed >= 16,
        "{closed} idle closed for new ones at the cap:\n{m}"
    );
    let open = metric(&m, "ace_control_connections_open ");
    assert!(
        open <= 2,
        "{open} connections open after the idle timeout:\n{m}"
    );
    r.stop().await;
}
