//! In-process upstream servers that record what they receive and misbehave
//! on request.
//!
//! Each [`Upstream`] listens on a free loopback port and answers HTTP/1.1
//! with keep-alive (Envoy pools upstream connections). Its [`Behavior`] can be
//! changed while it runs, so one test can make a destination fail, throttle
//! or slow down and then recover.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What an upstream does with the next requests.
#[derive(Clone, Debug, PartialEq)]
pub enum Behavior {
    /// 200 with a JSON body naming the upstream.
    Ok,
    /// Answer with this status and a JSON body naming the upstream.
    Status(u16),
    /// 429 with `retry-after: <seconds>`.
    RateLimited {
        /// Value of the `retry-after` header, in seconds.
        retry_after_s: u64,
    },
    /// Wait this long, then answer 200.
    Slow(Duration),
    /// Read the request, then close the connection without answering.
    Close,
    /// Answer with exactly this status, these headers and this body.
    Respond {
        /// HTTP status.
        status: u16,
        /// Extra headers (content-length is added).
        headers: Vec<(String, String)>,
        /// Response body.
        body: Vec<u8>,
    },
    /// 200 as a model server streams (`text/event-stream`, chunked): the
    /// headers and a first event after `first` plus `per_in_flight` for
    /// every other request in flight here when this one arrived (time to
    /// first token that grows with the load), plus the request's own
    /// [`DELAY_HEADER`] (a client whose input is slow to serve, such as a
    /// huge prompt), the last event and its end `rest` later.
    Stream {
        /// Time to the headers and first event with nothing else in flight.
        first: Duration,
        /// Added to it per other request in flight at arrival.
        per_in_flight: Duration,
        /// From the first event to the end of the stream.
        rest: Duration,
    },
    /// Answer with this status, these headers, this body in one chunk of
    /// `transfer-encoding: chunked`, and these trailers (Envoy forwards
    /// them only from clusters with `enable_trailers`).
    RespondWithTrailers {
        /// HTTP status.
        status: u16,
        /// Extra headers.
        headers: Vec<(String, String)>,
        /// Response body.
        body: Vec<u8>,
        /// Trailers.
        trailers: Vec<(String, String)>,
    },
    /// Answer with this status and these headers, then the body as a
    /// provider streams it: each of `chunks` its own chunk of
    /// `transfer-encoding: chunked`, written and flushed `gap` apart.
    Chunks {
        /// HTTP status.
        status: u16,
        /// Extra headers.
        headers: Vec<(String, String)>,
        /// The body, piece by piece.
        chunks: Vec<Vec<u8>>,
        /// The pause before each piece after the first.
        gap: Duration,
    },
}

impl Behavior {
    /// 200 with `events` as a model server's server-sent events
    /// (`text/event-stream`), the body in one piece.
    pub fn sse(events: &str) -> Behavior {
        Behavior::Respond {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            body: events.as_bytes().to_vec(),
        }
    }
}

/// One request as the upstream received it.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// Request method.
    pub method: String,
    /// Request path with query.
    pub path: String,
    /// Headers, names lower-cased, in arrival order.
    pub headers: Vec<(String, String)>,
    /// Request body.
    pub body: Vec<u8>,
    /// Trailers of a chunked body, names lower-cased, in arrival order.
    pub trailers: Vec<(String, String)>,
    /// When it arrived.
    pub at: Instant,
}

impl Recorded {
    /// First value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        crate::find_header(&self.headers, name)
    }
}

struct Shared {
    name: String,
    behavior: Mutex<Behavior>,
    requests: Mutex<Vec<Recorded>>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    stop: AtomicBool,
    intercept: Option<Arc<dyn Intercept>>,
}

/// How an upstream answers a request an [`Intercept`] took over.
pub(crate) enum Reply {
    /// As for an inference request with this behaviour.
    Respond(Behavior),
    /// Never answer: hold the connection until the peer closes it or the
    /// upstream stops, then close it.
    Hang,
}

/// A crate-internal hook that turns an [`Upstream`] into a richer server
/// (see [`crate::model_server`]): it answers some requests itself and watches
/// the inference requests the upstream serves.
pub(crate) trait Intercept: Send + Sync {
    /// `Some` if `req` is not an inference request but one this hook answers;
    /// such a request is neither recorded nor counted in flight.
    fn intercept(&self, req: &Recorded) -> Option<Reply>;
    /// An inference request is about to be served; the token goes to
    /// [`finished`](Self::finished) once its response is written.
    fn started(&self, req: &Recorded) -> u64;
    /// The inference request `token` was answered (or its connection closed).
    fn finished(&self, token: u64);
    /// [`Upstream::clear`] was called.
    fn clear(&self);
}

