//! LiteLLM's router, as its documentation describes it
//! (docs.litellm.ai, "Router - Load Balancing" and "Retries, fallbacks
//! and cooldowns", 2026):
//!
//! - **Deployments** of a model group: every listed destination serving
//!   the model, with `max_parallel_requests` set to a GPU server's slots,
//!   `rpm`/`tpm` to an API's limits and a reserved block's commitment, and
//!   `input_cost_per_token`/`output_cost_per_token` to the tier's price at
//!   rest. A deployment at its limits is filtered out before the strategy.
//! - **Strategies** ([`Strategy`]): `simple-shuffle` (random, weighted by
//!   `rpm`, else by `tpm`, when some deployment sets it, a deployment
//!   without it weighing 0; uniform when none does: "weight, rpm, tpm:
//!   simple-shuffle weights, in that order of preference", docs.litellm.ai
//!   "Deployments and model groups"), `least-busy` (fewest in flight), `usage-based-
//!   routing-v2` (lowest tokens this minute that stays under its limits),
//!   `latency-based-routing` (lowest mean time to first token over the
//!   last 10 answers; untried first) and `cost-based-routing` (lowest
//!   input + output cost per token).
//! - **Fallbacks**: once a model group has failed `num_retries` times, the
//!   next group in its `fallbacks` list, as an operator would write them
//!   from the manifest's model classes (each class's other models, in
//!   order). LiteLLM knows nothing of who may be served another model: a
//!   fallback for a tenant whose policy forbids substitution is counted as
//!   a violation.
//! - **Reliability**: `num_retries` 2, each retry re-picking without the
//!   deployments that failed, immediately when another deployment is
//!   available and otherwise after the `retry-after` header (up to 60 s) or
//!   0.5 s doubling; a deployment is cooled down for 5 s on a 429, and on
//!   other failures once it has failed 3 times and half its requests this
//!   minute. With no deployment left the router answers 429 ("no
//!   deployments available").
//! - **Residency**: region-based routing keeps `personal_eu` requests on EU
//!   deployments; LiteLLM has no place for the other rules.

use super::{list_price, retryable, Candidates, Rules};
use crate::engine::{Next, Policy, Route, World};
use crate::fleet::Answer;
use crate::rng::Rng;
use std::collections::VecDeque;

/// LiteLLM's routing strategies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// `simple-shuffle`.
    SimpleShuffle,
    /// `least-busy`.
    LeastBusy,
    /// `usage-based-routing-v2`.
    UsageBased,
    /// `latency-based-routing`.
    LatencyBased,
    /// `cost-based-routing`.
    CostBased,
}

impl Strategy {
    /// Every strategy.
    pub const ALL: [Strategy; 5] = [
        Strategy::SimpleShuffle,
        Strategy::LeastBusy,
        Strategy::UsageBased,
        Strategy::LatencyBased,
        Strategy::CostBased,
    ];

    /// Its name in LiteLLM's configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::SimpleShuffle => "simple-shuffle",
            Strategy::LeastBusy => "least-busy",
            Strategy::UsageBased => "usage-based",
            Strategy::LatencyBased => "latency-based",
            Strategy::CostBased => "cost-based",
        }
    }
}

/// Retries per request.
pub const NUM_RETRIES: u32 = 2;
/// Cool-down, ms.
pub const COOLDOWN_MS: u64 = 5_000;
/// Failures in a minute before a non-429 failure cools a deployment.
pub const ALLOWED_FAILS: u32 = 3;

/// One deployment's usage in one minute (LiteLLM keys its rpm, tpm and
/// failure counters by the minute).
#[derive(Clone, Copy, Debug, Default)]
struct Minute {
    minute: u64,
    requests: u32,
    tokens: u64,
    fails: u32,
}

#[derive(Clone, Debug, Default)]
struct Deployment {
    in_flight: u32,
    cooldown_until: u64,
    /// Usage by minute, in the slot of the minute's parity: at most the
    /// present minute and the next are live, since a retry waits at most
    /// 60 s and is booked when it is sent.
    minutes: [Minute; 2],
    latencies: VecDeque<f64>,
}

impl Deployment {
    /// Usage in the minute of `now` (zero for a minute not yet booked).
    fn usage(&self, now: u64) -> Minute {
        let m = now / 60_000;
        let slot = self.minutes[(m % 2) as usize];
        if slot.minute == m {
            slot
        } else {
            Minute {
                minute: m,
                ..Minute::default()
            }
        }
    }

    /// The counters of the minute of `now`, to book into.
    fn usage_mut(&mut self, now: u64) -> &mut Minute {
        let m = now / 60_000;
        let slot = &mut self.minutes[(m % 2) as usize];
        if slot.minute != m {
            *slot = Minute {
                minute: m,
                ..Minute::default()
            };
        }
        slot
    }
}

