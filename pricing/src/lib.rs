//! ace-pricing: the one pricing of a request, for everything that states
//! money: the ledger books with it, the simulator charges every policy's
//! requests with it, and reports read what they booked.
//!
//! Why one crate: a figure priced twice is priced two ways. The simulator
//! once charged a substituted model at the reference model's price and
//! reported a cost the ledger, reading the same requests, did not book.
//! Here the rules are written once, over the facts an event line states
//! ([`Facts`]), so any two figures for the same requests agree to the
//! nano-dollar.
//!
//! - **Booked** (true marginal) cost: the served destination's cost curve
//!   for exactly the request's tokens ([`CostModel::marginal_usd`]): the
//!   tier's prices (the control service's where the request was decided on
//!   them, the line's `live_*` fields: a spot price, a price feed), or the
//!   reserved overage price when `overage`, at the
//!   served model's price factor (model routing's `cost_factors`), plus
//!   the destination's `cold_load_usd` when `warm` is false; nothing for
//!   an answer from the cache. Bias and derate are not inputs, so they
//!   cannot move it.
//! - **Counterfactual**: the cheapest pay-as-you-go destination that the
//!   configuration's feasibility tables allow for the request's attributes
//!   (tenant, data class, latency class, model requested), at list price,
//!   for the same tokens (see `feasible` for attributes the line does not
//!   carry).
//! - **Served-model counterfactual**: the same for the model that served
//!   it; the two differ only when policy allowed a cheaper model.
//! - **Served** ([`served`]): which requests earn a counterfactual at all.
//!
//! Money is integer nano-dollars ([`money`]): each request's figures are
//! computed once in `f64`, as the core prices them, rounded to the
//! nano-dollar, and only integers are summed after that.
#![forbid(unsafe_code)]
// The no-panic lints of product code (tests/tests/lints.rs checks them;
// tests may still unwrap and index: clippy.toml).
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![deny(clippy::panic, clippy::indexing_slicing)]

pub mod money;

use ace_config::{Api, Config, OnMissing};
use ace_core::cost::CostModel;
use ace_flow::routing::Routing;
use ace_flow::Setup;
use ace_snapshot::{MAX_USD_PER_HOUR, MAX_USD_PER_TOKEN};
use money::Nano;
use serde::Deserialize;
use std::borrow::Cow;

/// What pricing reads of one request: the fields of its event line
/// ([`ace_event::event_fields!`]) of the same names (a test holds each
/// name to the list). It reads straight off a line
/// (`serde_json::from_slice::<Facts>`); other fields are ignored.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Facts<'a> {
    /// The destination that served it (none when refused).
    #[serde(borrow)]
    pub destination: Option<Cow<'a, str>>,
    /// Its tier, as the line states it (checked against the
    /// configuration).
    #[serde(borrow)]
    pub tier: Option<Cow<'a, str>>,
    /// Input tokens.
    pub tokens_in: u32,
    /// Output tokens.
    pub tokens_out: u32,
    /// Of the input, read from the provider's prompt cache.
    #[serde(default)]
    pub tokens_cache_read: u32,
    /// Of the input, written to it.
    #[serde(default)]
    pub tokens_cache_write: u32,
    /// The status the client got.
    pub status: u32,
    /// Whether the model was resident (`false`: a cold load is charged).
    pub warm: Option<bool>,
    /// Whether a reserved block served past its commitment.
    pub overage: bool,
    /// Whether ACE's cache answered.
    pub cached: bool,
    /// The model (or class) asked for.
    #[serde(borrow)]
    pub model_requested: Option<Cow<'a, str>>,
    /// The model that served it.
    #[serde(borrow)]
    pub model_served: Option<Cow<'a, str>>,
    /// The tenant.
    #[serde(borrow)]
    pub tenant: Option<Cow<'a, str>>,
    /// The data class.
    #[serde(borrow)]
    pub data_class: Option<Cow<'a, str>>,
    /// The latency class.
    #[serde(borrow)]
    pub latency_class: Option<Cow<'a, str>>,
    /// The API the client's path asked for (only destinations serving it
    /// were feasible).
    #[serde(default, borrow)]
    pub api: Option<Cow<'a, str>>,
    /// The destination's price per input token the request was decided
    /// on, when the control service had set it.
    pub live_usd_per_input_token: Option<f64>,
    /// The same per output token.
    pub live_usd_per_output_token: Option<f64>,
    /// The destination's GPU-hour price the request was decided on, when
    /// the control service had set it.
    pub live_usd_per_hour: Option<f64>,
}

