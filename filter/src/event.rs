//! The event spine: exactly one event per request, as one JSON line.
//!
//! The filter writes the event into Envoy filter state (`wasm.ace_event`),
//! and the access log emits it with `%FILTER_STATE(wasm.ace_event:PLAIN)%`,
//! so every request, served or refused, lands on the same line format that
//! the ledger reads. Costs are the core's numbers: `marginal_usd` is the true
//! marginal cost (bias and derate never touch it) and `counterfactual_usd`
//! is what the cheapest feasible pay-as-you-go destination would have
//! charged.

use serde::Serialize;

/// Version of the event's fields; bump on any incompatible change.
pub const SCHEMA: &str = "ace.event/1";

/// Filter-state key (Envoy prefixes it with `wasm.`).
pub const PROPERTY: &str = "ace_event";

/// One request's event.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Event {
    /// [`SCHEMA`].
    pub schema: &'static str,
    /// Envoy's `x-request-id`.
    pub request_id: Option<String>,
    /// When the decision was made, ms since the Unix epoch.
    pub time_ms: u64,
    /// `x-ace-tenant`.
    pub tenant: Option<String>,
    /// `x-ace-data-class`.
    pub data_class: Option<String>,
    /// `x-ace-latency-class`.
    pub latency_class: Option<String>,
    /// The model the client asked for (`x-ace-model`).
    pub model_requested: Option<String>,
    /// The model the destination served (today: the one requested).
    pub model_served: Option<String>,
    /// Destination name, when one was chosen.
    pub destination: Option<String>,
    /// Its tier.
    pub tier: Option<&'static str>,
    /// Estimated input tokens.
    pub tokens_in: u32,
    /// Estimated output tokens.
    pub tokens_out: u32,
    /// Whether the token counts are estimates (true until usage parsing).
    pub tokens_estimated: bool,
    /// Response status sent to the client.
    pub status: u32,
    /// Time to response headers, ms.
    pub latency_ms: u64,
    /// The destination's SLO, ms.
    pub slo_ms: Option<u64>,
    /// Whether the SLO held (`None` when there is no SLO).
    pub slo_met: Option<bool>,
    /// True marginal cost, USD (0 when refused).
    pub marginal_usd: f64,
    /// All-pay-as-you-go counterfactual, USD.
    pub counterfactual_usd: Option<f64>,
    /// Decision reason or refusal code.
    pub reason: &'static str,
}

impl Event {
    /// One JSON line (no trailing newline).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| String::from("{}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialises_every_field_on_one_line() {
        let e = Event {
            schema: SCHEMA,
            request_id: Some("r-1".into()),
            time_ms: 5,
            tenant: Some("acme".into()),
            data_class: Some("eu-personal".into()),
            latency_class: None,
            model_requested: Some("m".into()),
            model_served: Some("m".into()),
            destination: Some("owned".into()),
            tier: Some("inhouse"),
            tokens_in: 10,
            tokens_out: 20,
            tokens_estimated: true,
            status: 200,
            latency_ms: 12,
            slo_ms: Some(100),
            slo_met: Some(true),
            marginal_usd: 0.25,
            counterfactual_usd: Some(1.0),
            reason: "cheapest",
        };
        let line = e.to_json();
        assert!(!line.contains('\n'));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        for k in [
            "schema",
            "request_id",
            "time_ms",
            "tenant",
            "data_class",
            "model_requested",
            "model_served",
            "destination",
            "tier",
            "tokens_in",
            "tokens_out",
            "status",
            "latency_ms",
            "slo_ms",
            "slo_met",
            "marginal_usd",
            "counterfactual_usd",
            "reason",
        ] {
            assert!(v.get(k).is_some(), "missing {k}");
        }
    }
}
