//! The `env.proxy_*` host functions: ABI 0.2.1 with Envoy's behaviour.
//!
//! Each function decodes its arguments defensively (see [`crate::memory`]),
//! acts on the current (or effective) context, and answers with the status
//! Envoy would give, because the SDK panics on any other. Effects that
//! Envoy defers until the callback returns (continue, close, local reply)
//! are queued in [`VmState::deferred`].

use crate::abi::{decode_pairs, split_path, BufferType, LogLevel, MapType, MetricType, Status};
use crate::headers::Headers;
use crate::http_call::CallRequest;
use crate::memory::{give, read, write_u32, write_u64, Cx};
use crate::process::MetricValue;
use crate::properties;
use crate::state::{Deferred, LocalResponse, MetricDef, Side, VmState};
use std::collections::HashSet;
use std::time::Duration;
use wasmtime::{Linker, Result};

/// `Ok` if an out-parameter write landed, `InvalidMemoryAccess` if not.
fn written(w: Option<()>) -> Result<i32> {
    st(if w.is_some() {
        Status::Ok
    } else {
        Status::InvalidMemoryAccess
    })
}

/// Status as the `i32` the guest receives.
fn st(s: Status) -> Result<i32> {
    Ok(s.code())
}

/// Registers every host function on `linker`, recording each name in
/// `defined` (used to name missing imports).
pub(crate) fn define(
    linker: &mut Linker<VmState>,
    defined: &mut HashSet<(String, String)>,
) -> Result<()> {
    macro_rules! def {
        ($name:literal, $f:expr) => {
            crate::define_import!(linker, defined, "env", $name, $f)
        };
    }

    // ---- logging, time, timers ----
    def!("proxy_log", |c: Cx<'_>,
                       level: i32,
                       ptr: i32,
                       len: i32|
     -> Result<i32> {
        let mut c = c;
        let Some(level) = LogLevel::from_i32(level) else {
            return st(Status::BadArgument);
        };
        let Some(msg) = read(&c, ptr, len) else {
            return st(Status::InvalidMemoryAccess);
        };
        c.data_mut()
            .log(level, String::from_utf8_lossy(&msg).into_owned());
        st(Status::Ok)
    });
    def!("proxy_get_log_level", |mut c: Cx<'_>,
                                 out: i32|
     -> Result<i32> {
        let level = c.data().log_level as u32;
        written(write_u32(&mut c, out, level))
    });
    def!("proxy_get_current_time_nanoseconds", |mut c: Cx<'_>,
                                                out: i32|
     -> Result<i32> {
        let now = c.data().now_ns();
        written(write_u64(&mut c, out, now))
    });
    def!("proxy_set_tick_period_milliseconds", |mut c: Cx<'_>,
                                                ms: i32|
     -> Result<i32> {
        let s = c.data_mut();
        s.tick_period_ms = u64::from(ms as u32);
        s.next_tick_ns = if s.tick_period_ms == 0 {
            None
        } else {
            Some(s.elapsed_ns + s.tick_period_ms * 1_000_000)
        };
        st(Status::Ok)
    });

    // ---- buffers ----
    def!("proxy_get_buffer_bytes", |mut c: Cx<'_>,
                                    ty: i32,
                                    start: i32,
                                    max: i32,
                                    pp: i32,
                                    sp: i32|
     -> Result<i32> {
        let Some(ty) = BufferType::from_i32(ty) else {
            return st(Status::BadArgument);
        };
        let Some(buf) = buffer(c.data(), ty) else {
            return st(Status::NotFound);
        };
        let (start, max) = (start as u32 as usize, max as u32 as usize);
        if start.checked_add(max).is_none() {
            return st(Status::BadArgument);
        }
        let end = start.saturating_add(max).min(buf.len());
        let slice = buf.get(start..end).unwrap_or_default().to_vec();
        give(&mut c, &slice, pp, sp).map(Status::code)
    });
    def!("proxy_set_buffer_bytes", |mut c: Cx<'_>,
                                    ty: i32,
                                    start: i32,
                                    size: i32,
                                    ptr: i32,
                                    len: i32|
     -> Result<i32> {
        let Some(ty) = BufferType::from_i32(ty) else {
            return st(Status::BadArgument);
        };
        let Some(data) = read(&c, ptr, len) else {
            return st(Status::InvalidMemoryAccess);
        };
        let Some(buf) = buffer_mut(c.data_mut(), ty) else {
            return st(Status::NotFound);
        };
        let (start, size) = (start as u32 as usize, size as u32 as usize);
        // Envoy's Buffer::copyFrom: replace a prefix, or append; nothing else.
        if start == 0 {
            let drained = size.min(buf.len());
            buf.drain(..drained);
            buf.splice(0..0, data);
        } else if start >= buf.len() {
            buf.extend_from_slice(&data);
        } else {
            return st(Status::BadArgument);
        }
        st(Status::Ok)
    });
    def!("proxy_get_buffer_status", |mut c: Cx<'_>,
                                     ty: i32,
                                     size_ptr: i32,
                                     flags_ptr: i32|
     -> Result<i32> {
        let Some(ty) = BufferType::from_i32(ty) else {
            return st(Status::BadArgument);
        };
        let Some(len) = buffer(c.data(), ty).map(|b| b.len()) else {
            return st(Status::NotFound);
        };
        match (
            write_u32(&mut c, size_ptr, len as u32),
            write_u32(&mut c, flags_ptr, 0),
        ) {
            (Some(()), Some(())) => st(Status::Ok),
            _ => st(Status::InvalidMemoryAccess),
        }
    });

    // ---- header maps ----
    def!("proxy_get_header_map_pairs", |mut c: Cx<'_>,
                                        ty: i32,
                                        pp: i32,
                                        sp: i32|
     -> Result<i32> {
        let Some(ty) = MapType::from_i32(ty) else {
            return st(Status::BadArgument);
        };
        // Envoy: an unavailable map reads as empty, with Ok.
        let bytes = match map(c.data(), ty) {
            Some(m) if !m.is_empty() => m.encode(),
            _ => Vec::new(),
        };
        give(&mut c, &bytes, pp, sp).map(Status::code)
    });
    def!("proxy_set_header_map_pairs", |mut c: Cx<'_>,
                                        ty: i32,
                                        ptr: i32,
                                        len: i32|
     -> Result<i32> {
        let Some(ty) = MapType::from_i32(ty) else {
            return st(Status::BadArgument);
        };
        let Some(bytes) = read(&c, ptr, len) else {
            return st(Status::InvalidMemoryAccess);
        };
        let Some(pairs) = decode_pairs(&bytes) else {
            return st(Status::BadArgument);
        };
        match map_mut(c.data_mut(), ty) {
            Some(m) => {
                m.replace_all(pairs);
                st(Status::Ok)
            }
            None => st(Status::BadArgument),
        }
    });
    def!("proxy_get_header_map_value", |mut c: Cx<'_>,
                                        ty: i32,
                                        kp: i32,
                                        kl: i32,
                                        pp: i32,
                                        sp: i32|
     -> Result<i32> {
        let Some(ty) = MapType::from_i32(ty) else {
            return st(Status::BadArgument);
        };
        let Some(key) = read(&c, kp, kl) else {
            return st(Status::InvalidMemoryAccess);
        };
        let value = match map(c.data(), ty) {
            None => return st(Status::BadArgument),
            Some(m) => match m.get_bytes(&key) {
                None => return st(Status::NotFound),
                Some(v) => v.to_vec(),
            },
        };
        give(&mut c, &value, pp, sp).map(Status::code)
    });
    def!("proxy_add_header_map_value", |mut c: Cx<'_>,
                                        ty: i32,
                                        kp: i32,
                                        kl: i32,
                                        vp: i32,
                                        vl: i32|
     -> Result<i32> {
        edit_map(&mut c, ty, kp, kl, Some((vp, vl)), |m, k, v| m.add(k, v))
    });
    def!("proxy_replace_header_map_value", |mut c: Cx<'_>,
                                            ty: i32,
                                            kp: i32,
                                            kl: i32,
                                            vp: i32,
                                            vl: i32|
     -> Result<i32> {
        edit_map(&mut c, ty, kp, kl, Some((vp, vl)), |m, k, v| m.set(k, v))
    });
    def!("proxy_remove_header_map_value", |mut c: Cx<'_>,
                                           ty: i32,
                                           kp: i32,
                                           kl: i32|
     -> Result<i32> {
        edit_map(&mut c, ty, kp, kl, None, |m, k, _| m.remove(k))
    });
    def!("proxy_get_header_map_size", |mut c: Cx<'_>,
                                       ty: i32,
                                       out: i32|
     -> Result<i32> {
        let Some(ty) = MapType::from_i32(ty) else {
            return st(Status::BadArgument);
        };
        let Some(size) = map(c.data(), ty).map(Headers::byte_size) else {
            return st(Status::BadArgument);
        };
        written(write_u32(&mut c, out, size as u32))
    });

    // ---- properties ----
    def!("proxy_get_property", |mut c: Cx<'_>,
                                pp: i32,
                                pl: i32,
                                rp: i32,
                                rs: i32|
     -> Result<i32> {
        let Some(path) = read(&c, pp, pl) else {
            return st(Status::InvalidMemoryAccess);
        };
        let segments = split_path(&path);
        match properties::get(c.data(), &segments) {
            Some(v) => give(&mut c, &v, rp, rs).map(Status::code),
            None => st(Status::NotFound),
        }
    });
    def!("proxy_set_property", |mut c: Cx<'_>,
                                pp: i32,
                                pl: i32,
                                vp: i32,
                                vl: i32|
     -> Result<i32> {
        let (Some(path), Some(value)) = (read(&c, pp, pl), read(&c, vp, vl)) else {
            return st(Status::InvalidMemoryAccess);
        };
        let s = c.data_mut();
        let ctx = s.context();
        // Envoy stores filter state on the stream; a root context has none.
        match s.streams.get_mut(&ctx) {
            Some(stream) => {
                stream.filter_state.insert(path, value);
                st(Status::Ok)
            }
            None => st(Status::NotFound),
        }
    });

    // ---- shared data and queues ----
    def!("proxy_get_shared_data", |mut c: Cx<'_>,
                                   kp: i32,
                                   kl: i32,
                                   vp: i32,
                                   vs: i32,
                                   casp: i32|
     -> Result<i32> {
        let Some(key) = read(&c, kp, kl) else {
            return st(Status::InvalidMemoryAccess);
        };
        let s = c.data();
        s.process.count_shared_data_read();
        let Some((value, cas)) = s.process.shared_data(&s.plugin.vm_id, &key) else {
            return st(Status::NotFound);
        };
        let status = give(&mut c, &value, vp, vs)?;
        if status != Status::Ok {
            return st(status);
        }
        written(write_u32(&mut c, casp, cas))
    });
    def!("proxy_set_shared_data", |c: Cx<'_>,
                                   kp: i32,
                                   kl: i32,
                                   vp: i32,
                                   vl: i32,
                                   cas: i32|
     -> Result<i32> {
        let (Some(key), Some(value)) = (read(&c, kp, kl), read(&c, vp, vl)) else {
            return st(Status::InvalidMemoryAccess);
        };
        let s = c.data();
        match s
            .process
            .set_shared_data(&s.plugin.vm_id, &key, &value, cas as u32)
        {
            Ok(()) => st(Status::Ok),
            Err(e) => st(e),
        }
    });
    def!("proxy_register_shared_queue", |mut c: Cx<'_>,
                                         np: i32,
                                         nl: i32,
                                         out: i32|
     -> Result<i32> {
        let Some(name) = read(&c, np, nl) else {
            return st(Status::InvalidMemoryAccess);
        };
        let s = c.data();
        let token = s
            .process
            .register_queue(&s.plugin.vm_id, &name, (s.vm_instance, s.root_id));
        written(write_u32(&mut c, out, token))
    });
    def!("proxy_resolve_shared_queue", |mut c: Cx<'_>,
                                        vp: i32,
                                        vl: i32,
                                        np: i32,
                                        nl: i32,
                                        out: i32|
     -> Result<i32> {
        let (Some(vm_id), Some(name)) = (read(&c, vp, vl), read(&c, np, nl)) else {
            return st(Status::InvalidMemoryAccess);
        };
        let s = c.data();
        let vm_id = if vm_id.is_empty() {
            s.plugin.vm_id.clone()
        } else {
            String::from_utf8_lossy(&vm_id).into_owned()
        };
        let Some(token) = s.process.resolve_queue(&vm_id, &name) else {
            return st(Status::NotFound);
        };
        written(write_u32(&mut c, out, token))
    });
    def!("proxy_enqueue_shared_queue", |c: Cx<'_>,
                                        token: i32,
                                        vp: i32,
                                        vl: i32|
     -> Result<i32> {
        let Some(value) = read(&c, vp, vl) else {
            return st(Status::InvalidMemoryAccess);
        };
        match c.data().process.enqueue(token as u32, &value) {
            Ok(()) => st(Status::Ok),
            Err(e) => st(e),
        }
    });
    def!("proxy_dequeue_shared_queue", |mut c: Cx<'_>,
                                        token: i32,
                                        pp: i32,
                                        sp: i32|
     -> Result<i32> {
        match c.data().process.dequeue(token as u32) {
            Ok(v) => give(&mut c, &v, pp, sp).map(Status::code),
            Err(e) => st(e),
        }
    });

    // ---- stream control ----
    def!("proxy_continue_stream", |mut c: Cx<'_>,
                                   ty: i32|
     -> Result<i32> {
        let s = c.data_mut();
        let ctx = s.context();
        let is_stream = s.streams.contains_key(&ctx);
        match ty {
            0 if is_stream => s.deferred.push(Deferred::Continue(ctx, Side::Request)),
            1 if is_stream => s.deferred.push(Deferred::Continue(ctx, Side::Response)),
            // Envoy: without stream callbacks (a root context) it is a no-op.
            0 | 1 => {}
            _ => return st(Status::BadArgument),
        }
        st(Status::Ok)
    });
    def!("proxy_close_stream", |mut c: Cx<'_>,
                                ty: i32|
     -> Result<i32> {
        let s = c.data_mut();
        let ctx = s.context();
        match ty {
            0 | 1 => {
                if s.streams.contains_key(&ctx) {
                    s.deferred.push(Deferred::Close(ctx));
                }
                st(Status::Ok)
            }
            _ => st(Status::BadArgument),
        }
    });
    def!("proxy_send_local_response", |mut c: Cx<'_>,
                                       code: i32,
                                       dp: i32,
                                       dl: i32,
                                       bp: i32,
                                       bl: i32,
                                       hp: i32,
                                       hl: i32,
                                       grpc: i32|
     -> Result<i32> {
        let (Some(details), Some(body), Some(hdrs)) =
            (read(&c, dp, dl), read(&c, bp, bl), read(&c, hp, hl))
        else {
            return st(Status::InvalidMemoryAccess);
        };
        let Some(pairs) = decode_pairs(&hdrs) else {
            return st(Status::BadArgument);
        };
        let s = c.data_mut();
        let ctx = s.context();
        if s.streams.contains_key(&ctx) {
            let details = String::from_utf8_lossy(&details)
                .chars()
                .map(|ch| if ch.is_whitespace() { '_' } else { ch })
                .collect();
            let reply = LocalResponse {
                status: code as u32,
                headers: pairs.into_iter().collect(),
                body,
                details,
                grpc_status: (0..=16).contains(&grpc).then_some(grpc),
            };
            s.deferred.push(Deferred::LocalResponse(ctx, reply));
        }
        st(Status::Ok)
    });

    // ---- HTTP callouts ----
    def!("proxy_http_call", |mut c: Cx<'_>,
                             up: i32,
                             ul: i32,
                             hp: i32,
                             hl: i32,
                             bp: i32,
                             bl: i32,
                             tp: i32,
                             tl: i32,
                             timeout: i32,
                             out: i32|
     -> Result<i32> {
        let (Some(cluster), Some(hdrs), Some(body), Some(trls)) = (
            read(&c, up, ul),
            read(&c, hp, hl),
            read(&c, bp, bl),
            read(&c, tp, tl),
        ) else {
            return st(Status::InvalidMemoryAccess);
        };
        if timeout < 0 {
            return st(Status::BadArgument);
        }
        let cluster = String::from_utf8_lossy(&cluster).into_owned();
        if c.data().process.cluster(&cluster).is_none() {
            return st(Status::BadArgument);
        }
        let mut headers: Headers = decode_pairs(&hdrs)
            .unwrap_or_default()
            .into_iter()
            .collect();
        let trailers: Headers = decode_pairs(&trls)
            .unwrap_or_default()
            .into_iter()
            .collect();
        if !(headers.contains(":path")
            && headers.contains(":method")
            && headers.contains(":authority"))
        {
            return st(Status::BadArgument);
        }
        // What Envoy's async client adds before the cluster sees the call.
        if !body.is_empty() {
            headers.set("content-length", body.len().to_string());
        }
        if timeout > 0 {
            headers.set("x-envoy-expected-rq-timeout-ms", timeout.to_string());
        }
        headers.set("x-envoy-internal", "true");
        let s = c.data_mut();
        let token = s.next_token;
        s.next_token = s.next_token.wrapping_add(1).max(1);
        let context_id = s.context();
        s.pending_calls.insert(
            token,
            CallRequest {
                token,
                cluster,
                headers,
                body,
                trailers,
                timeout: (timeout > 0).then(|| Duration::from_millis(timeout as u64)),
                context_id,
            },
        );
        written(write_u32(&mut c, out, token))
    });
    def!("proxy_get_status", |mut c: Cx<'_>,
                              code_ptr: i32,
                              pp: i32,
                              sp: i32|
     -> Result<i32> {
        let (code, msg) = c.data().status.clone();
        if write_u32(&mut c, code_ptr, code).is_none() {
            return st(Status::InvalidMemoryAccess);
        }
        give(&mut c, &msg, pp, sp).map(Status::code)
    });
    def!("proxy_set_effective_context", |mut c: Cx<'_>,
                                         ctx: i32|
     -> Result<i32> {
        let s = c.data_mut();
        let ctx = ctx as u32;
        if ctx == s.root_id || s.streams.contains_key(&ctx) {
            s.effective = Some(ctx);
            st(Status::Ok)
        } else {
            st(Status::BadArgument)
        }
    });
    def!("proxy_done", |mut c: Cx<'_>| -> Result<i32> {
        c.data_mut().done_called = true;
        st(Status::Ok)
    });
    def!("proxy_call_foreign_function", |mut c: Cx<'_>,
                                         np: i32,
                                         nl: i32,
                                         _ap: i32,
                                         _al: i32,
                                         _rp: i32,
                                         _rs: i32|
     -> Result<i32> {
        let Some(name) = read(&c, np, nl) else {
            return st(Status::InvalidMemoryAccess);
        };
        let s = c.data_mut();
        match name.as_slice() {
            b"clear_route_cache" => {
                let ctx = s.context();
                if let Some(stream) = s.streams.get_mut(&ctx) {
                    stream.request_header_mutations += 1;
                }
                st(Status::Ok)
            }
            // Registered in Envoy 1.40, not emulated here: say so loudly.
            b"set_envoy_filter_state"
            | b"declare_property"
            | b"compress"
            | b"uncompress"
            | b"verify_signature"
            | b"expr_create"
            | b"expr_evaluate"
            | b"expr_delete" => {
                let msg = format!(
                    "ace-wasm-host: foreign function {} is not emulated",
                    String::from_utf8_lossy(&name)
                );
                s.log(LogLevel::Warn, msg);
                st(Status::InternalFailure)
            }
            _ => st(Status::NotFound),
        }
    });

    // ---- metrics ----
    def!("proxy_define_metric", |mut c: Cx<'_>,
                                 ty: i32,
                                 np: i32,
                                 nl: i32,
                                 out: i32|
     -> Result<i32> {
        let Some(kind) = MetricType::from_i32(ty) else {
            return st(Status::BadArgument);
        };
        let Some(name) = read(&c, np, nl) else {
            return st(Status::InvalidMemoryAccess);
        };
        let name = String::from_utf8_lossy(&name).into_owned();
        let s = c.data_mut();
        s.next_metric += 1;
        // Envoy keeps the type in the id's low bits; so do we.
        let id = (s.next_metric << 2) | ty as u32;
        s.process.define_metric(kind, &name);
        s.metrics.insert(id, MetricDef { kind, name });
        written(write_u32(&mut c, out, id))
    });
    def!("proxy_increment_metric", |c: Cx<'_>,
                                    id: i32,
                                    delta: i64|
     -> Result<i32> {
        let s = c.data();
        // Envoy reads the kind from the id's low bits before looking it up.
        let kind = MetricType::from_i32(id & 3);
        if !matches!(kind, Some(MetricType::Counter | MetricType::Gauge)) {
            return st(Status::BadArgument);
        }
        let Some(def) = s.metrics.get(&(id as u32)) else {
            return st(Status::NotFound);
        };
        match def.kind {
            MetricType::Counter if delta > 0 => s.process.update_metric(&def.name, |m| {
                if let MetricValue::Counter(v) = m {
                    *v = v.saturating_add(delta as u64);
                }
            }),
            MetricType::Gauge => s.process.update_metric(&def.name, |m| {
                if let MetricValue::Gauge(v) = m {
                    *v = v.saturating_add(delta);
                }
            }),
            _ => return st(Status::BadArgument),
        }
        st(Status::Ok)
    });
    def!("proxy_record_metric", |c: Cx<'_>,
                                 id: i32,
                                 value: i64|
     -> Result<i32> {
        let s = c.data();
        let Some(def) = s.metrics.get(&(id as u32)) else {
            return st(Status::NotFound);
        };
        let value = value as u64;
        s.process.update_metric(&def.name, |m| match m {
            // Envoy: recording on a counter adds.
            MetricValue::Counter(v) => *v = v.saturating_add(value),
            MetricValue::Gauge(v) => *v = value as i64,
            MetricValue::Histogram(samples) => samples.push(value),
        });
        st(Status::Ok)
    });
    def!("proxy_get_metric", |mut c: Cx<'_>,
                              id: i32,
                              out: i32|
     -> Result<i32> {
        let s = c.data();
        // Histograms (and ids with no kind) cannot be read: BadArgument
        // before any lookup, as in Envoy.
        if !matches!(
            MetricType::from_i32(id & 3),
            Some(MetricType::Counter | MetricType::Gauge)
        ) {
            return st(Status::BadArgument);
        }
        let Some(def) = s.metrics.get(&(id as u32)) else {
            return st(Status::NotFound);
        };
        let value = match s.process.metric(&def.name) {
            Some(MetricValue::Counter(v)) => v,
            Some(MetricValue::Gauge(v)) => v as u64,
            Some(MetricValue::Histogram(_)) => return st(Status::BadArgument),
            None => return st(Status::NotFound),
        };
        written(write_u64(&mut c, out, value))
    });

    // ---- gRPC: imported by every SDK filter, not emulated ----
    def!("proxy_grpc_call", |mut c: Cx<'_>,
                             _a: i32,
                             _b: i32,
                             _d: i32,
                             _e: i32,
                             _f: i32,
                             _g: i32,
                             _h: i32,
                             _i: i32,
                             _j: i32,
                             _k: i32,
                             _t: i32,
                             _o: i32|
     -> Result<i32> {
        grpc_unsupported(&mut c)
    });
    def!("proxy_grpc_stream", |mut c: Cx<'_>,
                               _a: i32,
                               _b: i32,
                               _d: i32,
                               _e: i32,
                               _f: i32,
                               _g: i32,
                               _h: i32,
                               _i: i32,
                               _o: i32|
     -> Result<i32> {
        grpc_unsupported(&mut c)
    });
    def!("proxy_grpc_send", |mut c: Cx<'_>,
                             _t: i32,
                             _p: i32,
                             _l: i32,
                             _e: i32|
     -> Result<i32> {
        grpc_unsupported(&mut c)
    });
    def!("proxy_grpc_cancel", |mut c: Cx<'_>,
                               _t: i32|
     -> Result<i32> {
        grpc_unsupported(&mut c)
    });
    def!("proxy_grpc_close", |mut c: Cx<'_>,
                              _t: i32|
     -> Result<i32> {
        grpc_unsupported(&mut c)
    });

    Ok(())
}

