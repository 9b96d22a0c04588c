//! What happens between callbacks: the virtual clock's ticks, callout
//! responses, queue notifications and the effects Envoy defers until a
//! callback returns.

use super::Vm;
use crate::error::Error;
use crate::http_call::{CallRequest, CallResponse, CallResult};
use crate::process::ClusterBehaviour;
use crate::state::Deferred;
use std::time::Duration;

impl Vm {
    /// Advances the virtual clock, firing `on_tick` once per elapsed period
    /// (each at its due time), and delivering what those ticks cause.
    pub fn advance(&mut self, by: Duration) -> Result<(), Error> {
        let target = self
            .store
            .data()
            .elapsed_ns
            .saturating_add(by.as_nanos() as u64);
        loop {
            // gRPC deadlines first when they fall before the next tick.
            if let Some(due) = self.next_grpc_deadline().filter(|d| *d <= target) {
                let tick = self.store.data().next_tick_ns;
                if tick.is_none_or(|t| due < t) {
                    self.store.data_mut().elapsed_ns = due;
                    self.expire_grpc(due)?;
                    self.settle()?;
                    continue;
                }
            }
            let s = self.store.data();
            match s.next_tick_ns {
                Some(due) if due <= target => {
                    let period = s.tick_period_ms * 1_000_000;
                    let s = self.store.data_mut();
                    s.elapsed_ns = due;
                    s.next_tick_ns = Some(due + period.max(1));
                    let root = s.root_id;
                    let f = self.exports.tick.clone();
                    self.call_void("proxy_on_tick", root, f, |f, st| f.call(st, root as i32))?;
                    self.settle()?;
                }
                _ => break,
            }
        }
        self.store.data_mut().elapsed_ns = target;
        Ok(())
    }

    /// Callouts dispatched and not yet answered, oldest first.
    pub fn pending_http_calls(&self) -> Vec<CallRequest> {
        self.store.data().pending_calls.values().cloned().collect()
    }

    /// Answers a pending callout: the filter's `on_http_call_response` runs
    /// on the root context with the response's header, body and trailer
    /// sizes (`n_headers == 0` for [`CallResult::Reset`]).
    pub fn complete_http_call(&mut self, token: u32, result: CallResult) -> Result<(), Error> {
        if self.store.data_mut().pending_calls.remove(&token).is_none() {
            return Err(Error::Unknown(format!("http call token {token}")));
        }
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
                    .filter_map(|c| match s.process.cluster(&c.cluster) {
                        Some(b @ ClusterBehaviour::Respond(_)) => Some((c.token, b, c.clone())),
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
                self.store.data_mut().pending_calls.remove(&token);
                if let ClusterBehaviour::Respond(f) = behaviour {
                    let result = f(&request);
                    self.deliver_call(token, result)?;
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
