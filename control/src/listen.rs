//! Serving a router with bounded connections: [`serve`].
//!
//! Why not `axum::serve`: it accepts every connection, holds each until
//! the peer leaves and has no idle timeout, so one unauthenticated client
//! that opens a thousand idle connections takes every file descriptor the
//! process has, and the pollers that matter cannot connect. Here:
//!
//! - the service holds at most a service-wide number of connections, by
//!   default what the process's file descriptor limit (`ulimit -n`) leaves
//!   once the service's own needs are kept aside ([`connection_cap`]), so
//!   that connections never take the descriptors its polls, its store and
//!   the next accept need;
//! - each peer address holds at most [`Limits::max_per_ip`]; one more is
//!   closed as soon as it is accepted;
//! - when the service is full, a new connection is still taken: the idlest
//!   connection (not answering a request) of the address holding the most
//!   is closed for it. A few addresses holding every connection cannot
//!   keep another out: a poll always gets through, and what it costs falls
//!   on the addresses that hold the most. Only when every connection is
//!   answering a request is a new one closed at once;
//! - a connection waits at most [`Limits::idle_timeout`] for a request's
//!   headers (which is also how long a keep-alive connection may stay
//!   idle), and each request is answered within [`Limits::request_timeout`]
//!   or answered 408 (a body sent one byte a minute cannot hold a
//!   connection).
//!
//! HTTP itself is hyper's; this module only decides which connections it
//! gets. An accept that fails (out of file descriptors) waits a little
//! before the next one instead of retrying at once, which would spin a
//! core.

use axum::body::{Body, Bytes};
use axum::http::{Request, Response, StatusCode};
use axum::Router;
use hyper::body::{Frame, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tower::ServiceExt as _;

/// The service-wide cap when the file descriptor limit allows more (or is
/// unknown): idle connections cost memory too.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// File descriptors the server keeps aside for the process's own needs
/// (standard streams, the runtime, the listener, the next accept), beyond
/// its connections. [`crate::start`] keeps more: three per destination
/// for its polls, and its store's.
pub const RESERVED_FDS: usize = 64;

/// The fewest connections a derived cap may allow: below it the limit is
/// too low to run the service, and starting is refused.
pub const MIN_CONNECTIONS: usize = 16;

/// The bounds of a server's connections.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once, all peers together (`--max-connections`).
    /// `None`: what the file descriptor soft limit (`ulimit -n`) leaves
    /// once the service's own needs are kept aside, at most
    /// [`DEFAULT_MAX_CONNECTIONS`] ([`connection_cap`]). A number the limit
    /// cannot hold refuses to start.
    pub max_connections: Option<usize>,
    /// Connections open at once from one peer address
    /// (`--max-connections-per-ip`).
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
    /// A cap derived from the file descriptor limit, 256 per address, 30 s
    /// idle, 30 s per request, 100 header lines.
    fn default() -> Limits {
        Limits {
            max_connections: None,
            max_per_ip: 256,
            idle_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(30),
            max_headers: 100,
        }
    }
}

/// The process's soft limit on open file descriptors (`ulimit -n`), from
/// `/proc/self/limits`; `None` where that cannot be read (not Linux) or
/// says "unlimited".
pub fn fd_soft_limit() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The service-wide connection cap under `limits` and file descriptor
/// soft limit `fd_limit`, keeping `reserved` descriptors for the service's
/// own needs: `limits.max_connections` if the limit holds it, else what
/// the limit leaves (at most [`DEFAULT_MAX_CONNECTIONS`]). An error names
/// the flag and the fix when a given cap, or the limit itself, cannot
/// work.
pub fn connection_cap(
    limits: &Limits,
    fd_limit: Option<usize>,
    reserved: usize,
) -> Result<usize, String> {
    if limits.max_per_ip == 0 {
        return Err("--max-connections-per-ip must be at least 1".into());
    }
    let room = fd_limit.map(|l| (l, l.saturating_sub(reserved)));
    match (limits.max_connections, room) {
        (Some(0), _) => Err("--max-connections must be at least 1".into()),
        (Some(n), Some((limit, room))) if n > room => Err(format!(
            "--max-connections {n} does not fit the file descriptor limit: `ulimit -n` is \
             {limit} and the service keeps {reserved} for its listener, polls and store, which \
             leaves {room} for connections; lower --max-connections to {room} or less, leave \
             it out (it is then derived from the limit), or raise `ulimit -n`"
        )),
        (Some(n), _) => Ok(n),
        (None, Some((limit, room))) if room < MIN_CONNECTIONS => Err(format!(
            "the file descriptor limit is too low: `ulimit -n` is {limit} and the service \
             keeps {reserved} for its listener, polls and store, which leaves {room} for \
             connections (at least {MIN_CONNECTIONS}); raise `ulimit -n` to {} or more",
            reserved + MIN_CONNECTIONS
        )),
        (None, Some((_, room))) => Ok(room.min(DEFAULT_MAX_CONNECTIONS)),
        (None, None) => Ok(DEFAULT_MAX_CONNECTIONS),
    }
}

