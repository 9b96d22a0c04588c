//! The steps one request is made of, each host-free and tested on its own;
//! [`crate::flow`] runs them in order for both hosts: what a request's
//! headers say ([`capture`]), what it asks of the core ([`plan`]), which
//! destinations may serve it ([`feasible`]), what an answer means for the
//! destination's health ([`outcome`]), what the request turned out to cost
//! ([`book_usage`]); the counters they report are [`crate::counters`].

use crate::attributes::{self, AttributeError};
use crate::body::{BodyError, RequestBody};
use crate::event::{self, Event, Price, Text};
use crate::headers::{self, Pairs};
use crate::usage::Usage;
use ace_config::Trusted;
use ace_config::{Config, LatencyClass, WhenLate};
use ace_core::cost::billed_input;
use ace_core::dispatch::{Decision, Refusal, Request};
use ace_core::fleet::LivePrices;
use ace_core::health::{Headroom, Outcome, ANY_TENANT, MAX_TENANT};
use ace_core::tables::Tables;
use std::sync::Arc;

/// Response header naming the destination that served the request.
pub const RESPONSE_DESTINATION_HEADER: &str = "x-ace-destination";
/// Response header with the decision's reason code.
pub const RESPONSE_REASON_HEADER: &str = "x-ace-reason";
/// Response header with the destination's tier.
pub const RESPONSE_TIER_HEADER: &str = "x-ace-tier";
/// Response header with the booked (true marginal) cost, USD.
pub const RESPONSE_COST_HEADER: &str = "x-ace-cost-usd";
/// Response header naming the model that served the request (model
/// routing may choose another than the one named).
pub const RESPONSE_MODEL_HEADER: &str = "x-ace-model-served";

/// What the request headers said, captured while they are readable.
#[derive(Debug)]
pub struct Head {
    /// The request's event, pointing into the header buffer.
    pub event: Event,
    /// `content-length`, if sent.
    pub content_length: Option<usize>,
    /// Whether the body is JSON (`content-type` names json).
    pub json: bool,
}

/// Capture a request's headers (the whole map, read in one go) at `now`
/// (ms), under configuration `cfg`; `event_id` is ACE's unique id for the
/// request (see [`EventIds`]).
pub fn capture(cfg: &Config, headers: Pairs, now: u64, event_id: [u8; 32]) -> Head {
    let [model, tenant, data_class, latency_class, request_id, length, content_type] = headers
        .find([
            "x-ace-model",
            "x-ace-tenant",
            "x-ace-data-class",
            "x-ace-latency-class",
            "x-request-id",
            "content-length",
            "content-type",
        ]);
    let content_length = headers::number(length);
    let json = headers::has(content_type, "json");
    // The event points into the header buffer instead of copying.
    let span = |v: Option<&[u8]>| v.and_then(|v| headers.span(v)).map(Text::Header);
    let (model, tenant, data_class, latency_class, request_id) = (
        span(model),
        span(tenant),
        span(data_class),
        span(latency_class),
        span(request_id),
    );
    // The rest blank (`Event::blank`, not `..Event::default()`, which
    // would build and drop a default `Arc` per request).
    let mut event = Event {
        schema: event::SCHEMA,
        event_id,
        request_id,
        time_ms: now,
        tenant,
        data_class,
        latency_class,
        model_requested: model,
        tokens_estimated: true,
        ..Event::blank(&cfg.id, headers)
    };
    // A verified source's value stands in the event for what the client's
    // header claimed.
    if let Some(p) = &cfg.policy {
        for a in p.attributes.iter().filter(|a| a.trusted.is_some()) {
            let field = match a.name.as_str() {
                "tenant" => &mut event.tenant,
                "data_class" => &mut event.data_class,
                "latency_class" => &mut event.latency_class,
                "model" => &mut event.model_requested,
                _ => continue,
            };
            *field = None;
        }
    }
    Head {
        event,
        content_length,
        json,
    }
}

