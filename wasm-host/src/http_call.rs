//! HTTP callouts (`dispatch_http_call`): what the filter sent, and what the
//! test answers.
//!
//! Envoy delivers a callout's response on the plugin's root context after
//! the callback that dispatched it has returned, with `n_headers == 0` when
//! the call failed (a reset). A timeout is not a failure: Envoy's async
//! client answers it with its own local reply, a 504 `upstream request
//! timeout` (checked in Envoy 1.40), which the host delivers when the
//! virtual clock reaches the deadline.
//! A cluster either answers through a function
//! ([`Process::add_cluster_with`](crate::Process::add_cluster_with)) or
//! leaves calls pending for the test to complete
//! ([`Vm::complete_http_call`](crate::Vm::complete_http_call)).

use crate::headers::Headers;
use crate::message::Response;
use std::time::Duration;

/// A callout as the filter dispatched it.
#[derive(Debug, Clone, PartialEq)]
pub struct CallRequest {
    /// The token returned to the filter.
    pub token: u32,
    /// The cluster (Envoy `cluster_manager` name) it targets.
    pub cluster: String,
    /// Request headers as the cluster receives them: the filter's
    /// (`:method`, `:path`, `:authority` included) plus what Envoy's async
    /// client adds (`x-envoy-internal`, `x-envoy-expected-rq-timeout-ms`,
    /// `content-length` for a body).
    pub headers: Headers,
    /// Request body.
    pub body: Vec<u8>,
    /// Request trailers.
    pub trailers: Headers,
    /// The timeout the filter asked for; `None` for 0 (Envoy: no timeout).
    pub timeout: Option<Duration>,
    /// The stream context that was current (or effective) when it was sent;
    /// the root context id for calls made outside a stream.
    pub context_id: u32,
}

impl CallRequest {
    /// A request header's first value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name)
    }
}

/// A callout's response: the same shape as an HTTP [`Response`]
/// (`CallResponse::new(200).header(..).body(..)`).
pub type CallResponse = Response;

/// How a callout ends.
#[derive(Debug, Clone, PartialEq)]
pub enum CallResult {
    /// The cluster answered.
    Response(CallResponse),
    /// The call failed without a response (delivered as `n_headers == 0`).
    Reset,
}

/// What Envoy's async client answers when a callout's timeout expires.
pub(crate) fn timeout_response() -> CallResponse {
    let body = b"upstream request timeout";
    CallResponse::new(504)
        .header("content-length", &body.len().to_string())
        .header("content-type", "text/plain")
        .body(body.to_vec())
}

impl From<CallResponse> for CallResult {
    fn from(r: CallResponse) -> CallResult {
        CallResult::Response(r)
    }
}