/// A running upstream server. Stops when dropped.
pub struct Upstream {
    shared: Arc<Shared>,
    port: u16,
    accept: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("name", &self.shared.name)
            .field("port", &self.port)
            .finish()
    }
}

impl Upstream {
    /// Start an upstream named `name` (the name appears in its responses).
    pub fn start(name: &str) -> std::io::Result<Upstream> {
        Upstream::start_with(name, None)
    }

    /// Start an upstream whose requests go through `intercept` first.
    pub(crate) fn start_with(
        name: &str,
        intercept: Option<Arc<dyn Intercept>>,
    ) -> std::io::Result<Upstream> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared {
            name: name.to_string(),
            behavior: Mutex::new(Behavior::Ok),
            requests: Mutex::new(Vec::new()),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            intercept,
        });
        let s = shared.clone();
        let accept = std::thread::Builder::new()
            .name(format!("upstream-{name}"))
            .spawn(move || {
                for conn in listener.incoming() {
                    if s.stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let s2 = s.clone();
                    let _ = std::thread::Builder::new()
                        .name(format!("upstream-{}-conn", s.name))
                        .spawn(move || serve(conn, &s2));
                }
            })?;
        Ok(Upstream {
            shared,
            port,
            accept: Some(accept),
        })
    }

    /// The upstream's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Change what it does with the next requests.
    pub fn set_behavior(&self, b: Behavior) {
        *lock(&self.shared.behavior) = b;
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        lock(&self.shared.requests).clone()
    }

    /// How many requests it has received.
    pub fn count(&self) -> usize {
        lock(&self.shared.requests).len()
    }

    /// Forget the recorded requests (and the in-flight high-water mark; for a
    /// [`ModelServer`](crate::model_server::ModelServer), its scrape and fetch
    /// counts too).
    pub fn clear(&self) {
        lock(&self.shared.requests).clear();
        self.shared.max_in_flight.store(0, Ordering::SeqCst);
        if let Some(i) = &self.shared.intercept {
            i.clear();
        }
    }

    /// How many requests it is serving right now (received, response not yet
    /// written).
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::SeqCst)
    }

    /// The most requests it has held at once since the last [`clear`](Self::clear).
    pub fn max_in_flight(&self) -> usize {
        self.shared.max_in_flight.load(Ordering::SeqCst)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn serve(conn: TcpStream, s: &Shared) {
    let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
    // One write per response and no Nagle: otherwise delayed ACKs add 40 ms.
    let _ = conn.set_nodelay(true);
    let Ok(write_half) = conn.try_clone() else {
        return;
    };
    let mut out = write_half;
    let mut reader = BufReader::new(conn);
    while !s.stop.load(Ordering::SeqCst) {
        let req = match read_request(&mut reader, &s.stop) {
            Ok(Some(r)) => r,
            Ok(None) | Err(_) => return,
        };
        if let Some(reply) = s.intercept.as_ref().and_then(|i| i.intercept(&req)) {
            let keep = match reply {
                Reply::Respond(b) => respond(&mut out, &b, &s.name, 0, Duration::ZERO),
                Reply::Hang => {
                    hang(&mut reader, &s.stop);
                    false
                }
            };
            if !keep {
                let _ = out.shutdown(Shutdown::Both);
                return;
            }
            continue;
        }
        let behavior = lock(&s.behavior).clone();
        let token = s.intercept.as_ref().map(|i| i.started(&req));
        let own_delay = req
            .header(DELAY_HEADER)
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(Duration::ZERO, Duration::from_millis);
        lock(&s.requests).push(req);
        let now = s.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        s.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let keep = respond(&mut out, &behavior, &s.name, now, own_delay);
        // The hook hears of the end first, so its count never undercuts ours.
        if let (Some(i), Some(t)) = (&s.intercept, token) {
            i.finished(t);
        }
        s.in_flight.fetch_sub(1, Ordering::SeqCst);
        if !keep {
            let _ = out.shutdown(Shutdown::Both);
            return;
        }
    }
}

/// Read and drop whatever the peer sends until it closes or we stop.
fn hang(r: &mut BufReader<TcpStream>, stop: &AtomicBool) {
    let mut buf = [0u8; 256];
    while !stop.load(Ordering::SeqCst) {
        match r.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(e) if is_timeout(&e) => continue,
            Err(_) => return,
        }
    }
}

