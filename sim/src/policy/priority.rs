//! A priority-fallback gateway, as Envoy AI Gateway configures Envoy:
//! backends in priority order by tier (owned, reserved, spot, on-demand,
//! pay-as-you-go); traffic goes to the first priority that has a backend
//! with room, least-request (two random choices) within it; a circuit
//! breaker at each GPU backend's slots overflows to the next priority; a
//! retry policy (`retry_on: 5xx, reset, connect-failure,
//! retriable-status-codes: 429`, one retry, `previous_hosts` predicate,
//! 25 ms base back-off) moves a failed request to the next candidate; and
//! outlier detection ejects a backend after 5 consecutive 5xx for 30 s
//! times its ejection count. Residency is expressed as Envoy expresses it,
//! by routes matching the data-class header (EU personal data to EU
//! backends, PHI to backends with a BAA); per-tenant rules have no route.

use super::{retryable, Candidates, Rules};
use crate::engine::{Next, Policy, Route, World};
use crate::fleet::Answer;
use crate::rng::Rng;

/// The priority-fallback gateway.
#[derive(Debug)]
pub struct PriorityGateway {
    candidates: Candidates,
    in_flight: Vec<u32>,
    consecutive_5xx: Vec<u32>,
    ejected_until: Vec<u64>,
    ejections: Vec<u32>,
    rng: Rng,
}

impl PriorityGateway {
    /// Over the destinations in `listed`, drawing from seed `seed`.
    pub fn new(listed: Vec<bool>, seed: u64) -> PriorityGateway {
        let n = listed.len();
        PriorityGateway {
            candidates: Candidates::new(
                Rules {
                    eu_personal_data: true,
                    phi_needs_baa: true,
                },
                listed,
            ),
            in_flight: vec![0; n],
            consecutive_5xx: vec![0; n],
            ejected_until: vec![0; n],
            ejections: vec![0; n],
            rng: Rng::fork(seed, "priority-gateway"),
        }
    }

    fn pick(&mut self, w: &World<'_>, r: u32, skip: &[usize]) -> Option<usize> {
        let now = w.now;
        let (in_flight, ejected) = (&self.in_flight, &self.ejected_until);
        let c = self.candidates.of(w, r);
        let open = |d: usize| {
            !skip.contains(&d)
                && ejected.get(d).is_none_or(|t| *t <= now)
                && w.up.get(d).is_some_and(|u| {
                    u.p.slots
                        .is_none_or(|s| in_flight.get(d).copied().unwrap_or(0) < s)
                })
        };
        let level = c
            .iter()
            .filter(|d| open(**d))
            .filter_map(|d| w.up.get(*d).map(|u| u.p.tier.position()))
            .min()?;
        let at_level: Vec<usize> = c
            .iter()
            .copied()
            .filter(|d| open(*d) && w.up.get(*d).is_some_and(|u| u.p.tier.position() == level))
            .collect();
        let a = *at_level.get(self.rng.below(at_level.len()))?;
        let b = *at_level.get(self.rng.below(at_level.len()))?;
        let load = |d: usize| self.in_flight.get(d).copied().unwrap_or(0);
        Some(if load(b) < load(a) { b } else { a })
    }

    fn sent(&mut self, route: Route) -> Route {
        if let Route::To(d) = route {
            if let Some(n) = self.in_flight.get_mut(d) {
                *n += 1;
            }
        }
        route
    }

    fn ended(&mut self, d: usize) {
        if let Some(n) = self.in_flight.get_mut(d) {
            *n = n.saturating_sub(1);
        }
    }
}

impl Policy for PriorityGateway {
    fn name(&self) -> String {
        "priority-gateway".into()
    }

    fn route(&mut self, w: &World<'_>, r: u32) -> Route {
        let route = self.pick(w, r, &[]).map_or(Route::Refuse(503), Route::To);
        self.sent(route)
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
        if (200..300).contains(&a.status) {
            if let Some(c) = self.consecutive_5xx.get_mut(d) {
                *c = 0;
            }
            return Next::Deliver;
        }
        self.ended(d);
        if a.status >= 500 {
            let c = self.consecutive_5xx.get(d).copied().unwrap_or(0) + 1;
            if c >= 5 {
                let k = self.ejections.get(d).copied().unwrap_or(0) + 1;
                if let Some(e) = self.ejections.get_mut(d) {
                    *e = k;
                }
                if let Some(t) = self.ejected_until.get_mut(d) {
                    *t = w.now + 30_000 * u64::from(k.min(10));
                }
                if let Some(x) = self.consecutive_5xx.get_mut(d) {
                    *x = 0;
                }
            } else if let Some(x) = self.consecutive_5xx.get_mut(d) {
                *x = c;
            }
        }
        if n >= 1 || !retryable(a.status) {
            return Next::Deliver;
        }
        match self.pick(w, r, tried) {
            Some(d2) => Next::Retry {
                after_ms: 25,
                route: self.sent(Route::To(d2)),
            },
            None => Next::Deliver,
        }
    }

    fn done(&mut self, _w: &World<'_>, _r: u32, d: usize, _ok: bool) {
        self.ended(d);
    }
}
