//! Re-deriving what a request cost and what pay-as-you-go would have
//! charged, from the configuration the event names.
//!
//! - **Booked** (true marginal) cost: the served destination's cost curve
//!   for exactly the event's tokens ([`CostModel::marginal_usd`]): the
//!   tier's prices, or the reserved overage price when `overage`, plus the
//!   destination's `cold_load_usd` when `warm` is false. Bias and derate
//!   are not inputs, so they cannot move it.
//! - **Counterfactual**: the cheapest pay-as-you-go destination that the
//!   configuration's feasibility tables allow for the event's attributes
//!   (tenant, data class, latency class, model requested), at list price,
//!   for the same tokens (see `feasible` for attributes the event does
//!   not carry).
//! - **Served-model counterfactual**: the same for the model that served
//!   it; the two differ only when policy allowed a cheaper model.
//!
//! The filter's own figures are compared, never booked; a difference of
//! more than a nano-dollar is flagged on the row.

use crate::event::Event;
use crate::money::{self, Nano};
use ace_config::{Config, OnMissing};
use ace_core::cost::CostModel;
use ace_flow::routing::Routing;
use ace_flow::Setup;

/// The ledger's figures for one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Priced {
    /// True marginal cost (0 when no destination served it).
    pub booked: Nano,
    /// Cheapest feasible pay-as-you-go at list price for the model asked
    /// for; `None` when policy allows no pay-as-you-go destination.
    pub counterfactual: Option<Nano>,
    /// The same for the model served.
    pub served_counterfactual: Option<Nano>,
}

/// Why an event cannot be priced against its configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriceError(pub String);

impl std::fmt::Display for PriceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Bound `e`'s token counts by `cfg`'s `max_context_tokens`, as the filter
/// bounds an upstream's usage claim (`ace_flow::request::book_usage`):
/// the excess is not booked, and `usage_capped` says so. The filter also
/// bounds output by the request's own `max_tokens`, which the line does not
/// carry, so the context window is the ledger's bound for both. Returns
/// whether a count was cut.
pub fn bound_tokens(e: &mut Event, cfg: &Config) -> bool {
    let bound = cfg.max_context_tokens;
    let capped = e.tokens_in > bound || e.tokens_out > bound;
    if capped {
        e.tokens_in = e.tokens_in.min(bound);
        e.tokens_out = e.tokens_out.min(bound);
        e.usage_capped = true;
    }
    capped
}

/// Price `e` under `cfg` (the configuration with id `cfg_id`).
pub fn price(e: &Event, setup: &Setup, cfg_id: &str) -> Result<Priced, PriceError> {
    let cfg = &setup.config;
    let Some(dest) = e.destination.as_deref() else {
        return Ok(Priced::default());
    };
    let Some(i) = cfg.destinations.iter().position(|d| d.name == dest) else {
        return Err(PriceError(format!(
            "field `destination` is {dest:?}, which configuration {cfg_id} does not define; \
             register the configuration this filter really loaded"
        )));
    };
    let model = cfg.models.get(i).copied().unwrap_or_default();
    if let Some(t) = e.tier.as_deref() {
        if t != model.tier.as_str() {
            return Err(PriceError(format!(
                "field `tier` is {t:?} but configuration {cfg_id} makes {dest:?} {}",
                model.tier.as_str()
            )));
        }
    }
    let warm = e.warm != Some(false);
    // Past a cap of 0 the core prices a reserved block at its overage.
    let cap = e.overage.then_some(0);
    let tokens = model
        .marginal_usd(e.tokens_in, e.tokens_out, true, 0, cap)
        .ok_or_else(|| {
            PriceError(format!(
                "field `overage` is true but {dest:?} in configuration {cfg_id} is {} with no \
                 overage price",
                model.tier.as_str()
            ))
        })?;
    // The served model's price on the destination (model routing), plus
    // a cold load; an answer from the cache costs nothing at the margin.
    let served = e.model_served.as_deref().or(e.model_requested.as_deref());
    let usd = if e.cached {
        0.0
    } else {
        let cold = if warm { 0.0 } else { model.cold_load_usd };
        tokens * factor(setup.routing.as_ref(), i, served) + cold
    };
    let booked = nano(usd, "booked cost")?;
    // Against the model named (a class: its reference model), served as
    // named; then the model served, as served.
    let named = e.model_requested.as_deref();
    let reference = setup
        .routing
        .as_ref()
        .zip(named)
        .and_then(|(r, n)| r.reference_of(n))
        .or(named);
    let counterfactual = cheapest_payg(e, setup, reference, false)?;
    let substituted = e.model_served.is_some()
        && e.model_served != e.model_requested
        && setup
            .routing
            .as_ref()
            .zip(named)
            .and_then(|(r, n)| r.asked(n))
            .is_some_and(|a| a.member.is_some());
    let served_counterfactual = if e.model_served == e.model_requested || e.model_served.is_none() {
        counterfactual
    } else {
        cheapest_payg(e, setup, e.model_served.as_deref(), substituted)?
    };
    Ok(Priced {
        booked,
        counterfactual,
        served_counterfactual,
    })
}

