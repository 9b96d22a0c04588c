//! A priority-fallback gateway: Envoy AI Gateway (EAIG) over Envoy, as
//! its documentation configures it for provider fallback. Sources, and the
//! review they come from: `sim/peers-source.md` §8 and §9.2 (P1-P7).
//!
//! - **One cluster per route rule, priorities inside it.** EAIG turns each
//!   `AIGatewayRoute` rule into one Envoy cluster, each `backendRef` one
//!   locality with its `priority` (`internal/extensionserver/
//!   post_translate_modify.go`, `maybeModifyCluster`). The operator lists
//!   a model's backends by tier: owned, reserved, spot, on-demand,
//!   pay-as-you-go, priority 0 to 4. Residency is what Envoy routes can
//!   say: rules matching the data-class header (EU personal data to EU
//!   backends, PHI to backends with a BAA); per-tenant rules have none.
//! - **Load follows health, never busyness** (P1, P2; Envoy's "Priority
//!   levels"): a level's health is its share of healthy (not ejected)
//!   hosts times the overprovisioning factor 1.4, capped at 100 %; the
//!   first level takes its health's share of the load and the rest spills
//!   to the next, normalised when the levels' health sums to less than
//!   100 %. A busy GPU server still gets its share and queues: Envoy's
//!   circuit breaker is per cluster, 1,024 requests by default (Envoy
//!   Gateway's default too), and its overflow is a local 503 (`UO`), not a
//!   spill. Within a level, least request over two random choices (Envoy
//!   Gateway's default load balancer).
//! - **Panic** (P7): a level with fewer than 50 % of its hosts healthy
//!   balances over all of them; with no healthy host anywhere, the first
//!   level takes all the load, over all its hosts (Envoy's panic
//!   threshold).
//! - **Retries** (P3, P4, P5): EAIG's shipped provider-fallback policy
//!   (`site/docs/capabilities/traffic/examples/provider-fallback-policy.yaml`):
//!   `numRetries: 5`, `numAttemptsPerPriority: 1`, `retryOn`:
//!   `connect-failure` and `retriable-status-codes` 500, back-off base
//!   100 ms, max 10 s. So a connection refused (the fleet's 503) and a 500
//!   are retried; a 429 is not, and reaches the client. Each retry skips
//!   the hosts tried (`previous_hosts`, up to 5 re-selections) and, after
//!   one attempt per priority, that priority (`previous_priorities`,
//!   update frequency 1; the exclusions reset when no healthy priority is
//!   left). The back-off is Envoy's fully jittered exponential:
//!   `U[0, base · (2^N − 1))`, capped at the max (Envoy Gateway
//!   `internal/xds/translator/route.go`, `buildRetryPolicy`).
//! - **Passive health** (P6): EAIG's fallback guide's outlier detection
//!   (`site/docs/capabilities/fallback.md`): eject after 1 consecutive
//!   5xx (a connection failure counts; any other answer resets the
//!   count), for 5 s times the host's ejection count, at most 300 s
//!   (Envoy's `max_ejection_time`), `maxEjectionPercent: 100`. Hosts come
//!   back at the detector's 2 s interval ticks, and each interval a host
//!   spends un-ejected takes one off its count (Envoy's outlier
//!   detection).

use super::{Candidates, Rules};
use crate::engine::{Answered, Next, Policy, Route, World};
use crate::rng::Rng;
use ace_core::cost::Tier;
use std::collections::HashMap;

