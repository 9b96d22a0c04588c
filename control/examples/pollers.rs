//! Load on the control service: P pollers that each behave like one Envoy.
//!
//! ```sh
//! cargo run --release -p ace-control --example pollers -- \
//!     [--pollers 1000] [--seconds 30] [--destinations 1024] [--change-every 5] [--idle 2000]
//! ```
//!
//! With `--idle N` the child first opens N connections that never send a
//! byte (from `127.0.0.2` on, 200 per address, under the service's
//! per-address cap), holds them through the run, and only then starts
//! the pollers, each from its own address (`127.1.x.y`), as each Envoy
//! has its own: the service must answer every poll while the idle ones
//! hold their slots. Keep `--seconds` under the service's 30 s idle
//! timeout for them to stay open throughout. The child holds N + P
//! sockets and the service as many: raise `ulimit -n` above twice that
//! (e.g. `ulimit -n 8192` for 2,000 + 1,000).
//!
//! It starts `ace control serve` in this process on 127.0.0.1:0 with a
//! generated fleet of N `payg` destinations (`dest-0000`, ...), each priced
//! from a generated LiteLLM-format price file and given capacity by a
//! one-step plan, so every report carries a price and a capacity; no live
//! source is polled (no model server, no metadata endpoint).
//!
//! The pollers run in a child process (this binary again, `--role
//! pollers`), so that the CPU time this process spends during the run is
//! the service's alone (its HTTP server, its once-a-second rebuild and
//! file checks), read from `/proc/self/stat`; the child reports its own.
//! Each poller holds its own client and so its own keep-alive connection,
//! as each Envoy holds one connection to its control cluster: a pooled
//! client would multiplex 1,000 pollers over a few connections and hide
//! the per-connection cost. Poller `i` first polls at `i / P` of a
//! second, then once a second (a late answer delays the next poll, as
//! Envoy re-arms its timer after one): `GET /v1/snapshot` with the bearer
//! token and, once it has one, its last ETag in `If-None-Match`. Every
//! 200's body is decoded and checked as a filter would.
//!
//! With `--change-every S` the child rewrites the price file every S
//! seconds (one destination's price moves), so the service publishes a new
//! version and every poller's next poll is a full snapshot.
//!
//! It prints the figures, then one summary line for `BENCHMARKS.md`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TOKEN: &str = "pollers-bench-token-0123456789abcdef";

#[derive(Clone, Debug)]
struct Args {
    pollers: usize,
    seconds: u64,
    destinations: usize,
    change_every: Option<u64>,
    /// Idle connections held through the run.
    idle: usize,
    /// Child only: the snapshot URL and the price file to rewrite.
    url: Option<String>,
    prices: Option<PathBuf>,
}

fn usage() -> ! {
    eprintln!(
        "usage: pollers [--pollers 1000] [--seconds 30] [--destinations 1024] [--change-every S]"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut a = Args {
        pollers: 1000,
        seconds: 30,
        destinations: 1024,
        change_every: None,
        idle: 0,
        url: None,
        prices: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let Some(v) = it.next() else { usage() };
        let num = |v: &str| v.parse::<u64>().unwrap_or_else(|_| usage());
        match flag.as_str() {
            "--pollers" => a.pollers = num(&v) as usize,
            "--seconds" => a.seconds = num(&v),
            "--destinations" => a.destinations = num(&v) as usize,
            "--change-every" => a.change_every = Some(num(&v)).filter(|&s| s > 0),
            "--idle" => a.idle = num(&v) as usize,
            "--url" => a.url = Some(v),
            "--prices" => a.prices = Some(PathBuf::from(v)),
            _ => usage(),
        }
    }
    if a.pollers == 0 || a.seconds == 0 || a.destinations == 0 {
        usage()
    }
    a
}

fn main() {
    let args = parse_args();
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    if args.url.is_some() {
        rt.block_on(pollers(args));
    } else {
        rt.block_on(service(args));
    }
}

/// This process's user + system CPU time, all threads, from
/// `/proc/self/stat` (clock ticks of 10 ms).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces): state is
    // field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    Duration::from_millis(ticks * 1000 / clock_ticks())
}

fn clock_ticks() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|&t| t > 0)
        .unwrap_or(100)
}

