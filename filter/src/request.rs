//! One request's steps that do not touch the host.
//!
//! ACE runs inside Envoy two ways: as a proxy-wasm filter (`wasm`, what
//! Istio's WasmPlugin loads) and as an Envoy dynamic module (`ace-dynamic`,
//! a native library, for proxies where a Wasm host call costs too much).
//! Both run the same request the same way; only how they read headers,
//! keep the fleet's shared state and answer differs. Everything else lives
//! here, once: what a request's headers say ([`capture`]), what it asks
//! of the core ([`plan`]), which destinations may serve it ([`feasible`]),
//! what an answer means for the destination's health ([`outcome`]), what
//! the request turned out to cost ([`book_usage`]), and the counters both
//! report ([`Counters`]).

use crate::attributes;
use crate::body::{self, BodyError, RequestBody};
use crate::config::Config;
use crate::event::{self, Event, Text};
use crate::headers::{self, Pairs};
use crate::usage::Usage;
use ace_core::dispatch::{Decision, Refusal, Request};
use ace_core::health::{Change, Outcome};
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

/// Capture a request's headers (the whole map, read in one go) at `now` (ms).
pub fn capture(headers: Pairs, now: u64) -> Head {
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
    let event = Event {
        schema: event::SCHEMA,
        headers,
        request_id,
        time_ms: now,
        tenant,
        data_class,
        latency_class,
        model_requested: model,
        destination: None,
        tier: None,
        tokens_in: 0,
        tokens_out: 0,
        tokens_estimated: true,
        status: 0,
        latency_ms: 0,
        slo_ms: None,
        slo_met: None,
        marginal_usd: 0.0,
        counterfactual_usd: None,
        reason: "",
    };
    Head {
        event,
        content_length,
        json,
    }
}

