//! One conformance suite for every host of ACE's request flow.
//!
//! The same cases ([`cases`]) run over four hosts, each behind a small
//! [`Driver`]: the tests' mock ([`mock`]), the fleet simulator's host
//! ([`sim`], through `ace_sim::policy::ace::Probe`), the Wasm filter on
//! the wasmtime host ([`wasm`], `ace_filter.wasm` built from source) and
//! the dynamic module under a fake of Envoy's dynamic-module ABI
//! ([`dynamic`]). A case is written once, against the [`Driver`]: it sends
//! requests whose upstream answer is scripted ([`Req`], [`Answer`]), sets
//! what the control service answers ([`Service`]), moves the clock, and
//! says what every host must show ([`Seen`]: where the request went, the
//! status and local reply, the response headers, the event line; and
//! counters). What a host cannot show by design it reports as `None`
//! (the simulator's host writes no response headers and keeps no
//! counters), and a case that a host cannot run says so in its `skip`
//! list, with the reason. No host may skip a control case.
//!
//! Where a host disagrees today with a rule the case encodes, the pair is
//! listed in [`DIVERGENCES`] with where the host's code says otherwise:
//! the case must then fail on that host, and the test fails loudly once it
//! passes, so the entry is removed when the host is fixed.
//!
//! Real-Envoy behaviour (the filter manager, the access log, Envoy's own
//! replies) stays in the `tests/` crate.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking

pub mod cases;
pub mod dynamic;
pub mod mock;
pub mod sim;
pub mod wasm;

use serde_json::Value;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Headers as the cases read them: (name, value) in order.
pub type HeaderList = Vec<(String, String)>;

/// Every host starts its clock here (Unix ms), so events and snapshots
/// carry the same times on all of them.
pub const T0: u64 = 1_800_000_000_000;

/// The hosts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostKind {
    /// The tests' mock host ([`mock::Mock`]).
    Mock,
    /// The fleet simulator's host (`ace_sim::policy::ace`).
    Sim,
    /// `ace_filter.wasm` on `ace-wasm-host`.
    Wasm,
    /// `ace-dynamic` under a fake Envoy ([`dynamic`]).
    Dynamic,
}

impl HostKind {
    /// Every host.
    pub const ALL: [HostKind; 4] = [
        HostKind::Mock,
        HostKind::Sim,
        HostKind::Wasm,
        HostKind::Dynamic,
    ];
}

/// A request as a client sends it (`:method`, `:path` and, with a body,
/// `content-length` and `content-type` are added by every driver alike).
#[derive(Clone, Debug, Default)]
pub struct Req {
    /// Headers, in order.
    pub headers: Vec<(&'static str, String)>,
    /// The body, in the chunks it arrives in (empty: none).
    pub body: Vec<Vec<u8>>,
}

impl Req {
    /// A request with data class `class` (the policy attribute).
    pub fn class(class: &str) -> Req {
        Req::default().header("x-ace-data-class", class)
    }

    /// With header `name: value` added.
    pub fn header(mut self, name: &'static str, value: &str) -> Req {
        self.headers.push((name, value.to_string()));
        self
    }

    /// With this body, arriving in these chunks.
    pub fn body(mut self, chunks: &[&str]) -> Req {
        self.body = chunks.iter().map(|c| c.as_bytes().to_vec()).collect();
        self
    }
}

/// What the upstream answers, and how long it takes.
#[derive(Clone, Debug)]
pub struct Answer {
    /// `:status`.
    pub status: u32,
    /// Other headers.
    pub headers: Vec<(&'static str, String)>,
    /// The body, in chunks.
    pub body: Vec<Vec<u8>>,
    /// ms from the request to the answer's headers.
    pub took_ms: u64,
}

impl Answer {
    /// A 200 with a JSON body, in 5 ms.
    pub fn ok(body: &str) -> Answer {
        Answer {
            status: 200,
            headers: vec![
                ("content-type", "application/json".into()),
                ("x-envoy-upstream-service-time", "3".into()),
            ],
            body: vec![body.as_bytes().to_vec()],
            took_ms: 5,
        }
    }

    /// `status` from the upstream, no body, in 5 ms.
    pub fn status(status: u32) -> Answer {
        Answer {
            status,
            headers: vec![("x-envoy-upstream-service-time", "1".into())],
            body: vec![],
            took_ms: 5,
        }
    }

    /// With header `name: value`.
    pub fn header(mut self, name: &'static str, value: &str) -> Answer {
        self.headers.retain(|(k, _)| *k != name);
        self.headers.push((name, value.to_string()));
        self
    }

    /// With the body in these chunks.
    pub fn chunks(mut self, chunks: &[&str]) -> Answer {
        self.body = chunks.iter().map(|c| c.as_bytes().to_vec()).collect();
        self
    }

