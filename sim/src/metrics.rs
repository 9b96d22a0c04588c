//! One run's figures, gathered as the run goes (nothing per request is
//! kept but its time to first token).

use crate::fleet::Upstream;
use crate::mix::Profile;
use crate::slo::Targets;
use ace_core::cost::Tier;
use ace_pricing::money::{usd_f64, Nano};
use ace_pricing::{PriceError, Priced};
use serde::Serialize;

/// How one request ended.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RequestOutcome {
    /// The status the client got.
    pub status: u16,
    /// Served whole.
    pub served: bool,
    /// Arrival to last byte, ms.
    pub e2e_ms: u64,
    /// Where its last attempt went.
    pub dest: Option<usize>,
    /// Whether that attempt had to load the model first.
    pub cold: bool,
    /// Whether it was served past a reserved commitment.
    pub overage: bool,
    /// The GPU-hour price it ran at, where the market had moved it from
    /// the configuration's (spot).
    pub live_usd_per_hour: Option<f64>,
    /// Input tokens its destination read from its prompt cache (what its
    /// usage reports as `prompt_tokens_details.cached_tokens`).
    pub cache_read: u32,
}

impl RequestOutcome {
    /// Refused without service (`after_ms` after arrival).
    pub fn refused(status: u16, after_ms: u64) -> RequestOutcome {
        RequestOutcome {
            status,
            served: false,
            e2e_ms: after_ms,
            dest: None,
            cold: false,
            overage: false,
            live_usd_per_hour: None,
            cache_read: 0,
        }
    }

    /// Failed at `dest`.
    pub fn failed(status: u16, after_ms: u64, dest: usize) -> RequestOutcome {
        RequestOutcome {
            dest: Some(dest),
            ..RequestOutcome::refused(status, after_ms)
        }
    }
}

/// What the books say of one request: the sums over its event lines (a
/// request re-run on another destination writes one per attempt), each
/// priced by [`ace_pricing`], exactly as the ledger books those lines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Booking {
    /// Booked marginal cost.
    pub booked: Nano,
    /// The counterfactual of the lines that count as served
    /// ([`ace_pricing::served`]; their booked cost where pay-as-you-go
    /// could not have served them).
    pub counterfactual: Nano,
    /// Booked cost of those lines.
    pub booked_served: Nano,
    /// Lines the pricing refused (a configuration the run does not
    /// match): a bug in the run, which tests hold at 0.
    pub unpriced: u32,
}

impl Booking {
    /// Add one line: its facts, priced (or why not).
    pub fn add(&mut self, served: bool, priced: Result<Priced, PriceError>) {
        match priced {
            Ok(p) => {
                self.booked = self.booked.saturating_add(p.booked);
                if served {
                    self.booked_served = self.booked_served.saturating_add(p.booked);
                    self.counterfactual = self
                        .counterfactual
                        .saturating_add(p.counterfactual_or_booked());
                }
            }
            Err(_) => self.unpriced += 1,
        }
    }

    /// Add `other`'s lines.
    pub fn merge(&mut self, other: Booking) {
        self.booked = self.booked.saturating_add(other.booked);
        self.counterfactual = self.counterfactual.saturating_add(other.counterfactual);
        self.booked_served = self.booked_served.saturating_add(other.booked_served);
        self.unpriced += other.unpriced;
    }
}

/// Per latency class.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ClassFigures {
    /// The class.
    pub class: String,
    /// Requests.
    pub requests: u64,
    /// Served and met the first-token target.
    pub ttft_met: u64,
    /// Served and met the end-to-end target.
    pub e2e_met: u64,
    /// Served and met both.
    pub met: u64,
}

/// What the destinations' prompt caches did for a run's served requests,
/// and their time to first token (kept on a trace with prompt blocks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PromptCacheFigures {
    /// Input tokens of the served requests.
    pub input_tokens: u64,
    /// Of those, read from the destination's prompt cache (what the
    /// upstream's usage reports, and the books price at the cached price).
    pub cached_input_tokens: u64,
    /// Time to first token of the served requests, median, ms.
    pub ttft_p50_ms: u64,
    /// Its 95th percentile, ms.
    pub ttft_p95_ms: u64,
}

