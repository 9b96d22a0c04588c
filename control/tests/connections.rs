//! Connection caps against many addresses (issue 50, item 7): the service
//! runs in a child process (this test binary again, one test, with
//! [`CHILD`] naming the case) under a soft file descriptor limit of
//! [`FD_LIMIT`], so that five addresses' idle connections can reach it
//! without this process needing thousands of descriptors. The red team's
//! figures (a 1,024 limit, 256 per address, `--max-connections 900`)
//! scaled down: a 256 limit, 64 per address, a given cap of 150.

use ace_control::Config;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::{idle_from, TOKEN};

const CHILD: &str = "ACE_CONNECTIONS_CHILD";

/// The child's soft limit on open file descriptors (`ulimit -n`).
const FD_LIMIT: usize = 256;

/// Connections from one address (the service's per-address cap).
const PER_IP: usize = 64;

fn manifest(dir: &Path) -> PathBuf {
    let text = "version = 1\n[[models]]\nid = \"llama\"\nvram_gb = 16\n\
        [[destinations]]\nname = \"a\"\ncluster = \"c-a\"\nprovider = \"p\"\ntier = \"spot\"\n\
        jurisdiction = \"US\"\nregion = \"r\"\naccelerator = \"h100\"\nvram_gb = 80\n\
        interconnect = \"nvlink\"\nmodels = [\"llama\"]\n[destinations.cost]\n";
    let p = dir.join("fleet.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// The service of case `case` in the child: `derived` (the service-wide
/// cap left to the service) or `given` (a cap below the limit, as
/// `--max-connections` sets it; one above it first, which must refuse to
/// start). Prints its address, then serves until its standard input
/// closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_service() {
    let Ok(case) = std::env::var(CHILD) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut c = Config::new(manifest(dir.path()));
    c.listen = "127.0.0.1:0".parse().unwrap();
    c.interval = Duration::from_millis(200);
    c.token = Some(TOKEN.into());
    c.limits = ace_control::listen::Limits {
        max_per_ip: PER_IP,
        // Longer than the test: no idle connection ends on its own.
        idle_timeout: Duration::from_secs(120),
        ..Default::default()
    };
    if case == "given" {
        let mut over = c.clone();
        over.limits.max_connections = Some(1000);
        match ace_control::start(over).await {
            Ok(_) => println!("STARTED with --max-connections 1000"),
            Err(e) => println!("REFUSED {e}"),
        }
        c.limits.max_connections = Some(150);
    }
    let r = ace_control::start(c).await.unwrap();
    println!("ADDR {}", r.addr);
    tokio::task::spawn_blocking(|| {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
    })
    .await
    .unwrap();
    r.stop().await;
}

/// Starts [`child_service`] under [`FD_LIMIT`]; the child, its address,
/// and the lines it printed before.
fn spawn(case: &str) -> (Child, String, Vec<String>) {
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    let test = format!("{module}::child_service");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -Sn {FD_LIMIT} && exec \"$0\" \"$@\""))
        .arg(std::env::current_exe().unwrap())
        .args([test.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, case)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut before = Vec::new();
    loop {
        let Some(Ok(line)) = lines.next() else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the child service did not start: {before:?}");
        };
        // The harness's "test ... " may open the line.
        if let Some((_, addr)) = line.split_once("ADDR ") {
            // Read on, so that the child's last lines find a reader.
            std::thread::spawn(move || lines.for_each(drop));
            return (child, addr.trim().to_string(), before);
        }
        before.push(line);
    }
}

/// A poller at `127.0.0.{last}`: the snapshot's status, or why there is
/// none.
async fn poll_from(addr: &str, last: u8) -> Result<u16, String> {
    // The service's client installs the TLS provider reqwest needs.
    let _ = ace_control::http_client(Duration::from_secs(5));
    let client = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, last]))
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let r = client
        .get(format!("http://{addr}/v1/snapshot"))
        .bearer_auth(TOKEN)
        .send()
        .await;
    r.map(|r| r.status().as_u16()).map_err(|e| format!("{e:?}"))
}

async fn metrics(addr: &str) -> String {
    let client = ace_control::http_client(Duration::from_secs(5)).unwrap();
    let r = client.get(format!("http://{addr}/metrics")).send().await;
    r.unwrap().text().await.unwrap()
}

fn metric(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in\n{text}"))
}

/// Five addresses each open [`PER_IP`] idle connections, more than the
/// child's descriptors; then a sixth address polls, three times.
async fn five_flood_and_a_sixth_polls(case: &str) -> (Vec<String>, String) {
    let (mut child, addr, before) = spawn(case);
    let mut idle = Vec::new();
    for last in 2..=6 {
        idle.extend(idle_from(addr.parse().unwrap(), last, PER_IP).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for n in 0..3 {
        let polled = poll_from(&addr, 7).await;
        if polled != Ok(200) {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the sixth address's poll {n} got {polled:?} while five addresses held {} \
                 connections ({case})",
                idle.len()
            );
        }
    }
    let m = metrics(&addr).await;
    drop(child.stdin.take());
    let _ = child.wait();
    (before, m)
}

/// Row (low, control service): "its connection caps stop one address, not
/// many. Five addresses with 256 idle connections each take every
/// descriptor under a 1,024 soft limit, and a sixth address's poll times
/// out; with `--max-connections 900` the global cap fills and polls are
/// reset until the idle timeout."
///
/// The service's cap is what its descriptor limit leaves once its own
/// needs are kept aside, and a full service closes the idlest connection
/// of the address holding the most for a new one: the sixth address is
/// answered every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_addresses_cannot_starve_a_sixth_under_the_descriptor_limit() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let (_, m) = five_flood_and_a_sixth_polls("derived").await;
    let cap = metric(&m, "ace_control_connections_max ");
    assert!(
        (16..FD_LIMIT as u64).contains(&cap),
        "the cap {cap} does not leave room under the limit {FD_LIMIT}:\n{m}"
    );
    assert!(
        metric(&m, "ace_control_connections_closed_idle_total ") > 0,
        "{m}"
    );
    assert!(
        metric(&m, "ace_control_connections_open ") <= cap + 8,
        "{m}"
    );
}

/// The same row's second half: a cap given below the limit fills, and a
/// sixth address is still answered; a cap the limit cannot hold refuses
/// to start, naming the flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_given_cap_that_fills_still_takes_a_sixth_address() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let (before, m) = five_flood_and_a_sixth_polls("given").await;
    let refused = before.iter().find(|l| l.contains("REFUSED"));
    assert!(
        refused.is_some_and(|l| l.contains("--max-connections 1000") && l.contains("ulimit -n")),
        "a cap above the descriptor limit: {before:?}"
    );
    assert_eq!(metric(&m, "ace_control_connections_max "), 150, "{m}");
    assert!(
        metric(&m, "ace_control_connections_closed_idle_total ") > 0,
        "{m}"
    );
}
