//! Pricing an event: the line's facts, priced by [`ace_pricing`] (the
//! one pricing the simulator and reports share), after the ledger's own
//! bound on its token counts.
//!
//! The filter's own figures are compared, never booked; a difference of
//! more than a nano-dollar is flagged on the row.

use crate::event::Event;
use crate::kind::filter_nano;
use crate::money::Nano;
use ace_config::Config;
use ace_flow::Setup;
pub use ace_pricing::{model_of, Facts, PriceError, Priced};
use std::borrow::Cow;

/// Bound `e`'s token counts as a bill would ([`ace_pricing::token_bounds`]):
/// by its destination's model's own context window (`max_input_tokens`,
/// `max_output_tokens`), within the configuration's `max_context_tokens`,
/// which the filter bounds an upstream's usage claim by
/// (`ace_flow::request::book_usage`). The excess is not booked, and
/// `usage_capped` says so. The filter also bounds output by the request's
/// own `max_tokens`, which the line does not carry. Returns whether a
/// count was cut.
pub fn bound_tokens(e: &mut Event, cfg: &Config) -> bool {
    let (bound_in, bound_out) = ace_pricing::token_bounds(cfg, e.destination.as_deref());
    let capped = e.tokens_in > bound_in || e.tokens_out > bound_out;
    if capped {
        e.tokens_in = e.tokens_in.min(bound_in);
        e.tokens_out = e.tokens_out.min(bound_out);
        e.usage_capped = true;
    }
    capped
}

/// What pricing reads of `e`, borrowed.
pub fn facts(e: &Event) -> Facts<'_> {
    fn text(s: &Option<String>) -> Option<Cow<'_, str>> {
        s.as_deref().map(Cow::Borrowed)
    }
    Facts {
        destination: text(&e.destination),
        tier: text(&e.tier),
        tokens_in: e.tokens_in,
        tokens_out: e.tokens_out,
        tokens_cache_read: e.tokens_cache_read,
        tokens_cache_write: e.tokens_cache_write,
        status: e.status,
        warm: e.warm,
        overage: e.overage,
        cached: e.cached,
        model_requested: text(&e.model_requested),
        model_served: text(&e.model_served),
        tenant: text(&e.tenant),
        data_class: text(&e.data_class),
        latency_class: text(&e.latency_class),
        api: text(&e.api),
        live_usd_per_input_token: e.live_usd_per_input_token,
        live_usd_per_output_token: e.live_usd_per_output_token,
        live_usd_per_hour: e.live_usd_per_hour,
    }
}

/// Price `e` under `setup` (the configuration with id `cfg_id`).
pub fn price(e: &Event, setup: &Setup, cfg_id: &str) -> Result<Priced, PriceError> {
    ace_pricing::price(&facts(e), setup, cfg_id)
}

/// Which of the filter's figures disagree with the ledger's by more than
/// a nano-dollar (names, comma-separated; empty when they agree).
pub fn disagreements(e: &Event, p: &Priced) -> String {
    let off = |filter: Option<Nano>, ledger: Option<Nano>| match (filter, ledger) {
        (Some(f), Some(l)) => f.abs_diff(l) > 1,
        (None, None) => false,
        _ => true,
    };
    let mut flags = Vec::new();
    if e.destination.is_some() && off(filter_nano(e.marginal_usd), Some(p.booked)) {
        flags.push("marginal_usd");
    }
    if e.destination.is_some() && off(filter_nano(e.counterfactual_usd), p.counterfactual) {
        flags.push("counterfactual_usd");
    }
    flags.join(",")
}