impl PromptCacheFigures {
    /// Cached input tokens over input tokens.
    pub fn cached_share(&self) -> f64 {
        ratio(self.cached_input_tokens, self.input_tokens)
    }
}

/// One run's figures.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Metrics {
    /// Requests.
    pub requests: u64,
    /// Served whole (2xx, not broken by an eviction).
    pub served: u64,
    /// What was spent: the booked marginal cost of every event line, as
    /// the ledger books them ([`Booking`]).
    pub cost: Nano,
    /// What all pay-as-you-go would have charged for the served requests
    /// (the ledger's counterfactual).
    pub counterfactual: Nano,
    /// What this run spent on those same requests.
    pub cost_served: Nano,
    /// Spend per tier (Tier::ALL order).
    pub cost_by_tier_nano: [Nano; 5],
    /// Event lines the pricing refused (0 in a sound run).
    pub unpriced: u64,
    /// What the owned and reserved capacity cost over the run, used or
    /// not: each in-house or reserved destination's hourly price (the
    /// manifest's `gpu_hour_usd` × `gpus`) over the run's whole hours
    /// ([`ace_pricing::money::standing`]). The same for every policy; the
    /// marginal [`Metrics::cost`] leaves it out.
    pub standing: Nano,
    /// [`Metrics::cost`], USD (for tables and charts; never summed).
    pub cost_usd: f64,
    /// [`Metrics::standing`], USD.
    pub standing_usd: f64,
    /// [`Metrics::counterfactual`], USD.
    pub counterfactual_usd: f64,
    /// [`Metrics::cost_served`], USD.
    pub cost_with_counterfactual_usd: f64,
    /// [`Metrics::cost_by_tier_nano`], USD.
    pub cost_by_tier: [f64; 5],
    /// Served requests per tier.
    pub served_by_tier: [u64; 5],
    /// Served requests per destination (manifest order).
    pub served_by_destination: Vec<(String, u64)>,
    /// Served requests that missed their latency class's targets, per
    /// destination (manifest order) and class (the targets' order): where
    /// the SLO was lost.
    pub missed_by_destination: Vec<(String, Vec<u64>)>,
    /// Per latency class.
    pub classes: Vec<ClassFigures>,
    /// Attempts sent to a destination the Cedar tables forbid for the
    /// request (each one sent data where policy says it may not go).
    pub violations: u64,
    /// Requests with at least one such attempt.
    pub violating_requests: u64,
    /// Requests refused or failed, by status.
    pub failed_by_status: std::collections::BTreeMap<u16, u64>,
    /// Owned (in-house) GPU utilisation, per hour of the run: running
    /// sequences over slots, averaged over the hour's minutes.
    pub owned_utilisation: Vec<f64>,
    /// Prompt caching, on a trace with prompt blocks (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_cache: Option<PromptCacheFigures>,
    /// Served requests' times to first token, ms (prompt caching only).
    #[serde(skip)]
    ttfts: Vec<u32>,
    #[serde(skip)]
    util_sum: Vec<(f64, u32)>,
    #[serde(skip)]
    owned_slots: f64,
    #[serde(skip)]
    owned: Vec<bool>,
    #[serde(skip)]
    tiers: Vec<Tier>,
    #[serde(skip)]
    ttft: Vec<u32>,
    /// Per request, whether an attempt of it has violated (a bit each).
    #[serde(skip)]
    violated: Vec<u64>,
    #[serde(skip)]
    targets: Targets,
}

