//! The mock host: ACE's request flow over plain memory, with one
//! [`FleetState`] (as the dynamic module keeps it), the control service's
//! answers applied through `ace_flow::control` as the rules say, and every
//! local reply, counter and event line recorded. It is the suite's
//! reference: the rules, and nothing a proxy adds.

use crate::{Answer, Driver, HostKind, Req, Seen, Service, T0};
use ace_config::{Control, Trusted};
use ace_core::fleet::FleetState;
use ace_flow::control::{Consumer, Delivery};
use ace_flow::counters::Counter;
use ace_flow::flow::{
    Can, FleetAnswer, FleetOp, FleetUnavailable, Flow, Host, Setup, Verdict, Worker,
};
use ace_flow::headers::Pairs;
use ace_flow::store;
use serde_json::Value;
use std::cell::RefCell;
use std::collections::HashMap;

/// The mock host: one per fleet.
#[derive(Debug)]
pub struct Mock {
    /// The clock, Unix ms.
    pub now: u64,
    /// The fleet's shared state.
    pub fleet: FleetState,
    /// What the control service said.
    pub outside: Consumer,
    /// The control service's settings, if configured.
    pub control: Option<Control>,
    /// When the mock started (staleness counts from here until heard).
    pub started_ms: u64,
    /// The cost models and health policy of the configuration.
    pub models: Vec<ace_core::cost::CostModel>,
    /// The health policy.
    pub policy: ace_core::health::HealthPolicy,
    /// Counters, by [`Counter::index`].
    pub counters: Vec<u64>,
    /// Counter names, by position.
    pub counter_names: Vec<String>,
    /// Event lines written.
    pub events: Vec<Value>,
    /// This request's headers, as the upstream will see them.
    pub headers: Vec<(String, String)>,
    /// The body chunk of the current body callback.
    pub chunk: Vec<u8>,
    /// The response headers of the current request.
    pub response: Vec<(String, String)>,
    /// Local replies sent.
    pub replies: Vec<(u32, Value)>,
    /// The last local reply's headers besides its content type.
    pub reply_headers: Vec<(String, String)>,
    /// Metadata a verified source reads.
    pub metadata: Option<Vec<u8>>,
    /// Whether this host can run a request again.
    pub can_rerun: bool,
    /// What a re-run takes over, when it can.
    pub parking: ace_flow::rerun::Parking,
    /// Whether this host can replace the held request body (off: the
    /// suite's cases hold for hosts that cannot).
    pub rewrites: bool,
    /// The request body as the flow replaced it (what Envoy holds now).
    pub body: Option<Vec<u8>>,
    /// Whether it marked the current run superseded.
    pub superseded: bool,
    /// The store every worker shares (one worker here), with prefix
    /// locality's secret fixed.
    pub store: store::Memory,
}

impl Mock {
    /// The mock for `setup`, its clock at [`T0`].
    pub fn new(setup: &Setup) -> Mock {
        let cfg = &setup.config;
        let mut fleet = FleetState::new(cfg.destinations.len());
        fleet.reprice_all(&cfg.models, &cfg.health, T0);
        Mock {
            now: T0,
            fleet,
            outside: Consumer::new(cfg, T0),
            control: cfg.control.clone(),
            started_ms: T0,
            models: cfg.models.clone(),
            policy: cfg.health,
            counters: vec![0; Counter::names(cfg).len()],
            counter_names: Counter::names(cfg),
            events: vec![],
            headers: vec![],
            chunk: vec![],
            response: vec![],
            replies: vec![],
            reply_headers: vec![],
            metadata: None,
            can_rerun: false,
            parking: ace_flow::rerun::Parking::new(),
            rewrites: false,
            body: None,
            superseded: false,
            store: store::Memory::deterministic([3, 5]),
        }
    }

    /// Request header `name`'s value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Age the snapshot in force at the current time (the one consumer's
    /// rules: `ace_flow::control::Consumer`), applying it to the fleet if
    /// that changed it.
    pub fn age(&mut self, setup: &Setup) {
        if self.control.is_some() && self.outside.age(self.now) {
            self.outside
                .apply_to(&mut self.fleet, &setup.config, self.now);
        }
    }

    /// One poll of the control service, answered as `service` answers, at
    /// the current time, through the one consumer: the poll asks with the
    /// ETag of the snapshot in force, as the Wasm filter does.
    pub fn poll(&mut self, setup: &Setup, service: &Service) {
        let cfg = &setup.config;
        let now = self.now;
        let etag = self.outside.etag();
        let changed = match (service, etag.as_deref()) {
            (Service::Down, _) | (Service::NotModified, None) => self.outside.age(now),
            (Service::NotModified, Some(etag)) => {
                let delivery = Delivery::Unchanged { etag, at_ms: now };
                self.outside.deliver(cfg, delivery, now).1
            }
            (Service::Serves(bytes), _) => {
                let delivery = Delivery::Snapshot { bytes, at_ms: now };
                self.outside.deliver(cfg, delivery, now).1
            }
        };
        if changed {
            self.outside.apply_to(&mut self.fleet, cfg, now);
        }
    }
}

