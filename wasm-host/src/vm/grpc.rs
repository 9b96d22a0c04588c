//! Delivering gRPC between callbacks: what the filter sent goes to the
//! cluster's server, and the server's replies come back as Envoy's gRPC
//! async client turns them into callbacks (see [`crate::grpc`]).

use super::Vm;
use crate::error::Error;
use crate::grpc::{status, GrpcEvent, GrpcReply, GrpcRequest};
use crate::headers::Headers;

impl Vm {
    /// The gRPC calls and streams the filter has open, with everything it
    /// sent on each so far, oldest first.
    pub fn grpc_calls(&self) -> Vec<(GrpcRequest, Vec<GrpcEvent>)> {
        self.store
            .data()
            .grpc
            .values()
            .map(|o| (o.request.clone(), o.sent.clone()))
            .collect()
    }

    /// Answers an open gRPC call or stream as its server would (for a
    /// cluster declared with [`crate::Process::add_grpc_cluster`]); the
    /// callbacks run now, in order.
    pub fn reply_grpc(&mut self, token: u32, replies: Vec<GrpcReply>) -> Result<(), Error> {
        if !self.store.data().grpc.contains_key(&token) {
            return Err(Error::Unknown(format!(
                "gRPC token {token} (not open: never dispatched, or already closed)"
            )));
        }
        for r in replies {
            self.grpc_reply(token, r)?;
        }
        self.settle()
    }

    /// Hands what the filter sent to the servers that answer by function
    /// and delivers their replies. Whether anything happened.
    pub(super) fn settle_grpc(&mut self) -> Result<bool, Error> {
        let root = self.root_id();
        // A stream context's calls die with it (Envoy cancels them in the
        // context's destructor).
        let s = self.store.data_mut();
        let streams = &s.streams;
        s.grpc.retain(|_, o| {
            let ctx = o.request.context_id;
            ctx == root || streams.contains_key(&ctx)
        });
        let due: Vec<(u32, Vec<GrpcEvent>)> = {
            let s = self.store.data_mut();
            let streams = &s.streams;
            let process = &s.process;
            s.grpc
                .iter_mut()
                .filter(|(_, o)| !o.unsent.is_empty())
                .filter(|(_, o)| {
                    let ctx = o.request.context_id;
                    ctx == root || streams.contains_key(&ctx)
                })
                .filter(|(_, o)| matches!(process.grpc_cluster(&o.request.cluster), Some(Some(_))))
                .map(|(t, o)| (*t, std::mem::take(&mut o.unsent)))
                .collect()
        };
        let any = !due.is_empty();
        for (token, events) in due {
            for event in events {
                let Some(open) = self.store.data().grpc.get(&token) else {
                    break;
                };
                let request = open.request.clone();
                let Some(Some(handler)) = self.store.data().process.grpc_cluster(&request.cluster)
                else {
                    break;
                };
                for reply in handler(&request, &event) {
                    self.grpc_reply(token, reply)?;
                }
            }
        }
        Ok(any)
    }

    /// Times out every call whose deadline is at or before `now_ns`
    /// (virtual-clock time since start), as Envoy's async client does.
    pub(super) fn expire_grpc(&mut self, now_ns: u64) -> Result<(), Error> {
        let expired: Vec<u32> = self
            .store
            .data()
            .grpc
            .iter()
            .filter(|(_, o)| o.deadline_ns.is_some_and(|d| d <= now_ns))
            .map(|(t, _)| *t)
            .collect();
        for token in expired {
            let message = status::with_details(status::TIMEOUT_MESSAGE, status::TIMEOUT_DETAILS);
            self.grpc_close(token, status::UNAVAILABLE, &message)?;
        }
        Ok(())
    }

    /// The earliest gRPC deadline (virtual-clock ns since start).
    pub(super) fn next_grpc_deadline(&self) -> Option<u64> {
        self.store
            .data()
            .grpc
            .values()
            .filter_map(|o| o.deadline_ns)
            .min()
    }

