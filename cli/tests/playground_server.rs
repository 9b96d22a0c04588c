//! `ace playground`'s server under idle connections: it used to spawn a
//! thread per connection with no cap, and panicked (exiting) when one
//! could not be spawned. Its thread count and memory are read from its
//! `/proc/PID/status` and bounded; its answers (the site, 404, 405, 421 for
//! a domain name) are checked over raw TCP.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const ACE: &str = env!("CARGO_BIN_EXE_ace");

struct Server {
    child: Child,
    addr: SocketAddr,
    _site: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve() -> Server {
    let site = tempfile::tempdir().unwrap();
    std::fs::write(site.path().join("index.html"), "<p>playground</p>").unwrap();
    std::fs::create_dir(site.path().join("pkg")).unwrap();
    std::fs::write(site.path().join("pkg/m.wasm"), b"\0asm").unwrap();
    let mut child = Command::new(ACE)
        .args(["playground", "--listen", "127.0.0.1:0", "--site"])
        .arg(site.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start ace playground");
    let out = BufReader::new(child.stdout.take().unwrap());
    let mut addr = None;
    for line in out.lines().map_while(Result::ok) {
        if let Some(rest) = line.strip_prefix("open http://") {
            addr = rest.split('/').next().and_then(|a| a.parse().ok());
            break;
        }
    }
    Server {
        child,
        addr: addr.expect("`ace playground` printed its address"),
        _site: site,
    }
}

/// A field of `/proc/PID/status` (the number before any unit).
fn status(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// One request over a fresh connection; the whole answer.
fn request(addr: SocketAddr, head: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn idle_connections_cost_no_threads_and_answers_stay_the_same() {
    let server = serve();
    let pid = server.child.id();
    let get = |target: &str, host: &str| {
        request(
            server.addr,
            &format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
        )
    };
    let page = get("/", "127.0.0.1");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("<p>playground</p>"), "{page}");
    assert!(page
        .to_ascii_lowercase()
        .contains("x-content-type-options: nosniff"));
    let wasm = get("/pkg/m.wasm?v=1", "localhost:9920");
    assert!(
        wasm.to_ascii_lowercase()
            .contains("content-type: application/wasm"),
        "{wasm}"
    );
    assert!(get("/missing.js", "127.0.0.1").starts_with("HTTP/1.1 404"));
    assert!(get("/../Cargo.toml", "127.0.0.1").starts_with("HTTP/1.1 404"));
    let rebound = get("/", "evil.example:9920");
    assert!(rebound.starts_with("HTTP/1.1 421"), "{rebound}");
    let post = request(
        server.addr,
        "POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n",
    );
    assert!(post.starts_with("HTTP/1.1 405"), "{post}");
    let mut many = String::from("GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    for i in 0..150 {
        many.push_str(&format!("X-{i}: 1\r\n"));
    }
    many.push_str("\r\n");
    assert!(
        !request(server.addr, &many).contains("<p>playground</p>"),
        "a request past 100 header lines is not served"
    );

    let threads_before = status(pid, "Threads:");
    // 600 idle connections: past the per-address cap (128), from one
    // address, and past the whole (512) with a second one.
    let mut idle = Vec::new();
    for i in 0..600 {
        let from = if i < 300 {
            [127, 0, 0, 1]
        } else {
            [127, 0, 0, 3]
        };
        let s = connect_from(from, server.addr);
        idle.push(s);
    }
    std::thread::sleep(Duration::from_millis(500));
    let threads = status(pid, "Threads:");
    let rss = status(pid, "VmHWM:");
    eprintln!("with 600 idle connections: {threads} threads (before: {threads_before}), peak RSS {rss} KiB");
    assert!(threads <= 8, "{threads} threads with 600 idle connections");
    assert!(rss <= 64 * 1024, "peak RSS {rss} KiB");
    // Still alive, and answering another address.
    assert!(server_alive(&server));
    let page = request_from([127, 0, 0, 2], server.addr);
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    drop(idle);
}

fn server_alive(s: &Server) -> bool {
    std::fs::metadata(format!("/proc/{}", s.child.id())).is_ok()
}

/// A connection from `127.0.0.x` (bound with a tokio socket, then handed
/// over as a std one).
fn connect_from(from: [u8; 4], to: SocketAddr) -> TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind(SocketAddr::from((from, 0))).unwrap();
        s.connect(to).await.unwrap().into_std().unwrap()
    })
}

fn request_from(from: [u8; 4], to: SocketAddr) -> String {
    let mut s = connect_from(from, to);
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}
