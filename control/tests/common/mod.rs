//! Helpers both integration tests of the service use: a fake peer on a
//! local port, the service's token, and the clock in the shapes peers
//! write it.
#![allow(dead_code)] // each test crate uses its own subset

use ace_control::{fetch, Fetched, Running};
use ace_snapshot::Snapshot;
use axum::Router;
use std::time::{Duration, Instant, SystemTime};

/// The bearer token the service under test expects.
pub const TOKEN: &str = "s3cret-token";

/// Serves `app` on a free port of `ip`; its base URL.
pub async fn serve_on(ip: &str, app: Router) -> String {
    let l = tokio::net::TcpListener::bind(format!("{ip}:0"))
        .await
        .unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    format!("http://{addr}")
}

/// Serves `app` on a free port of 127.0.0.1; its base URL.
pub async fn serve(app: Router) -> String {
    serve_on("127.0.0.1", app).await
}

/// Opens `n` connections to `addr` from `127.0.0.{last}` that send nothing.
pub async fn idle_from(
    addr: std::net::SocketAddr,
    last: u8,
    n: usize,
) -> Vec<tokio::net::TcpStream> {
    let mut out = Vec::new();
    for _ in 0..n {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind(std::net::SocketAddr::from(([127, 0, 0, last], 0)))
            .unwrap();
        out.push(s.connect(addr).await.unwrap());
    }
    out
}

/// The service's `/metrics` page.
pub async fn metrics(r: &Running) -> String {
    metrics_with(&reqwest::Client::new(), r).await
}

/// The service's `/metrics` page, asked with `client`.
pub async fn metrics_with(client: &reqwest::Client, r: &Running) -> String {
    client
        .get(format!("http://{}/metrics", r.addr))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The service's snapshot now, and its ETag.
pub async fn snapshot_and_etag(r: &Running) -> (Snapshot, String) {
    let client = ace_control::http_client(Duration::from_secs(2)).unwrap();
    let url = format!("http://{}/v1/snapshot", r.addr);
    match fetch(&client, &url, Some(TOKEN), None).await.unwrap() {
        Fetched::Snapshot(s, etag) => (s, etag),
        Fetched::NotModified => panic!("304 without an ETag sent"),
    }
}

/// Polls the service's snapshot until `ok` holds (`secs` at most).
pub async fn wait_for(
    r: &Running,
    secs: u64,
    what: &str,
    ok: impl Fn(&Snapshot) -> bool,
) -> Snapshot {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let (s, _) = snapshot_and_etag(r).await;
        if ok(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; last: {s:#?}"
        );
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
}

/// Unix ms now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Unix ms as RFC 3339, as clouds and feeds write times.
pub fn rfc3339(ms: u64) -> String {
    chrono::DateTime::from_timestamp_millis(ms as i64)
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}
