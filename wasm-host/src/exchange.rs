//! One whole request, driven the way Envoy's filter manager drives it.
//!
//! [`Vm::exchange`] plays the HTTP connection manager, the router and the
//! codec around the filter: it decorates the request as the connection
//! manager does before any filter runs (`x-forwarded-proto`,
//! `x-request-id`), honours pauses (a headers Pause stops everything unless
//! `allow_on_headers_stop_iteration`; a body Pause buffers), turns a local
//! reply into a response that passes back through the filter's response
//! callbacks, picks the upstream cluster like a route with `cluster` or
//! `cluster_header`, and returns what the client and the upstream
//! observed. This is the level the differential suite compares with a real
//! Envoy.
//!
//! Two of Envoy's limits apply here as there: a body the filter holds past
//! the listener's buffer limit (a request: Envoy's local 413; a response:
//! a reset once its headers left), and time: while the filter holds the
//! stream for a callout, the virtual clock moves on to the callout's
//! answer (from a cluster with latency) or its timeout, as real time would.

use crate::error::Error;
use crate::headers::Headers;
use crate::message::{Request, Response, UpstreamRequest};
use crate::state::LocalResponse;
use crate::vm::{HttpStream, Vm};

/// How the route picks a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// A fixed cluster (`route.cluster`).
    Cluster(String),
    /// The first value of this request header (`route.cluster_header`); a
    /// missing header is Envoy's `cluster_not_found` 503.
    ClusterHeader(String),
}

/// What one request produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exchange {
    /// What the upstream received, if the request got that far.
    pub upstream: Option<UpstreamRequest>,
    /// What the client received; `None` if the stream was reset or is held
    /// forever by the filter.
    pub response: Option<Response>,
    /// The filter's local reply, if it sent one.
    pub local_reply: Option<LocalResponse>,
    /// The filter reset the stream.
    pub reset: bool,
    /// The filter paused and nothing resumed it: a real client would wait
    /// until a timeout.
    pub hung: bool,
    /// The VM trapped (in this request or before): Envoy's `FAIL_CLOSED`
    /// answer is in `response`.
    pub vm_failure: Option<String>,
    /// The response headers the client had got when the stream was reset
    /// (Envoy resets a response whose body outgrew the buffer limit after
    /// its headers left).
    pub headers_before_reset: Option<Headers>,
}

/// The most body the host hands a filter in one callback: Envoy passes a
/// large body on in pieces as its socket reads complete (how much one read
/// gets varies), so a filter that holds a large body sees several calls.
const READ_SIZE: usize = 16 * 1024;

/// `chunks` cut into pieces of at most [`READ_SIZE`].
fn reads(chunks: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    chunks
        .into_iter()
        .flat_map(|c| {
            if c.len() <= READ_SIZE {
                vec![c]
            } else {
                c.chunks(READ_SIZE).map(<[u8]>::to_vec).collect()
            }
        })
        .collect()
}

enum Flow {
    Go,
    Local(LocalResponse),
    Stop,
}

fn flow(s: &mut HttpStream<'_>, out: &mut Exchange, end: bool) -> Result<Flow, Error> {
    if end {
        wait_for_callouts(s, |s| {
            s.request_paused() && s.local_response().is_none() && !s.closed()
        })?;
    }
    if s.closed() {
        out.reset = true;
        return Ok(Flow::Stop);
    }
    if let Some(l) = s.local_response() {
        return Ok(Flow::Local(l.clone()));
    }
    if end && s.request_paused() {
        out.hung = true;
        return Ok(Flow::Stop);
    }
    Ok(Flow::Go)
}