/// What the server did with connections, for `/metrics` and tests.
#[derive(Debug, Default)]
pub struct Stats {
    /// Open now.
    pub open: AtomicU64,
    /// Accepted and served, in all.
    pub accepted: AtomicU64,
    /// Closed at once: the service was full and every connection was
    /// answering a request.
    pub refused_full: AtomicU64,
    /// Closed at once: the peer address's cap was reached.
    pub refused_per_ip: AtomicU64,
    /// Idle connections closed to take a new one while the service was
    /// full.
    pub closed_idle: AtomicU64,
    /// Failed accepts (e.g. out of file descriptors).
    pub accept_errors: AtomicU64,
    /// The service-wide cap in force.
    pub cap: AtomicU64,
}

/// [`Conn::idle_since`] while the connection answers a request.
const BUSY: u64 = u64::MAX;

/// One open connection, as the server tracks it.
#[derive(Debug)]
struct Conn {
    ip: IpAddr,
    /// Since when it has been idle (ms since the server started), or
    /// [`BUSY`] from a request's headers until its answer's last byte.
    idle_since: AtomicU64,
    /// Told to close: the service is full and a new connection takes its
    /// place.
    close: Notify,
}

/// The open connections, per address too.
#[derive(Debug, Default)]
struct Table {
    conns: HashMap<u64, Arc<Conn>>,
    per_ip: HashMap<IpAddr, usize>,
    next: u64,
}

/// What [`Table::admit`] decided about a new connection.
#[derive(Debug)]
enum Admit {
    /// Taken as connection `id`; `evicted`: the connection closed for it.
    Open {
        id: u64,
        conn: Arc<Conn>,
        evicted: bool,
    },
    /// Its address holds its cap.
    PerIp,
    /// The service is full and no connection is idle.
    Full,
}

impl Table {
    /// Take a connection from `ip` at `now` (ms) under `cap` in all and
    /// `per_ip` per address; when full, the idlest connection of the
    /// address holding the most is removed and told to close.
    fn admit(&mut self, ip: IpAddr, cap: usize, per_ip: usize, now: u64) -> Admit {
        if self.per_ip.get(&ip).copied().unwrap_or(0) >= per_ip {
            return Admit::PerIp;
        }
        let mut evicted = false;
        if self.conns.len() >= cap {
            let victim = self
                .conns
                .iter()
                .filter_map(|(id, c)| {
                    let since = c.idle_since.load(Ordering::Relaxed);
                    let held = self.per_ip.get(&c.ip).copied().unwrap_or(0);
                    (since != BUSY).then_some(((held, now.saturating_sub(since)), *id))
                })
                .max()
                .map(|(_, id)| id);
            let Some(victim) = victim.and_then(|id| self.remove(id)) else {
                return Admit::Full;
            };
            victim.close.notify_one();
            evicted = true;
        }
        let id = self.next;
        self.next += 1;
        let conn = Arc::new(Conn {
            ip,
            idle_since: AtomicU64::new(now),
            close: Notify::new(),
        });
        self.conns.insert(id, conn.clone());
        *self.per_ip.entry(ip).or_insert(0) += 1;
        Admit::Open { id, conn, evicted }
    }