/// Envoy's overprovisioning factor, percent.
pub const OVERPROVISIONING_PERCENT: u32 = 140;
/// Envoy's default panic threshold: a level with fewer healthy hosts than
/// this share balances over all of them.
pub const PANIC_THRESHOLD: f64 = 0.5;
/// Envoy's (and Envoy Gateway's) default `max_requests` per cluster.
pub const MAX_REQUESTS: u32 = 1024;
/// EAIG's example `numRetries`.
pub const NUM_RETRIES: u32 = 5;
/// EAIG's example back-off base, ms.
pub const BACKOFF_BASE_MS: u64 = 100;
/// EAIG's example back-off max, ms.
pub const BACKOFF_MAX_MS: u64 = 10_000;
/// Envoy Gateway's `HostSelectionRetryMaxAttempts`.
pub const HOST_SELECTION_ATTEMPTS: u32 = 5;
/// EAIG's fallback guide: `consecutive5XxErrors`.
pub const CONSECUTIVE_5XX: u32 = 1;
/// EAIG's fallback guide: `baseEjectionTime`, ms.
pub const BASE_EJECTION_MS: u64 = 5_000;
/// Envoy's default `max_ejection_time`, ms.
pub const MAX_EJECTION_MS: u64 = 300_000;
/// EAIG's fallback guide: the detector's `interval`, ms.
pub const DETECTOR_INTERVAL_MS: u64 = 2_000;

/// Priority levels: one per tier.
const LEVELS: usize = Tier::ALL.len();

/// One backend's passive health.
#[derive(Clone, Copy, Debug, Default)]
struct Outlier {
    consecutive_5xx: u32,
    ejected_until: u64,
    ejections: u32,
}

impl Outlier {
    fn ejected(&self, now: u64) -> bool {
        now < self.ejected_until
    }

    /// An answer from the host: count a 5xx, eject at the threshold.
    fn record(&mut self, now: u64, five_xx: bool) {
        if !five_xx {
            self.consecutive_5xx = 0;
            return;
        }
        self.consecutive_5xx += 1;
        if self.consecutive_5xx < CONSECUTIVE_5XX || self.ejected(now) {
            return;
        }
        // Each whole interval spent un-ejected took one off the count.
        let healthy_for = now.saturating_sub(self.ejected_until);
        let decay = u32::try_from(healthy_for / DETECTOR_INTERVAL_MS).unwrap_or(u32::MAX);
        self.ejections = self.ejections.saturating_sub(decay) + 1;
        let span = (BASE_EJECTION_MS * u64::from(self.ejections)).min(MAX_EJECTION_MS);
        // Back at the first interval tick once the span has passed.
        self.ejected_until = (now + span).div_ceil(DETECTOR_INTERVAL_MS) * DETECTOR_INTERVAL_MS;
        self.consecutive_5xx = 0;
    }
}

/// The priority-fallback gateway.
#[derive(Debug)]
pub struct PriorityGateway {
    candidates: Candidates,
    in_flight: Vec<u32>,
    outliers: Vec<Outlier>,
    /// Route rules (one cluster each), by (model, data class).
    clusters: HashMap<(String, String), usize>,
    /// Each profile's cluster, once looked up.
    cluster_of_profile: Vec<Option<usize>>,
    /// Requests in flight per cluster, for its circuit breaker.
    cluster_load: Vec<u32>,
    /// Requests in flight: their cluster.
    cluster_of: HashMap<u32, usize>,
    rng: Rng,
}

impl PriorityGateway {
    /// Over the destinations in `listed`, drawing from seed `seed`.
    pub fn new(listed: Vec<bool>, seed: u64) -> PriorityGateway {
        let n = listed.len();
        PriorityGateway {
            candidates: Candidates::new(Rules::ALL, listed),
            in_flight: vec![0; n],
            outliers: vec![Outlier::default(); n],
            clusters: HashMap::new(),
            cluster_of_profile: Vec::new(),
            cluster_load: Vec::new(),
            cluster_of: HashMap::new(),
            rng: Rng::fork(seed, "priority-gateway"),
        }
    }

    /// Request `r`'s route rule.
    fn cluster(&mut self, w: &World<'_>, r: u32) -> usize {
        let profile = w.req(r).profile as usize;
        if let Some(Some(c)) = self.cluster_of_profile.get(profile) {
            return *c;
        }
        let key = w
            .profile(r)
            .map(|p| (p.model.clone(), p.data_class.clone()))
            .unwrap_or_default();
        let next = self.clusters.len();
        let c = *self.clusters.entry(key).or_insert(next);
        if c >= self.cluster_load.len() {
            self.cluster_load.resize(c + 1, 0);
        }
        if profile >= self.cluster_of_profile.len() {
            self.cluster_of_profile.resize(profile + 1, None);
        }
        if let Some(slot) = self.cluster_of_profile.get_mut(profile) {
            *slot = Some(c);
        }
        c
    }