impl Facts<'_> {
    /// Whether the request counts as served ([`served`]).
    pub fn served(&self) -> bool {
        served(self.destination.is_some(), self.cached, self.status)
    }
}

/// Whether a request counts as served: a destination (`routed`) or the
/// cache answered, with anything but a 5xx or a 429. Only served requests
/// earn a counterfactual, and so a saving.
pub fn served(routed: bool, cached: bool, status: u32) -> bool {
    (routed || cached) && (1..500).contains(&status) && status != 429
}

/// The books' figures for one request.
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

/// Why a request cannot be priced against its configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriceError(pub String);

impl std::fmt::Display for PriceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Price `e` under `setup` (the configuration with id `cfg_id`, which
/// errors name).
pub fn price(e: &Facts<'_>, setup: &Setup, cfg_id: &str) -> Result<Priced, PriceError> {
    price_with(e, setup, cfg_id, None)
}

/// The feasible sets of the attribute combinations already priced under
/// one configuration: pricing many lines of one configuration (a
/// simulated run, an ingest) then looks the tables up once per
/// combination, not once per line. Bounded: past [`Memo::MAX`]
/// combinations it starts afresh, so hostile lines cannot grow it.
#[derive(Debug, Default)]
pub struct Memo {
    masks: std::collections::HashMap<Vec<u8>, Vec<u64>>,
    key: Vec<u8>,
}

impl Memo {
    /// The most combinations kept.
    pub const MAX: usize = 4096;

    /// [`price`], remembering feasible sets. `setup` must be the same
    /// configuration on every call.
    pub fn price(
        &mut self,
        e: &Facts<'_>,
        setup: &Setup,
        cfg_id: &str,
    ) -> Result<Priced, PriceError> {
        price_with(e, setup, cfg_id, Some(self))
    }

    /// The feasible set for `e` with `model` and `substituted`.
    fn feasible(
        &mut self,
        e: &Facts<'_>,
        cfg: &Config,
        model: Option<&str>,
        substituted: bool,
    ) -> &[u64] {
        self.key.clear();
        for v in [
            e.tenant.as_deref(),
            e.data_class.as_deref(),
            e.latency_class.as_deref(),
            model,
            e.api.as_deref(),
        ] {
            match v {
                // Length-prefixed: no two tuples share a key.
                Some(v) => {
                    self.key.push(1);
                    self.key.extend_from_slice(&(v.len() as u64).to_le_bytes());
                    self.key.extend_from_slice(v.as_bytes());
                }
                None => self.key.push(0),
            }
        }
        self.key.push(u8::from(substituted));
        if !self.masks.contains_key(&self.key) {
            if self.masks.len() >= Memo::MAX {
                self.masks.clear();
            }
            let mask = feasible(e, cfg, model, substituted);
            self.masks.insert(self.key.clone(), mask);
        }
        self.masks.get(&self.key).map_or(&[], Vec::as_slice)
    }
}

fn price_with(
    e: &Facts<'_>,
    setup: &Setup,
    cfg_id: &str,
    mut memo: Option<&mut Memo>,
) -> Result<Priced, PriceError> {
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
    let mut model = cfg.models.get(i).copied().unwrap_or_default();
    live(&mut model, e)?;
    if let Some(t) = e.tier.as_deref() {
        if t != model.tier.as_str() {
            return Err(PriceError(format!(
                "field `tier` is {t:?} but configuration {cfg_id} makes {dest:?} {}",
                model.tier.as_str()
            )));
        }
    }
    let warm = e.warm != Some(false);
    // Past a cap of 0 that is its commitment (not its provider's limit)
    // the core prices a reserved block at its overage.
    let cap = e.overage.then_some(0);
    let tokens = model
        .marginal_usd_billed(billed(e, cfg, i), e.tokens_out, true, 0, cap, false)
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
    let counterfactual = cheapest_payg(e, setup, reference, false, memo.as_deref_mut())?;
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
        cheapest_payg(e, setup, e.model_served.as_deref(), substituted, memo)?
    };
    Ok(Priced {
        booked,
        counterfactual,
        served_counterfactual,
    })
}

