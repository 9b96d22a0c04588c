//! An in-process gRPC server: HTTP/2 with prior knowledge (what Envoy
//! speaks to a cluster with `http2_protocol_options`), real gRPC framing
//! (5-byte length-prefixed messages, `grpc-status` / `grpc-message` in the
//! trailers or in a trailers-only response), and a scripted behaviour.
//!
//! The behaviour is a plain function from what the server received to what
//! it answers ([`GrpcBehavior::on`]), separate from the network code, so a
//! test can drive the same server logic without a socket (the wasm host's
//! differential suite does: Envoy talks to the [`GrpcUpstream`], the host's
//! gRPC cluster calls [`GrpcBehavior::on`] directly).

use bytes::Bytes;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// What a scripted gRPC server does with each call or stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GrpcBehavior {
    /// Initial metadata `x-echo: initial` when the call opens, one reply
    /// `echo:<message>` per message, and on the client's half-close the
    /// trailers `grpc-status: 0` with `x-echo: trailing`.
    Echo,
    /// Nothing until the client half-closes, then a trailers-only response
    /// with this status and message.
    Status {
        /// `grpc-status`.
        code: u32,
        /// `grpc-message`.
        message: String,
    },
    /// Resets the stream (RST_STREAM, INTERNAL_ERROR) on the first message
    /// or half-close.
    Reset,
    /// Never answers; the stream stays open until the client gives up.
    Hang,
}

/// Something the server received on one call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GrpcEvent {
    /// The request headers (the call opened).
    Open,
    /// One length-prefixed message.
    Message(Vec<u8>),
    /// The client half-closed (END_STREAM).
    HalfClose,
}

/// Something the server sends on one call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GrpcAction {
    /// Response headers (`:status 200`, `content-type: application/grpc`)
    /// plus this metadata.
    InitialMetadata(Vec<(String, String)>),
    /// One length-prefixed message (initial metadata goes first if it was
    /// not sent yet).
    Message(Vec<u8>),
    /// The end of the call: trailers, or a trailers-only response when no
    /// headers were sent.
    Close {
        /// `grpc-status`.
        status: u32,
        /// `grpc-message` (left out when empty).
        message: String,
        /// Trailing metadata.
        metadata: Vec<(String, String)>,
    },
    /// RST_STREAM with INTERNAL_ERROR.
    Reset,
}

impl GrpcBehavior {
    /// What the server answers to `event`.
    pub fn on(&self, event: &GrpcEvent) -> Vec<GrpcAction> {
        match (self, event) {
            (GrpcBehavior::Echo, GrpcEvent::Open) => vec![GrpcAction::InitialMetadata(vec![(
                "x-echo".into(),
                "initial".into(),
            )])],
            (GrpcBehavior::Echo, GrpcEvent::Message(m)) => {
                let mut reply = b"echo:".to_vec();
                reply.extend_from_slice(m);
                vec![GrpcAction::Message(reply)]
            }
            (GrpcBehavior::Echo, GrpcEvent::HalfClose) => vec![GrpcAction::Close {
                status: 0,
                message: String::new(),
                metadata: vec![("x-echo".into(), "trailing".into())],
            }],
            (GrpcBehavior::Status { code, message }, GrpcEvent::HalfClose) => {
                vec![GrpcAction::Close {
                    status: *code,
                    message: message.clone(),
                    metadata: Vec::new(),
                }]
            }
            (GrpcBehavior::Reset, GrpcEvent::Message(_) | GrpcEvent::HalfClose) => {
                vec![GrpcAction::Reset]
            }
            _ => Vec::new(),
        }
    }
}

/// One call as the server received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrpcRecorded {
    /// `:path`, i.e. `/<service>/<method>`.
    pub path: String,
    /// Request headers (names lower-case, pseudo-headers left out), in
    /// arrival order.
    pub headers: Vec<(String, String)>,
    /// The messages received, without their 5-byte prefixes.
    pub messages: Vec<Vec<u8>>,
    /// Whether the client half-closed.
    pub half_closed: bool,
}