    /// Forget connection `id` (closed, or told to); it, if it was open.
    fn remove(&mut self, id: u64) -> Option<Arc<Conn>> {
        let conn = self.conns.remove(&id)?;
        if let Some(n) = self.per_ip.get_mut(&conn.ip) {
            *n -= 1;
            if *n == 0 {
                self.per_ip.remove(&conn.ip);
            }
        }
        Some(conn)
    }
}

/// Removes its connection from the table when the connection's task ends.
struct Registered {
    table: Arc<Mutex<Table>>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        lock(&self.table).remove(self.id);
    }
}

fn lock(table: &Mutex<Table>) -> std::sync::MutexGuard<'_, Table> {
    table.lock().unwrap_or_else(|p| p.into_inner())
}

/// Marks its connection idle when dropped: with the answer's body, once
/// its last byte is written (or the connection is gone).
struct IdleOnDrop {
    conn: Arc<Conn>,
    clock: Instant,
}

impl Drop for IdleOnDrop {
    fn drop(&mut self) {
        let now = ms_since(self.clock);
        self.conn.idle_since.store(now, Ordering::Relaxed);
    }
}

fn ms_since(clock: Instant) -> u64 {
    u64::try_from(clock.elapsed().as_millis()).unwrap_or(BUSY - 1)
}

/// An answer's body that keeps its connection busy until it is written.
struct Tracked {
    inner: Body,
    _idle: IdleOnDrop,
}