fn grpc_unsupported(c: &mut Cx<'_>) -> Result<i32> {
    c.data_mut().log(
        LogLevel::Warn,
        "ace-wasm-host: gRPC calls are not emulated".to_string(),
    );
    st(Status::InternalFailure)
}

fn edit_map(
    c: &mut Cx<'_>,
    ty: i32,
    kp: i32,
    kl: i32,
    value: Option<(i32, i32)>,
    f: impl FnOnce(&mut Headers, &[u8], &[u8]),
) -> Result<i32> {
    let Some(ty) = MapType::from_i32(ty) else {
        return st(Status::BadArgument);
    };
    let Some(key) = read(c, kp, kl) else {
        return st(Status::InvalidMemoryAccess);
    };
    let value = match value {
        Some((vp, vl)) => match read(c, vp, vl) {
            Some(v) => v,
            None => return st(Status::InvalidMemoryAccess),
        },
        None => Vec::new(),
    };
    match map_mut(c.data_mut(), ty) {
        Some(m) => {
            f(m, &key, &value);
            st(Status::Ok)
        }
        None => st(Status::BadArgument),
    }
}

/// The map readable now, following Envoy's `Context::getConstMap`.
pub(crate) fn map(s: &VmState, ty: MapType) -> Option<&Headers> {
    match ty {
        MapType::HttpCallResponseHeaders => return s.call_response.as_ref().map(|r| &r.headers),
        MapType::HttpCallResponseTrailers => return s.call_response.as_ref().map(|r| &r.trailers),
        MapType::GrpcReceiveInitialMetadata | MapType::GrpcReceiveTrailingMetadata => return None,
        _ => {}
    }
    let st = s.streams.get(&s.context())?;
    let log = st.access_log_phase;
    match ty {
        MapType::RequestHeaders if st.request.headers_open || log => Some(&st.request.headers),
        MapType::RequestTrailers if st.request.trailers_open && !log => Some(&st.request.trailers),
        MapType::ResponseHeaders if st.response.headers_open || log => Some(&st.response.headers),
        MapType::ResponseTrailers if st.response.trailers_open || log => {
            Some(&st.response.trailers)
        }
        _ => None,
    }
}

