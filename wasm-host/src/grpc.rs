//! gRPC calls and streams (`dispatch_grpc_call`, `open_grpc_stream`): what
//! the filter opened and sent, and what the test's server answers.
//!
//! Envoy's gRPC async client sits between the filter and the cluster; the
//! host plays it. A gRPC cluster is a function from what the server
//! received ([`GrpcEvent`]) to what it sends back ([`GrpcReply`]), called
//! between callbacks, as Envoy delivers gRPC events only after the callback
//! that caused them returned. The function sees each call or stream's
//! [`GrpcRequest`] (keep per-call state by its token). Envoy's rules for
//! turning the server's answer into callbacks are the host's: a unary call
//! gets one `on_grpc_receive` for a message with status 0, or one
//! `on_grpc_close` with the status otherwise; a stream gets initial
//! metadata, each message, trailing metadata and the close.

use crate::headers::Headers;
use std::sync::Arc;
use std::time::Duration;

/// A gRPC call or stream as the cluster's server receives it.
#[derive(Debug, Clone, PartialEq)]
pub struct GrpcRequest {
    /// The token the filter got.
    pub token: u32,
    /// The cluster it targets.
    pub cluster: String,
    /// The service, e.g. `test.Echo`.
    pub service: String,
    /// The method, e.g. `Say`.
    pub method: String,
    /// Request headers as the server receives them: what Envoy's gRPC
    /// client sets (`:path`, `content-type`, `te`, `grpc-timeout`, ...) and
    /// the filter's initial metadata.
    pub headers: Headers,
    /// The call's timeout; `None` for streams and for 0.
    pub timeout: Option<Duration>,
    /// A stream (`open_grpc_stream`), not a unary call.
    pub stream: bool,
    /// The context that opened it (the callbacks go there).
    pub context_id: u32,
}

/// What the server received, in order: the call opened, a message, the
/// client's half-close. A unary call is all three at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrpcEvent {
    /// The request headers.
    Open,
    /// One message (without gRPC's 5-byte prefix).
    Message(Vec<u8>),
    /// End of stream from the client.
    HalfClose,
}

/// What the server sends back.
#[derive(Debug, Clone, PartialEq)]
pub enum GrpcReply {
    /// Response headers (`:status: 200` and `content-type` are added).
    InitialMetadata(Headers),
    /// One message.
    Message(Vec<u8>),
    /// Trailers: `grpc-status`, `grpc-message` and trailing metadata; with
    /// no initial metadata before, a trailers-only response.
    Close {
        /// `grpc-status`.
        status: u32,
        /// `grpc-message`.
        message: String,
        /// Trailing metadata.
        trailing_metadata: Headers,
    },
    /// The server reset the stream.
    Reset,
}

/// A gRPC cluster's server: given the call and what just arrived, the
/// replies.
pub type GrpcHandler = Arc<dyn Fn(&GrpcRequest, &GrpcEvent) -> Vec<GrpcReply> + Send + Sync>;

/// gRPC statuses, messages and response code details as Envoy 1.40's
/// async client reports them (observed by the differential suite). The
/// message `get_status` gives is the `grpc-message` followed by the
/// details in braces, or the details alone when there is no message.
pub(crate) mod status {
    /// The `grpc-message` of the router's local reply when the server
    /// resets the stream before its response headers.
    pub const RESET_MESSAGE: &str =
        "upstream connect error or disconnect/reset before headers. reset reason: remote reset";
    /// Its response code details.
    pub const RESET_DETAILS: &str = "upstream_reset_before_response_started{remote_reset}";
    /// The `grpc-message` of the router's local reply when a call's timeout
    /// passes (with UNAVAILABLE, not DEADLINE_EXCEEDED).
    pub const TIMEOUT_MESSAGE: &str = "upstream request timeout";
    /// Its response code details.
    pub const TIMEOUT_DETAILS: &str = "response_timeout";
    /// The details of anything the server answered.
    pub const VIA_UPSTREAM: &str = "via_upstream";

    /// What `get_status` gives for `message` with `details`.
    pub fn with_details(message: &str, details: &str) -> String {
        if message.is_empty() {
            details.to_string()
        } else {
            format!("{message}{{{details}}}")
        }
    }

    /// `INTERNAL`.
    pub const INTERNAL: u32 = 13;
    /// `UNAVAILABLE`.
    pub const UNAVAILABLE: u32 = 14;
}

/// A call or stream the filter has open, in the VM's state.
#[derive(Debug, Clone)]
pub(crate) struct OpenGrpc {
    pub request: GrpcRequest,
    /// Events the server has not been given yet.
    pub unsent: Vec<GrpcEvent>,
    /// Everything the filter sent, for [`crate::Vm::grpc_calls`].
    pub sent: Vec<GrpcEvent>,
    /// The filter half-closed.
    pub local_closed: bool,
    /// The server closed (or reset) it; kept until the filter closes too.
    pub remote_closed: bool,
    /// A unary call's response message, until the trailers come.
    pub response: Option<Vec<u8>>,
    /// Initial metadata was received (a later close is not trailers-only).
    pub headers_received: bool,
    /// Virtual-clock time (ns since start) the call times out at.
    pub deadline_ns: Option<u64>,
}