/// LiteLLM's router with one strategy.
#[derive(Debug)]
pub struct LiteLlm {
    strategy: Strategy,
    candidates: Candidates,
    deployments: Vec<Deployment>,
    rng: Rng,
    /// `fallbacks`: per model, the model groups to try once its own has
    /// failed `NUM_RETRIES` times (the manifest's model classes, in order).
    fallbacks: std::collections::HashMap<String, Vec<String>>,
    /// Requests that fell back: the model group now tried, and the attempt
    /// number at which it started.
    falling_back: std::collections::HashMap<u32, (String, u32)>,
    listed: Vec<bool>,
}

impl LiteLlm {
    /// `strategy` over the destinations in `listed`.
    pub fn new(
        strategy: Strategy,
        listed: Vec<bool>,
        seed: u64,
        classes: &[Vec<String>],
    ) -> LiteLlm {
        let n = listed.len();
        let fallbacks = fallback_chains(classes);
        LiteLlm {
            fallbacks,
            falling_back: Default::default(),
            listed: listed.clone(),
            strategy,
            candidates: Candidates::new(
                Rules {
                    eu_personal_data: true,
                    phi_needs_baa: false,
                },
                listed,
            ),
            deployments: vec![Deployment::default(); n],
            rng: Rng::fork(seed, strategy.as_str()),
        }
    }

    fn pick(&mut self, w: &World<'_>, r: u32, skip: &[usize]) -> Option<usize> {
        let now = w.now;
        let req = w.req(r);
        let tokens = u64::from(req.prompt) + u64::from(req.output);
        let c: Vec<usize> = match self.falling_back.get(&r) {
            Some((model, _)) => fallback_candidates(w, r, model, &self.listed),
            None => self.candidates.of(w, r).to_vec(),
        };
        let mut open: Vec<usize> = Vec::with_capacity(c.len());
        for d in c {
            if skip.contains(&d) {
                continue;
            }
            let Some(u) = w.up.get(d) else { continue };
            let (slots, api, tpm_cap) = (u.p.slots, u.p.api_limits, u.p.tpm_cap);
            let Some(x) = self.deployments.get(d) else {
                continue;
            };
            let Minute {
                requests,
                tokens: used,
                ..
            } = x.usage(now);
            if x.cooldown_until > now {
                continue;
            }
            if slots.is_some_and(|s| x.in_flight >= s) {
                continue;
            }
            if let Some((rpm, tpm)) = api {
                if requests >= rpm || used + tokens > tpm {
                    continue;
                }
            }
            if tpm_cap.is_some_and(|cap| used + tokens > cap) {
                continue;
            }
            open.push(d);
        }
        if open.is_empty() {
            return None;
        }
        let deps = &self.deployments;
        Some(match self.strategy {
            Strategy::SimpleShuffle => {
                // Weighted by `rpm`, else by `tpm`, else uniform: the first
                // of them that some open deployment sets (one without it
                // weighs 0).
                let rpm = |d: &usize| w.up.get(*d).and_then(|u| u.p.api_limits).map(|l| l.0);
                let tpm = |d: &usize| {
                    w.up.get(*d)
                        .and_then(|u| u.p.api_limits.map(|l| l.1).or(u.p.tpm_cap))
                };
                let by_rpm: Vec<f64> = open.iter().map(|d| rpm(d).map_or(0.0, f64::from)).collect();
                let by_tpm: Vec<f64> = open
                    .iter()
                    .map(|d| tpm(d).map_or(0.0, |t| t as f64))
                    .collect();
                let i = if by_rpm.iter().any(|x| *x > 0.0) {
                    self.rng.weighted(&by_rpm)
                } else if by_tpm.iter().any(|x| *x > 0.0) {
                    self.rng.weighted(&by_tpm)
                } else {
                    self.rng.below(open.len())
                };
                *open.get(i)?
            }
            Strategy::LeastBusy => *open
                .iter()
                .min_by_key(|d| (deps.get(**d).map_or(0, |x| x.in_flight), **d))?,
            Strategy::UsageBased => *open
                .iter()
                .min_by_key(|d| (deps.get(**d).map_or(0, |x| x.usage(now).tokens), **d))?,
            Strategy::LatencyBased => *open.iter().min_by(|a, b| {
                // The mean of the last answers' times to first token; 0
                // (tried first) for none.
                let mean = |d: usize| {
                    deps.get(d)
                        .map(|x| &x.latencies)
                        .filter(|l| !l.is_empty())
                        .map_or(0.0, |l| l.iter().sum::<f64>() / l.len() as f64)
                };
                mean(**a).total_cmp(&mean(**b)).then(a.cmp(b))
            })?,
            Strategy::CostBased => *open.iter().min_by(|a, b| {
                let cost = |d: usize| {
                    w.up.get(d).map_or(f64::MAX, |u| {
                        let (i, o) = list_price(u);
                        i + o
                    })
                };
                cost(**a).total_cmp(&cost(**b)).then(a.cmp(b))
            })?,
        })
    }