fn body_for(name: &str, status: u16) -> Vec<u8> {
    serde_json::json!({"upstream": name, "status": status})
        .to_string()
        .into_bytes()
}

/// A request header a [`Behavior::Stream`] upstream adds to that request's
/// time to first token, ms.
pub const DELAY_HEADER: &str = "x-upstream-delay-ms";

/// Write the response for `b` to a request that arrived with `in_flight`
/// requests in flight (itself included) and asked for `own` delay; returns
/// whether to keep the connection.
fn respond(out: &mut TcpStream, b: &Behavior, name: &str, in_flight: usize, own: Duration) -> bool {
    let (status, extra, body): (u16, Vec<(String, String)>, Vec<u8>) = match b {
        Behavior::Ok => (200, vec![], body_for(name, 200)),
        Behavior::Status(code) => (*code, vec![], body_for(name, *code)),
        Behavior::RateLimited { retry_after_s } => (
            429,
            vec![("retry-after".into(), retry_after_s.to_string())],
            body_for(name, 429),
        ),
        Behavior::Slow(d) => {
            std::thread::sleep(*d);
            (200, vec![], body_for(name, 200))
        }
        Behavior::Close => return false,
        Behavior::Respond {
            status,
            headers,
            body,
        } => (*status, headers.clone(), body.clone()),
        Behavior::RespondWithTrailers {
            status,
            headers,
            body,
            trailers,
        } => return respond_chunked(out, name, *status, headers, body, trailers),
        Behavior::Chunks {
            status,
            headers,
            chunks,
            gap,
        } => return respond_chunks(out, name, *status, headers, chunks, *gap),
        Behavior::Stream {
            first,
            per_in_flight,
            rest,
        } => {
            let others = u32::try_from(in_flight.saturating_sub(1)).unwrap_or(u32::MAX);
            std::thread::sleep(*first + per_in_flight.saturating_mul(others) + own);
            return respond_stream(out, name, *rest);
        }
    };
    let mut head = format!(
        "HTTP/1.1 {status} {}\r\ncontent-length: {}\r\nx-upstream: {name}\r\n",
        reason(status),
        body.len()
    );
    if !extra
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
    {
        head.push_str("content-type: application/json\r\n");
    }
    for (k, v) in &extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(&body);
    out.write_all(&bytes).is_ok() && out.flush().is_ok()
}

