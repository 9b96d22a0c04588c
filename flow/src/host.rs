//! What only Envoy can do for a request, as the flow needs it: the one
//! trait every host implements ([`Host`]), and what it says it can do
//! ([`Can`]).

use crate::budget;
use crate::counters::Counter;
use crate::fleet::{FleetAnswer, FleetOp, FleetUnavailable};
use crate::headers::Pairs;
use crate::parking::Parking;
use crate::request;
use ace_config::Trusted;

/// The response headers the flow reads, for hosts that read a header map
/// in one pass ([`Host::response_header`] asks for them one at a time).
pub const RESPONSE_HEADERS: [&str; 5] = [
    ":status",
    "retry-after",
    "retry-after-ms",
    "content-type",
    request::UPSTREAM_TIME_HEADER,
];

/// What only Envoy can do for a request, as the flow needs it. Every
/// method is infallible or reports failure in its result: a host never
/// panics, it logs and answers.
pub trait Host {
    /// The clock, ms since the Unix epoch.
    fn now_ms(&mut self) -> u64;

    /// The request headers, whole (empty if they cannot be read: every
    /// attribute is then unknown, and the policy fails closed).
    fn request_headers(&mut self) -> Pairs;

    /// Remove every value of request header `name`; false if the host
    /// could not.
    fn remove_request_header(&mut self, name: &str) -> bool;

    /// Set request header `name` to `value`, replacing every earlier
    /// value; false if the host could not.
    fn set_request_header(&mut self, name: &str, value: &str) -> bool;

    /// Add `value` to request header `name`, keeping its earlier values
    /// (a re-run puts a repeated header back, [`crate::rerun::restore`]); false
    /// if the host could not (the default).
    fn add_request_header(&mut self, name: &str, value: &str) -> bool {
        let _ = (name, value);
        false
    }

    /// Make Envoy select the route again after the destination header
    /// changed (a no-op where the host does it on its own).
    fn clear_route_cache(&mut self);

    /// The request body that arrived with this body callback: append up
    /// to `room` bytes of it to `into`, and return how many arrived.
    fn request_body(&mut self, into: &mut Vec<u8>, room: usize) -> usize;

    /// A verified attribute's value (dynamic metadata, the mTLS peer), or
    /// `None` when the source has none or this host cannot read it.
    fn trusted(&mut self, source: &Trusted) -> Option<Vec<u8>>;

    /// `f` of response header `name`'s value (`None` when absent).
    fn response_header<R>(&mut self, name: &str, f: impl FnOnce(Option<&[u8]>) -> R) -> R;

    /// Set response header `name` to `value`.
    fn set_response_header(&mut self, name: &str, value: &str);

    /// Every response header, `f(name, value)` for each, in one pass.
    fn each_response_header(&mut self, f: impl FnMut(&[u8], &[u8]));

    /// Calls `f` on each chunk of the response body that arrived with this
    /// body callback.
    fn response_body(&mut self, f: impl FnMut(&[u8]));

    /// Answer the request from the proxy: `status`, `body` of type
    /// `content_type` with `headers` besides (a budget's 429 carries
    /// `retry-after`; at most seven), and `details` for Envoy's
    /// response-code details; false if the host could not.
    fn send_local(
        &mut self,
        status: u32,
        content_type: &str,
        body: &[u8],
        details: &str,
        headers: &[(&str, &str)],
    ) -> bool;

    /// The status Envoy answered with, when it answered without the
    /// filter seeing the answer (its 413 while the body was held).
    fn envoy_response_code(&mut self) -> Option<u32>;

    /// Hand the request's event line to Envoy's access log.
    fn write_event(&mut self, line: &[u8]) -> bool;

    /// Count `n` on `counter`.
    fn count(&mut self, counter: Counter, n: u64);

    /// Run `op` on the fleet's shared state at `now_ms`, as one
    /// transaction: the host brings its copy of the state up to `now_ms`,
    /// runs [`FleetOp::apply`] with the warmth the control service last
    /// gave it ([`crate::control::Outside`]), and stores the destination
    /// the op changed (repriced). A host whose store can refuse a write
    /// (the Wasm filter's compare-and-swap in shared data) may run `apply`
    /// again on a fresher copy; an op is safe to re-run. What the op does
    /// is the flow's, never the host's: [`FleetOp::run`] is the whole
    /// transaction for a host that holds the state in its own memory.
    fn fleet(&mut self, now_ms: u64, op: FleetOp<'_, '_>) -> Result<FleetAnswer, FleetUnavailable>;

    /// Where this host keeps what a re-run takes over from the run it
    /// replaces ([`crate::rerun`]), shared by every worker; `None` (the default):
    /// this host cannot run a request again within the same request, and
    /// `retry_next` is ignored.
    fn parking(&self) -> Option<&Parking> {
        None
    }

    /// Whether Envoy holds the whole request body, `bytes` long, to run
    /// the request again.
    fn replayable(&mut self, bytes: usize) -> bool {
        let _ = bytes;
        false
    }

    /// Mark this run of the request as replaced by a re-run (its access
    /// log line carries no event), or not.
    fn mark_superseded(&mut self, superseded: bool) {
        let _ = superseded;
    }

    /// What this host can change of a request and its answer (the
    /// default: nothing).
    fn can(&self) -> Can {
        Can::default()
    }

    /// Replace the whole held request body with `body` (and its
    /// `content-length`); false if the host could not.
    fn replace_request_body(&mut self, body: &[u8]) -> bool {
        let _ = body;
        false
    }

    /// Replace the response body chunk of this callback with `bytes`;
    /// false if the host could not.
    fn replace_response_chunk(&mut self, bytes: &[u8]) -> bool {
        let _ = bytes;
        false
    }

    /// The value at `key` in the store every worker of this proxy
    /// shares ([`crate::store`]), appended to `into`, and its version;
    /// `None` when there is none or it cannot be read (the host logs why).
    fn shared_get(&mut self, key: &str, into: &mut Vec<u8>) -> Option<Version>;

    /// Store `value` at `key` in the shared store if `expect` holds of
    /// the value there (a compare-and-swap).
    fn shared_set(&mut self, key: &str, value: &[u8], expect: Expect) -> Written;

    /// The control service's latest reading of budget `b`, as this host
    /// holds it ([`crate::control::Outside::budget`]); an empty one when
    /// it has none (the default: a host without a control service).
    fn budget_reading(&mut self, b: u16) -> budget::Reading {
        let _ = b;
        budget::Reading::default()
    }
}

/// What a host can change of a request and its answer ([`Host::can`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Can {
    /// Replace the held request body ([`Host::replace_request_body`]).
    /// Model routing substitutes a model only on a host that can: the
    /// upstream serves the model its body names.
    pub replace_request_body: bool,
    /// Replace a response body chunk as it passes
    /// ([`Host::replace_response_chunk`]). ACE asks a stream for its usage
    /// on the client's behalf only on a host that can give the client back
    /// the stream it asked for ([`crate::stream_usage`]).
    pub replace_response_body: bool,
}

/// A value's version in the store, as a compare-and-swap compares it
/// (Envoy's shared data CAS); never 0 for a stored value.
pub type Version = u32;

/// What a write requires of the value it replaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Nothing: the write replaces whatever is there.
    Any,
    /// That there is none: the first writer wins.
    Absent,
    /// That it is still the version read.
    Version(Version),
}

/// What a write came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    /// Stored.
    Stored,
    /// Another writer changed the value first: read it again.
    Raced,
    /// The store refused (the host logged why).
    Failed,
}