impl Metrics {
    /// Empty figures for a fleet and `requests` requests.
    pub fn new(up: &[Upstream], targets: &Targets, requests: usize) -> Metrics {
        let owned: Vec<bool> = up
            .iter()
            .map(|u| u.p.tier == Tier::InHouse && u.p.slots.is_some())
            .collect();
        Metrics {
            classes: targets
                .classes
                .iter()
                .map(|c| ClassFigures {
                    class: c.class.clone(),
                    ..ClassFigures::default()
                })
                .collect(),
            owned_slots: up
                .iter()
                .zip(&owned)
                .filter(|(_, o)| **o)
                .map(|(u, _)| f64::from(u.p.slots.unwrap_or(0)))
                .sum(),
            owned,
            tiers: up.iter().map(|u| u.p.tier).collect(),
            served_by_destination: up.iter().map(|u| (u.p.name.clone(), 0)).collect(),
            missed_by_destination: up
                .iter()
                .map(|u| (u.p.name.clone(), vec![0; targets.classes.len()]))
                .collect(),
            ttft: vec![u32::MAX; requests],
            violated: vec![0; requests.div_ceil(64)],
            targets: targets.clone(),
            ..Metrics::default()
        }
    }

    /// Keep [`Metrics::prompt_cache`] (a trace with prompt blocks).
    pub fn track_prompt_cache(&mut self) {
        self.prompt_cache = Some(PromptCacheFigures::default());
    }

    /// Request `r`'s first byte reached the client at `now`.
    pub fn first_byte(&mut self, r: u32, now: u64) {
        if let Some(t) = self.ttft.get_mut(r as usize) {
            *t = u32::try_from(now).unwrap_or(u32::MAX);
        }
    }

    /// Request `r`'s time to first byte, ms after its arrival, if one
    /// arrived.
    pub fn ttft(&self, r: u32, req: &crate::trace::Req) -> Option<u64> {
        self.ttft
            .get(r as usize)
            .filter(|t| **t != u32::MAX)
            .map(|t| u64::from(*t).saturating_sub(req.at_ms))
    }

    /// An attempt of request `r` went to a destination the tables forbid.
    pub fn violation(&mut self, r: u32) {
        self.violations += 1;
        if let Some(w) = self.violated.get_mut(r as usize / 64) {
            let bit = 1u64 << (r % 64);
            if *w & bit == 0 {
                *w |= bit;
                self.violating_requests += 1;
            }
        }
    }

    /// Request `r` is over.
    pub fn record(
        &mut self,
        r: u32,
        req: &crate::trace::Req,
        profile: Option<&Profile>,
        o: RequestOutcome,
        b: Booking,
    ) {
        self.requests += 1;
        let class = profile.map_or(usize::MAX, |p| self.targets.index(&p.latency_class));
        let first = self
            .ttft
            .get(r as usize)
            .filter(|t| **t != u32::MAX)
            .map(|t| u64::from(*t).saturating_sub(req.at_ms));
        let served = o.served && (200..300).contains(&o.status);
        self.cost = self.cost.saturating_add(b.booked);
        self.counterfactual = self.counterfactual.saturating_add(b.counterfactual);
        self.cost_served = self.cost_served.saturating_add(b.booked_served);
        self.unpriced += u64::from(b.unpriced);
        if let Some(d) = o.dest {
            if let Some(t) = self.tiers.get(d) {
                if let Some(c) = self.cost_by_tier_nano.get_mut(t.position()) {
                    *c = c.saturating_add(b.booked);
                }
                if served {
                    if let Some(c) = self.served_by_tier.get_mut(t.position()) {
                        *c += 1;
                    }
                    if let Some((_, c)) = self.served_by_destination.get_mut(d) {
                        *c += 1;
                    }
                }
            }
        }
        if let (Some(pc), true) = (self.prompt_cache.as_mut(), served) {
            pc.input_tokens += u64::from(req.prompt);
            pc.cached_input_tokens += u64::from(o.cache_read.min(req.prompt));
            if let Some(f) = first {
                self.ttfts.push(u32::try_from(f).unwrap_or(u32::MAX));
            }
        }
        if served {
            self.served += 1;
        } else {
            *self.failed_by_status.entry(o.status).or_default() += 1;
        }
        let (ttft_ok, e2e_ok) = self.targets.met(class, first, o.e2e_ms, req.output);
        if let Some(c) = self.classes.get_mut(class) {
            c.requests += 1;
            if served {
                c.ttft_met += u64::from(ttft_ok);
                c.e2e_met += u64::from(e2e_ok);
                c.met += u64::from(ttft_ok && e2e_ok);
            }
        }
        if served && !(ttft_ok && e2e_ok) {
            let missed = o.dest.and_then(|d| self.missed_by_destination.get_mut(d));
            if let Some(c) = missed.and_then(|(_, m)| m.get_mut(class)) {
                *c += 1;
            }
        }
    }