/// A streamed chat completion in two events, `rest` apart, each its own
/// chunk, then the end of the stream.
fn respond_stream(out: &mut TcpStream, name: &str, rest: Duration) -> bool {
    let head = format!(
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-type: text/event-stream\r\n\
         x-upstream: {name}\r\n\r\n"
    );
    let event = |data: String| {
        let e = format!("data: {data}\n\n");
        format!("{:x}\r\n{e}\r\n", e.len())
    };
    let first = event(
        serde_json::json!({"upstream": name, "choices": [{"index": 0, "delta": {"content": "hi"}}]})
            .to_string(),
    );
    let last = event(
        serde_json::json!({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
            .to_string(),
    ) + &event("[DONE]".into())
        + "0\r\n\r\n";
    if !(out.write_all(head.as_bytes()).is_ok()
        && out.write_all(first.as_bytes()).is_ok()
        && out.flush().is_ok())
    {
        return false;
    }
    std::thread::sleep(rest);
    out.write_all(last.as_bytes()).is_ok() && out.flush().is_ok()
}

/// The status line and headers of a chunked answer from upstream `name`.
fn chunked_head(name: &str, status: u16, headers: &[(String, String)]) -> String {
    let mut head = format!(
        "HTTP/1.1 {status} {}\r\ntransfer-encoding: chunked\r\nx-upstream: {name}\r\n",
        reason(status)
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    head
}

/// The answer of [`Behavior::Chunks`].
fn respond_chunks(
    out: &mut TcpStream,
    name: &str,
    status: u16,
    headers: &[(String, String)],
    chunks: &[Vec<u8>],
    gap: Duration,
) -> bool {
    let head = chunked_head(name, status, headers);
    if !(out.write_all(head.as_bytes()).is_ok() && out.flush().is_ok()) {
        return false;
    }
    for (i, c) in chunks.iter().filter(|c| !c.is_empty()).enumerate() {
        if i > 0 {
            std::thread::sleep(gap);
        }
        let mut bytes = format!("{:x}\r\n", c.len()).into_bytes();
        bytes.extend_from_slice(c);
        bytes.extend_from_slice(b"\r\n");
        if !(out.write_all(&bytes).is_ok() && out.flush().is_ok()) {
            return false;
        }
    }
    out.write_all(b"0\r\n\r\n").is_ok() && out.flush().is_ok()
}

fn respond_chunked(
    out: &mut TcpStream,
    name: &str,
    status: u16,
    headers: &[(String, String)],
    body: &[u8],
    trailers: &[(String, String)],
) -> bool {
    let head = chunked_head(name, status, headers);
    let mut bytes = head.into_bytes();
    if !body.is_empty() {
        bytes.extend_from_slice(format!("{:x}\r\n", body.len()).as_bytes());
        bytes.extend_from_slice(body);
        bytes.extend_from_slice(b"\r\n");
    }
    bytes.extend_from_slice(b"0\r\n");
    for (k, v) in trailers {
        bytes.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
    }
    bytes.extend_from_slice(b"\r\n");
    out.write_all(&bytes).is_ok() && out.flush().is_ok()
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}

/// Read one request; `Ok(None)` when the peer closed or we are stopping.
fn read_request(
    r: &mut BufReader<TcpStream>,
    stop: &AtomicBool,
) -> std::io::Result<Option<Recorded>> {
    let mut line = String::new();
    // Wait for a request line, waking up to check the stop flag.
    loop {
        match r.read_line(&mut line) {
            Ok(0) => return Ok(None),
            Ok(_) => break,
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                if stop.load(Ordering::SeqCst) {
                    return Ok(None);
                }
                if !line.is_empty() {
                    continue;
                }
            }
            Err(e) => return Err(e),
        }
    }
    let at = Instant::now();
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let path = parts.next().unwrap_or("").to_string();
    let headers = read_fields(r, stop)?;
    let mut body = Vec::new();
    let mut trailers = Vec::new();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked"));
    if chunked {
        loop {
            let mut size_line = String::new();
            read_line_patiently(r, &mut size_line, stop)?;
            let size = usize::from_str_radix(size_line.trim().split(';').next().unwrap_or("0"), 16)
                .unwrap_or(0);
            if size == 0 {
                // The last chunk, then trailer fields.
                trailers = read_fields(r, stop)?;
                break;
            }
            let mut chunk = vec![0u8; size + 2];
            read_exact_patiently(r, &mut chunk, stop)?;
            chunk.truncate(size);
            body.extend_from_slice(&chunk);
        }
    } else if let Some(len) = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok())
    {
        body = vec![0u8; len];
        read_exact_patiently(r, &mut body, stop)?;
    }
    Ok(Some(Recorded {
        method,
        path,
        headers,
        body,
        trailers,
        at,
    }))
}

/// Header (or trailer) fields up to an empty line, names lower-cased.
fn read_fields(
    r: &mut BufReader<TcpStream>,
    stop: &AtomicBool,
) -> std::io::Result<Vec<(String, String)>> {
    let mut fields = Vec::new();
    loop {
        let mut h = String::new();
        read_line_patiently(r, &mut h, stop)?;
        let h = h.trim_end_matches(['\r', '\n']);
        if h.is_empty() {
            return Ok(fields);
        }
        if let Some((k, v)) = h.split_once(':') {
            fields.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

fn read_line_patiently(
    r: &mut BufReader<TcpStream>,
    buf: &mut String,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    loop {
        match r.read_line(buf) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(_) if buf.ends_with('\n') => return Ok(()),
            Ok(_) => continue,
            Err(e) if is_timeout(&e) && !stop.load(Ordering::SeqCst) => continue,
            Err(e) => return Err(e),
        }
    }
}

fn read_exact_patiently(
    r: &mut BufReader<TcpStream>,
    buf: &mut [u8],
    stop: &AtomicBool,
) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match r.read(&mut buf[done..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => done += n,
            Err(e) if is_timeout(&e) && !stop.load(Ordering::SeqCst) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