    /// Each level's share of the load, percent, for request `r`'s hosts,
    /// with the levels of `excluded` given none (`previous_priorities`);
    /// and whether each level is in panic.
    fn priority_load(
        &self,
        w: &World<'_>,
        hosts: &[usize],
        excluded: [bool; LEVELS],
    ) -> ([u32; LEVELS], [bool; LEVELS]) {
        let (mut total, mut healthy) = ([0u32; LEVELS], [0u32; LEVELS]);
        for &d in hosts {
            let Some(l) = level(w, d) else { continue };
            if let Some(t) = total.get_mut(l) {
                *t += 1;
            }
            if !self.outliers.get(d).is_some_and(|o| o.ejected(w.now)) {
                if let Some(h) = healthy.get_mut(l) {
                    *h += 1;
                }
            }
        }
        let mut panic = [false; LEVELS];
        for ((p, t), h) in panic.iter_mut().zip(total).zip(healthy) {
            *p = t > 0 && f64::from(h) < PANIC_THRESHOLD * f64::from(t);
        }
        let health = |excluded: &[bool; LEVELS]| -> [u32; LEVELS] {
            let mut out = [0u32; LEVELS];
            for (((o, t), h), e) in out.iter_mut().zip(total).zip(healthy).zip(excluded) {
                if t > 0 && !e {
                    *o = (OVERPROVISIONING_PERCENT * h / t).min(100);
                }
            }
            out
        };
        let mut h = health(&excluded);
        if h.iter().sum::<u32>() == 0 && excluded.iter().any(|e| *e) {
            // No healthy priority left: the exclusions reset.
            h = health(&[false; LEVELS]);
        }
        let sum = h.iter().sum::<u32>().min(100);
        let mut load = [0u32; LEVELS];
        if sum == 0 {
            // Nothing healthy: the first level, in panic, takes it all.
            if let Some(first) = total
                .iter()
                .position(|t| *t > 0)
                .and_then(|f| load.get_mut(f))
            {
                *first = 100;
            }
            return (load, panic);
        }
        let mut left = 100u32;
        for (share, health) in load.iter_mut().zip(h) {
            *share = left.min(health * 100 / sum);
            left -= *share;
        }
        // Rounding's remainder to the first level with health.
        if let Some(first) = h.iter().position(|h| *h > 0).and_then(|f| load.get_mut(f)) {
            *first += left;
        }
        (load, panic)
    }

    /// A host for request `r`, not among `tried` where the predicates can
    /// avoid it; `None` when the request has no host at all.
    fn pick(&mut self, w: &World<'_>, r: u32, tried: &[usize]) -> Option<usize> {
        let hosts = self.candidates.of(w, r).to_vec();
        if hosts.is_empty() {
            return None;
        }
        let mut excluded = [false; LEVELS];
        for &d in tried {
            if let Some(e) = level(w, d).and_then(|l| excluded.get_mut(l)) {
                *e = true;
            }
        }
        let (load, panic) = self.priority_load(w, &hosts, excluded);
        let mut x = self.rng.below(100) as u32;
        let chosen = load
            .iter()
            .position(|share| {
                if x < *share {
                    true
                } else {
                    x -= share;
                    false
                }
            })
            .or_else(|| load.iter().position(|share| *share > 0))?;
        let in_panic = panic.get(chosen).copied().unwrap_or(false);
        let now = w.now;
        let at_level: Vec<usize> = hosts
            .iter()
            .copied()
            .filter(|d| level(w, *d) == Some(chosen))
            .filter(|d| in_panic || !self.outliers.get(*d).is_some_and(|o| o.ejected(now)))
            .collect();
        if at_level.is_empty() {
            return None;
        }
        let mut pick = 0;
        for _ in 0..HOST_SELECTION_ATTEMPTS {
            let (i, j) = (
                self.rng.below(at_level.len()),
                self.rng.below(at_level.len()),
            );
            let (Some(&a), Some(&b)) = (at_level.get(i), at_level.get(j)) else {
                return None;
            };
            let busy = |d: usize| self.in_flight.get(d).copied().unwrap_or(0);
            pick = if busy(b) < busy(a) { b } else { a };
            if !tried.contains(&pick) {
                break;
            }
        }
        Some(pick)
    }