/// While `held` (the filter holds the stream) and a callout is due to end
/// (a cluster with latency answers, an HTTP callout times out, or a gRPC
/// call's deadline passes), the virtual clock moves on to it: in Envoy,
/// real time passes.
fn wait_for_callouts(
    s: &mut HttpStream<'_>,
    held: impl Fn(&HttpStream<'_>) -> bool,
) -> Result<(), Error> {
    while held(s) {
        if !s.vm().advance_to_next_callout()? {
            break;
        }
    }
    Ok(())
}

fn uuid(vm: &Vm, id: u32) -> String {
    // Deterministic per VM and stream: tests must be reproducible.
    let a = u64::from(id).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ vm.memory_size() as u64;
    format!(
        "{:08x}-{:04x}-4{:03x}-a{:03x}-{:012x}",
        (a >> 32) as u32,
        (a >> 16) as u16,
        a as u16 & 0xfff,
        id & 0xfff,
        a & 0xffff_ffff_ffff
    )
}

impl Vm {
    /// Runs one request through the filter as Envoy would, with `upstream`
    /// answering for the chosen cluster (`None`: Envoy has no such cluster,
    /// which is a 503 `cluster_not_found`). Callouts go to the process's
    /// clusters; one left pending leaves the request hung.
    ///
    /// A trap (now, or earlier in this VM) is answered as Envoy's
    /// `FAIL_CLOSED` plugin does: a 503 with an empty body, with the trap in
    /// [`Exchange::vm_failure`]. Only host-side misuse is an `Err`.
    pub fn exchange(
        &mut self,
        route: &Route,
        request: Request,
        upstream: impl FnMut(&UpstreamRequest) -> Option<Response>,
    ) -> Result<Exchange, Error> {
        let mut out = Exchange::default();
        let grpc = is_grpc(&request.headers);
        match self.exchange_into(&mut out, route, request, upstream) {
            Ok(()) => Ok(out),
            Err(Error::Trap { callback, message }) => {
                self.fail_closed(&mut out, grpc, format!("{callback}: {message}"));
                Ok(out)
            }
            Err(Error::Failed(why)) => {
                self.fail_closed(&mut out, grpc, why);
                Ok(out)
            }
            Err(e) => Err(e),
        }
    }

    /// Envoy's `failStream`: a local 503 with gRPC status UNAVAILABLE
    /// (which a gRPC client gets as a trailers-only response).
    fn fail_closed(&self, out: &mut Exchange, grpc: bool, why: String) {
        let mut r = match grpc {
            true => Response::new(200)
                .header("content-type", "application/grpc")
                .header("grpc-status", "14"),
            false => Response::new(503).header("content-length", "0"),
        };
        r.headers.add("date", http_date(self.now()));
        r.headers.add("server", "envoy");
        out.response = Some(r);
        out.vm_failure = Some(why);
    }

    fn exchange_into(
        &mut self,
        out: &mut Exchange,
        route: &Route,
        request: Request,
        mut upstream: impl FnMut(&UpstreamRequest) -> Option<Response>,
    ) -> Result<(), Error> {
        let allow_stop = self.allow_stop_iteration();
        let mut s = self.http_stream()?;
        let id = s.id();
        let mut headers = request.headers;
        if !headers.contains("x-forwarded-proto") {
            headers.add("x-forwarded-proto", "http");
        }
        if !headers.contains("x-request-id") {
            headers.add("x-request-id", uuid(s.vm(), id));
        }
        let has_body = !request.body.is_empty();
        let has_trailers = !request.trailers.is_empty();
        if !request.dynamic_metadata.is_empty() {
            s.update_info(|i| i.dynamic_metadata.merge(&request.dynamic_metadata))?;
        }
        let http2 = request.http2;
        s.send_request_headers(headers, !has_body && !has_trailers)?;

        // Decoding: headers, then body, then trailers.
        let mut decoded = flow(&mut s, out, !has_body && !has_trailers || !allow_stop)?;
        if matches!(decoded, Flow::Go) && has_body {
            // After a stop-all was resumed, Envoy delivers what it buffered at
            // once, end of stream included. Otherwise its HTTP/1 codec hands
            // over the data first and the end of stream as a separate empty
            // frame (observed: `on_request_body(21, false)`, then
            // `on_request_body(21, true)` after a Pause), and its HTTP/2
            // codec one call per DATA frame, the end of stream on the last
            // (`on_request_body(5, true)`), or, with trailers, every chunk
            // with `end_of_stream` false and then `on_request_trailers`:
            // even after a headers Pause (with
            // `allow_on_headers_stop_iteration`), whose hold a Continue from
            // the trailers callback releases.
            let resumed = s.request_resumes() > 0;
            let (chunks, split_end) = if resumed {
                (vec![request.body.concat()], false)
            } else {
                (reads(request.body), !has_trailers && !http2)
            };
            let last = chunks.len().saturating_sub(1);
            for (i, chunk) in chunks.into_iter().enumerate() {
                let end = i == last && !has_trailers && !split_end;
                s.send_request_body(chunk, end)?;
                decoded = flow(&mut s, out, end)?;
                if !matches!(decoded, Flow::Go) {
                    break;
                }
            }
            if matches!(decoded, Flow::Go) && split_end {
                s.send_request_body(b"", true)?;
                decoded = flow(&mut s, out, true)?;
            }
        }
        if matches!(decoded, Flow::Go) && has_trailers {
            s.send_request_trailers(request.trailers)?;
            decoded = flow(&mut s, out, true)?;
        }

        let reply = match decoded {
            Flow::Stop => None,
            Flow::Local(l) => {
                s.update_info(|i| i.response_code_details = Some(l.details.clone()))?;
                Some(local_response_headers(&s, &l))
            }
            Flow::Go => {
                let cluster = match route {
                    Route::Cluster(c) => Some(c.clone()),
                    Route::ClusterHeader(h) => s.request_headers().get(h).map(str::to_string),
                };
                let mut up = UpstreamRequest {
                    cluster: cluster.clone().unwrap_or_default(),
                    headers: s.request_headers().clone(),
                    body: s.forwarded_request_body().to_vec(),
                    trailers: s.request_trailers().clone(),
                };
                up.headers.set("x-envoy-expected-rq-timeout-ms", "15000");
                let answer = match cluster {
                    Some(_) => upstream(&up),
                    None => None,
                };
                let (reply, details) = match answer {
                    Some(mut r) => {
                        s.update_info(|i| i.cluster_name = Some(up.cluster.clone()))?;
                        out.upstream = Some(up);
                        r.headers.set("x-envoy-upstream-service-time", "0");
                        (r, "via_upstream")
                    }
                    None => (Response::new(503), "cluster_not_found"),
                };
                s.update_info(|i| i.response_code_details = Some(details.to_string()))?;
                Some(reply)
            }
        };

        if let Some(reply) = reply {
            out.local_reply = s.local_response().cloned();
            encode(&mut s, out, reply, http2)?;
        }
        s.finish()
    }
}

/// The headers Envoy's `sendLocalReply` builds for a filter's local reply.
/// To a gRPC request (`content-type: application/grpc...`) it is a
/// trailers-only gRPC response: `:status` 200, the filter's gRPC status
/// (or the HTTP status mapped to one), the body as `grpc-message`.
fn local_response_headers(s: &HttpStream<'_>, l: &LocalResponse) -> Response {
    if is_grpc(s.request_headers()) {
        let mut r = Response::new(200);
        for (k, v) in l.headers.pairs() {
            r.headers.add(k, v);
        }
        r.headers.set("content-type", "application/grpc");
        if !r.headers.contains("grpc-status") {
            let code = l
                .grpc_status
                .map_or_else(|| http_to_grpc(l.status), |g| g as u32);
            r.headers.add("grpc-status", code.to_string());
        }
        let text = String::from_utf8_lossy(&l.body);
        let text = text.strip_suffix('\n').unwrap_or(&text);
        if !text.is_empty() {
            r.headers.add("grpc-message", percent_encode(text));
        }
        return r;
    }
    let mut r = Response::new(u16::try_from(l.status).unwrap_or(500));
    for (k, v) in l.headers.pairs() {
        r.headers.add(k, v);
    }
    if !l.body.is_empty() {
        r.headers.set("content-length", l.body.len().to_string());
        if !r.headers.contains("content-type") {
            r.headers.add("content-type", "text/plain");
        }
    }
    r.body = l.body.clone();
    r
}

/// Envoy's `Grpc::Common::isGrpcRequestHeaders`: the local replies to
/// such a request are gRPC responses.
fn is_grpc(h: &Headers) -> bool {
    h.get("content-type")
        .is_some_and(|t| t.starts_with("application/grpc"))
}

/// Envoy's `Grpc::Utility::httpToGrpcStatus`.
fn http_to_grpc(status: u32) -> u32 {
    match status {
        400 => 13,
        401 => 16,
        403 => 7,
        404 => 12,
        429 | 502..=504 => 14,
        _ => 2,
    }
}

/// gRPC's percent-encoding of `grpc-message`: bytes outside printable
/// ASCII, and `%`, as `%XX`.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (b' '..=b'~').contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Encoding: the response passes through the filter's response callbacks.
/// Response trailers reach an HTTP/2 client only: Envoy's HTTP/1 codec
/// drops them unless the listener enables trailers, which the connection
/// manager emulated here does not (the filter still gets them).
fn encode(
    s: &mut HttpStream<'_>,
    out: &mut Exchange,
    r: Response,
    http2: bool,
) -> Result<(), Error> {
    let local_before = s.local_response().cloned();
    let has_body = !r.body.is_empty();
    let has_trailers = !r.trailers.is_empty();
    // The headers leave for the client as soon as the filter lets them go
    // (a headers Continue, or a later body or trailers Continue or resume
    // that releases a headers Pause); what the filter writes into the map
    // after that is accepted but never reaches the client.
    let mut sent: Option<Headers> = None;
    let release = |s: &HttpStream<'_>, sent: &mut Option<Headers>| {
        if sent.is_none() && !s.response_paused() {
            *sent = Some(s.response_headers().clone());
        }
    };
    s.send_response_headers(r.headers, !has_body && !has_trailers)?;
    let end = !has_body && !has_trailers;
    let mut stopped = check_encode(s, out, &local_before, &sent, end)?;
    release(s, &mut sent);
    if !stopped && has_body {
        let chunks = reads(vec![r.body]);
        let last = chunks.len().saturating_sub(1);
        for (i, chunk) in chunks.into_iter().enumerate() {
            let end = i == last && !has_trailers;
            s.send_response_body(chunk, end)?;
            stopped = check_encode(s, out, &local_before, &sent, end)?;
            release(s, &mut sent);
            if stopped {
                break;
            }
        }
    }
    if !stopped && has_trailers {
        s.send_response_trailers(r.trailers)?;
        stopped = check_encode(s, out, &local_before, &sent, true)?;
        release(s, &mut sent);
    }
    if !stopped {
        let mut headers = sent.unwrap_or_else(|| s.response_headers().clone());
        finish_headers(s, &mut headers);
        out.response = Some(Response {
            headers,
            body: s.forwarded_response_body().to_vec(),
            trailers: if http2 {
                s.response_trailers().clone()
            } else {
                Headers::new()
            },
        });
    }
    Ok(())
}