impl Host for Mock {
    fn now_ms(&mut self) -> u64 {
        self.now
    }

    fn budget_reading(&mut self, b: u16) -> ace_flow::budget::Reading {
        self.outside.budget(b)
    }

    fn shared_get(&mut self, key: &str, into: &mut Vec<u8>) -> Option<store::Version> {
        self.store.get(key, into)
    }

    fn shared_set(&mut self, key: &str, value: &[u8], expect: store::Expect) -> store::Written {
        self.store.set(key, value, expect)
    }

    fn request_headers(&mut self) -> Pairs {
        Pairs::encode(
            self.headers
                .iter()
                .map(|(k, v)| (k.as_bytes(), v.as_bytes())),
        )
    }

    fn remove_request_header(&mut self, name: &str) -> bool {
        self.headers.retain(|(k, _)| k != name);
        true
    }

    fn set_request_header(&mut self, name: &str, value: &str) -> bool {
        self.remove_request_header(name);
        self.headers.push((name.to_string(), value.to_string()));
        true
    }

    fn add_request_header(&mut self, name: &str, value: &str) -> bool {
        self.headers.push((name.to_string(), value.to_string()));
        true
    }

    fn clear_route_cache(&mut self) {}

    fn request_body(&mut self, into: &mut Vec<u8>, room: usize) -> usize {
        let take = room.min(self.chunk.len());
        into.extend_from_slice(self.chunk.get(..take).unwrap_or_default());
        self.chunk.len()
    }

    fn trusted(&mut self, _source: &Trusted) -> Option<Vec<u8>> {
        self.metadata.clone()
    }

    fn response_header<R>(&mut self, name: &str, f: impl FnOnce(Option<&[u8]>) -> R) -> R {
        f(self
            .response
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_bytes()))
    }

    fn each_response_header(&mut self, mut f: impl FnMut(&[u8], &[u8])) {
        for (k, v) in &self.response {
            f(k.as_bytes(), v.as_bytes());
        }
    }

    fn set_response_header(&mut self, name: &str, value: &str) {
        self.response.retain(|(k, _)| k != name);
        self.response.push((name.to_string(), value.to_string()));
    }

    fn response_body(&mut self, mut f: impl FnMut(&[u8])) {
        f(&self.chunk);
    }

    fn send_local(
        &mut self,
        status: u32,
        _content_type: &str,
        body: &[u8],
        _details: &str,
        headers: &[(&str, &str)],
    ) -> bool {
        let v = serde_json::from_slice(body).unwrap_or_else(|e| panic!("reply not JSON: {e}"));
        self.replies.push((status, v));
        self.reply_headers = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        true
    }

    fn envoy_response_code(&mut self) -> Option<u32> {
        None
    }

    fn write_event(&mut self, line: &[u8]) -> bool {
        let v = serde_json::from_slice(line).unwrap_or_else(|e| panic!("event not JSON: {e}"));
        self.events.push(v);
        true
    }

    fn count(&mut self, counter: Counter, n: u64) {
        if let Some(c) = self.counters.get_mut(counter.index()) {
            *c += n;
        }
    }

    fn fleet(&mut self, now_ms: u64, op: FleetOp<'_, '_>) -> Result<FleetAnswer, FleetUnavailable> {
        let warmth = &self.outside.outside().warmth;
        Ok(op.run(&mut self.fleet, warmth, &self.models, &self.policy, now_ms))
    }

    fn parking(&self) -> Option<&ace_flow::rerun::Parking> {
        self.can_rerun.then_some(&self.parking)
    }

    fn can(&self) -> Can {
        Can {
            replace_request_body: self.rewrites,
            replace_response_body: false,
        }
    }

    fn replace_request_body(&mut self, body: &[u8]) -> bool {
        if !self.rewrites {
            return false;
        }
        self.body = Some(body.to_vec());
        self.set_request_header("content-length", &body.len().to_string())
    }

    fn replayable(&mut self, _bytes: usize) -> bool {
        true
    }

    fn mark_superseded(&mut self, superseded: bool) {
        self.superseded = superseded;
    }
}

/// The headers every driver sends for `req`: its own, then `:method`,
/// `:path`, and with a body its length and type.
pub fn request_headers(req: &Req) -> Vec<(String, String)> {
    let mut h: Vec<(String, String)> = [
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        (":authority", "ace.test"),
    ]
    .into_iter()
    .filter(|(k, _)| req.headers.iter().all(|(n, _)| n != k))
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    h.extend(req.headers.iter().map(|(k, v)| (k.to_string(), v.clone())));
    if !req.body.is_empty() {
        let len: usize = req.body.iter().map(Vec::len).sum();
        h.push(("content-length".into(), len.to_string()));
        h.push(("content-type".into(), "application/json".into()));
    }
    h
}

