//! One HTTP stream: deliver what Envoy would, callback by callback, and
//! look at what the filter did.

use super::Vm;
use crate::abi::Action;
use crate::error::Error;
use crate::headers::Headers;
use crate::state::{Half, LocalResponse, Side, StreamInfo, StreamState};
use std::time::SystemTime;

impl Vm {
    /// Opens an HTTP stream: `on_context_create(stream, root)`.
    pub fn http_stream(&mut self) -> Result<HttpStream<'_>, Error> {
        let id = self.alloc_context();
        let root = self.root_id();
        let info = self.info.clone();
        self.store.data_mut().streams.insert(
            id,
            StreamState {
                info,
                ..StreamState::default()
            },
        );
        let f = self.exports.context_create.clone();
        self.call_void("proxy_on_context_create", id, f, |f, s| {
            f.call(s, (id as i32, root as i32))
        })?;
        Ok(HttpStream { vm: self, id })
    }

    /// Returns to an open stream by id.
    pub fn stream(&mut self, id: u32) -> Result<HttpStream<'_>, Error> {
        if !self.store.data().streams.contains_key(&id) {
            return Err(Error::Unknown(format!("stream {id}")));
        }
        Ok(HttpStream { vm: self, id })
    }
}

/// A handle on one HTTP stream of a [`Vm`]: send it what Envoy would, then
/// look at what the filter did.
///
/// These calls invoke the callbacks directly, in the order you make them;
/// [`Vm::exchange`] drives a whole request the way Envoy's filter manager
/// does (pauses, buffering, local replies, the upstream).
pub struct HttpStream<'vm> {
    vm: &'vm mut Vm,
    id: u32,
}

impl std::fmt::Debug for HttpStream<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpStream").field("id", &self.id).finish()
    }
}

impl<'vm> HttpStream<'vm> {
    /// The stream's context id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Current virtual wall-clock time.
    pub fn now(&self) -> SystemTime {
        self.vm.now()
    }

    /// The VM, e.g. to complete a callout or read logs mid-stream.
    pub fn vm(&mut self) -> &mut Vm {
        self.vm
    }

    fn st(&self) -> &StreamState {
        // INVARIANT: a handle exists only for a stream in the map, and only
        // `finish` (which consumes the handle) removes it.
        static EMPTY: std::sync::OnceLock<StreamState> = std::sync::OnceLock::new();
        self.vm
            .stream_state(self.id)
            .unwrap_or_else(|| EMPTY.get_or_init(StreamState::default))
    }

    fn st_mut(&mut self) -> Result<&mut StreamState, Error> {
        let id = self.id;
        self.vm
            .stream_state_mut(id)
            .ok_or_else(|| Error::Unknown(format!("stream {id}")))
    }

    /// Sets the connection and routing facts the stream's properties report.
    pub fn set_info(&mut self, info: StreamInfo) -> Result<(), Error> {
        self.st_mut()?.info = info;
        Ok(())
    }

    /// Changes some of the stream's facts (e.g. the cluster once routed).
    pub fn update_info(&mut self, f: impl FnOnce(&mut StreamInfo)) -> Result<(), Error> {
        f(&mut self.st_mut()?.info);
        Ok(())
    }

    /// The stream's connection and routing facts.
    pub fn info(&self) -> &StreamInfo {
        &self.st().info
    }

    /// Delivers request headers (`on_request_headers`). The returned action
    /// is the filter's; a local reply or a pause shows in
    /// [`HttpStream::local_response`] / [`HttpStream::request_paused`].
    pub fn send_request_headers(
        &mut self,
        headers: impl Into<Headers>,
        end_of_stream: bool,
    ) -> Result<Action, Error> {
        self.send_headers(Side::Request, headers.into(), end_of_stream)
    }

    /// Delivers a request body chunk (`on_request_body`). After a Pause the
    /// next call sees the whole buffered body, as with Envoy's
    /// StopIterationAndBuffer.
    pub fn send_request_body(
        &mut self,
        chunk: impl AsRef<[u8]>,
        end_of_stream: bool,
    ) -> Result<Action, Error> {
        self.send_body(Side::Request, chunk.as_ref(), end_of_stream)
    }

    /// Delivers request trailers (`on_request_trailers`).
    pub fn send_request_trailers(&mut self, trailers: impl Into<Headers>) -> Result<Action, Error> {
        self.send_trailers(Side::Request, trailers.into())
    }

    /// Delivers response headers (`on_response_headers`).
    pub fn send_response_headers(
        &mut self,
        headers: impl Into<Headers>,
        end_of_stream: bool,
    ) -> Result<Action, Error> {
        self.send_headers(Side::Response, headers.into(), end_of_stream)
    }