    fn grpc_reply(&mut self, token: u32, reply: GrpcReply) -> Result<(), Error> {
        let Some(open) = self.store.data_mut().grpc.get_mut(&token) else {
            return Ok(());
        };
        if open.remote_closed {
            return Ok(());
        }
        let stream = open.request.stream;
        let ctx = open.request.context_id;
        // Envoy's router times the upstream only once the request is
        // complete: the header comes with a response to a half-closed call.
        let timed = open.local_closed;
        match reply {
            GrpcReply::InitialMetadata(h) => {
                open.headers_received = true;
                if stream {
                    let mut full = response_headers();
                    for (k, v) in h.pairs() {
                        full.add(k, v);
                    }
                    if timed {
                        full.add("x-envoy-upstream-service-time", "0");
                    }
                    self.grpc_initial(token, ctx, full)?;
                }
            }
            GrpcReply::Message(m) => {
                if !open.headers_received {
                    self.grpc_reply(token, GrpcReply::InitialMetadata(Headers::new()))?;
                }
                if stream {
                    self.grpc_message(token, ctx, m)?;
                } else if let Some(open) = self.store.data_mut().grpc.get_mut(&token) {
                    if open.response.is_some() {
                        // A unary call answered twice: Envoy fails it.
                        return self.grpc_close(token, status::INTERNAL, "");
                    }
                    open.response = Some(m);
                }
            }
            GrpcReply::Close {
                status,
                message,
                trailing_metadata,
            } => {
                let trailers_only = !open.headers_received;
                let response = open.response.take();
                let mut t = if trailers_only {
                    response_headers()
                } else {
                    Headers::new()
                };
                if trailers_only {
                    for (k, v) in trailing_metadata.pairs() {
                        t.add(k, v);
                    }
                }
                t.add("grpc-status", status.to_string());
                if !message.is_empty() {
                    t.add("grpc-message", &message);
                }
                if trailers_only && timed {
                    t.add("x-envoy-upstream-service-time", "0");
                } else if !trailers_only {
                    for (k, v) in trailing_metadata.pairs() {
                        t.add(k, v);
                    }
                }
                let message = status::with_details(&message, status::VIA_UPSTREAM);
                if stream {
                    return self.grpc_end(token, ctx, trailers_only, t, status, &message);
                }
                match response {
                    Some(m) if status == 0 => {
                        self.store.data_mut().grpc.remove(&token);
                        self.grpc_message(token, ctx, m)?;
                    }
                    None if status == 0 => self.grpc_close(token, status::INTERNAL, &message)?,
                    _ => self.grpc_close(token, status, &message)?,
                }
            }
            GrpcReply::Reset => {
                // Envoy's router answers for the server: a gRPC local reply.
                let mut t = response_headers();
                t.add("grpc-status", status::UNAVAILABLE.to_string());
                t.add("grpc-message", status::RESET_MESSAGE);
                let message = status::with_details(status::RESET_MESSAGE, status::RESET_DETAILS);
                if stream {
                    let trailers_only = !open.headers_received;
                    return self.grpc_end(
                        token,
                        ctx,
                        trailers_only,
                        t,
                        status::UNAVAILABLE,
                        &message,
                    );
                }
                self.grpc_close(token, status::UNAVAILABLE, &message)?;
            }
        }
        Ok(())
    }

    /// The end of a stream: (empty) initial metadata first for a
    /// trailers-only response, the trailing metadata, then the close.
    fn grpc_end(
        &mut self,
        token: u32,
        ctx: u32,
        trailers_only: bool,
        trailers: Headers,
        code: u32,
        message: &str,
    ) -> Result<(), Error> {
        if trailers_only {
            self.grpc_initial(token, ctx, Headers::new())?;
        }
        let n = trailers.len() as i32;
        self.store.data_mut().grpc_trailing_metadata = Some(trailers);
        let f = self.exports.grpc_trailing_metadata.clone();
        let r = self.grpc_callback("proxy_on_grpc_receive_trailing_metadata", ctx, token, f, n);
        self.store.data_mut().grpc_trailing_metadata = None;
        r?;
        self.grpc_close(token, code, message)
    }

    /// `proxy_on_grpc_receive_initial_metadata` with the map readable.
    fn grpc_initial(&mut self, token: u32, ctx: u32, h: Headers) -> Result<(), Error> {
        if let Some(open) = self.store.data_mut().grpc.get_mut(&token) {
            open.headers_received = true;
        }
        let n = h.len() as i32;
        self.store.data_mut().grpc_initial_metadata = Some(h);
        let f = self.exports.grpc_initial_metadata.clone();
        let r = self.grpc_callback("proxy_on_grpc_receive_initial_metadata", ctx, token, f, n);
        self.store.data_mut().grpc_initial_metadata = None;
        r
    }

    /// `proxy_on_grpc_receive` with the message readable.
    fn grpc_message(&mut self, token: u32, ctx: u32, m: Vec<u8>) -> Result<(), Error> {
        let n = m.len() as i32;
        self.store.data_mut().grpc_message = Some(m);
        let f = self.exports.grpc_receive.clone();
        let r = self.grpc_callback("proxy_on_grpc_receive", ctx, token, f, n);
        self.store.data_mut().grpc_message = None;
        r
    }

    /// `proxy_on_grpc_close` with `get_status` giving the status and message.
    fn grpc_close(&mut self, token: u32, code: u32, message: &str) -> Result<(), Error> {
        let s = self.store.data_mut();
        let Some(open) = s.grpc.get_mut(&token) else {
            return Ok(());
        };
        let ctx = open.request.context_id;
        open.remote_closed = true;
        open.deadline_ns = None;
        open.unsent.clear();
        if open.local_closed {
            s.grpc.remove(&token);
        }
        s.status = (code, message.as_bytes().to_vec());
        let f = self.exports.grpc_close.clone();
        let r = self.grpc_callback("proxy_on_grpc_close", ctx, token, f, code as i32);
        self.store.data_mut().status = (0, Vec::new());
        r
    }

    /// Runs a gRPC callback on the context that opened the call, then what
    /// it deferred.
    fn grpc_callback(
        &mut self,
        name: &str,
        ctx: u32,
        token: u32,
        f: super::exports::F3,
        n: i32,
    ) -> Result<(), Error> {
        self.call_void(name, ctx, f, |f, st| {
            f.call(st, (ctx as i32, token as i32, n))
        })?;
        self.apply_deferred();
        Ok(())
    }
}

/// What every gRPC response's headers start with.
fn response_headers() -> Headers {
    let mut h = Headers::new();
    h.add(":status", "200");
    h.add("content-type", "application/grpc");
    h
}
