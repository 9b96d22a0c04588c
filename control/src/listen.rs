//! Serving a router with bounded connections: [`serve`].
//!
//! Why not `axum::serve`: it accepts every connection, holds each until
//! the peer leaves and has no idle timeout, so one unauthenticated client
//! that opens a thousand idle connections takes every file descriptor the
//! process has, and the pollers that matter cannot connect. Here each
//! connection needs a slot of a service-wide cap and of its peer address's
//! cap (refused at once, closed, when there is none, so a flood costs an
//! accept and a close), waits at most [`Limits::idle_timeout`] for a
//! request's headers (which is also how long a keep-alive connection may
//! stay idle), and each request is answered within
//! [`Limits::request_timeout`] or answered 408 (a body sent one byte a
//! minute cannot hold a connection). HTTP itself is hyper's; this module
//! only decides which connections it gets.
//!
//! An accept that fails (out of file descriptors) waits a little before
//! the next one instead of retrying at once, which would spin a core.

use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt as _;

/// The bounds of a server's connections.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once, all peers together; one more is closed
    /// as soon as it is accepted. Keep it below the process's file
    /// descriptor limit (`ulimit -n`) less what the service's own polls
    /// need.
    pub max_connections: usize,
    /// Connections open at once from one peer address.
    pub max_per_ip: usize,
    /// How long a connection may go without sending a request's headers
    /// in full: the header-read timeout, and the idle timeout of a
    /// keep-alive connection between requests.
    pub idle_timeout: Duration,
    /// How long a request may take from its headers to its answer (its
    /// body included); past it the answer is 408.
    pub request_timeout: Duration,
    /// Header lines accepted per request (more: 431).
    pub max_headers: usize,
}

impl Default for Limits {
    /// 4,096 connections, 256 per address, 30 s idle, 30 s per request,
    /// 100 header lines.
    fn default() -> Limits {
        Limits {
            max_connections: 4096,
            max_per_ip: 256,
            idle_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(30),
            max_headers: 100,
        }
    }
}

/// What the server did with connections, for `/metrics` and tests.
#[derive(Debug, Default)]
pub struct Stats {
    /// Open now.
    pub open: AtomicU64,
    /// Accepted and served, in all.
    pub accepted: AtomicU64,
    /// Closed at once: the service-wide cap was reached.
    pub refused_full: AtomicU64,
    /// Closed at once: the peer address's cap was reached.
    pub refused_per_ip: AtomicU64,
    /// Failed accepts (e.g. out of file descriptors).
    pub accept_errors: AtomicU64,
}

/// Open connections per peer address; a slot is given back on drop.
#[derive(Debug, Default)]
struct PerIp {
    open: Mutex<HashMap<IpAddr, usize>>,
}

#[derive(Debug)]
struct IpSlot {
    table: Arc<PerIp>,
    ip: IpAddr,
}

impl PerIp {
    fn take(table: &Arc<PerIp>, ip: IpAddr, max: usize) -> Option<IpSlot> {
        let mut open = table.open.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(IpSlot {
            table: table.clone(),
            ip,
        })
    }
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        let mut open = self.table.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Serves `app` on `listener` within `limits` until `shutdown` completes;
/// connections still open then are dropped. `log` takes one line per
/// problem of the server's own (peer errors are the peer's business and
/// are not logged).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    stats: Arc<Stats>,
    shutdown: impl Future<Output = ()>,
    log: impl Fn(&str),
) {
    let global = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let per_ip = Arc::new(PerIp::default());
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.idle_timeout)
        .max_headers(limits.max_headers.max(1))
        .keep_alive(true);
    let http = Arc::new(http);
    let mut conns = tokio::task::JoinSet::new();
    let mut last_logged: Option<Instant> = None;
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = &mut shutdown => break,
            // Reap finished connection tasks as they end.
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                stats.accept_errors.fetch_add(1, Ordering::Relaxed);
                if last_logged.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                    log(&format!(
                        "cannot accept a connection: {e} (at the file descriptor limit? \
                         raise `ulimit -n` or lower the connection caps)"
                    ));
                    last_logged = Some(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = global.clone().try_acquire_owned() else {
            stats.refused_full.fetch_add(1, Ordering::Relaxed);
            continue; // dropped: closed
        };
        let Some(slot) = PerIp::take(&per_ip, peer.ip().to_canonical(), limits.max_per_ip) else {
            stats.refused_per_ip.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let _ = stream.set_nodelay(true);
        stats.accepted.fetch_add(1, Ordering::Relaxed);
        stats.open.fetch_add(1, Ordering::Relaxed);
        let (app, http, stats) = (app.clone(), http.clone(), stats.clone());
        let timeout = limits.request_timeout;
        conns.spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let app = app.clone();
                async move {
                    let answer = tokio::time::timeout(timeout, app.oneshot(req.map(Body::new)));
                    Ok::<_, std::convert::Infallible>(match answer.await {
                        Ok(Ok(r)) => r,
                        Ok(Err(never)) => match never {},
                        Err(_) => timed_out(timeout),
                    })
                }
            });
            // A peer that resets, stalls past a timeout or sends garbage
            // ends its own connection; nothing to report.
            let _ = http.serve_connection(TokioIo::new(stream), service).await;
            stats.open.fetch_sub(1, Ordering::Relaxed);
            drop((permit, slot));
        });
    }
}

fn timed_out(after: Duration) -> Response<Body> {
    let mut r = Response::new(Body::from(format!(
        "the request took longer than {} ms (headers to answer, body included); send it whole\n",
        after.as_millis()
    )));
    *r.status_mut() = StatusCode::REQUEST_TIMEOUT;
    r.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    r
}