    /// Delivers a response body chunk (`on_response_body`), buffering after
    /// a Pause like the request side.
    pub fn send_response_body(
        &mut self,
        chunk: impl AsRef<[u8]>,
        end_of_stream: bool,
    ) -> Result<Action, Error> {
        self.send_body(Side::Response, chunk.as_ref(), end_of_stream)
    }

    /// Delivers response trailers (`on_response_trailers`).
    pub fn send_response_trailers(
        &mut self,
        trailers: impl Into<Headers>,
    ) -> Result<Action, Error> {
        self.send_trailers(Side::Response, trailers.into())
    }

    /// After a callback: a Continue (without a local reply) lets the half
    /// go on past the filter; anything else holds it. Then deferred actions
    /// and events run.
    fn after(
        &mut self,
        side: Side,
        action: Action,
        passed: impl FnOnce(&mut Half),
    ) -> Result<Action, Error> {
        let local = self.vm.local_reply_queued(self.id);
        let half = self.st_mut()?.half_mut(side);
        if action == Action::Continue && !local {
            passed(half);
        } else {
            half.paused = true;
        }
        self.vm.settle()?;
        Ok(action)
    }

    fn send_headers(&mut self, side: Side, headers: Headers, end: bool) -> Result<Action, Error> {
        let n = headers.len() as i32;
        let st = self.st_mut()?;
        if side == Side::Response {
            st.info.response_code = headers.get(":status").and_then(|s| s.parse().ok());
        }
        let half = st.half_mut(side);
        half.headers = headers;
        half.headers_open = true;
        half.end = end;
        let (name, f) = match side {
            Side::Request => (
                "proxy_on_request_headers",
                self.vm.exports.request_headers.clone(),
            ),
            Side::Response => (
                "proxy_on_response_headers",
                self.vm.exports.response_headers.clone(),
            ),
        };
        let action = self.vm.stream_callback(name, self.id, f, n, end as i32)?;
        self.after(side, action, |h| h.headers_open = false)
    }

    fn send_body(&mut self, side: Side, chunk: &[u8], end: bool) -> Result<Action, Error> {
        let limit = self.vm.buffer_limit as usize;
        let over = |held: usize| limit > 0 && held > limit;
        let half = self.st_mut()?.half_mut(side);
        // Envoy adds a chunk to what the filter holds (after a body Pause)
        // before calling it again: past the limit that buffer overflows,
        // and the filter is not called.
        let holding = !half.body.is_empty();
        half.body.extend_from_slice(chunk);
        if holding && over(half.body.len()) {
            self.overflow(side)?;
            return Ok(Action::Pause);
        }
        half.body_open = true;
        half.end = end;
        let size = half.body.len() as i32;
        let (name, f) = match side {
            Side::Request => (
                "proxy_on_request_body",
                self.vm.exports.request_body.clone(),
            ),
            Side::Response => (
                "proxy_on_response_body",
                self.vm.exports.response_body.clone(),
            ),
        };
        let action = self
            .vm
            .stream_callback(name, self.id, f, size, end as i32)?;
        // A Continue here releases headers held by a headers Pause, but the
        // header map stays the filter's (Envoy clears `request_headers_`
        // only when `on_request_headers` itself returns Continue).
        let action = self.after(side, action, |h| {
            h.paused = false;
            h.forward_body();
        })?;
        // A Pause buffers the chunk (StopIterationAndBuffer).
        let st = self.st_mut()?;
        if st.local_response.is_none() && !st.closed && over(st.half_mut(side).body.len()) {
            self.overflow(side)?;
        }
        Ok(action)
    }

    /// The body the filter holds outgrew the buffer limit: Envoy answers a
    /// request with its local 413 (through the filter's response
    /// callbacks), and marks a response for [`Vm::exchange`] to reset
    /// (or, while its headers are still held, to answer 500).
    fn overflow(&mut self, side: Side) -> Result<(), Error> {
        let st = self.st_mut()?;
        st.half_mut(side).paused = true;
        match side {
            Side::Request => {
                let body = b"Payload Too Large".to_vec();
                st.local_response = Some(LocalResponse {
                    status: 413,
                    headers: Headers::new(),
                    body,
                    details: "request_payload_too_large".into(),
                    grpc_status: None,
                });
            }
            Side::Response => st.response_overflow = true,
        }
        Ok(())
    }