/// Put the prices `e` was decided on (the control service's, where it had
/// set them) in `model`'s place: the books charge what the decision saw.
/// A price outside what the control service itself accepts is refused.
fn live(model: &mut CostModel, e: &Facts<'_>) -> Result<(), PriceError> {
    let check = |name: &str, v: f64, max: f64| {
        if v.is_finite() && (0.0..=max).contains(&v) {
            Ok(v)
        } else {
            Err(PriceError(format!(
                "field `{name}` is {v}, not a price from 0 to {max} USD; the line is wrong"
            )))
        }
    };
    match (e.live_usd_per_input_token, e.live_usd_per_output_token) {
        (Some(i), Some(o)) => {
            model.usd_per_input_token = check("live_usd_per_input_token", i, MAX_USD_PER_TOKEN)?;
            model.usd_per_output_token = check("live_usd_per_output_token", o, MAX_USD_PER_TOKEN)?;
        }
        (None, None) => {}
        _ => {
            return Err(PriceError(
                "fields `live_usd_per_input_token` and `live_usd_per_output_token` come together \
                 (the control service sets both); the line is wrong"
                    .into(),
            ))
        }
    }
    if let Some(h) = e.live_usd_per_hour {
        model.usd_per_gpu_hour = check("live_usd_per_hour", h, MAX_USD_PER_HOUR)?;
    }
    Ok(())
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
    e: &Facts<'_>,
    setup: &Setup,
    model: Option<&str>,
    substituted: bool,
    memo: Option<&mut Memo>,
) -> Result<Option<Nano>, PriceError> {
    let cfg = &setup.config;
    let owned;
    let mask = match memo {
        Some(m) => m.feasible(e, cfg, model, substituted),
        None => {
            owned = feasible(e, cfg, model, substituted);
            &owned
        }
    };
    let best = cfg
        .models
        .iter()
        .enumerate()
        .filter(|(i, m)| m.tier.is_pay_as_you_go() && bit(mask, *i))
        .map(|(i, m)| {
            m.rest_usd_billed(billed(e, cfg, i), e.tokens_out)
                * factor(setup.routing.as_ref(), i, model)
        })
        .min_by(f64::total_cmp);
    best.map(|usd| nano(usd, "counterfactual")).transpose()
}

