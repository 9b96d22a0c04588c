//! What happens between callbacks: the virtual clock's ticks, callout
//! responses, queue notifications and the effects Envoy defers until a
//! callback returns.

use super::Vm;
use crate::error::Error;
use crate::http_call::{timeout_response, CallRequest, CallResponse, CallResult};
use crate::process::ClusterBehaviour;
use crate::state::Deferred;
use std::time::Duration;

/// A timed event of the virtual clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timed {
    /// A cluster with latency answers callout `token`.
    Answer(u32),
    /// Callout `token` times out.
    Timeout(u32),
    /// The root context's timer.
    Tick,
    /// The gRPC calls and streams whose deadline this is time out.
    GrpcDeadline,
}

impl Vm {
    /// Advances the virtual clock, and delivers each timed event at its
    /// due time, in time order: `on_tick` once per elapsed period, the
    /// answers of clusters with latency, callout timeouts (Envoy's 504
    /// `upstream request timeout`) and gRPC deadlines (UNAVAILABLE), with
    /// what each of them causes.
    pub fn advance(&mut self, by: Duration) -> Result<(), Error> {
        let target = self
            .store
            .data()
            .elapsed_ns
            .saturating_add(u64::try_from(by.as_nanos()).unwrap_or(u64::MAX));
        while let Some((due, event)) = self.next_event(true).filter(|(due, _)| *due <= target) {
            self.store.data_mut().elapsed_ns = due;
            match event {
                Timed::Answer(token) => {
                    let s = self.store.data_mut();
                    let answer = s.call_answers.remove(&token);
                    s.call_deadlines.remove(&token);
                    s.pending_calls.remove(&token);
                    if let Some((_, result)) = answer {
                        self.deliver_call(token, result)?;
                    }
                }
                Timed::Timeout(token) => {
                    let s = self.store.data_mut();
                    s.call_deadlines.remove(&token);
                    s.call_answers.remove(&token);
                    if s.pending_calls.remove(&token).is_some() {
                        self.deliver_call(token, CallResult::Response(timeout_response()))?;
                    }
                }
                Timed::Tick => {
                    let s = self.store.data_mut();
                    let period = s.tick_period_ms * 1_000_000;
                    s.next_tick_ns = Some(due + period.max(1));
                    let root = s.root_id;
                    let f = self.exports.tick.clone();
                    self.call_void("proxy_on_tick", root, f, |f, st| f.call(st, root as i32))?;
                }
                Timed::GrpcDeadline => self.expire_grpc(due)?,
            }
            self.settle()?;
        }
        self.store.data_mut().elapsed_ns = target;
        Ok(())
    }

    /// The earliest timed event (ticks only if `ticks`); at the same
    /// instant an answer comes before a timeout, both before a tick, and a
    /// tick before gRPC deadlines.
    fn next_event(&self, ticks: bool) -> Option<(u64, Timed)> {
        let s = self.store.data();
        let answer = s
            .call_answers
            .iter()
            .map(|(t, (due, _))| (*due, Timed::Answer(*t)))
            .min();
        let timeout = s
            .call_deadlines
            .iter()
            .map(|(t, due)| (*due, Timed::Timeout(*t)))
            .min();
        let tick = s
            .next_tick_ns
            .filter(|_| ticks)
            .map(|due| (due, Timed::Tick));
        let grpc = self
            .next_grpc_deadline()
            .map(|due| (due, Timed::GrpcDeadline));
        [answer, timeout, tick, grpc].into_iter().flatten().min()
    }