    /// Taking `ms` to answer.
    pub fn took(mut self, ms: u64) -> Answer {
        self.took_ms = ms;
        self
    }
}

/// What the client and the access log saw of one request.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    /// The cluster the request was sent to (`None`: answered locally).
    pub upstream: Option<String>,
    /// The status the client got.
    pub status: u32,
    /// The local reply's JSON body, when ACE answered.
    pub reply: Option<Value>,
    /// The response headers the client got (`None`: this host does not
    /// show them).
    pub headers: Option<Vec<(String, String)>>,
    /// The request's event line.
    pub event: Value,
}

impl Seen {
    /// Response header `name` as the client got it; `Some(None)` when
    /// absent, `None` when this host does not show response headers.
    pub fn header(&self, name: &str) -> Option<Option<&str>> {
        self.headers.as_ref().map(|h| {
            h.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        })
    }
}

/// What the control service answers every poll from now on.
#[derive(Clone, Debug)]
pub enum Service {
    /// No answer (the poll fails: reset, timeout).
    Down,
    /// This snapshot's bytes (`ace_snapshot::encode`), 200 with its ETag,
    /// or 304 to a poll that sends that ETag.
    Serves(Vec<u8>),
    /// 304 "not modified" to every poll.
    NotModified,
}

/// The control service's settings every control case configures: polled
/// each second, stale after three seconds without an answer.
pub const CONTROL: &str =
    r#""control":{"cluster":"ace_control","interval_ms":1000,"stale_after_ms":3000}"#;

/// One host, driven by a case.
pub trait Driver {
    /// Which host this is.
    fn kind(&self) -> HostKind;
    /// The host's clock, Unix ms.
    fn now(&self) -> u64;
    /// Run `req`'s request path and leave it in flight; its id.
    fn open(&mut self, req: &Req) -> u64;
    /// The cluster request `id` went to (`None`: answered locally).
    fn upstream(&self, id: u64) -> Option<String>;
    /// The request headers request `id` left for its upstream with
    /// (`None`: answered locally, or a host that keeps no headers).
    fn sent(&self, id: u64) -> Option<Vec<(String, String)>>;
    /// The upstream answers request `id` (ignored if it was answered
    /// locally), and the request ends.
    fn close(&mut self, id: u64, answer: &Answer) -> Seen;
    /// The control service answers every poll this way from now on.
    fn service(&mut self, service: Service);
    /// Move the clock on `ms` (the control service is polled on the way,
    /// every interval).
    fn advance(&mut self, ms: u64);
    /// Counter `name` (`ace.trips`, ...); `None` when this host keeps no
    /// counters a test can read.
    fn counter(&mut self, name: &str) -> Option<u64>;

    /// One whole request.
    fn send(&mut self, req: &Req, answer: &Answer) -> Seen {
        let id = self.open(req);
        self.close(id, answer)
    }
}

/// A case: a configuration, what every host must do with it, and the
/// hosts that cannot run it by design, with why.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    /// Its name (the test's).
    pub name: &'static str,
    /// The plugin configuration (JSON).
    pub config: fn() -> String,
    /// Hosts that cannot run it by design, and why.
    pub skip: &'static [(HostKind, &'static str)],
    /// The case, against any host.
    pub run: fn(&mut dyn Driver),
}

/// Where a host disagrees today with a rule a case encodes: (case, host,
/// where and why). The case must fail on that host; when it passes, the
/// host was fixed and the entry goes.
pub const DIVERGENCES: &[(&str, HostKind, &str)] = &[];

/// A driver for `kind` running `config`.
pub fn driver(kind: HostKind, config: &str) -> Box<dyn Driver> {
    match kind {
        HostKind::Mock => Box::new(mock::MockDriver::new(config)),
        HostKind::Sim => Box::new(sim::SimDriver::new(config)),
        HostKind::Wasm => Box::new(wasm::WasmDriver::new(config)),
        HostKind::Dynamic => Box::new(dynamic::DynamicDriver::new(config)),
    }
}

/// Run case `name` on host `kind`: it must pass, or, where
/// [`DIVERGENCES`] lists the pair, fail.
pub fn check(name: &str, kind: HostKind) {
    let case = cases::ALL
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no case {name}"));
    if let Some((_, why)) = case.skip.iter().find(|(k, _)| *k == kind) {
        eprintln!("{name} on {kind:?}: skipped by design: {why}");
        return;
    }
    let config = (case.config)();
    let diverges = DIVERGENCES
        .iter()
        .find(|(c, k, _)| *c == name && *k == kind);
    match diverges {
        None => {
            let mut d = driver(kind, &config);
            (case.run)(d.as_mut());
        }
        Some((_, _, why)) => {
            let r = catch_unwind(AssertUnwindSafe(|| {
                let mut d = driver(kind, &config);
                (case.run)(d.as_mut());
            }));
            assert!(
                r.is_err(),
                "{name} now passes on {kind:?}: the divergence ({why}) is gone; remove it from \
                 ace_conformance::DIVERGENCES"
            );
            eprintln!("{name} on {kind:?}: known divergence, failed as expected: {why}");
        }
    }
}