/// The LiteLLM-format price file; `generation` moves one destination's
/// input price.
fn price_file(n: usize, generation: u64) -> String {
    let mut s = String::from("{\n  \"sample_spec\": {\"input_cost_per_token\": \"set this\"}");
    let moved = (generation as usize) % n;
    for i in 0..n {
        let bump = if generation > 0 && i == moved {
            1e-9 * generation as f64
        } else {
            0.0
        };
        s.push_str(&format!(
            ",\n  \"prov{p}/model-{i:04}\": {{\"max_tokens\": 8192, \"max_input_tokens\": 128000, \
             \"max_output_tokens\": 8192, \"input_cost_per_token\": {inp:e}, \
             \"output_cost_per_token\": {out:e}, \"litellm_provider\": \"prov{p}\", \"mode\": \"chat\", \
             \"supports_function_calling\": true}}",
            p = i % 8,
            inp = 1e-7 * (1 + i % 50) as f64 + bump,
            out = 4e-7 * (1 + i % 50) as f64,
        ));
    }
    s.push_str("\n}\n");
    s
}

fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write the price file");
    std::fs::rename(&tmp, path).expect("move the price file into place");
}

/// The parent: the service, in process.
async fn service(args: Args) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let n = args.destinations;
    let (c, prices) = fleet(dir.path(), n);
    let running = ace_control::start(c).await.expect("the service starts");
    let url = format!("http://{}/v1/snapshot", running.addr);
    let snapshot_bytes = first_snapshot(&url, n).await;

    // The idle service: its rebuild and file checks, once a second.
    let (idle_cpu0, idle_t0) = (cpu_time(), Instant::now());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle = (cpu_time() - idle_cpu0, idle_t0.elapsed());

    let counters0 = counters(running.addr).await;
    let (cpu0, t0) = (cpu_time(), Instant::now());
    let out = run_pollers(&args, &url, &prices).await;
    let cpu = cpu_time() - cpu0;
    let wall = t0.elapsed();
    let counters1 = counters(running.addr).await;
    running.stop().await;
    assert!(out.status.success(), "the pollers failed: {}", out.status);
    let r: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("the pollers' report (JSON)");
    let own = (counters1.0 - counters0.0, counters1.1 - counters0.1);
    print_figures(&args, &r, snapshot_bytes, (cpu, wall), idle, own);
}

/// The generated fleet of `n` destinations in `dir`, its price file and
/// a one-step plan: the service's configuration, and the price file.
fn fleet(dir: &Path, n: usize) -> (ace_control::Config, PathBuf) {
    let mut fleet = String::from("version = 1\n[[models]]\nid = \"llama\"\nvram_gb = 16\n");
    for i in 0..n {
        fleet.push_str(&format!(
            "[[destinations]]\nname = \"dest-{i:04}\"\ncluster = \"c{i}\"\nprovider = \"prov{p}\"\n\
             tier = \"payg\"\njurisdiction = \"US\"\nregion = \"us-east-1\"\naccelerator = \"h100\"\n\
             vram_gb = 80\ninterconnect = \"nvlink\"\nmodels = [\"llama\"]\n[destinations.cost]\n\
             [destinations.control]\nprice_key = \"prov{p}/model-{i:04}\"\nplan_app = {a}\nslots_per_gpu = 8\n",
            p = i % 8,
            a = i % 8,
        ));
    }
    let manifest = dir.join("fleet.toml");
    std::fs::write(&manifest, fleet).expect("write the manifest");
    let prices = dir.join("model_prices_and_context_window.json");
    write_atomically(&prices, &price_file(n, 0));
    let plan = dir.join("plan.jsonl");
    let owned: Vec<String> = (0..8)
        .map(|a| format!("{{\"app\":{a},\"gpus\":{}}}", 4 + a))
        .collect();
    std::fs::write(
        &plan,
        format!("{{\"step\":0,\"owned\":[{}]}}\n", owned.join(",")),
    )
    .expect("write the plan");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;

    let mut c = ace_control::Config::new(manifest);
    c.listen = "127.0.0.1:0".parse().unwrap();
    c.token = Some(TOKEN.into());
    c.prices = Some(prices.clone());
    c.plan = Some(ace_control::PlanSource {
        path: plan,
        start_ms: now_ms - 60_000,
        step: Duration::from_secs(24 * 3600),
    });
    (c, prices)
}