impl Head {
    /// Whether to hold the headers and read the body before routing: the
    /// configuration asks for it, and a body is coming that is JSON, or
    /// whatever it claims to be when the policy decides on the model (the
    /// upstream may parse a body sent as `text/plain`).
    pub fn wants_body(&self, cfg: &Config, end_of_stream: bool) -> bool {
        let model_policy = cfg.policy.as_ref().is_some_and(|p| p.model.is_some());
        cfg.read_body
            && !end_of_stream
            && self.content_length != Some(0)
            && (self.json || model_policy)
    }
}

/// Headers a client may not send through: the destination header (clients
/// never choose) and the header of every attribute that has a verified
/// source. An adapter removes each one the request carries as soon as it
/// sees the headers, before anything can pause the request.
pub fn forbidden_headers<'c>(
    cfg: &'c Config,
    headers: &'c Pairs,
) -> impl Iterator<Item = &'c str> + 'c {
    let trusted = cfg
        .policy
        .iter()
        .flat_map(|p| p.attributes.iter())
        .filter(|a| a.trusted.is_some())
        .map(|a| a.header.as_str());
    std::iter::once(cfg.destination_header.as_str())
        .chain(trusted)
        .filter(move |h| headers.get(h).is_some())
}

/// Unique event ids for one VM or process: a random 64-bit prefix drawn
/// once, then a counter, as 32 lowercase hex digits. The last id is kept
/// written out, and the next one is that id plus one in its last 16
/// digits (a digit or two rewritten, not 32 formatted).
#[derive(Debug, Clone)]
pub struct EventIds {
    last: [u8; 32],
}

impl EventIds {
    /// Ids under `prefix` (draw it from the system's randomness).
    pub fn new(prefix: u64) -> EventIds {
        EventIds {
            last: event_id(prefix, 0),
        }
    }

    /// The next id: [`event_id`] of the prefix and a count from 1 (after
    /// 2^64 - 1 ids, 0 again).
    #[inline]
    pub fn next_id(&mut self) -> [u8; 32] {
        for digit in self.last.iter_mut().skip(16).rev() {
            let (next, carry) = match *digit {
                b'9' => (b'a', false),
                b'f' => (b'0', true),
                d => (d.wrapping_add(1), false),
            };
            *digit = next;
            if !carry {
                break;
            }
        }
        self.last
    }
}

/// Event id `n` under `prefix`: both as 16 lowercase hex digits.
#[inline]
pub fn event_id(prefix: u64, n: u64) -> [u8; 32] {
    let mut out = [b'0'; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        let word = if i < 16 { prefix } else { n };
        let shift = 60 - 4 * (i % 16);
        *byte = event::hex_digit(((word >> shift) & 15) as u8);
    }
    out
}

/// A random 64-bit number from the system (seeded hashing's keys).
pub fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x5eed);
    h.finish()
}

/// The request's side of the decision, from its body (if read) or its
/// size; records the estimates and the time in its event.
pub fn plan(
    cfg: &Config,
    event: &mut Event,
    body: Option<&RequestBody>,
    content_length: Option<usize>,
    now: u64,
) -> Request {
    // Estimates, bounded by the context window: a client's `max_tokens` of
    // four billion books no more than a full context.
    let tokens_in = body
        .map(|b| b.tokens_in)
        .unwrap_or_else(|| content_length.map_or(1, crate::tokens::estimate_tokens))
        .min(cfg.max_context_tokens);
    let tokens_out = body
        .and_then(|b| b.max_output_tokens)
        .unwrap_or(cfg.default_output_tokens)
        .min(cfg.max_context_tokens);
    event.time_ms = now;
    event.tokens_in = tokens_in;
    event.tokens_out = tokens_out;
    if event.model_requested.is_none() {
        event.model_requested = body.and_then(|b| b.model.clone()).map(Text::Owned);
    }
    // The class is read as text (a UTF-8 check) only where there are
    // classes to find it among.
    let class = if cfg.latency_classes.is_empty() {
        LatencyClass::untimed(cfg.latency_usd_per_s)
    } else {
        cfg.latency_class(event.text(&event.latency_class))
    };
    Request {
        tokens_in,
        tokens_out,
        // Past a knee a request also costs the timed work it slows.
        latency_usd_per_s: class.usd_per_s.max(cfg.congestion_usd_per_s),
        ttft_target_s: class
            .ttft_ms
            .map_or(f64::INFINITY, |t| f64::from(t) / 1000.0),
        late_usd: class.late_usd,
        refuse_late: class.when_late == WhenLate::Refuse,
        max_usd: f64::INFINITY,
    }
}