impl hyper::body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Serves `app` on `listener` within `limits` until `shutdown` completes;
/// connections still open then are dropped. `log` takes one line per
/// problem of the server's own (peer errors are the peer's business and
/// are not logged). A cap the file descriptor limit cannot hold is
/// lowered to what it can, and logged ([`crate::start`] refuses it
/// instead).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    stats: Arc<Stats>,
    shutdown: impl Future<Output = ()>,
    log: impl Fn(&str),
) {
    let fds = fd_soft_limit();
    let cap = connection_cap(&limits, fds, RESERVED_FDS).unwrap_or_else(|e| {
        let room = fds.map_or(DEFAULT_MAX_CONNECTIONS, |l| l.saturating_sub(RESERVED_FDS));
        let cap = limits.max_connections.unwrap_or(room).min(room).max(1);
        log(&format!("{e}; serving at most {cap} connections"));
        cap
    });
    stats.cap.store(cap as u64, Ordering::Relaxed);
    let per_ip = limits.max_per_ip.max(1);
    let table = Arc::new(Mutex::new(Table::default()));
    let clock = Instant::now();
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
                         raise `ulimit -n` or lower --max-connections)"
                    ));
                    last_logged = Some(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let ip = peer.ip().to_canonical();
        let admitted = lock(&table).admit(ip, cap, per_ip, ms_since(clock));
        let (id, conn) = match admitted {
            Admit::Open { id, conn, evicted } => {
                if evicted {
                    stats.closed_idle.fetch_add(1, Ordering::Relaxed);
                }
                (id, conn)
            }
            Admit::PerIp => {
                stats.refused_per_ip.fetch_add(1, Ordering::Relaxed);
                continue; // dropped: closed
            }
            Admit::Full => {
                stats.refused_full.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        let registered = Registered {
            table: table.clone(),
            id,
        };
        let _ = stream.set_nodelay(true);
        stats.accepted.fetch_add(1, Ordering::Relaxed);
        stats.open.fetch_add(1, Ordering::Relaxed);
        let (app, http, stats) = (app.clone(), http.clone(), stats.clone());
        let timeout = limits.request_timeout;
        conns.spawn(async move {
            let busy = conn.clone();
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let app = app.clone();
                busy.idle_since.store(BUSY, Ordering::Relaxed);
                let idle = IdleOnDrop {
                    conn: busy.clone(),
                    clock,
                };
                async move {
                    let answer = tokio::time::timeout(timeout, app.oneshot(req.map(Body::new)));
                    let r = match answer.await {
                        Ok(Ok(r)) => r,
                        Ok(Err(never)) => match never {},
                        Err(_) => timed_out(timeout),
                    };
                    Ok::<_, std::convert::Infallible>(r.map(|inner| Tracked { inner, _idle: idle }))
                }
            });
            let served = http.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(served);
            // A peer that resets, stalls past a timeout or sends garbage
            // ends its own connection; nothing to report.
            tokio::select! {
                _ = served.as_mut() => {}
                () = conn.close.notified() => {
                    // Taken for idle; if a request came in meanwhile, it
                    // is answered first.
                    if conn.idle_since.load(Ordering::Relaxed) == BUSY {
                        served.as_mut().graceful_shutdown();
                        let _ = served.await;
                    }
                }
            }
            stats.open.fetch_sub(1, Ordering::Relaxed);
            drop(registered);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    fn open(a: Admit) -> (u64, Arc<Conn>, bool) {
        match a {
            Admit::Open { id, conn, evicted } => (id, conn, evicted),
            other => panic!("not admitted: {other:?}"),
        }
    }

    #[test]
    fn a_full_service_closes_the_idlest_of_the_address_holding_most() {
        let mut t = Table::default();
        // Address 2 holds three, address 3 one (the oldest of all).
        let (old3, _, _) = open(t.admit(ip(3), 4, 8, 0));
        let (a, _, _) = open(t.admit(ip(2), 4, 8, 10));
        let (b, _, _) = open(t.admit(ip(2), 4, 8, 20));
        let (_, busy, _) = open(t.admit(ip(2), 4, 8, 5));
        busy.idle_since.store(BUSY, Ordering::Relaxed);
        // Address 7 comes to a full service: address 2's idlest goes.
        let (_, _, evicted) = open(t.admit(ip(7), 4, 8, 100));
        assert!(evicted);
        assert!(!t.conns.contains_key(&a) && t.conns.contains_key(&b));
        assert!(
            t.conns.contains_key(&old3),
            "the small address lost its connection"
        );
        assert_eq!(t.per_ip.get(&ip(2)), Some(&2));
        assert_eq!(t.conns.len(), 4);
    }

    #[test]
    fn a_full_service_of_busy_connections_refuses_and_per_ip_caps_hold() {
        let mut t = Table::default();
        for _ in 0..2 {
            let (_, c, _) = open(t.admit(ip(2), 2, 8, 0));
            c.idle_since.store(BUSY, Ordering::Relaxed);
        }
        assert!(matches!(t.admit(ip(3), 2, 8, 1), Admit::Full));
        let mut t = Table::default();
        open(t.admit(ip(2), 8, 1, 0));
        assert!(matches!(t.admit(ip(2), 8, 1, 0), Admit::PerIp));
        let (id, _, _) = open(t.admit(ip(3), 8, 1, 0));
        assert!(t.remove(id).is_some());
        assert!(!t.per_ip.contains_key(&ip(3)));
    }

    #[test]
    fn the_cap_fits_the_descriptor_limit_or_the_error_names_the_flag() {
        let given = |n| Limits {
            max_connections: n,
            ..Limits::default()
        };
        assert_eq!(connection_cap(&given(None), Some(1024), 100), Ok(924));
        assert_eq!(
            connection_cap(&given(None), Some(1 << 20), 100),
            Ok(DEFAULT_MAX_CONNECTIONS)
        );
        assert_eq!(
            connection_cap(&given(None), None, 100),
            Ok(DEFAULT_MAX_CONNECTIONS)
        );
        assert_eq!(connection_cap(&given(Some(900)), Some(1024), 100), Ok(900));
        let e = connection_cap(&given(Some(1000)), Some(1024), 100).unwrap_err();
        assert!(
            e.contains("--max-connections 1000") && e.contains("924"),
            "{e}"
        );
        let e = connection_cap(&given(None), Some(110), 100).unwrap_err();
        assert!(e.contains("ulimit -n") && e.contains("116"), "{e}");
        let e = connection_cap(&given(Some(0)), None, 0).unwrap_err();
        assert!(e.contains("--max-connections"), "{e}");
        let zero = Limits {
            max_per_ip: 0,
            ..Limits::default()
        };
        let e = connection_cap(&zero, None, 0).unwrap_err();
        assert!(e.contains("--max-connections-per-ip"), "{e}");
    }

    #[test]
    fn the_soft_limit_is_read() {
        if std::path::Path::new("/proc/self/limits").exists() {
            assert!(fd_soft_limit().is_some_and(|n| n > 0));
        }
    }
}