impl Head {
    /// Whether to hold the headers and read the body before routing: the
    /// configuration asks for it, and a JSON body is coming.
    pub fn wants_body(&self, cfg: &Config, end_of_stream: bool) -> bool {
        cfg.read_body && !end_of_stream && self.content_length != Some(0) && self.json
    }
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
    let tokens_in = body
        .map(|b| b.tokens_in)
        .unwrap_or_else(|| content_length.map_or(1, body::estimate_tokens));
    let tokens_out = body
        .and_then(|b| b.max_output_tokens)
        .unwrap_or(cfg.default_output_tokens);
    event.time_ms = now;
    event.tokens_in = tokens_in;
    event.tokens_out = tokens_out;
    if event.model_requested.is_none() {
        event.model_requested = body.and_then(|b| b.model.clone()).map(Text::Owned);
    }
    Request {
        tokens_in,
        tokens_out,
        latency_usd_per_s: cfg.latency_value(event.text(&event.latency_class)),
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
pub fn feasible(
    cfg: &Config,
    tables: Option<&Tables<'_>>,
    event: &Event,
    body_model: Option<&str>,
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
    if let Err(a) = attributes::resolve(tables, policy, &event.headers, body_model, values) {
        return Err(Refused {
            status: 400,
            kind: "missing_attribute",
            reason: attribute_reason(&a.name),
            message: format!(
                "this request needs the `{}` attribute; send it in the `{}` header",
                a.name, a.header
            ),
        });
    }
    if let Err(e) = tables.feasible(values, mask) {
        log::error!("feasibility lookup failed: {e}");
        mask.fill(0);
    }
    Ok(())
}

/// What to do with a request body that did not parse: refuse it when the
/// policy needs the model and no header named one, else `None` (route on
/// the body's size instead; the body only refines the estimate).
pub fn body_refusal(cfg: &Config, event: &Event, err: &BodyError) -> Option<Refused> {
    let needs_model = cfg
        .policy
        .as_ref()
        .is_some_and(|p| p.attributes.iter().any(|a| a.name == "model"));
    (needs_model && event.model_requested.is_none()).then(|| Refused {
        status: 400,
        kind: "bad_request_body",
        reason: "bad_request_body",
        message: err.to_string(),
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

/// Record the decision in the request's event.
pub fn record(event: &mut Event, cfg: &Config, names: &[Arc<str>], decision: &Decision) {
    event.destination = names.get(decision.index).cloned();
    event.tier = cfg.models.get(decision.index).map(|m| m.tier.as_str());
    event.slo_ms = cfg.destinations.get(decision.index).and_then(|d| d.slo_ms);
    event.marginal_usd = decision.marginal_usd;
    event.counterfactual_usd = decision.counterfactual_usd;
    event.reason = decision.reason.as_str();
}

/// What an upstream's answer (its `:status` and `retry-after` values)
/// `latency_ms` after the decision means for the destination's health.
/// Envoy's own replies for refused connections and timeouts are 5xx.
pub fn outcome(
    status: u32,
    retry_after: Option<&[u8]>,
    latency_ms: u64,
    slo_ms: Option<u64>,
) -> Outcome {
    match status {
        429 => Outcome::Throttled {
            retry_after_ms: headers::number::<u64>(retry_after).map(|s| s.saturating_mul(1000)),
        },
        500..=599 | 0 => Outcome::Failure,
        _ => Outcome::Success { latency_ms, slo_ms },
    }
}

/// Once actual usage is known, book the request on it: tokens and both
/// costs are recomputed from the destination's and the counterfactual's
/// cost models at list (unloaded) prices.
pub fn book_usage(event: &mut Event, cfg: &Config, decision: &Decision, usage: Usage) {
    event.tokens_in = usage.input;
    event.tokens_out = usage.output;
    event.tokens_estimated = false;
    let price = |i: usize| {
        cfg.models
            .get(i)
            .and_then(|m| m.marginal_usd(usage.input, usage.output, true, 0, None))
    };
    if let Some(c) = price(decision.index) {
        event.marginal_usd = c;
    }
    if let Some(c) = decision.counterfactual_index.and_then(price) {
        event.counterfactual_usd = Some(c);
    }
}

/// The response headers ACE adds when `response_headers` is on:
/// destination, reason, tier and booked cost. `cost` is scratch space for
/// the formatted cost.
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

/// USD as whole nano-dollars for the dollar counters (0 when not positive).
pub fn nano_usd(usd: f64) -> u64 {
    if usd.is_finite() && usd > 0.0 {
        // Rounds half up (usd > 0); the cast saturates.
        (usd * 1e9 + 0.5) as u64
    } else {
        0
    }
}

/// The counters both adapters report, by position: the fleet-wide ones,
/// then three per destination. Envoy shows them under its own prefix
/// (`wasmcustom.` for the Wasm filter); dollars are counted in nano-USD.
#[derive(Debug, Clone, Copy)]
pub struct Counters;

impl Counters {
    /// Requests seen.
    pub const REQUESTS: usize = 0;
    /// Requests refused with no feasible, healthy destination.
    pub const NO_DESTINATION: usize = 1;
    /// Destinations tripped out.
    pub const TRIPS: usize = 2;
    /// Capacity caps cut by a 429.
    pub const CAP_CUTS: usize = 3;
    /// Destinations derated for slowness.
    pub const DERATES: usize = 4;
    /// Booked (true marginal) cost, nano-USD.
    pub const BOOKED_NANO_USD: usize = 5;
    /// The all-pay-as-you-go counterfactual, nano-USD.
    pub const COUNTERFACTUAL_NANO_USD: usize = 6;
    /// Requests run again on the next destination (`retry_next`, the
    /// dynamic module); not counted again in [`Counters::REQUESTS`].
    pub const RETRIES: usize = 7;
    const FLEET: [&'static str; 8] = [
        "ace.requests",
        "ace.no_destination",
        "ace.trips",
        "ace.cap_cuts",
        "ace.derates",
        "ace.booked_nano_usd",
        "ace.counterfactual_nano_usd",
        "ace.retries",
    ];

    /// Every counter's name for `cfg`, in position order.
    pub fn names(cfg: &Config) -> Vec<String> {
        let mut names: Vec<String> = Self::FLEET.iter().map(|s| s.to_string()).collect();
        for (d, m) in cfg.destinations.iter().zip(&cfg.models) {
            let base = format!("ace.destination.{}.tier.{}", d.name, m.tier.as_str());
            for what in ["requests", "failures", "throttled"] {
                names.push(format!("{base}.{what}"));
            }
        }
        names
    }

    /// What a decision counts: the booked and counterfactual dollars, and
    /// one request on its destination.
    pub fn decided(decision: &Decision) -> [(usize, u64); 3] {
        [
            (Self::BOOKED_NANO_USD, nano_usd(decision.marginal_usd)),
            (
                Self::COUNTERFACTUAL_NANO_USD,
                nano_usd(decision.counterfactual_usd.unwrap_or(0.0)),
            ),
            (Self::destination_requests(decision.index), 1),
        ]
    }

    /// Requests sent to destination `d`.
    pub const fn destination_requests(d: usize) -> usize {
        Self::FLEET.len() + 3 * d
    }

    /// The per-destination counter an outcome on `d` counts in, if any.
    pub fn destination_outcome(d: usize, outcome: Option<Outcome>) -> Option<usize> {
        match outcome? {
            Outcome::Failure => Some(Self::FLEET.len() + 3 * d + 1),
            Outcome::Throttled { .. } => Some(Self::FLEET.len() + 3 * d + 2),
            Outcome::Success { .. } => None,
        }
    }

    /// The counter a health change counts in, if any.
    pub fn change(change: Change) -> Option<usize> {
        match change {
            Change::Tripped { .. } => Some(Self::TRIPS),
            Change::CapCut { .. } => Some(Self::CAP_CUTS),
            Change::Derated { .. } => Some(Self::DERATES),
            Change::Recovered | Change::None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_positions_match_names() {
        let cfg = Config::parse(
            br#"{"destinations":[{"name":"a","cluster":"a"},{"name":"b","cluster":"b","tier":"payg","usd_per_input_token":1e-6,"usd_per_output_token":1e-6}]}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let names = Counters::names(&cfg);
        let at = |i: usize| names.get(i).map(String::as_str);
        assert_eq!(at(Counters::REQUESTS), Some("ace.requests"));
        assert_eq!(
            at(Counters::COUNTERFACTUAL_NANO_USD),
            Some("ace.counterfactual_nano_usd")
        );
        assert!(at(Counters::destination_requests(1))
            .is_some_and(|n| n.starts_with("ace.destination.b.tier.payg.requests")));
        let fail = Counters::destination_outcome(1, Some(Outcome::Failure));
        assert!(fail
            .and_then(at)
            .is_some_and(|n| n.ends_with("b.tier.payg.failures")));
        assert_eq!(names.len(), 8 + 6);
        assert_eq!(at(Counters::RETRIES), Some("ace.retries"));
    }

    #[test]
    fn error_bodies_are_json_naming_the_problem() {
        let b = error_body("no_feasible_destination", "x", "say \"why\"");
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v["error"]["type"], "no_feasible_destination");
        assert_eq!(v["error"]["message"], "say \"why\"");
    }
}