/// A request refused before any destination was chosen, and how to say so.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    /// HTTP status of the local reply.
    pub status: u32,
    /// The error's `type`.
    pub kind: &'static str,
    /// The error's `reason` (also the event's).
    pub reason: &'static str,
    /// What to tell the client.
    pub message: String,
}

impl Refused {
    /// Nothing that may serve the request is healthy and under its cap
    /// (or nothing may serve it at all): 503, never a fallback.
    pub fn no_destination(refusal: Refusal) -> Refused {
        if refusal == Refusal::NoTimelyDestination {
            return Refused {
                status: 503,
                kind: "no_timely_destination",
                reason: refusal.as_str(),
                message: "no destination that may serve this request is expected to answer \
                          within its latency class's time-to-first-token target, and the class \
                          refuses late service (latency_classes.<class>.when_late)"
                    .to_string(),
            };
        }
        Refused {
            status: 503,
            kind: "no_feasible_destination",
            reason: refusal.as_str(),
            message: "no destination that may serve this request is healthy and under its cap"
                .to_string(),
        }
    }

    /// The reply's JSON body, `{"error": {"type", "reason", "message"}}`.
    pub fn body(&self) -> Vec<u8> {
        error_body(self.kind, self.reason, &self.message)
    }
}

/// An error reply's JSON body. By hand: `serde_json::json!` cost ~30,000
/// Wasm instructions, on the path that refusals (and floods of them) take.
pub fn error_body(kind: &str, reason: &str, message: &str) -> Vec<u8> {
    let mut body = Vec::with_capacity(96 + message.len());
    body.extend_from_slice(b"{\"error\":{\"type\":");
    event::string(&mut body, kind.as_bytes());
    body.extend_from_slice(b",\"reason\":");
    event::string(&mut body, reason.as_bytes());
    body.extend_from_slice(b",\"message\":");
    event::string(&mut body, message.as_bytes());
    body.extend_from_slice(b"}}");
    body
}

/// Per-request buffers for the feasibility lookup, sized for one
/// configuration and reused.
#[derive(Debug, Clone, Default)]
pub struct Lookup {
    /// One value index per table attribute.
    pub values: Vec<u32>,
    /// The feasible-destination bitmask.
    pub mask: Vec<u64>,
}

impl Lookup {
    /// Buffers for `cfg`.
    pub fn new(cfg: &Config) -> Lookup {
        let mut l = Lookup::default();
        l.fit(cfg);
        l
    }

    /// Resize for `cfg` (no allocation when already that size).
    pub fn fit(&mut self, cfg: &Config) {
        let attributes = cfg.policy.as_ref().map_or(0, |p| p.attributes.len());
        self.values.resize(attributes, 0);
        self.mask.resize(cfg.destinations.len().div_ceil(64), 0);
    }
}