/// Waits for the first full snapshot at `url` (every one of the `n`
/// destinations priced); its size in bytes.
async fn first_snapshot(url: &str, n: usize) -> usize {
    let client = ace_control::http_client(Duration::from_secs(5)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = client
            .get(url)
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("the service answers");
        let body = r.bytes().await.unwrap();
        let s = ace_snapshot::decode(&body).expect("a valid snapshot");
        if s.reports.len() == n && s.reports.iter().all(|r| r.price.is_some()) {
            return body.len();
        }
        assert!(Instant::now() < deadline, "no full snapshot within 30 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs the pollers in a child process (this binary, `--url`) to its
/// exit.
async fn run_pollers(args: &Args, url: &str, prices: &Path) -> std::process::Output {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--pollers",
        &args.pollers.to_string(),
        "--seconds",
        &args.seconds.to_string(),
        "--destinations",
        &args.destinations.to_string(),
        "--url",
        url,
        "--prices",
        &prices.display().to_string(),
        "--idle",
        &args.idle.to_string(),
    ]);
    if let Some(s) = args.change_every {
        cmd.args(["--change-every", &s.to_string()]);
    }
    cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
    tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .expect("run the pollers")
}

/// Prints the figures of the pollers' report `r`: the service's CPU and
/// wall time over the run (`run`) and idle (`idle`), and its own count of
/// 200s and 304s (`own`).
fn print_figures(
    args: &Args,
    r: &serde_json::Value,
    snapshot_bytes: usize,
    (cpu, wall): (Duration, Duration),
    (idle_cpu, idle_wall): (Duration, Duration),
    (svc_200, svc_304): (u64, u64),
) {
    let n = args.destinations;
    let polls = r["polls"].as_u64().unwrap_or(0);
    let target = (args.pollers as u64) * args.seconds;
    let ok = r["ok"]["n"].as_u64().unwrap_or(0);
    let nm = r["not_modified"]["n"].as_u64().unwrap_or(0);
    let errors = r["errors"].as_u64().unwrap_or(0);
    let window = r["window_s"].as_f64().unwrap_or(1.0);
    let per_poll_us = cpu.as_secs_f64() * 1e6 / polls.max(1) as f64;
    // The service is all but idle outside the poll window (the idle
    // figure below), so its CPU is spread over the window's seconds.
    let core_share = cpu.as_secs_f64() / args.seconds as f64 * 100.0;
    let lat = |k: &str| {
        let v = &r[k];
        format!(
            "p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            v["p50_us"].as_f64().unwrap_or(0.0) / 1e3,
            v["p99_us"].as_f64().unwrap_or(0.0) / 1e3,
            v["max_us"].as_f64().unwrap_or(0.0) / 1e3
        )
    };
    let change = args
        .change_every
        .map_or("nothing changing".to_string(), |s| {
            format!("a price change every {s} s")
        });
    println!(
        "{} pollers x {} s at 1 Hz, {} destinations, {}",
        args.pollers, args.seconds, n, change
    );
    println!("snapshot: {snapshot_bytes} bytes");
    println!(
        "polls: {polls} of {target} ({:.1} % of target; {:.1}/s against {}/s; the last answer {:.2} s after the window's start)",
        polls as f64 * 100.0 / target as f64,
        polls as f64 / args.seconds as f64,
        args.pollers,
        window
    );
    println!("  200: {ok:>7}  {}", lat("ok"));
    println!("  304: {nm:>7}  {}", lat("not_modified"));
    println!("  errors: {errors}  {}", r["first_errors"]);
    println!("service's own count: 200 {svc_200}, 304 {svc_304}");
    println!(
        "service CPU: {:.2} s from the pollers' start to their exit ({:.1} s; {core_share:.1} % of one core over the {} s window; {per_poll_us:.0} µs per poll); idle {:.2} s over {:.1} s",
        cpu.as_secs_f64(),
        wall.as_secs_f64(),
        args.seconds,
        idle_cpu.as_secs_f64(),
        idle_wall.as_secs_f64()
    );
    println!(
        "pollers' CPU (the child): {:.2} s",
        r["cpu_s"].as_f64().unwrap_or(0.0)
    );
    let answered = ok + nm;
    let all_p99 = r["ok"]["p99_us"]
        .as_f64()
        .unwrap_or(0.0)
        .max(r["not_modified"]["p99_us"].as_f64().unwrap_or(0.0))
        / 1e3;
    println!(
        "idle: {} connections opened, {} still open at the end; answered {answered}/{polls} polls; p99 {all_p99:.2} ms (the larger of 200's and 304's)",
        args.idle,
        r["idle_open"].as_u64().unwrap_or(0)
    );
    println!(
        "summary: {} pollers x {} s, {} dests ({} B snapshot), {}: {polls}/{target} polls, {errors} errors; 304 x{nm} {}; 200 x{ok} {}; service CPU {:.2} s = {per_poll_us:.0} µs/poll, {core_share:.1} % of a core",
        args.pollers,
        args.seconds,
        n,
        snapshot_bytes,
        change,
        lat("not_modified"),
        lat("ok"),
        cpu.as_secs_f64(),
    );
}

/// The service's own 200 and 304 counts, from its `/metrics`.
async fn counters(addr: std::net::SocketAddr) -> (u64, u64) {
    let client = ace_control::http_client(Duration::from_secs(5)).unwrap();
    let text = client
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .expect("/metrics answers")
        .text()
        .await
        .unwrap();
    let get = |code: &str| {
        let key = format!("ace_control_snapshot_requests_total{{code=\"{code}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(key.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    (get("200"), get("304"))
}

/// What one poller saw.
#[derive(Default)]
struct Seen {
    ok: Vec<u32>,
    not_modified: Vec<u32>,
    errors: u64,
    first_error: Option<String>,
    bytes: u64,
}

/// The child: P pollers.
async fn pollers(args: Args) {
    let url: Arc<str> = args.url.clone().unwrap().into();
    let cpu0 = cpu_time();
    let period = Duration::from_secs(1);
    let p = args.pollers;
    let target: std::net::SocketAddr = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .and_then(|a| a.parse().ok())
        .expect("the snapshot URL's address");
    let idle = idle_connections(target, args.idle).await;
    let clients = clients(p);
    let start = tokio::time::Instant::now() + Duration::from_millis(200);
    let end = start + Duration::from_secs(args.seconds);
    if let (Some(every), Some(path)) = (args.change_every, args.prices.clone()) {
        tokio::spawn(change_prices(args.destinations, path, every, start, end));
    }

    // When the last answer came, µs after `start`.
    let last = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for (i, client) in clients.into_iter().enumerate() {
        let (url, last) = (url.clone(), last.clone());
        let first = start + period.mul_f64(i as f64 / p as f64);
        let clock = Clock {
            start,
            first,
            period,
            end,
        };
        tasks.spawn(poller(client, url, clock, last));
    }
    let mut all = Seen::default();
    let mut first_errors = BTreeMap::new();
    while let Some(s) = tasks.join_next().await {
        let s = s.expect("a poller");
        all.ok.extend(s.ok);
        all.not_modified.extend(s.not_modified);
        all.errors += s.errors;
        all.bytes += s.bytes;
        if let Some(e) = s.first_error {
            *first_errors.entry(e).or_insert(0u64) += 1;
        }
    }
    // The idle connections still open at the end (read would block: the
    // service has not closed them).
    let idle_open = idle
        .iter()
        .filter(|c| {
            let mut b = [0u8; 1];
            matches!(c.try_read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
        })
        .count();
    drop(idle);
    let window = last.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1e6;
    let stats = |v: &mut Vec<u32>| {
        v.sort_unstable();
        let q = |f: f64| {
            if v.is_empty() {
                0
            } else {
                v[((v.len() - 1) as f64 * f).round() as usize]
            }
        };
        serde_json::json!({"n": v.len(), "p50_us": q(0.5), "p99_us": q(0.99), "max_us": q(1.0)})
    };
    let polls = all.ok.len() as u64 + all.not_modified.len() as u64 + all.errors;
    let report = serde_json::json!({
        "polls": polls,
        "ok": stats(&mut all.ok),
        "not_modified": stats(&mut all.not_modified),
        "errors": all.errors,
        "first_errors": first_errors.into_iter().take(5).collect::<Vec<_>>(),
        "bytes": all.bytes,
        "window_s": window,
        "idle_open": idle_open,
        "cpu_s": (cpu_time() - cpu0).as_secs_f64(),
    });
    println!("{report}");
}

/// `n` connections to `target` that never send a byte, from `127.0.0.2`
/// on, 200 per address (under the service's per-address cap).
async fn idle_connections(target: std::net::SocketAddr, n: usize) -> Vec<tokio::net::TcpStream> {
    let mut idle = Vec::with_capacity(n);
    for i in 0..n {
        let s = tokio::net::TcpSocket::new_v4().expect("a socket");
        let from = std::net::Ipv4Addr::new(127, 0, 0, 2 + (i / 200) as u8);
        s.bind((from, 0).into()).expect("bind a loopback address");
        match s.connect(target).await {
            Ok(c) => idle.push(c),
            Err(e) => panic!("idle connection {i}: {e} (raise `ulimit -n`)"),
        }
    }
    idle
}

/// One client per poller, built before the clock starts: its own
/// keep-alive connection, from its own address (`127.1.x.y`), as each
/// Envoy has its own.
fn clients(p: usize) -> Vec<reqwest::Client> {
    // http_client first: it installs the TLS crypto provider.
    let _ = ace_control::http_client(Duration::from_secs(10));
    (0..p)
        .map(|i| {
            let from = std::net::Ipv4Addr::new(127, 1, (i / 250) as u8, (i % 250) as u8 + 1);
            reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .local_address(std::net::IpAddr::V4(from))
                .build()
                .unwrap()
        })
        .collect()
}

/// Rewrites the price file at `path` (`n` destinations) every `every`
/// seconds from `start` until `end`, one destination's price moved.
async fn change_prices(
    n: usize,
    path: PathBuf,
    every: u64,
    start: tokio::time::Instant,
    end: tokio::time::Instant,
) {
    let mut generation = 0;
    let mut tick = tokio::time::interval_at(
        start + Duration::from_secs(every),
        Duration::from_secs(every),
    );
    loop {
        tick.tick().await;
        if tokio::time::Instant::now() >= end {
            break;
        }
        generation += 1;
        let text = price_file(n, generation);
        let path = path.clone();
        tokio::task::spawn_blocking(move || write_atomically(&path, &text))
            .await
            .unwrap();
    }
}

/// One poller's times: the run's start, its own first poll, the period
/// and the run's end.
struct Clock {
    start: tokio::time::Instant,
    first: tokio::time::Instant,
    period: Duration,
    end: tokio::time::Instant,
}

/// One poller: `GET url` every period until the end, with the last ETag
/// it got; `last` keeps when the latest answer came (µs after the start).
async fn poller(
    client: reqwest::Client,
    url: Arc<str>,
    clock: Clock,
    last: Arc<std::sync::atomic::AtomicU64>,
) -> Seen {
    let mut seen = Seen::default();
    let mut etag: Option<String> = None;
    let mut tick = tokio::time::interval_at(clock.first, clock.period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let at = tick.tick().await;
        if at >= clock.end {
            break;
        }
        let t = Instant::now();
        let mut req = client.get(&*url).bearer_auth(TOKEN);
        if let Some(e) = &etag {
            req = req.header(reqwest::header::IF_NONE_MATCH, e.as_str());
        }
        let r = async {
            let r = req.send().await.map_err(|e| e.to_string())?;
            let status = r.status().as_u16();
            let tag = r
                .headers()
                .get(reqwest::header::ETAG)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let body = r.bytes().await.map_err(|e| e.to_string())?;
            Ok::<_, String>((status, tag, body))
        }
        .await;
        let us = t.elapsed().as_micros().min(u32::MAX as u128) as u32;
        let done = (tokio::time::Instant::now() - clock.start).as_micros() as u64;
        last.fetch_max(done, std::sync::atomic::Ordering::Relaxed);
        let mut fail = |e: String| {
            seen.errors += 1;
            seen.first_error.get_or_insert(e);
        };
        match r {
            Ok((304, _, _)) => seen.not_modified.push(us),
            Ok((200, tag, body)) => match ace_snapshot::decode(&body) {
                Ok(_) => {
                    seen.ok.push(us);
                    seen.bytes += body.len() as u64;
                    etag = tag;
                }
                Err(e) => fail(format!("a bad snapshot: {e}")),
            },
            Ok((s, _, _)) => fail(format!("HTTP {s}")),
            Err(e) => fail(e),
        }
    }
    seen
}
