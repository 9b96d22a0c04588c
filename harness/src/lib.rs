//! ace-harness: a real Envoy, our filter built from source, and upstreams
//! that do what a test tells them.
//!
//! Why it exists: everything ACE promises happens inside Envoy, and Envoy's
//! behaviour around routing, local replies and retries is subtle enough that
//! we check it against the real binary rather than a model of it. The same
//! kit runs the end-to-end tests, the demo (`ace-demo`, `make demo`), and
//! the load benchmarks. It is test code: no product crate depends on it
//! (`tests/tests/crate_graph.rs` checks).
//!
//! - [`wasm::build`] builds a workspace cdylib for `wasm32-wasip1` (once per
//!   process) with `scripts/build-wasm.sh`; [`dylib::build`] builds one as
//!   a native shared library (an Envoy dynamic module), once per process.
//! - [`upstream::Upstream`] is an in-process HTTP/1.1 server on a free
//!   loopback port that records every request and can be told to misbehave
//!   (5xx, 429 with `retry-after`, slow, close the connection).
//! - [`model_server::ModelServer`] is an upstream that also behaves like
//!   vLLM for ACE's control service: `GET /metrics` (vLLM's Prometheus
//!   families, following its real in-flight load or an override) and
//!   `GET /v1/models` (base models and LoRA adapters), each of which can be
//!   made to fail.
//! - [`envoy::EnvoyBuilder`] writes a bootstrap into a temp dir with free
//!   loopback ports, starts `envoy`, waits for the admin `/ready`, and tears it
//!   down on drop, printing Envoy's log when the thread is panicking.
//! - [`grpc::GrpcUpstream`] is an in-process gRPC server (HTTP/2 with prior
//!   knowledge, real gRPC framing) whose scripted [`grpc::GrpcBehavior`]
//!   can also be driven without a socket.
//! - [`client`] is a small blocking HTTP/1.1 client for talking to Envoy.
//! - [`provider`] fakes LLM providers that hold a request to what the real
//!   ones check: their paths, model names and credential header, TLS for
//!   their own name, their rate-limit figures and 429s.
//! - [`control::FakeControl`] serves control snapshots as `ace control
//!   serve` does (ETags, 304s), and can be stopped and started again.
//! - [`chromium::Page`] drives a headless Chromium over the DevTools
//!   protocol, for tests of the pages ACE serves (the policy playground).
//! - [`pg::Pg`] is a real PostgreSQL in a temp dir, for the ledger's store
//!   and what reads it.
//!
//! Nothing here skips: if `envoy` is missing, [`envoy::find_envoy`] returns an
//! error naming it and the command that installs it.
#![forbid(unsafe_code)]

pub mod chromium;
pub mod client;
pub mod control;
pub mod dylib;
pub mod envoy;
pub mod grpc;
pub mod model_server;
pub mod pg;
pub mod provider;
pub mod upstream;
pub mod wasm;

/// The workspace root (the directory holding the top-level `Cargo.toml`).
pub fn workspace_root() -> std::path::PathBuf {
    let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent().unwrap_or(here).to_path_buf()
}

/// Ask the OS for a free TCP port on 127.0.0.1.
///
/// The port is free when this returns; a race with another process taking it
/// before Envoy binds is possible but rare, and shows up as a clear startup
/// error in Envoy's log.
pub fn free_port() -> std::io::Result<u16> {
    let l = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    Ok(l.local_addr()?.port())
}

/// `N` distinct free ports on 127.0.0.1 (each held until all are found,
/// so no two are the same; see [`free_port`] for the race with other
/// processes).
pub fn free_ports<const N: usize>() -> std::io::Result<[u16; N]> {
    let held = (0..N)
        .map(|_| std::net::TcpListener::bind(("127.0.0.1", 0)))
        .collect::<std::io::Result<Vec<_>>>()?;
    let mut ports = [0u16; N];
    for (p, l) in ports.iter_mut().zip(&held) {
        *p = l.local_addr()?.port();
    }
    Ok(ports)
}

/// First value of header `name` (case-insensitive) among lower-cased pairs.
pub(crate) fn find_header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}