/// Feasibility first: fill `lookup.mask` with the destinations that may
/// serve this request, from the compiled Cedar tables (every destination
/// when the configuration has no policy). A request missing an attribute
/// the policy refuses to do without is refused, naming it. A lookup that
/// fails leaves the mask empty: fail closed.
pub fn feasible<V: AsRef<[u8]>>(
    cfg: &Config,
    tables: Option<&Tables<'_>>,
    event: &mut Event,
    body_model: Option<&str>,
    mut trusted: impl FnMut(&Trusted) -> Option<V>,
    lookup: &mut Lookup,
) -> Result<(), Refused> {
    lookup.fit(cfg);
    let Lookup { values, mask } = lookup;
    let (Some(tables), Some(policy)) = (tables, &cfg.policy) else {
        // No policy: every destination (the warm mask for no model
        // names them all).
        mask.iter_mut()
            .zip(cfg.warmth.mask(None))
            .for_each(|(m, all)| *m = *all);
        return Ok(());
    };
    // A verified value also stands in the event.
    let mut seen = |source: &Trusted| {
        let v = trusted(source)?;
        if let Some(a) = policy
            .attributes
            .iter()
            .find(|a| a.trusted.as_ref() == Some(source))
        {
            let text = Some(Text::Owned(
                String::from_utf8_lossy(v.as_ref().trim_ascii()).into_owned(),
            ));
            match a.name.as_str() {
                "tenant" => event.tenant = text,
                "data_class" => event.data_class = text,
                "latency_class" => event.latency_class = text,
                "model" => event.model_requested = text,
                _ => {}
            }
        }
        Some(v)
    };
    let resolved = attributes::resolve(
        tables,
        policy,
        &event.headers,
        body_model,
        &mut seen,
        values,
    );
    match resolved {
        Ok(()) => {}
        Err(AttributeError::Missing(a)) => {
            let source = match &a.trusted {
                Some(Trusted::Metadata { namespace, path }) => {
                    format!("it comes from metadata {namespace}/{}", path.join("/"))
                }
                Some(Trusted::Peer(p)) => {
                    format!("it comes from the mTLS peer certificate ({})", p.property())
                }
                None => format!("send it in the `{}` header", a.header),
            };
            return Err(Refused {
                status: 400,
                kind: "missing_attribute",
                reason: attribute_reason(&a.name),
                message: format!("this request needs the `{}` attribute; {source}", a.name),
            });
        }
        Err(AttributeError::Conflicting(a)) => {
            return Err(Refused {
                status: 400,
                kind: "conflicting_attribute",
                reason: "conflicting_attribute",
                message: format!(
                    "the `{}` header was sent more than once with different values; send it once",
                    a.header
                ),
            });
        }
    }
    event.tenant_key = policy
        .tenant
        .and_then(|t| values.get(t))
        .map_or(1, |v| v.saturating_add(1).min(MAX_TENANT));
    if let Err(e) = tables.feasible(values, mask) {
        log::error!("feasibility lookup failed: {e}");
        mask.fill(0);
    }
    Ok(())
}

/// What to do with a request body that could not be read: refuse it when
/// the policy decides on the model, whatever a header says (a body too
/// large to read whole, or one that is not one JSON object, say with the
/// `model` key twice, may name another model to the upstream than the one
/// ACE checked); else `None` (route on the body's size instead; the body
/// only refines the estimate).
pub fn body_refusal(cfg: &Config, err: &BodyError) -> Option<Refused> {
    let needs_model = cfg.policy.as_ref().is_some_and(|p| p.model.is_some());
    needs_model.then(|| Refused {
        status: if err.too_large { 413 } else { 400 },
        kind: "bad_request_body",
        reason: "bad_request_body",
        message: err.to_string(),
    })
}

/// One model per request: a request whose `x-ace-model` header and body
/// `model` name different models is refused (policy and cost would follow
/// the header while the upstream serves the body's).
pub fn model_conflict(event: &Event, body: Option<&RequestBody>) -> Option<Refused> {
    let in_body = body?.model.as_deref()?.trim();
    let Some(Text::Header(_)) = &event.model_requested else {
        return None;
    };
    let in_header = event.text(&event.model_requested)?.trim();
    (in_header != in_body).then(|| Refused {
        status: 400,
        kind: "model_conflict",
        reason: "model_conflict",
        message: format!(
            "the x-ace-model header names {in_header:?} but the body's model is {in_body:?}; \
             name one model"
        ),
    })
}

/// The refusal reason for a missing attribute (a static string per known
/// attribute, so the hot path does not allocate one).
pub fn attribute_reason(name: &str) -> &'static str {
    match name {
        "tenant" => "tenant",
        "data_class" => "data_class",
        "model" => "model",
        "latency_class" => "latency_class",
        "tp_degree" => "tp_degree",
        _ => "attribute",
    }
}