    /// Send request `r` of cluster `c` to `d`, or overflow the cluster's
    /// circuit breaker.
    fn send(&mut self, r: u32, c: usize, d: Option<usize>) -> Route {
        let Some(d) = d else {
            // No healthy upstream, no host at all: Envoy's 503.
            return Route::Refuse(503);
        };
        let load = self.cluster_load.get(c).copied().unwrap_or(0);
        if load >= MAX_REQUESTS {
            // Overflow: a local 503 (`UO`), not a spill.
            return Route::Refuse(503);
        }
        if let Some(n) = self.in_flight.get_mut(d) {
            *n += 1;
        }
        if let Some(n) = self.cluster_load.get_mut(c) {
            *n += 1;
        }
        self.cluster_of.insert(r, c);
        Route::To(d)
    }

    fn ended(&mut self, r: u32, d: usize) {
        if let Some(n) = self.in_flight.get_mut(d) {
            *n = n.saturating_sub(1);
        }
        if let Some(c) = self.cluster_of.remove(&r) {
            if let Some(n) = self.cluster_load.get_mut(c) {
                *n = n.saturating_sub(1);
            }
        }
    }
}

/// Destination `d`'s priority: its tier's place.
fn level(w: &World<'_>, d: usize) -> Option<usize> {
    w.up.get(d).map(|u| u.p.tier.position())
}

/// EAIG's example `retryOn`: `connect-failure` (the fleet answers 503
/// only when nothing accepts the connection) and `retriable-status-codes`
/// 500.
fn retried(status: u16) -> bool {
    matches!(status, 500 | 503)
}

/// The back-off before retry `n` (1 for the first): Envoy's fully
/// jittered exponential.
fn backoff_ms(rng: &mut Rng, n: u32) -> u64 {
    let ceiling = BACKOFF_BASE_MS
        .saturating_mul((1u64 << n.min(20)) - 1)
        .min(BACKOFF_MAX_MS);
    (rng.uniform() * ceiling as f64) as u64
}

impl Policy for PriorityGateway {
    fn name(&self) -> String {
        "priority-gateway".into()
    }

    fn route(&mut self, w: &World<'_>, r: u32) -> Route {
        let c = self.cluster(w, r);
        let d = self.pick(w, r, &[]);
        self.send(r, c, d)
    }

    fn answered(&mut self, w: &World<'_>, at: &Answered<'_>) -> Next {
        let (r, d, a, n, tried) = (at.r, at.dest, at.answer, at.n, at.tried);
        let ok = (200..300).contains(&a.status);
        if let Some(o) = self.outliers.get_mut(d) {
            o.record(w.now, a.status >= 500);
        }
        if ok {
            return Next::Deliver;
        }
        self.ended(r, d);
        if n >= NUM_RETRIES || !retried(a.status) {
            return Next::Deliver;
        }
        let after_ms = backoff_ms(&mut self.rng, n + 1);
        let later = World {
            now: w.now + after_ms,
            ..*w
        };
        let c = self.cluster(&later, r);
        let d2 = self.pick(&later, r, tried);
        Next::Retry {
            after_ms,
            route: self.send(r, c, d2),
        }
    }

    fn done(&mut self, _w: &World<'_>, r: u32, d: usize, _ok: bool) {
        self.ended(r, d);
    }

    fn finished_without_service(&mut self, _w: &World<'_>, r: u32) {
        self.cluster_of.remove(&r);
    }
}

#[cfg(test)]
mod tests;
