//! A small blocking HTTP/1.1 client: one request per connection.
//!
//! Enough for tests and the demo (content-length and chunked responses);
//! deliberately free of async runtimes so a test reads top to bottom.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A response as the client saw it.
#[derive(Clone, Debug)]
pub struct Response {
    /// HTTP status.
    pub status: u16,
    /// Headers, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// Body bytes.
    pub body: Vec<u8>,
}

impl Response {
    /// First value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        crate::find_header(&self.headers, name)
    }

    /// Where ACE sent the request (`x-ace-destination`), or `refused
    /// <status>` when it did not.
    pub fn served(&self) -> String {
        match self.header("x-ace-destination") {
            Some(d) => d.to_string(),
            None => format!("refused {}", self.status),
        }
    }

    /// The body as (lossy) UTF-8.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body parsed as JSON.
    pub fn json(&self) -> Result<serde_json::Value, String> {
        serde_json::from_slice(&self.body)
            .map_err(|e| format!("response body is not JSON ({e}): {}", self.text()))
    }
}

/// A request to send.
#[derive(Clone, Debug)]
pub struct Request {
    /// Method, e.g. `GET`.
    pub method: String,
    /// Path with query, e.g. `/v1/chat/completions`.
    pub path: String,
    /// Extra headers.
    pub headers: Vec<(String, String)>,
    /// Body (content-length is set for it).
    pub body: Vec<u8>,
    /// Read/write timeout.
    pub timeout: Duration,
}

impl Request {
    /// A GET of `path`.
    pub fn get(path: &str) -> Request {
        Request {
            method: "GET".into(),
            path: path.into(),
            headers: Vec::new(),
            body: Vec::new(),
            timeout: Duration::from_secs(30),
        }
    }

    /// A POST of a JSON body to `path`.
    pub fn post_json(path: &str, body: &serde_json::Value) -> Request {
        Request {
            method: "POST".into(),
            path: path.into(),
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.to_string().into_bytes(),
            timeout: Duration::from_secs(30),
        }
    }

    /// Add a header.
    pub fn header(mut self, k: &str, v: &str) -> Request {
        self.headers.push((k.into(), v.into()));
        self
    }

    /// Send it to `127.0.0.1:port`.
    pub fn send(&self, port: u16) -> std::io::Result<Response> {
        let mut s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(self.timeout))?;
        s.set_write_timeout(Some(self.timeout))?;
        let mut head = format!(
            "{} {} HTTP/1.1\r\nhost: ace.test\r\nconnection: close\r\ncontent-length: {}\r\n",
            self.method,
            self.path,
            self.body.len()
        );
        for (k, v) in &self.headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(&self.body);
        s.write_all(&bytes)?;
        s.flush()?;
        read_response(BufReader::new(s))
    }
}

/// GET `path` from `127.0.0.1:port`.
pub fn get(port: u16, path: &str) -> std::io::Result<Response> {
    Request::get(path).send(port)
}

fn bad(msg: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg.into())
}

fn read_response(mut r: BufReader<TcpStream>) -> std::io::Result<Response> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| bad(format!("bad status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 {
            return Err(bad("connection closed inside the response headers"));
        }
        let h = h.trim_end_matches(['\r', '\n']);
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let find = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v): &(String, String)| v.clone())
    };
    let mut body = Vec::new();
    if find("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
        loop {
            let mut size_line = String::new();
            r.read_line(&mut size_line)?;
            let size = usize::from_str_radix(size_line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| bad(format!("bad chunk size {size_line:?}")))?;
            let mut chunk = vec![0u8; size + 2];
            r.read_exact(&mut chunk)?;
            chunk.truncate(size);
            body.extend_from_slice(&chunk);
            if size == 0 {
                break;
            }
        }
    } else if let Some(len) = find("content-length").and_then(|v| v.parse::<usize>().ok()) {
        body = vec![0u8; len];
        r.read_exact(&mut body)?;
    } else {
        r.read_to_end(&mut body)?;
    }
    Ok(Response {
        status,
        headers,
        body,
    })
}