/// Record the decision in the request's event, with the control
/// service's prices it was priced with (`live`).
pub fn record(
    event: &mut Event,
    cfg: &Config,
    names: &[Arc<str>],
    decision: &Decision,
    live: &LivePrices,
) {
    event.destination = names.get(decision.index).cloned();
    event.tier = cfg.models.get(decision.index).map(|m| m.tier.as_str());
    event.slo_ms = cfg.destinations.get(decision.index).and_then(|d| d.slo_ms);
    event.marginal_usd = decision.marginal_usd;
    event.counterfactual_usd = decision.counterfactual_usd;
    event.reason = decision.reason.as_str();
    event.warm = Some(decision.warm);
    event.overage = decision.overage;
    event.live_usd_per_input_token = Price::of(live.usd_per_token.map(|p| p.0));
    event.live_usd_per_output_token = Price::of(live.usd_per_token.map(|p| p.1));
    event.live_usd_per_hour = Price::of(live.usd_per_hour);
}

/// What an answer (its `:status` and `retry-after` values) `latency_ms`
/// after the upstream had the whole request means for the destination's
/// health. `upstream_answered` says whether the upstream itself answered
/// (Envoy's router marks those with `x-envoy-upstream-service-time`): a
/// 5xx that Envoy made itself (a refused connection, a timeout) is blamed
/// on no tenant, while an upstream's 5xx is blamed on the request's tenant
/// `tenant_key` (see the `trip_tenants` health rule).
#[inline]
pub fn outcome(
    status: u32,
    retry_after_ms: Option<u64>,
    upstream_answered: bool,
    tenant_key: u32,
    latency_ms: u64,
    slo_ms: Option<u64>,
    headroom: Option<Headroom>,
) -> Outcome {
    match status {
        429 => Outcome::Throttled { retry_after_ms },
        500..=599 | 0 => Outcome::Failure {
            tenant: if upstream_answered {
                tenant_key.min(MAX_TENANT)
            } else {
                ANY_TENANT
            },
        },
        _ => Outcome::Success {
            latency_ms,
            slo_ms,
            headroom,
        },
    }
}

/// The response header Envoy's router adds to answers from an upstream.
pub const UPSTREAM_TIME_HEADER: &str = "x-envoy-upstream-service-time";

/// Once actual usage is known, book the request on it: tokens and the
/// true marginal cost at the prices the decision booked (load, overage and
/// cold load included), the counterfactual at its list price.
///
/// An upstream's claim is bounded by what the request allowed: input by
/// the context window, output by the request's `max_tokens` (else the
/// context window). The excess is not booked, and `usage_capped` says so.
/// `max_output` is the request's own output budget, if it gave one.
#[inline]
pub fn book_usage(
    event: &mut Event,
    cfg: &Config,
    decision: &Decision,
    usage: Usage,
    max_output: Option<u32>,
) {
    book_usage_scaled(event, cfg, decision, usage, max_output, 1.0)
}