    /// Moves the virtual clock to the next callout answer or timeout, or
    /// gRPC deadline, if one is due at all (what a stream held for a
    /// callout waits for). `false` when none is.
    pub(crate) fn advance_to_next_callout(&mut self) -> Result<bool, Error> {
        match self.next_event(false) {
            Some((due, _)) => {
                let by = due.saturating_sub(self.store.data().elapsed_ns);
                self.advance(Duration::from_nanos(by))?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Callouts dispatched and not yet answered, oldest first.
    pub fn pending_http_calls(&self) -> Vec<CallRequest> {
        self.store.data().pending_calls.values().cloned().collect()
    }

    /// Answers a pending callout: the filter's `on_http_call_response` runs
    /// on the root context with the response's header, body and trailer
    /// sizes (`n_headers == 0` for [`CallResult::Reset`]).
    pub fn complete_http_call(&mut self, token: u32, result: CallResult) -> Result<(), Error> {
        let s = self.store.data_mut();
        if s.pending_calls.remove(&token).is_none() {
            return Err(Error::Unknown(format!("http call token {token}")));
        }
        s.call_deadlines.remove(&token);
        s.call_answers.remove(&token);
        self.deliver_call(token, result)?;
        self.settle()
    }

    fn deliver_call(&mut self, token: u32, result: CallResult) -> Result<(), Error> {
        let (resp, status) = match result {
            CallResult::Response(r) => (r, (0, Vec::new())),
            CallResult::Reset => (CallResponse::default(), (14, b"reset".to_vec())),
        };
        let (nh, nb, nt) = (
            resp.headers.len() as i32,
            resp.body.len() as i32,
            resp.trailers.len() as i32,
        );
        let s = self.store.data_mut();
        s.status = status;
        s.call_response = Some(resp);
        let root = s.root_id;
        let f = self.exports.http_call_response.clone();
        let r = self.call_void("proxy_on_http_call_response", root, f, |f, st| {
            f.call(st, (root as i32, token as i32, nh, nb, nt))
        });
        self.store.data_mut().call_response = None;
        r?;
        self.apply_deferred();
        Ok(())
    }

    /// Delivers what is due between callbacks until nothing is: deferred
    /// actions, callouts to clusters that answer by function, and queue
    /// notifications addressed to this VM. Called after every callback;
    /// call it yourself after another VM enqueued to this one's queue.
    pub fn settle(&mut self) -> Result<(), Error> {
        self.apply_deferred();
        loop {
            let auto: Vec<(u32, ClusterBehaviour, CallRequest)> = {
                let s = self.store.data();
                s.pending_calls
                    .values()
                    .filter(|c| !s.call_answers.contains_key(&c.token))
                    .filter_map(|c| match s.process.cluster(&c.cluster) {
                        Some(b @ ClusterBehaviour::Respond(..)) => Some((c.token, b, c.clone())),
                        _ => None,
                    })
                    .collect()
            };
            let ready = {
                let s = self.store.data();
                s.process.take_ready(s.vm_instance)
            };
            let grpc = self.settle_grpc()?;
            if auto.is_empty() && ready.is_empty() && !grpc {
                return Ok(());
            }
            for (token, behaviour, request) in auto {
                if let ClusterBehaviour::Respond(f, latency) = behaviour {
                    let result = f(&request);
                    let s = self.store.data_mut();
                    if latency.is_zero() {
                        s.pending_calls.remove(&token);
                        s.call_deadlines.remove(&token);
                        self.deliver_call(token, result)?;
                    } else {
                        let lat = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
                        let due = s.elapsed_ns.saturating_add(lat);
                        s.call_answers.insert(token, (due, result));
                    }
                }
            }
            for (root, queue) in ready {
                let f = self.exports.queue_ready.clone();
                self.call_void("proxy_on_queue_ready", root, f, |f, st| {
                    f.call(st, (root as i32, queue as i32))
                })?;
                self.apply_deferred();
            }
        }
    }

    pub(super) fn apply_deferred(&mut self) {
        let deferred = std::mem::take(&mut self.store.data_mut().deferred);
        for d in deferred {
            let streams = &mut self.store.data_mut().streams;
            match d {
                Deferred::Continue(id, side) => {
                    if let Some(st) = streams.get_mut(&id) {
                        st.half_mut(side).resume();
                    }
                }
                Deferred::Close(id) => {
                    if let Some(st) = streams.get_mut(&id) {
                        st.closed = true;
                    }
                }
                Deferred::LocalResponse(id, reply) => {
                    if let Some(st) = streams.get_mut(&id) {
                        if st.local_response.is_none() {
                            st.local_response = Some(reply);
                        }
                    }
                }
            }
        }
    }
}