/// Prefixes `message` with gRPC's 5 bytes: not compressed, big-endian length.
pub fn frame(message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(message.len() + 5);
    out.push(0);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// Takes every complete length-prefixed message off the front of `buf`.
pub fn unframe(buf: &mut Vec<u8>) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(head) = buf.get(..5) {
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let Some(body) = buf.get(5..5 + len) else {
            break;
        };
        out.push(body.to_vec());
        buf.drain(..5 + len);
    }
    out
}

struct Shared {
    behavior: Mutex<GrpcBehavior>,
    calls: Mutex<Vec<GrpcRecorded>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running gRPC server on a free loopback port. Stops when dropped.
pub struct GrpcUpstream {
    shared: Arc<Shared>,
    port: u16,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for GrpcUpstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcUpstream")
            .field("port", &self.port)
            .finish()
    }
}

impl GrpcUpstream {
    /// Starts a server that behaves as `behavior`.
    pub fn start(behavior: GrpcBehavior) -> std::io::Result<GrpcUpstream> {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
        let port = listener.local_addr()?.port();
        listener.set_nonblocking(true)?;
        let shared = Arc::new(Shared {
            behavior: Mutex::new(behavior),
            calls: Mutex::new(Vec::new()),
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("grpc-upstream-{port}"))
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                        return;
                    };
                    tokio::select! {
                        _ = accept(listener, s) => {}
                        _ = stopped => {}
                    }
                });
            })?;
        Ok(GrpcUpstream {
            shared,
            port,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Changes what it does with the next calls.
    pub fn set_behavior(&self, b: GrpcBehavior) {
        *lock(&self.shared.behavior) = b;
    }

    /// Every call received so far, in arrival order.
    pub fn calls(&self) -> Vec<GrpcRecorded> {
        lock(&self.shared.calls).clone()
    }

    /// Forgets the recorded calls.
    pub fn clear(&self) {
        lock(&self.shared.calls).clear();
    }
}

impl Drop for GrpcUpstream {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn accept(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((socket, _)) = listener.accept().await else {
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let Ok(mut conn) = h2::server::handshake(socket).await else {
                return;
            };
            while let Some(Ok((request, respond))) = conn.accept().await {
                tokio::spawn(serve(request, respond, shared.clone()));
            }
        });
    }
}

/// The response side of one call.
struct Reply {
    respond: h2::server::SendResponse<Bytes>,
    stream: Option<h2::SendStream<Bytes>>,
    done: bool,
}

impl Reply {
    fn headers(metadata: &[(String, String)], status: Option<(u32, &str)>) -> http::Response<()> {
        let mut b = http::Response::builder()
            .status(200)
            .header("content-type", "application/grpc");
        for (k, v) in metadata {
            b = b.header(k.as_str(), v.as_str());
        }
        if let Some((code, message)) = status {
            b = b.header("grpc-status", code.to_string());
            if !message.is_empty() {
                b = b.header("grpc-message", message);
            }
        }
        b.body(()).unwrap_or_default()
    }

    fn open(&mut self, metadata: &[(String, String)]) {
        if self.stream.is_none() && !self.done {
            self.stream = self
                .respond
                .send_response(Reply::headers(metadata, None), false)
                .ok();
        }
    }

