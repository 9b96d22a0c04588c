//! A fake control service for real-Envoy tests: `GET /v1/snapshot`
//! answers the snapshot it holds (`ace_snapshot::encode`'s bytes) with its
//! ETag, or 304 when `If-None-Match` matches, and counts what it serves;
//! it can be stopped (connections closed, port refused) and started again
//! on the same port. The wire format is `ace-snapshot`'s, the same the
//! real service (`ace control serve`) answers with.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// What the fake control service serves and counts (kept across a
/// restart).
#[derive(Debug, Default)]
pub struct Served {
    /// The snapshot's bytes.
    pub snapshot: Mutex<Vec<u8>>,
    /// Snapshot requests answered (200 or 304).
    pub requests: AtomicUsize,
    /// Of which 304.
    pub not_modified: AtomicUsize,
}

/// A tiny HTTP/1.1 control service on 127.0.0.1 (keep-alive, GET only).
#[derive(Debug)]
pub struct FakeControl {
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// What it serves and counts.
    pub served: Arc<Served>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl FakeControl {
    /// Serve `served` on `port` (0: any free one).
    pub fn start(served: Arc<Served>, port: u16) -> FakeControl {
        let listener = TcpListener::bind(("127.0.0.1", port))
            .unwrap_or_else(|e| panic!("fake control service on port {port}: {e}"));
        let port = listener.local_addr().map(|a| a.port()).unwrap_or(port);
        listener
            .set_nonblocking(true)
            .unwrap_or_else(|e| panic!("{e}"));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (served.clone(), stop.clone());
        let accept = std::thread::spawn(move || {
            let mut conns = Vec::new();
            while !st.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (s, st) = (s.clone(), st.clone());
                        conns.push(std::thread::spawn(move || serve(stream, &s, &st)));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
            drop(listener);
            for c in conns {
                let _ = c.join();
            }
        });
        FakeControl {
            port,
            served,
            stop,
            threads: vec![accept],
        }
    }

    /// Close the port and every connection.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }

    /// Snapshot requests answered.
    pub fn requests(&self) -> usize {
        self.served.requests.load(Ordering::SeqCst)
    }

    /// Serve `bytes` from now on.
    pub fn set(&self, bytes: Vec<u8>) {
        *self
            .served
            .snapshot
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = bytes;
    }
}

impl Drop for FakeControl {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Answer the requests of one connection until it closes or the service
/// stops.
fn serve(mut stream: TcpStream, served: &Served, stop: &AtomicBool) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !stop.load(Ordering::SeqCst) {
        match stream.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(_) => return,
        }
        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            buf.drain(..end + 4);
            let answer = respond(&head, served);
            if stream.write_all(&answer).is_err() {
                return;
            }
        }
    }
}

fn respond(head: &str, served: &Served) -> Vec<u8> {
    let mut lines = head.lines();
    let path = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("");
    if path != "/v1/snapshot" {
        return b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_vec();
    }
    let if_none_match = lines.find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("if-none-match")
            .then(|| v.trim().to_string())
    });
    served.requests.fetch_add(1, Ordering::SeqCst);
    let body = served
        .snapshot
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let etag = ace_snapshot::etag(&body).unwrap_or_default();
    if if_none_match.as_deref() == Some(etag.as_str()) {
        served.not_modified.fetch_add(1, Ordering::SeqCst);
        return format!("HTTP/1.1 304 Not Modified\r\netag: {etag}\r\n\r\n").into_bytes();
    }
    let mut out = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\netag: {etag}\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}
