//! The HTTP messages a test hands the host and gets back: a client
//! [`Request`], a [`Response`] (from an upstream, a callout's cluster, or as
//! the client received it) and the [`UpstreamRequest`] that left Envoy.
//!
//! Plain data over [`Headers`] and [`Metadata`], and nothing else from this crate, so that
//! every other module (the VM, callouts, the exchange driver) can use them
//! without depending on one another.

use crate::headers::Headers;
use crate::metadata::{Metadata, MetadataValue};

/// A client request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Request {
    /// Headers, pseudo-headers included.
    pub headers: Headers,
    /// Body chunks, in arrival order.
    pub body: Vec<Vec<u8>>,
    /// Trailers (empty: none).
    pub trailers: Headers,
    /// Arrives over HTTP/2 (each chunk a DATA frame, the end of stream on
    /// the last frame) instead of HTTP/1.1 (the end of stream as a frame of
    /// its own). Request trailers need HTTP/2: HTTP/1 clients do not send
    /// them.
    pub http2: bool,
    /// Dynamic metadata filters before this one set on the request
    /// (added to the VM's own, [`crate::VmBuilder::dynamic_metadata`]).
    pub dynamic_metadata: Metadata,
}

impl Request {
    /// A request with `:authority` `localhost`, `:path`, `:method` and
    /// `:scheme` `http`, in the order Envoy's HTTP/1 codec produces them.
    pub fn new(method: &str, path: &str) -> Request {
        let mut headers = Headers::new();
        headers.add(":authority", "localhost");
        headers.add(":path", path);
        headers.add(":method", method);
        headers.add(":scheme", "http");
        Request {
            headers,
            ..Request::default()
        }
    }
    /// `GET path`.
    pub fn get(path: &str) -> Request {
        Request::new("GET", path)
    }
    /// `POST path`.
    pub fn post(path: &str) -> Request {
        Request::new("POST", path)
    }
    /// Sets `:authority`.
    pub fn authority(mut self, authority: &str) -> Request {
        // In place: the codec's order, as if the client had sent it.
        self.headers.replace_in_place(":authority", authority);
        self
    }
    /// Adds a header.
    pub fn header(mut self, name: &str, value: &str) -> Request {
        self.headers.add(name, value);
        self
    }
    /// Appends a body chunk.
    pub fn body(mut self, chunk: impl Into<Vec<u8>>) -> Request {
        let chunk = chunk.into();
        if !chunk.is_empty() {
            self.body.push(chunk);
        }
        self
    }
    /// Adds a trailer.
    pub fn trailer(mut self, name: &str, value: &str) -> Request {
        self.trailers.add(name, value);
        self
    }
    /// Sets dynamic metadata `key` in namespace `ns`, as a filter before
    /// this one would (`envoy.filters.http.set_metadata`, Lua).
    pub fn dynamic_metadata(
        mut self,
        ns: &str,
        key: &str,
        value: impl Into<MetadataValue>,
    ) -> Request {
        self.dynamic_metadata.set(ns, key, value);
        self
    }
    /// Sends it over HTTP/2 (see [`Request::http2`]).
    pub fn http2(mut self) -> Request {
        self.http2 = true;
        self
    }
}

/// A response, from the upstream or as the client received it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Response {
    /// Headers, `:status` included.
    pub headers: Headers,
    /// The body.
    pub body: Vec<u8>,
    /// Trailers (empty: none).
    pub trailers: Headers,
}

impl Response {
    /// A response with `:status`.
    pub fn new(status: u16) -> Response {
        let mut headers = Headers::new();
        headers.add(":status", status.to_string());
        Response {
            headers,
            ..Response::default()
        }
    }
    /// Adds a header.
    pub fn header(mut self, name: &str, value: &str) -> Response {
        self.headers.add(name, value);
        self
    }
    /// Sets the body.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Response {
        self.body = body.into();
        self
    }
    /// Adds a trailer.
    pub fn trailer(mut self, name: &str, value: &str) -> Response {
        self.trailers.add(name, value);
        self
    }
    /// The `:status` code (0 if missing or malformed).
    pub fn status(&self) -> u16 {
        self.headers
            .get(":status")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }
    /// The body as lossy text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// What the upstream received.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpstreamRequest {
    /// The cluster the route chose.
    pub cluster: String,
    /// Headers as they left Envoy (the router adds
    /// `x-envoy-expected-rq-timeout-ms`).
    pub headers: Headers,
    /// The body.
    pub body: Vec<u8>,
    /// The trailers.
    pub trailers: Headers,
}
