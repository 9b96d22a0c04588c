//! The fleet simulator's host (`ace_sim::policy::ace`, through its
//! [`Probe`]): the very host `ace sim` runs ACE with. It writes no
//! response headers and keeps no counters (the simulator needs neither),
//! so [`Seen::headers`] and [`Driver::counter`] are `None`. It takes each
//! snapshot the service serves every interval, as the simulator's
//! control service publishes one.

use crate::mock::request_headers;
use crate::{Answer, Driver, HostKind, Req, Seen, Service, T0};
use ace_flow::flow::Setup;
use ace_sim::policy::ace::{Probe, Probed};
use serde_json::Value;
use std::collections::HashMap;

/// The simulator's host behind the [`Driver`] trait.
#[derive(Debug)]
pub struct SimDriver {
    probe: Probe,
    now: u64,
    interval: Option<u64>,
    service: Service,
    routed: HashMap<u64, Probed>,
}

impl SimDriver {
    /// The simulator's host running `config`.
    pub fn new(config: &str) -> SimDriver {
        let setup = Setup::parse(config.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
        let interval = setup.config.control.as_ref().map(|c| c.interval_ms);
        SimDriver {
            probe: Probe::new(setup),
            now: T0,
            interval,
            service: Service::Down,
            routed: HashMap::new(),
        }
    }

    fn last_event(&mut self) -> Value {
        let lines = self.probe.take_events();
        let line = lines
            .split(|b| *b == b'\n')
            .rfind(|l| !l.is_empty())
            .unwrap_or_else(|| panic!("no event written"));
        serde_json::from_slice(line).unwrap_or_else(|e| panic!("event not JSON: {e}"))
    }
}

impl Driver for SimDriver {
    fn kind(&self) -> HostKind {
        HostKind::Sim
    }

    fn now(&self) -> u64 {
        self.now
    }

    fn open(&mut self, req: &Req) -> u64 {
        let body: Vec<u8> = req.body.concat();
        let (id, probed) = self.probe.request(self.now, &request_headers(req), &body);
        self.routed.insert(id, probed);
        id
    }

    /// The simulator sends no headers: it models where a request goes and
    /// what it costs.
    fn sent(&self, _id: u64) -> Option<Vec<(String, String)>> {
        None
    }

    fn upstream(&self, id: u64) -> Option<String> {
        match self.routed.get(&id)? {
            Probed::Upstream(c) => Some(c.clone()),
            Probed::Refused(_) => None,
        }
    }

    fn close(&mut self, id: u64, answer: &Answer) -> Seen {
        let probed = self.routed.remove(&id).expect("a request in flight");
        let mut seen = Seen::default();
        match probed {
            Probed::Upstream(c) => {
                self.now += answer.took_ms;
                self.probe
                    .respond(id, self.now, answer.status, &answer.headers, &answer.body);
                seen.upstream = Some(c);
                seen.status = answer.status;
            }
            Probed::Refused(status) => seen.status = status,
        }
        self.probe.complete(id, self.now);
        seen.event = self.last_event();
        seen
    }

    fn service(&mut self, service: Service) {
        self.service = service;
    }

    fn advance(&mut self, ms: u64) {
        let end = self.now + ms;
        if let Some(interval) = self.interval {
            let mut next = (self.now - T0) / interval * interval + interval + T0;
            while next <= end {
                self.now = next;
                match &self.service {
                    Service::Serves(bytes) => {
                        self.probe.snapshot(bytes, next);
                    }
                    Service::NotModified => {
                        self.probe.unchanged(next);
                    }
                    Service::Down => {}
                }
                next += interval;
            }
        }
        self.now = end;
    }

    fn counter(&mut self, _name: &str) -> Option<u64> {
        None
    }
}