fn nano(usd: f64, what: &str) -> Result<Nano, PriceError> {
    money::from_usd(usd).ok_or_else(|| PriceError(format!("the {what} is not a finite amount")))
}

/// The price factor of `model` on destination `d` (model routing's
/// `cost_factors`; 1 without them).
fn factor(routing: Option<&Routing>, d: usize, model: Option<&str>) -> f64 {
    let Some((r, model)) = routing.zip(model) else {
        return 1.0;
    };
    r.members
        .iter()
        .position(|m| m.name == model.trim())
        .map_or(1.0, |k| r.factor(k, d))
}

/// The cheapest feasible pay-as-you-go list price for `e`'s tokens, with
/// `model` as the model attribute (at its price there) and `substituted`
/// as model routing's computed attribute.
fn cheapest_payg(
    e: &Event,
    setup: &Setup,
    model: Option<&str>,
    substituted: bool,
) -> Result<Option<Nano>, PriceError> {
    let cfg = &setup.config;
    let mask = feasible(e, cfg, model, substituted);
    let best = cfg
        .models
        .iter()
        .enumerate()
        .filter(|(i, m)| m.tier.is_pay_as_you_go() && bit(&mask, *i))
        .map(|(i, m)| {
            m.rest_usd(e.tokens_in, e.tokens_out) * factor(setup.routing.as_ref(), i, model)
        })
        .min_by(f64::total_cmp);
    best.map(|usd| nano(usd, "counterfactual")).transpose()
}

fn bit(mask: &[u64], i: usize) -> bool {
    mask.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1)
}

/// Most combinations of values of attributes the event does not carry
/// that feasibility is tried over; past it no counterfactual is claimed.
const MAX_COMBINATIONS: usize = 4096;

/// The destinations the configuration's tables allow for `e`'s attributes
/// (every one without tables).
///
/// The event carries tenant, data class, latency class and model, and the
/// computed `substituted` and `cached` follow from it; each is
/// looked up as the filter does (trimmed; unknown values fail closed; a
/// missing one takes the configured default, or, where the policy refuses
/// requests without it, allows nothing, as the filter refused them). An
/// attribute the tables read but the event does not carry (e.g.
/// `tp_degree`) is tried at every value it can take, and the feasible sets
/// are joined: the counterfactual is then the cheapest pay-as-you-go under
/// any value, a lower bound, so a saving is never overstated.
fn feasible(e: &Event, cfg: &Config, model: Option<&str>, substituted: bool) -> Vec<u64> {
    let words = cfg.destinations.len().div_ceil(64);
    let (Some(tables), Some(policy)) = (cfg.tables(), &cfg.policy) else {
        return cfg.warmth.mask(None).to_vec();
    };
    let mut values = vec![0u32; policy.attributes.len()];
    let mut free: Vec<(usize, u32)> = Vec::new();
    for (i, a) in policy.attributes.iter().enumerate() {
        let carried = match a.name.as_str() {
            "tenant" => Some(e.tenant.as_deref()),
            "data_class" => Some(e.data_class.as_deref()),
            "latency_class" => Some(e.latency_class.as_deref()),
            "model" => Some(model),
            // What the filter computes: the counterfactual is served
            // fresh, substituted as the caller says.
            "substituted" => Some(Some(if substituted { "true" } else { "false" })),
            "cached" => Some(Some("false")),
            _ => None,
        };
        let slot = match values.get_mut(i) {
            Some(s) => s,
            None => continue,
        };
        match carried {
            Some(Some(v)) => *slot = tables.value_index_bytes(i as u32, v.as_bytes().trim_ascii()),
            Some(None) if policy.on_missing == OnMissing::Reject => return vec![0; words],
            Some(None) => *slot = a.default_index,
            None => free.push((i, tables.value_count(i as u32))),
        }
    }
    let combinations = free
        .iter()
        .try_fold(1usize, |n, (_, count)| n.checked_mul(*count as usize + 1))
        .filter(|n| *n <= MAX_COMBINATIONS);
    let Some(combinations) = combinations else {
        return vec![0; words];
    };
    let mut mask = vec![0u64; words];
    let mut one = vec![0u64; words];
    for mut k in 0..combinations {
        for (i, count) in &free {
            if let Some(slot) = values.get_mut(*i) {
                let n = *count as usize + 1;
                *slot = (k % n) as u32;
                k /= n;
            }
        }
        if tables.feasible(&values, &mut one).is_ok() {
            mask.iter_mut().zip(&one).for_each(|(m, o)| *m |= o);
        }
    }
    mask
}

/// The filter's figure, to compare with the ledger's.
pub fn filter_nano(usd: Option<f64>) -> Option<Nano> {
    usd.and_then(money::from_usd)
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

/// The core's cost model of destination `name` in `cfg`.
pub fn model_of<'a>(cfg: &'a Config, name: &str) -> Option<&'a CostModel> {
    let i = cfg.destinations.iter().position(|d| d.name == name)?;
    cfg.models.get(i)
}