/// One request in flight on the mock.
#[derive(Debug)]
struct InFlight {
    flow: Flow,
    upstream: Option<String>,
    /// The headers it left with.
    sent: Option<Vec<(String, String)>>,
    /// The local reply (status, body, headers), when answered at once.
    reply: Option<(u32, Value, crate::HeaderList)>,
}

/// The mock behind the [`Driver`] trait: polls the service every
/// interval (on the interval's multiples since [`T0`]).
#[derive(Debug)]
pub struct MockDriver {
    setup: Setup,
    worker: RefCell<Worker>,
    mock: Mock,
    flows: HashMap<u64, InFlight>,
    next: u64,
    service: Service,
}

impl MockDriver {
    /// The mock running `config`.
    pub fn new(config: &str) -> MockDriver {
        let setup = Setup::parse(config.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
        let mock = Mock::new(&setup);
        MockDriver {
            setup,
            worker: RefCell::new(Worker::with_event_ids(7)),
            mock,
            flows: HashMap::new(),
            next: 0,
            service: Service::Down,
        }
    }
}

impl Driver for MockDriver {
    fn kind(&self) -> HostKind {
        HostKind::Mock
    }

    fn now(&self) -> u64 {
        self.mock.now
    }

    fn open(&mut self, req: &Req) -> u64 {
        let (s, w, m) = (&self.setup, &self.worker, &mut self.mock);
        m.age(s);
        m.headers = request_headers(req);
        m.response.clear();
        let replies = m.replies.len();
        let mut flow = Flow::new();
        let mut verdict = flow.on_request_headers(s, w, m, req.body.is_empty());
        for (i, chunk) in req.body.iter().enumerate() {
            if verdict == Verdict::Answered {
                break;
            }
            m.chunk.clone_from(chunk);
            verdict = flow.on_request_body(s, w, m, i + 1 == req.body.len());
        }
        assert_ne!(verdict, Verdict::Hold, "a whole request is never left held");
        let upstream = (verdict == Verdict::Continue)
            .then(|| m.header("x-ace-destination").map(str::to_string))
            .flatten();
        let reply = m.replies.get(replies).cloned().map(|(status, body)| {
            let headers = std::mem::take(&mut m.reply_headers);
            (status, body, headers)
        });
        let sent = upstream.as_ref().map(|_| m.headers.clone());
        self.next += 1;
        self.flows.insert(
            self.next,
            InFlight {
                flow,
                upstream,
                sent,
                reply,
            },
        );
        self.next
    }

    fn upstream(&self, id: u64) -> Option<String> {
        self.flows.get(&id).and_then(|f| f.upstream.clone())
    }

    fn sent(&self, id: u64) -> Option<Vec<(String, String)>> {
        self.flows.get(&id).and_then(|f| f.sent.clone())
    }

    fn close(&mut self, id: u64, answer: &Answer) -> Seen {
        let mut f = self.flows.remove(&id).expect("a request in flight");
        let (s, w, m) = (&self.setup, &self.worker, &mut self.mock);
        let events = m.events.len();
        let mut seen = Seen::default();
        if f.upstream.is_some() {
            m.now += answer.took_ms;
            m.response = answer
                .headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect();
            m.response
                .push((":status".into(), answer.status.to_string()));
            assert_eq!(f.flow.on_response_headers(s, m), Verdict::Continue);
            for (i, chunk) in answer.body.iter().enumerate() {
                m.chunk.clone_from(chunk);
                f.flow.on_response_body(s, m, i + 1 == answer.body.len());
            }
            seen.status = answer.status;
            seen.headers = Some(m.response.clone());
        } else if let Some((status, body, headers)) = f.reply.take() {
            seen.status = status;
            seen.reply = Some(body);
            seen.headers = Some(headers);
        }
        f.flow.on_complete(s, w, m);
        assert_eq!(m.events.len(), events + 1, "exactly one event per request");
        seen.upstream = f.upstream;
        seen.event = m.events.last().cloned().unwrap_or_default();
        seen
    }

    fn service(&mut self, service: Service) {
        self.service = service;
    }

    fn advance(&mut self, ms: u64) {
        let interval = self.mock.control.as_ref().map(|c| c.interval_ms);
        let end = self.mock.now + ms;
        if let Some(interval) = interval {
            // Every multiple of the interval since T0 crossed on the way.
            let mut next = (self.mock.now - T0) / interval * interval + interval + T0;
            while next <= end {
                self.mock.now = next;
                self.mock.poll(&self.setup, &self.service);
                next += interval;
            }
        }
        self.mock.now = end;
        self.mock.age(&self.setup);
    }

    fn counter(&mut self, name: &str) -> Option<u64> {
        let i = self.mock.counter_names.iter().position(|n| n == name)?;
        self.mock.counters.get(i).copied()
    }
}
