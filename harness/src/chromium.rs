//! A headless Chromium driven over the DevTools protocol, for tests that
//! use a page the way a person does (type, choose, click, wait) rather than
//! only read its rendered DOM.
//!
//! Why hand-written: the protocol is JSON over one WebSocket, and the part
//! a test needs (text frames to one page, no extensions) is a few dozen
//! lines, where a WebSocket crate and its dependencies would be built in
//! every CI run for one test. Nothing here skips: a missing Chromium is an
//! error naming it and `make setup`.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The Chromium command on PATH, or an error naming what to install.
pub fn command() -> Result<&'static str, String> {
    for c in ["chromium", "chromium-browser", "google-chrome"] {
        if Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return Ok(c);
        }
    }
    Err(
        "no headless Chromium on PATH (tried chromium, chromium-browser, google-chrome): \
         run `make setup` (Debian package `chromium`)"
            .into(),
    )
}

fn io(what: &'static str) -> impl Fn(std::io::Error) -> String {
    move |e| format!("{what}: {e}")
}

/// One WebSocket connection, client side (masked text frames out).
#[derive(Debug)]
struct Socket {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Socket {
    fn connect(url: &str) -> Result<Socket, String> {
        let rest = url
            .strip_prefix("ws://")
            .ok_or_else(|| format!("`{url}` is not a ws:// address"))?;
        let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let mut writer = TcpStream::connect(host).map_err(io("connect to Chromium's DevTools"))?;
        let mut reader = BufReader::new(writer.try_clone().map_err(io("socket"))?);
        write!(
            writer,
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        .map_err(io("WebSocket handshake"))?;
        let mut status = String::new();
        reader
            .read_line(&mut status)
            .map_err(io("WebSocket handshake"))?;
        if !status.contains(" 101 ") {
            return Err(format!("Chromium refused the WebSocket upgrade: {status}"));
        }
        loop {
            let mut line = String::new();
            reader
                .read_line(&mut line)
                .map_err(io("WebSocket handshake"))?;
            if line.trim().is_empty() {
                return Ok(Socket { reader, writer });
            }
        }
    }

    fn send(&mut self, text: &str) -> Result<(), String> {
        let payload = text.as_bytes();
        let mut frame = vec![0x81u8];
        match payload.len() {
            n if n < 126 => frame.push(0x80 | n as u8),
            n if n < 65536 => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                frame.push(0x80 | 127);
                frame.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        let mask = [0x5a, 0x1c, 0xe3, 0x07];
        frame.extend_from_slice(&mask);
        frame.extend(payload.iter().zip(mask.iter().cycle()).map(|(b, m)| b ^ m));
        self.writer
            .write_all(&frame)
            .map_err(io("send to Chromium"))
    }

    /// The next text message (fragments joined, pings answered).
    fn recv(&mut self) -> Result<String, String> {
        let closed = io("Chromium closed the DevTools connection");
        let mut message = Vec::new();
        loop {
            let mut head = [0u8; 2];
            self.reader.read_exact(&mut head).map_err(&closed)?;
            let (fin, opcode) = (head[0] & 0x80 != 0, head[0] & 0x0f);
            let len = match head[1] & 0x7f {
                126 => {
                    let mut b = [0u8; 2];
                    self.reader.read_exact(&mut b).map_err(&closed)?;
                    u64::from(u16::from_be_bytes(b))
                }
                127 => {
                    let mut b = [0u8; 8];
                    self.reader.read_exact(&mut b).map_err(&closed)?;
                    u64::from_be_bytes(b)
                }
                n => u64::from(n),
            };
            let mut payload = Vec::new();
            (&mut self.reader)
                .take(len)
                .read_to_end(&mut payload)
                .map_err(&closed)?;
            match opcode {
                0x8 => return Err("Chromium closed the DevTools connection".into()),
                0x9 => {
                    let mut pong = vec![0x8a, 0x80 | (payload.len() as u8 & 0x7f), 0, 0, 0, 0];
                    pong.extend_from_slice(&payload);
                    self.writer.write_all(&pong).map_err(io("pong"))?;
                }
                0xa => {}
                _ => {
                    message.extend_from_slice(&payload);
                    if fin {
                        return String::from_utf8(message)
                            .map_err(|e| format!("Chromium sent a frame that is not UTF-8: {e}"));
                    }
                }
            }
        }
    }

    fn recv_json(&mut self) -> Result<Value, String> {
        let text = self.recv()?;
        serde_json::from_str(&text).map_err(|e| format!("Chromium sent no JSON ({e}): {text}"))
    }
}

/// A headless Chromium with one page of its own; the browser stops on drop.
#[derive(Debug)]
pub struct Page {
    socket: Socket,
    next: u64,
    child: Child,
    /// The page's console messages and uncaught exceptions, in order.
    pub console: Vec<String>,
    stderr: Arc<Mutex<String>>,
    _profile: tempfile::TempDir,
}

impl Page {
    /// Starts Chromium (a fresh profile, no network of its own) and opens
    /// an empty page.
    pub fn launch() -> Result<Page, String> {
        let profile = tempfile::tempdir().map_err(io("profile directory"))?;
        let mut child = Command::new(command()?)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(io("start chromium"))?;
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        if let Some(stderr) = child.stderr.take() {
            let sink = Arc::clone(&log);
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Some(url) = line.split("DevTools listening on ").nth(1) {
                        let _ = tx.send(url.trim().to_string());
                    }
                    let mut l = sink.lock().unwrap_or_else(|e| e.into_inner());
                    l.push_str(&line);
                    l.push('\n');
                }
            });
        }
        let browser = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(url) => url,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "Chromium printed no DevTools address within 30 s:\n{}",
                    log.lock().unwrap_or_else(|e| e.into_inner())
                ));
            }
        };
        let opened = Self::open_page(&browser).and_then(|url| Socket::connect(&url));
        let socket = match opened {
            Ok(s) => s,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e);
            }
        };
        let mut page = Page {
            socket,
            next: 0,
            child,
            console: Vec::new(),
            stderr: log,
            _profile: profile,
        };
        page.call("Runtime.enable", json!({}))?;
        page.call("Page.enable", json!({}))?;
        Ok(page)
    }

    /// Opens a page through the browser's socket and returns the page's
    /// own socket address.
    fn open_page(browser: &str) -> Result<String, String> {
        let mut socket = Socket::connect(browser)?;
        socket.send(r#"{"id":1,"method":"Target.createTarget","params":{"url":"about:blank"}}"#)?;
        loop {
            let msg = socket.recv_json()?;
            if msg["id"] == 1 {
                let target = msg["result"]["targetId"]
                    .as_str()
                    .ok_or_else(|| format!("Chromium opened no page: {msg}"))?;
                let host = browser.split("/devtools/").next().unwrap_or(browser);
                return Ok(format!("{host}/devtools/page/{target}"));
            }
        }
    }

    /// Calls a DevTools method and returns its result (the console events
    /// that arrive meanwhile go to [`Page::console`]).
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, String> {
        self.next += 1;
        let id = self.next;
        self.socket
            .send(&json!({ "id": id, "method": method, "params": params }).to_string())?;
        loop {
            let msg = self.socket.recv_json()?;
            if msg["id"] == id {
                if let Some(e) = msg.get("error") {
                    return Err(format!("DevTools {method} failed: {e}"));
                }
                return Ok(msg["result"].clone());
            }
            match msg["method"].as_str() {
                Some("Runtime.consoleAPICalled") => {
                    let args: Vec<String> = msg["params"]["args"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|a| {
                            a["value"]
                                .as_str()
                                .map_or_else(|| a["description"].to_string(), str::to_string)
                        })
                        .collect();
                    self.console.push(format!(
                        "console.{}: {}",
                        msg["params"]["type"].as_str().unwrap_or("log"),
                        args.join(" ")
                    ));
                }
                Some("Runtime.exceptionThrown") => self.console.push(format!(
                    "uncaught: {}",
                    msg["params"]["exceptionDetails"]["exception"]["description"]
                )),
                _ => {}
            }
        }
    }

    /// Opens `url` in the page.
    pub fn navigate(&mut self, url: &str) -> Result<(), String> {
        self.call("Page.navigate", json!({ "url": url })).map(drop)
    }

    /// Evaluates `expression` in the page (a promise is awaited) and returns
    /// its value, or the exception's text with the page's console.
    pub fn eval(&mut self, expression: &str) -> Result<Value, String> {
        let r = self.call(
            "Runtime.evaluate",
            json!({ "expression": expression, "awaitPromise": true, "returnByValue": true }),
        )?;
        match r.get("exceptionDetails") {
            Some(e) => Err(format!(
                "`{expression}` threw {}\n{}",
                e["exception"]["description"]
                    .as_str()
                    .map_or_else(|| e.to_string(), str::to_string),
                self.log()
            )),
            None => Ok(r["result"]["value"].clone()),
        }
    }

    /// Polls `expression` until it gives something other than null, false or
    /// undefined, and returns that; after `timeout` an error naming `what`.
    /// An exception counts as "not yet" (the page may still be loading) and
    /// is reported if it is still there at the end.
    pub fn wait(
        &mut self,
        what: &str,
        expression: &str,
        timeout: Duration,
    ) -> Result<Value, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match self.eval(expression) {
                Ok(v) if !(v.is_null() || v == false) => return Ok(v),
                Ok(v) => format!("it gave {v}"),
                Err(e) => e,
            };
            if Instant::now() > deadline {
                return Err(format!(
                    "waited {timeout:?} for {what}; last, {last}\n{}",
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The page's console and the tail of Chromium's own log, for failure
    /// messages.
    pub fn log(&self) -> String {
        let stderr = self
            .stderr
            .lock()
            .map(|s| {
                let lines: Vec<&str> = s.lines().collect();
                lines[lines.len().saturating_sub(20)..].join("\n")
            })
            .unwrap_or_default();
        format!(
            "page console:\n  {}\nchromium stderr (last lines):\n{stderr}",
            self.console.join("\n  ")
        )
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