/// `e`'s input as destination `i` bills it: its prompt-cache reads and
/// writes at its own cached prices (as the filter books them).
fn billed(e: &Facts<'_>, cfg: &Config, i: usize) -> f64 {
    let (read, write) = cfg
        .destinations
        .get(i)
        .map_or((1.0, 1.0), ace_config::Destination::cache_factors);
    ace_core::cost::billed_input(
        e.tokens_in,
        e.tokens_cache_read,
        e.tokens_cache_write,
        read,
        write,
    )
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
fn feasible(e: &Facts<'_>, cfg: &Config, model: Option<&str>, substituted: bool) -> Vec<u64> {
    let mut mask = allowed(e, cfg, model, substituted);
    // Only destinations serving the request's API, as the filter narrowed.
    let api = e
        .api
        .as_deref()
        .and_then(|a| Api::ALL.into_iter().find(|x| x.name() == a));
    cfg.serving.narrow(api, &mut mask);
    mask
}

/// The destinations the tables allow for `e` (see [`feasible`]).
fn allowed(e: &Facts<'_>, cfg: &Config, model: Option<&str>, substituted: bool) -> Vec<u64> {
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

impl Priced {
    /// What a served request adds to the counterfactual: its
    /// counterfactual, or its own booked cost where pay-as-you-go could not
    /// have served it (no saving claimed either way).
    pub fn counterfactual_or_booked(&self) -> Nano {
        self.counterfactual.unwrap_or(self.booked)
    }
}

/// The most input and output tokens one request served by destination
/// `name` is booked for: its model's own bounds (`max_input_tokens`,
/// `max_output_tokens`: the context window LiteLLM's price file gives the
/// model), within the configuration's `max_context_tokens`, which alone
/// bounds a request no destination served (or one `cfg` does not define).
/// A provider's bill never charges past its model's window, so a usage
/// claim past it is not booked either: a hostile answer claiming a million
/// tokens of gpt-4o books 128,000 in and 16,384 out (USD 0.48), not the
/// USD 13.11 of the configuration's bound.
pub fn token_bounds(cfg: &Config, name: Option<&str>) -> (u32, u32) {
    name.and_then(|n| cfg.destinations.iter().find(|d| d.name == n))
        .map_or((cfg.max_context_tokens, cfg.max_context_tokens), |d| {
            d.token_bounds(cfg.max_context_tokens)
        })
}

/// The core's cost model of destination `name` in `cfg`.
pub fn model_of<'a>(cfg: &'a Config, name: &str) -> Option<&'a CostModel> {
    let i = cfg.destinations.iter().position(|d| d.name == name)?;
    cfg.models.get(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = r#"{"allow_no_policy":true,"destinations":[
        {"name":"spot","cluster":"spot","tier":"spot","capacity":8,
         "usd_per_gpu_hour":4.0,"tokens_per_second":1000,"eviction_premium":0.0},
        {"name":"api","cluster":"api","tier":"payg",
         "usd_per_input_token":1e-6,"usd_per_output_token":2e-6}]}"#;

    fn setup() -> Setup {
        Setup::parse(CONFIG.as_bytes()).expect("config")
    }

    fn line(extra: &str) -> String {
        format!(
            r#"{{"destination":"spot","tier":"spot","tokens_in":1000,"tokens_out":500,
                "status":200,"warm":true,"model_requested":"m"{extra}}}"#
        )
    }

    fn priced(extra: &str) -> Result<Priced, PriceError> {
        let text = line(extra);
        let facts: Facts = serde_json::from_str(&text).expect("facts");
        price(&facts, &setup(), "cfg")
    }

    #[test]
    fn a_line_is_priced_at_the_price_its_request_was_decided_on() {
        // 4 USD an hour over 1,000 tokens a second: 4/3.6e6 per token.
        let configured = priced("").expect("priced");
        assert_eq!(
            configured.booked,
            money::from_usd(1500.0 * 4.0 / 3.6e6).unwrap()
        );
        let live = priced(r#","live_usd_per_hour":2.0"#).expect("priced");
        assert_eq!(live.booked, configured.booked / 2);
        // The counterfactual is the list price, whatever the spot market.
        assert_eq!(live.counterfactual, configured.counterfactual);
        assert_eq!(
            configured.counterfactual,
            money::from_usd(1000.0 * 1e-6 + 500.0 * 2e-6)
        );
    }

    #[test]
    fn a_price_the_control_service_would_not_accept_refuses_the_line() {
        for (extra, field) in [
            (r#","live_usd_per_hour":-1"#, "live_usd_per_hour"),
            (r#","live_usd_per_hour":1e9"#, "live_usd_per_hour"),
            (
                r#","live_usd_per_input_token":1,"live_usd_per_output_token":0"#,
                "live_usd_per_input_token",
            ),
            (r#","live_usd_per_output_token":1e-7"#, "come together"),
        ] {
            let e = priced(extra).expect_err(extra);
            assert!(e.0.contains(field), "{extra}: {e}");
        }
    }

    #[test]
    fn the_memo_prices_as_the_tables_do() {
        let setup = setup();
        let mut memo = Memo::default();
        for extra in [
            "",
            r#","tenant":"a""#,
            r#","tenant":"b","data_class":"phi""#,
            r#","live_usd_per_hour":2.0"#,
            r#","model_served":"n""#,
        ] {
            for _ in 0..2 {
                let text = line(extra);
                let facts: Facts = serde_json::from_str(&text).expect("facts");
                assert_eq!(
                    memo.price(&facts, &setup, "cfg"),
                    price(&facts, &setup, "cfg"),
                    "{extra}"
                );
            }
        }
    }

    /// Each provider's usage shape, read as the filter reads it, booked
    /// at that provider's cached prices: OpenAI's cached tokens (inside
    /// the prompt count) at half the input price, Anthropic's cache reads
    /// at a tenth and writes at 1.25 (apart from `input_tokens`).
    #[test]
    fn each_providers_cached_usage_is_booked_at_its_cached_price() {
        let config = r#"{"allow_no_policy":true,"destinations":[
            {"name":"openai","cluster":"openai","tier":"payg",
             "usd_per_input_token":2.5e-6,"usd_per_output_token":1e-5,"cached_input_factor":0.5},
            {"name":"anthropic","cluster":"anthropic","tier":"payg",
             "usd_per_input_token":3e-6,"usd_per_output_token":1.5e-5,
             "cached_input_factor":0.1,"cache_write_factor":1.25}]}"#;
        let setup = Setup::parse(config.as_bytes()).expect("config");
        for (dest, body, billed_in, out) in [
            (
                "openai",
                &br#"{"object":"chat.completion","usage":{"prompt_tokens":2006,"completion_tokens":300,
                   "prompt_tokens_details":{"cached_tokens":1920}}}"#[..],
                86.0 + 1920.0 * 0.5,
                300.0,
            ),
            (
                "openai",
                br#"{"object":"response","usage":{"input_tokens":1300,"input_tokens_details":{"cached_tokens":1024},
                   "output_tokens":50,"total_tokens":1350}}"#,
                276.0 + 1024.0 * 0.5,
                50.0,
            ),
            (
                "anthropic",
                br#"{"type":"message","usage":{"input_tokens":21,"cache_creation_input_tokens":2000,
                   "cache_read_input_tokens":10000,"output_tokens":393}}"#,
                21.0 + 10000.0 * 0.1 + 2000.0 * 1.25,
                393.0,
            ),
        ] {
            let mut scanner = ace_flow::usage::UsageScanner::new(false);
            scanner.feed(body);
            let u = scanner.finish().expect("usage");
            let line = format!(
                r#"{{"destination":"{dest}","tier":"payg","tokens_in":{},"tokens_out":{},
                    "tokens_cache_read":{},"tokens_cache_write":{},"status":200,"warm":true}}"#,
                u.input, u.output, u.cache_read, u.cache_write
            );
            let facts: Facts = serde_json::from_str(&line).expect("facts");
            let p = price(&facts, &setup, "cfg").expect("priced");
            let (pin, pout) = if dest == "openai" {
                (2.5e-6, 1e-5)
            } else {
                (3e-6, 1.5e-5)
            };
            let want = money::from_usd(billed_in * pin + out * pout).expect("usd");
            assert_eq!(p.booked, want, "{dest}: {line}");
            // The counterfactual (the cheapest pay-as-you-go, at its own
            // cached prices) is never above the booked one here: both are
            // providers, and the same cache is assumed for both.
            assert!(p.counterfactual.is_some_and(|c| c <= want), "{dest}");
        }
    }

    /// Every field pricing reads is a field of the event line: a name
    /// the line does not have would read as its default (`serde(default)`)
    /// on every line, and price every request wrong without an error.
    #[test]
    fn every_fact_is_a_field_of_the_event() {
        let read = fact_names();
        assert!(read.contains(&"tokens_in"), "{read:?}");
        for name in read {
            assert!(
                ace_event::schema::FIELDS.iter().any(|f| f.name == *name),
                "Facts reads `{name}`, which ace_event::event_fields! does not define"
            );
        }
    }

    /// The field names `Facts` deserialises, as serde's derive hands
    /// them to a deserializer.
    fn fact_names() -> &'static [&'static str] {
        use serde::de::{Error, Visitor};
        use serde::forward_to_deserialize_any;
        type E = serde::de::value::Error;
        struct Names(&'static [&'static str]);
        impl<'de> serde::Deserializer<'de> for &mut Names {
            type Error = E;
            fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, E> {
                Err(E::custom("not a struct"))
            }
            fn deserialize_struct<V: Visitor<'de>>(
                self,
                _: &'static str,
                fields: &'static [&'static str],
                _: V,
            ) -> Result<V::Value, E> {
                self.0 = fields;
                Err(E::custom("names taken"))
            }
            forward_to_deserialize_any! {
                bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
                bytes byte_buf option unit unit_struct newtype_struct seq tuple
                tuple_struct map enum identifier ignored_any
            }
        }
        let mut names = Names(&[]);
        let _ = Facts::deserialize(&mut names);
        names.0
    }

    #[test]
    fn only_a_destination_or_the_cache_answering_below_500_is_served() {
        assert!(served(true, false, 200));
        assert!(served(false, true, 200));
        assert!(served(true, false, 404));
        assert!(!served(false, false, 200));
        assert!(!served(true, false, 429));
        assert!(!served(true, false, 503));
        assert!(!served(true, false, 0));
    }
}