/// [`book_usage`] where the counterfactual destination's list price is
/// scaled by `counterfactual_scale`: the price factor there of the model
/// the request named (model routing; the booked prices are the
/// decision's, already at the served model's).
#[inline]
pub fn book_usage_scaled(
    event: &mut Event,
    cfg: &Config,
    decision: &Decision,
    usage: Usage,
    max_output: Option<u32>,
    counterfactual_scale: f64,
) {
    // A claim is bounded by the served model's own window (the ledger
    // bounds it the same way: `ace_pricing::token_bounds`).
    let (in_bound, out_own) = cfg
        .destinations
        .get(decision.index)
        .map_or((cfg.max_context_tokens, cfg.max_context_tokens), |d| {
            d.token_bounds(cfg.max_context_tokens)
        });
    let out_bound = max_output.unwrap_or(u32::MAX).min(out_own);
    let input = usage.input.min(in_bound);
    let output = usage.output.min(out_bound);
    event.usage_capped = input != usage.input || output != usage.output;
    event.tokens_in = input;
    event.tokens_out = output;
    event.tokens_cache_read = usage.cache_read.min(input);
    event.tokens_cache_write = usage.cache_write.min(input - event.tokens_cache_read);
    event.tokens_estimated = false;
    // Cached input at each destination's own cached price: the chosen
    // one's for the cost, the counterfactual's for what it would have
    // charged (a provider that caches would have cached it too).
    let billed = |d: usize| {
        let (read, write) = cfg
            .destinations
            .get(d)
            .map_or((1.0, 1.0), ace_config::Destination::cache_factors);
        billed_input(
            input,
            event.tokens_cache_read,
            event.tokens_cache_write,
            read,
            write,
        )
    };
    event.marginal_usd = decision.cost_of_billed(billed(decision.index), output);
    let list = decision.counterfactual_index.and_then(|i| {
        cfg.models
            .get(i)
            .map(|m| m.rest_usd_billed(billed(i), output) * counterfactual_scale)
    });
    if let Some(c) = list {
        event.counterfactual_usd = Some(c);
    }
}

/// The response headers ACE adds when `response_headers` is on:
/// destination, reason, tier and booked cost. `cost` is scratch space for
/// the formatted cost.
#[inline]
pub fn response_headers<'a>(
    cfg: &'a Config,
    decision: &Decision,
    cost: &'a mut event::UsdBuffer,
) -> Option<[(&'static str, &'a str); 4]> {
    let dest = cfg.destinations.get(decision.index)?;
    let tier = cfg
        .models
        .get(decision.index)
        .map_or("?", |m| m.tier.as_str());
    Some([
        (RESPONSE_DESTINATION_HEADER, dest.name.as_str()),
        (RESPONSE_REASON_HEADER, decision.reason.as_str()),
        (RESPONSE_TIER_HEADER, tier),
        (RESPONSE_COST_HEADER, cost.format(decision.marginal_usd)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counter written in place gives what formatting each id would,
    /// across every carry (…9 to …a, …f to …10, all f to all 0).
    #[test]
    fn event_ids_count_in_hex_as_event_id_writes_them() {
        let prefix = 0x0123_4567_89ab_cdef;
        let mut ids = EventIds::new(prefix);
        for n in 1..=5_000u64 {
            assert_eq!(ids.next_id(), event_id(prefix, n), "id {n}");
        }
        let mut ids = EventIds {
            last: event_id(prefix, u64::MAX - 1),
        };
        assert_eq!(ids.next_id(), event_id(prefix, u64::MAX));
        assert_eq!(ids.next_id(), event_id(prefix, 0));
        assert_eq!(ids.next_id(), event_id(prefix, 1));
    }

    #[test]
    fn error_bodies_are_json_naming_the_problem() {
        let b = error_body("no_feasible_destination", "x", "say \"why\"");
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v["error"]["type"], "no_feasible_destination");
        assert_eq!(v["error"]["message"], "say \"why\"");
    }

    /// A batch request values its own time at nothing but pays, past a
    /// knee, what its queueing costs the timed work it slows.
    #[test]
    fn queueing_is_priced_at_least_at_the_congestion_floor() {
        let cfg = Config::parse(
            br#"{"allow_no_policy":true,"destinations":[{"name":"a","cluster":"ca"}],
                 "latency_classes":{"interactive":{"usd_per_s":0.01,"ttft_ms":1000},
                                    "standard":{"usd_per_s":0.002,"ttft_ms":3000},
                                    "batch":0}}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let value = |class: &str| {
            let mut e = Event {
                latency_class: Some(Text::Owned(class.to_string())),
                ..Event::default()
            };
            plan(&cfg, &mut e, None, Some(100), 0).latency_usd_per_s
        };
        assert_eq!(value("batch"), 0.002);
        assert_eq!(value("standard"), 0.002);
        assert_eq!(value("interactive"), 0.01);
    }
}