    fn act(&mut self, action: GrpcAction) {
        if self.done {
            return;
        }
        match action {
            GrpcAction::InitialMetadata(m) => self.open(&m),
            GrpcAction::Message(m) => {
                self.open(&[]);
                if let Some(s) = &mut self.stream {
                    let _ = s.send_data(Bytes::from(frame(&m)), false);
                }
            }
            GrpcAction::Close {
                status,
                message,
                metadata,
            } => {
                self.done = true;
                match &mut self.stream {
                    Some(s) => {
                        let mut trailers = http::HeaderMap::new();
                        let mut put = |k: &str, v: &str| {
                            if let (Ok(k), Ok(v)) = (
                                http::HeaderName::from_bytes(k.as_bytes()),
                                http::HeaderValue::from_str(v),
                            ) {
                                trailers.append(k, v);
                            }
                        };
                        put("grpc-status", &status.to_string());
                        if !message.is_empty() {
                            put("grpc-message", &message);
                        }
                        for (k, v) in &metadata {
                            put(k, v);
                        }
                        let _ = s.send_trailers(trailers);
                    }
                    None => {
                        let headers = Reply::headers(&metadata, Some((status, &message)));
                        let _ = self.respond.send_response(headers, true);
                    }
                }
            }
            GrpcAction::Reset => {
                self.done = true;
                match &mut self.stream {
                    Some(s) => s.send_reset(h2::Reason::INTERNAL_ERROR),
                    None => self.respond.send_reset(h2::Reason::INTERNAL_ERROR),
                }
            }
        }
    }
}

async fn serve(
    request: http::Request<h2::RecvStream>,
    respond: h2::server::SendResponse<Bytes>,
    shared: Arc<Shared>,
) {
    let behavior = lock(&shared.behavior).clone();
    let (parts, mut body) = request.into_parts();
    let index = {
        let mut calls = lock(&shared.calls);
        calls.push(GrpcRecorded {
            path: parts
                .uri
                .path_and_query()
                .map(|p| p.as_str().to_string())
                .unwrap_or_default(),
            headers: parts
                .headers
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().to_string(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect(),
            messages: Vec::new(),
            half_closed: false,
        });
        calls.len() - 1
    };
    let record = |f: &dyn Fn(&mut GrpcRecorded)| {
        if let Some(c) = lock(&shared.calls).get_mut(index) {
            f(c);
        }
    };
    let mut reply = Reply {
        respond,
        stream: None,
        done: false,
    };
    for a in behavior.on(&GrpcEvent::Open) {
        reply.act(a);
    }
    let mut buf = Vec::new();
    while let Some(Ok(chunk)) = body.data().await {
        let _ = body.flow_control().release_capacity(chunk.len());
        buf.extend_from_slice(&chunk);
        for m in unframe(&mut buf) {
            record(&|c| c.messages.push(m.clone()));
            for a in behavior.on(&GrpcEvent::Message(m)) {
                reply.act(a);
            }
        }
    }
    if body.is_end_stream() {
        record(&|c| c.half_closed = true);
        for a in behavior.on(&GrpcEvent::HalfClose) {
            reply.act(a);
        }
    }
    // Hold the stream open until the call ends or the client resets it.
    if !reply.done {
        let _ = std::future::poll_fn(|cx| reply.respond.poll_reset(cx)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_partial_frames_wait() {
        let mut buf = frame(b"abc");
        buf.extend_from_slice(&frame(b"")[..3]);
        assert_eq!(unframe(&mut buf), vec![b"abc".to_vec()]);
        assert_eq!(buf.len(), 3, "the partial frame stays");
        buf.extend_from_slice(&frame(b"")[3..]);
        assert_eq!(unframe(&mut buf), vec![Vec::<u8>::new()]);
        assert!(buf.is_empty());
    }

    #[test]
    fn echo_answers_each_message_and_closes_on_half_close() {
        let b = GrpcBehavior::Echo;
        assert_eq!(
            b.on(&GrpcEvent::Message(b"x".to_vec())),
            vec![GrpcAction::Message(b"echo:x".to_vec())]
        );
        assert!(matches!(
            b.on(&GrpcEvent::HalfClose).as_slice(),
            [GrpcAction::Close { status: 0, .. }]
        ));
        assert!(GrpcBehavior::Hang.on(&GrpcEvent::HalfClose).is_empty());
    }
}