    /// Request `r`'s model group is exhausted after attempt `n`: the next
    /// fallback group with an open deployment, or 429.
    fn fall_back(&mut self, w: &World<'_>, r: u32, n: u32) -> Next {
        let Some(profile) = w.profile(r) else {
            return Next::Deliver;
        };
        let chain = self
            .fallbacks
            .get(&profile.model)
            .cloned()
            .unwrap_or_default();
        let current = self.falling_back.get(&r).map(|(m, _)| m.clone());
        let start = current
            .as_ref()
            .and_then(|m| chain.iter().position(|x| x == m).map(|i| i + 1))
            .unwrap_or(0);
        for model in chain.iter().skip(start) {
            self.falling_back.insert(r, (model.clone(), n + 1));
            if let Some(d) = self.pick(w, r, &[]) {
                return Next::Retry {
                    after_ms: 0,
                    route: self.sent(w, r, d),
                };
            }
        }
        Next::Deliver
    }

    fn sent(&mut self, w: &World<'_>, r: u32, d: usize) -> Route {
        let req = w.req(r);
        if let Some(x) = self.deployments.get_mut(d) {
            x.in_flight += 1;
            let u = x.usage_mut(w.now);
            u.requests += 1;
            u.tokens += u64::from(req.prompt) + u64::from(req.output);
        }
        Route::To(d)
    }
}

impl Policy for LiteLlm {
    fn name(&self) -> String {
        format!("litellm-{}", self.strategy.as_str())
    }

    fn route(&mut self, w: &World<'_>, r: u32) -> Route {
        match self.pick(w, r, &[]) {
            Some(d) => self.sent(w, r, d),
            None => Route::Refuse(429),
        }
    }

    fn answered(
        &mut self,
        w: &World<'_>,
        r: u32,
        d: usize,
        a: &Answer,
        n: u32,
        tried: &[usize],
    ) -> Next {
        let now = w.now;
        let ok = (200..300).contains(&a.status);
        if let Some(x) = self.deployments.get_mut(d) {
            if ok {
                x.latencies.push_back(a.first_ms as f64);
                if x.latencies.len() > 10 {
                    x.latencies.pop_front();
                }
                return Next::Deliver;
            }
            x.in_flight = x.in_flight.saturating_sub(1);
            let u = x.usage_mut(now);
            u.fails += 1;
            if a.status == 429
                || (u.fails >= ALLOWED_FAILS && f64::from(u.fails) >= 0.5 * f64::from(u.requests))
            {
                x.cooldown_until = now + COOLDOWN_MS;
            }
        }
        if !retryable(a.status) {
            return Next::Deliver;
        }
        let in_group = self.falling_back.get(&r).map_or(n, |(_, first)| n - first);
        if in_group >= NUM_RETRIES {
            return self.fall_back(w, r, n);
        }
        match self.pick(w, r, tried) {
            Some(d2) => Next::Retry {
                after_ms: 0,
                route: self.sent(w, r, d2),
            },
            None => {
                // Nothing else is open: LiteLLM sleeps, then tries the
                // group again (perhaps the same deployment).
                let wait = match a.retry_after_s {
                    Some(s) if s <= 60 => u64::from(s) * 1000,
                    _ => 500 << n.min(4),
                };
                let later = World {
                    now: now + wait,
                    ..*w
                };
                match self.pick(&later, r, &[]) {
                    Some(d2) => Next::Retry {
                        after_ms: wait,
                        route: self.sent(&later, r, d2),
                    },
                    None => self.fall_back(w, r, n),
                }
            }
        }
    }

    fn served_model(&self, r: u32) -> Option<&str> {
        self.falling_back.get(&r).map(|(m, _)| m.as_str())
    }

    fn finished_without_service(&mut self, _w: &World<'_>, r: u32) {
        self.falling_back.remove(&r);
    }

    fn done(&mut self, _w: &World<'_>, r: u32, d: usize, _ok: bool) {
        self.falling_back.remove(&r);
        if let Some(x) = self.deployments.get_mut(d) {
            x.in_flight = x.in_flight.saturating_sub(1);
        }
    }
}

/// Per model, the other models of its classes in class order: the
/// `fallbacks` an operator writes from the manifest's model classes.
pub fn fallback_chains(classes: &[Vec<String>]) -> std::collections::HashMap<String, Vec<String>> {
    let mut fallbacks: std::collections::HashMap<String, Vec<String>> = Default::default();
    for class in classes {
        for m in class {
            let entry = fallbacks.entry(m.clone()).or_default();
            for x in class {
                if x != m && !entry.contains(x) {
                    entry.push(x.clone());
                }
            }
        }
    }
    fallbacks
}