/// The map writable now (`Context::getMap`): never in the access-log phase.
fn map_mut(s: &mut VmState, ty: MapType) -> Option<&mut Headers> {
    match ty {
        MapType::HttpCallResponseHeaders => {
            return s.call_response.as_mut().map(|r| &mut r.headers)
        }
        MapType::HttpCallResponseTrailers => {
            return s.call_response.as_mut().map(|r| &mut r.trailers)
        }
        MapType::GrpcReceiveInitialMetadata | MapType::GrpcReceiveTrailingMetadata => return None,
        _ => {}
    }
    let ctx = s.context();
    let st = s.streams.get_mut(&ctx)?;
    if st.access_log_phase {
        return None;
    }
    match ty {
        MapType::RequestHeaders if st.request.headers_open => {
            // ABI 0.2.1: any request-header change clears the route cache.
            st.request_header_mutations += 1;
            Some(&mut st.request.headers)
        }
        MapType::RequestTrailers if st.request.trailers_open => Some(&mut st.request.trailers),
        MapType::ResponseHeaders if st.response.headers_open => Some(&mut st.response.headers),
        MapType::ResponseTrailers if st.response.trailers_open => Some(&mut st.response.trailers),
        _ => None,
    }
}

/// The buffer readable now, following Envoy's `Context::getBuffer`.
fn buffer(s: &VmState, ty: BufferType) -> Option<&[u8]> {
    match ty {
        BufferType::VmConfiguration => Some(&s.plugin.vm_configuration),
        BufferType::PluginConfiguration if s.configuring => Some(&s.plugin.configuration),
        BufferType::HttpCallResponseBody => s.call_response.as_ref().map(|r| r.body.as_slice()),
        // Envoy always offers a stream's body buffers; outside the body
        // callbacks they read as empty (observed: Ok, not NotFound).
        BufferType::RequestBody => {
            let st = s.streams.get(&s.context())?;
            Some(if st.request.body_open {
                &st.request.body[..]
            } else {
                &[]
            })
        }
        BufferType::ResponseBody => {
            let st = s.streams.get(&s.context())?;
            Some(if st.response.body_open {
                &st.response.body[..]
            } else {
                &[]
            })
        }
        _ => None,
    }
}

fn buffer_mut(s: &mut VmState, ty: BufferType) -> Option<&mut Vec<u8>> {
    let ctx = s.context();
    match ty {
        BufferType::HttpCallResponseBody => s.call_response.as_mut().map(|r| &mut r.body),
        BufferType::RequestBody => {
            let st = s.streams.get_mut(&ctx)?;
            st.request.body_open.then_some(&mut st.request.body)
        }
        BufferType::ResponseBody => {
            let st = s.streams.get_mut(&ctx)?;
            st.response.body_open.then_some(&mut st.response.body)
        }
        _ => None,
    }
}