    fn send_trailers(&mut self, side: Side, trailers: Headers) -> Result<Action, Error> {
        let n = trailers.len() as i32;
        let half = self.st_mut()?.half_mut(side);
        half.trailers = trailers;
        half.trailers_open = true;
        half.end = true;
        let (name, f) = match side {
            Side::Request => (
                "proxy_on_request_trailers",
                self.vm.exports.request_trailers.clone(),
            ),
            Side::Response => (
                "proxy_on_response_trailers",
                self.vm.exports.response_trailers.clone(),
            ),
        };
        let action = self.vm.stream_callback2(name, self.id, f, n)?;
        // A Continue releases whatever the filter held (headers after a
        // headers Pause, a buffered body): Envoy's filter manager resumes
        // iteration, so the upstream gets headers, body and trailers. The
        // header map stays writable, as after a body Continue.
        self.after(side, action, |h| {
            h.trailers_open = false;
            h.paused = false;
            h.forward_body();
        })
    }

    /// Ends the stream: `on_log` (every map read-only), `on_done`,
    /// `on_delete`. The stream's data is gone afterwards.
    pub fn finish(self) -> Result<(), Error> {
        self.finish_logged().map(drop)
    }

    /// [`HttpStream::finish`], returning the filter state as the access
    /// log read it (after `on_log`): what `%FILTER_STATE(wasm.<key>)%`
    /// logs, such as a filter's per-request event line written at
    /// `on_log`.
    pub fn finish_logged(self) -> Result<std::collections::BTreeMap<Vec<u8>, Vec<u8>>, Error> {
        let id = self.id;
        let vm = self.vm;
        if let Some(st) = vm.stream_state_mut(id) {
            st.access_log_phase = true;
        }
        let f = vm.exports.log.clone();
        vm.call_void("proxy_on_log", id, f, |f, s| f.call(s, id as i32))?;
        let logged = match vm.stream_state_mut(id) {
            Some(st) => {
                st.access_log_phase = false;
                st.filter_state.clone()
            }
            None => Default::default(),
        };
        let f = vm.exports.done.clone();
        vm.call_ret("proxy_on_done", id, f, 1, |f, s| f.call(s, id as i32))?;
        let f = vm.exports.delete.clone();
        vm.call_void("proxy_on_delete", id, f, |f, s| f.call(s, id as i32))?;
        vm.store.data_mut().streams.remove(&id);
        vm.settle()?;
        Ok(logged)
    }

    /// The request headers as they stand (what goes upstream once the
    /// request continues).
    pub fn request_headers(&self) -> &Headers {
        &self.st().request.headers
    }
    /// The request trailers as they stand.
    pub fn request_trailers(&self) -> &Headers {
        &self.st().request.trailers
    }
    /// The response headers as they stand (what the client gets).
    pub fn response_headers(&self) -> &Headers {
        &self.st().response.headers
    }
    /// The response trailers as they stand.
    pub fn response_trailers(&self) -> &Headers {
        &self.st().response.trailers
    }
    /// Request body bytes that went past the filter (upstream-bound).
    pub fn forwarded_request_body(&self) -> &[u8] {
        &self.st().request.forwarded_body
    }
    /// Response body bytes that went past the filter (client-bound).
    pub fn forwarded_response_body(&self) -> &[u8] {
        &self.st().response.forwarded_body
    }
    /// Request body bytes the filter is holding (buffered after a Pause).
    pub fn buffered_request_body(&self) -> &[u8] {
        &self.st().request.body
    }
    /// Response body bytes the filter is holding.
    pub fn buffered_response_body(&self) -> &[u8] {
        &self.st().response.body
    }
    /// The local reply the filter sent, if any.
    pub fn local_response(&self) -> Option<&LocalResponse> {
        self.st().local_response.as_ref()
    }
    /// Whether the request is held by the filter (a Pause not yet resumed).
    pub fn request_paused(&self) -> bool {
        self.st().request.paused
    }
    /// Whether the response is held by the filter.
    pub fn response_paused(&self) -> bool {
        self.st().response.paused
    }
    /// How often the filter resumed the request (`resume_http_request`).
    pub fn request_resumes(&self) -> u32 {
        self.st().request.resumes
    }
    /// Whether the filter reset the stream (`reset_http_request/response`).
    pub fn closed(&self) -> bool {
        self.st().closed
    }
    /// Whether the response body the filter held outgrew the buffer limit
    /// ([`VmBuilder::per_connection_buffer_limit_bytes`](crate::VmBuilder::per_connection_buffer_limit_bytes)).
    pub fn response_overflow(&self) -> bool {
        self.st().response_overflow
    }
    /// How many times the filter changed request headers or called
    /// `clear_route_cache` (each clears Envoy's route cache for ABI 0.2.1).
    pub fn route_cache_clears(&self) -> u32 {
        self.st().request_header_mutations
    }
    /// A value the filter stored with `set_property` (Envoy filter state
    /// `wasm.<path>`); `path` segments joined by NUL.
    pub fn filter_state(&self, path: &[&str]) -> Option<&[u8]> {
        let key = path.join("\0");
        self.st()
            .filter_state
            .get(key.as_bytes())
            .map(Vec::as_slice)
    }
}