    /// The standing cost of `up`'s owned and reserved capacity over a run
    /// ending at `end_ms`, billed by the whole hour.
    pub fn stand(&mut self, up: &[Upstream], end_ms: u64) {
        let period = end_ms.max(1).div_ceil(3_600_000).saturating_mul(3_600_000);
        let period = i64::try_from(period).unwrap_or(i64::MAX);
        self.standing = up
            .iter()
            .filter(|u| u.p.tier.is_sunk())
            .map(|u| ace_pricing::money::standing(u.p.cost.usd_per_gpu_hour, period))
            .fold(0, Nano::saturating_add);
    }

    /// Sample owned utilisation at `now`.
    pub fn sample(&mut self, now: u64, up: &[Upstream]) {
        if self.owned_slots <= 0.0 {
            return;
        }
        let running: f64 = up
            .iter()
            .zip(&self.owned)
            .filter(|(_, o)| **o)
            .map(|(u, _)| f64::from(u.running))
            .sum();
        let hour = (now / 3_600_000) as usize;
        if self.util_sum.len() <= hour {
            self.util_sum.resize(hour + 1, (0.0, 0));
        }
        if let Some(h) = self.util_sum.get_mut(hour) {
            h.0 += running / self.owned_slots;
            h.1 += 1;
        }
    }

    /// The run is over: hourly utilisation averaged, per-request state
    /// dropped.
    pub fn finish(&mut self) {
        self.cost_usd = usd_f64(self.cost);
        self.standing_usd = usd_f64(self.standing);
        self.counterfactual_usd = usd_f64(self.counterfactual);
        self.cost_with_counterfactual_usd = usd_f64(self.cost_served);
        self.cost_by_tier = self.cost_by_tier_nano.map(usd_f64);
        self.owned_utilisation = self
            .util_sum
            .iter()
            .map(|(s, n)| if *n > 0 { s / f64::from(*n) } else { 0.0 })
            .collect();
        self.ttft = Vec::new();
        if let Some(pc) = self.prompt_cache.as_mut() {
            let mut t = std::mem::take(&mut self.ttfts);
            t.sort_unstable();
            // Nearest rank.
            let at = |q: f64| {
                let i = ((q * t.len() as f64).ceil() as usize).saturating_sub(1);
                t.get(i).map_or(0, |v| u64::from(*v))
            };
            pc.ttft_p50_ms = at(0.5);
            pc.ttft_p95_ms = at(0.95);
        }
    }

    /// Served requests over all requests.
    pub fn served_fraction(&self) -> f64 {
        ratio(self.served, self.requests)
    }

    /// Requests that met both targets over all requests (every class).
    pub fn slo_attainment(&self) -> f64 {
        let met: u64 = self.classes.iter().map(|c| c.met).sum();
        ratio(met, self.requests)
    }

    /// Class `class`'s attainment (both targets).
    pub fn class_attainment(&self, class: &str) -> Option<f64> {
        self.classes
            .iter()
            .find(|c| c.class == class && c.requests > 0)
            .map(|c| ratio(c.met, c.requests))
    }

    /// Mean owned utilisation over the run.
    pub fn mean_owned_utilisation(&self) -> f64 {
        if self.owned_utilisation.is_empty() {
            return 0.0;
        }
        self.owned_utilisation.iter().sum::<f64>() / self.owned_utilisation.len() as f64
    }

    /// Requests that met their SLO per dollar spent.
    pub fn goodput_per_usd(&self) -> f64 {
        let met: u64 = self.classes.iter().map(|c| c.met).sum();
        met as f64 / self.cost_usd.max(1e-9)
    }

    /// Spend on the served requests over what all pay-as-you-go would
    /// have charged for them.
    pub fn cost_vs_counterfactual(&self) -> f64 {
        if self.counterfactual > 0 {
            usd_f64(self.cost_served) / usd_f64(self.counterfactual)
        } else {
            0.0
        }
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}