/// What the connection manager adds after every filter ran: `date` (from
/// the virtual clock) and `server`.
fn finish_headers(s: &HttpStream<'_>, headers: &mut Headers) {
    if !headers.contains("date") {
        headers.add("date", http_date(s.now()));
    }
    if !headers.contains("server") {
        headers.add("server", "envoy");
    }
}

/// RFC 9110 IMF-fixdate, e.g. `Thu, 01 Jan 2026 00:00:00 GMT`.
fn http_date(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    format!(
        "{}, {:02} {} {} {:02}:{:02}:{:02} GMT",
        WEEKDAYS.get(days.rem_euclid(7) as usize).unwrap_or(&"Thu"),
        day,
        MONTHS.get((month - 1) as usize).unwrap_or(&"Jan"),
        year,
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn check_encode(
    s: &mut HttpStream<'_>,
    out: &mut Exchange,
    local_before: &Option<LocalResponse>,
    sent: &Option<Headers>,
    end: bool,
) -> Result<bool, Error> {
    if end {
        wait_for_callouts(s, |s| {
            s.response_paused() && s.local_response() == local_before.as_ref() && !s.closed()
        })?;
    }
    if s.closed() {
        out.reset = true;
        return Ok(true);
    }
    if s.response_overflow() {
        match sent {
            // Envoy's `responseDataTooLarge`: the headers already left, so
            // its local reply can only reset the stream.
            Some(headers) => {
                let mut headers = headers.clone();
                finish_headers(s, &mut headers);
                out.headers_before_reset = Some(headers);
                out.reset = true;
            }
            None => {
                let mut r = Response::new(500).body("Internal Server Error");
                r.headers.add("content-length", "21");
                r.headers.add("content-type", "text/plain");
                finish_headers(s, &mut r.headers);
                out.response = Some(r);
            }
        }
        return Ok(true);
    }
    if let Some(l) = s.local_response() {
        if local_before.as_ref() != Some(l) {
            // A local reply while encoding replaces the response outright.
            out.local_reply = Some(l.clone());
            let mut r = local_response_headers(s, l);
            finish_headers(s, &mut r.headers);
            out.response = Some(r);
            return Ok(true);
        }
    }
    if end && s.response_paused() {
        out.hung = true;
        return Ok(true);
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::http_date;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn http_dates() {
        assert_eq!(http_date(UNIX_EPOCH), "Thu, 01 Jan 1970 00:00:00 GMT");
        let t = UNIX_EPOCH + Duration::from_secs(1_796_206_705);
        assert_eq!(http_date(t), "Wed, 02 Dec 2026 10:18:25 GMT");
    }
}