/// Request `r`'s deployments for fallback model `model` (a rare path: not
/// cached).
fn fallback_candidates(w: &World<'_>, r: u32, model: &str, listed: &[bool]) -> Vec<usize> {
    let Some(profile) = w.profile(r) else {
        return Vec::new();
    };
    let mut p = profile.clone();
    p.model = model.to_string();
    let rules = Rules {
        eu_personal_data: true,
        phi_needs_baa: false,
    };
    w.up.iter()
        .enumerate()
        .filter(|(d, u)| listed.get(*d).copied().unwrap_or(false) && super::passes(rules, &p, u))
        .map(|(d, _)| d)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Req;
    use crate::fleet::{Params, Upstream};
    use crate::mix::Profile;

    /// A GPU server and two APIs (100 and 300 requests a minute), all
    /// serving model `m`.
    fn fleet() -> Vec<Upstream> {
        let base = Params {
            name: "gpu".into(),
            slots: Some(64),
            ..crate::fleet::test_gpu(64)
        };
        let api = |name: &str, rpm: u32| Params {
            name: name.into(),
            tier: ace_core::cost::Tier::Payg,
            slots: None,
            api_limits: Some((rpm, 10_000_000)),
            ..base.clone()
        };
        let mut rng = Rng::fork(1, "test");
        [base.clone(), api("a", 100), api("b", 300)]
            .into_iter()
            .map(|p| Upstream::new(p, &mut rng, 1))
            .collect()
    }

    fn profile() -> Profile {
        Profile {
            tenant: "t".into(),
            data_class: "public".into(),
            latency_class: "interactive".into(),
            model: "m".into(),
            tp_degree: 1,
            headers: Vec::new(),
            feasible: vec![u64::MAX],
            substitutes: Vec::new(),
        }
    }

    #[test]
    fn simple_shuffle_weighs_by_rpm_when_deployments_set_it() {
        let up = fleet();
        let reqs = [Req {
            at_ms: 0,
            prompt: 10,
            output: 10,
            profile: 0,
        }];
        let profiles = [profile()];
        let w = World {
            now: 0,
            up: &up,
            reqs: &reqs,
            profiles: &profiles,
        };
        let mut l = LiteLlm::new(Strategy::SimpleShuffle, vec![true; 3], 7, &[]);
        let mut count = [0usize; 3];
        for _ in 0..4000 {
            // Picks only: nothing is booked, so no limit is reached.
            if let Some(d) = l.pick(&w, 0, &[]) {
                count[d] += 1;
            }
        }
        assert_eq!(count[0], 0, "the server without an rpm weighs 0: {count:?}");
        assert!(
            (2700..3300).contains(&count[2]) && count[1] + count[2] == 4000,
            "300 against 100 requests a minute: {count:?}"
        );
        // Without the APIs, uniform over what is left.
        let mut l = LiteLlm::new(Strategy::SimpleShuffle, vec![true, false, false], 7, &[]);
        assert_eq!(l.pick(&w, 0, &[]), Some(0));
    }

    #[test]
    fn usage_is_counted_per_minute_with_the_next_minute_apart() {
        let mut x = Deployment::default();
        let at = |minute: u64, s: u64| minute * 60_000 + s * 1000;
        x.usage_mut(at(5, 50)).requests = 7;
        // A retry booked in minute 6 (after its retry-after) does not
        // touch minute 5, where requests arriving now are still counted.
        x.usage_mut(at(6, 10)).requests += 1;
        x.usage_mut(at(5, 58)).requests += 1;
        assert_eq!(x.usage(at(5, 59)).requests, 8);
        assert_eq!(x.usage(at(6, 0)).requests, 1);
        // Minute 7 takes minute 5's slot, and starts from zero.
        assert_eq!(x.usage(at(7, 0)).requests, 0);
        x.usage_mut(at(7, 1)).tokens += 3;
        assert_eq!(
            (x.usage(at(7, 2)).requests, x.usage(at(7, 2)).tokens),
            (0, 3)
        );
        assert_eq!(x.usage(at(6, 30)).requests, 1);
    }

    #[test]
    fn fallbacks_are_each_models_classmates_in_order() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let chains = fallback_chains(&[s(&["big", "mid", "small"]), s(&["mid", "other"])]);
        assert_eq!(chains["big"], s(&["mid", "small"]));
        assert_eq!(chains["mid"], s(&["big", "small", "other"]));
        assert_eq!(chains["other"], s(&["mid"]));
        assert!(fallback_chains(&[]).is_empty());
    }
}
