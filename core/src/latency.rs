//! Latency learned from answers: each destination's time to first token at
//! the SLO's quantile, by load.
//!
//! The manifest declares a destination's latency (a knee, a typical time
//! to first token); the engines and APIs deliver their own. Whether a
//! request sent somewhere now will see its first token within its class's
//! target is what the merit order must know, so every answer's time to
//! first byte is folded into an estimate of the destination's quantile
//! (the SLO bar's, 0.95 by default) in the load band it was sent at; the
//! declared figures are the prior until a band has seen enough answers.
//!
//! **The estimator.** Per load band (in-flight over the destination's cap,
//! in eighths; one band for a destination with no cap), the first
//! [`WARMUP`] samples are kept and the estimate starts at their
//! second-largest (one outlier cannot set it); from then on a sample above
//! the estimate multiplies it by `1 + step`, a sample at or below by
//! `1 - step (1 - p) / p`. At equilibrium a fraction `1 - p` of samples lie
//! above it: it is the `p`-quantile, and it follows the destination as it
//! changes.
//!
//! **Why no client can steer it.** A sample moves the estimate by one
//! bounded step however extreme it is, so a client's slow answers (a huge
//! prompt, a model it knows is slow) weigh as its share of the traffic and
//! no more. With `trip_tenants: 2` an upward step also needs another tenant
//! than the destination's previous upward step: one tenant's answers alone
//! cannot raise the estimate at all, and among others' they can at most
//! double the rate at which it rises. Its start needs two tenants too: a
//! band's estimate starts once its last [`WARMUP`] samples come from two
//! tenants, at the smallest of the tenants' largest samples, so that a
//! tenant's own slow answers cannot set it either. The request flow leaves
//! out answers on a model that was not resident (a cold load teaches
//! nothing about load). And the estimate only ever prices: it moves the
//! ranking and the lateness of a destination, never which destinations are
//! feasible.
//!
//! The state is per host copy (each Envoy worker learns from its own
//! answers: the estimates agree statistically, and none of it crosses the
//! shared fleet state); nothing here reads a clock or allocates.

/// Load bands per destination.
pub const BANDS: usize = 8;

/// Samples a band keeps before its estimate starts.
pub const WARMUP: usize = 8;

/// Tunables of the estimator (a part of [`crate::health::HealthPolicy`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LearnPolicy {
    /// The quantile estimated, in (0.5, 1): the SLO bar's.
    pub quantile: f64,
    /// Relative size of an upward step (0.05: 5 %).
    pub step: f64,
}

impl Default for LearnPolicy {
    fn default() -> Self {
        LearnPolicy {
            quantile: 0.95,
            step: 0.05,
        }
    }
}

/// Time to first token is taken as at most this, ms (ten minutes): a
/// sample past it is clamped.
const MAX_MS: f32 = 600_000.0;

/// One load band's estimate.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Band {
    /// The quantile estimate, ms (valid once `started`).
    q: f32,
    /// Whether the estimate has started.
    started: bool,
    /// Samples seen before it started (saturating).
    seen: u16,
    /// The last samples before it started, ms, in a ring.
    warmup: [f32; WARMUP],
    /// Their tenants.
    tenants: [u32; WARMUP],
}

impl Band {
    /// The estimate's start from the warm-up ring, if it may start: the
    /// second-largest sample; under the two-tenant rule, once two tenants
    /// are among the samples, the smallest of each tenant's largest.
    fn start(&self, two_tenants: bool) -> Option<f32> {
        if usize::from(self.seen) < WARMUP {
            return None;
        }
        if !two_tenants {
            let mut sorted = self.warmup;
            sorted.sort_unstable_by(f32::total_cmp);
            return sorted.get(WARMUP - 2).copied();
        }
        let first = self.tenants.first().copied()?;
        if self.tenants.iter().all(|t| *t == first) {
            return None;
        }
        let largest_of = |tenant: u32| {
            self.warmup
                .iter()
                .zip(&self.tenants)
                .filter(|(_, t)| **t == tenant)
                .map(|(x, _)| *x)
                .fold(0.0f32, f32::max)
        };
        self.tenants.iter().map(|t| largest_of(*t)).reduce(f32::min)
    }
}

/// A destination's learned time to first token, by load band.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Learned {
    bands: [Band; BANDS],
    /// The tenant of the last upward step (0: none yet).
    last_up_tenant: u32,
}

/// The load band of `in_flight` requests on a destination holding `cap`
/// (`None` or 0: no cap, one band).
#[inline]
pub fn band(in_flight: u32, cap: Option<u32>) -> u8 {
    match cap {
        Some(c) if c > 0 => {
            let b = u64::from(in_flight) * BANDS as u64 / u64::from(c);
            b.min(BANDS as u64 - 1) as u8
        }
        _ => 0,
    }
}

impl Learned {
    /// Fold in an answer's time to first byte, `ttft_ms`, for a request sent
    /// in load band `band` by `tenant` (`trip_tenants`: 2 asks upward
    /// steps of two tenants, as the health rules do). Returns whether the
    /// estimate moved.
    pub fn observe(
        &mut self,
        band: u8,
        ttft_ms: u64,
        tenant: u32,
        trip_tenants: u8,
        p: &LearnPolicy,
    ) -> bool {
        let x = (ttft_ms as f32).clamp(1.0, MAX_MS);
        let Some(b) = self.bands.get_mut(usize::from(band)) else {
            return false;
        };
        if !b.started {
            let at = usize::from(b.seen) % WARMUP;
            if let (Some(slot), Some(who)) = (b.warmup.get_mut(at), b.tenants.get_mut(at)) {
                *slot = x;
                *who = tenant;
            }
            b.seen = b.seen.saturating_add(1);
            if let Some(q) = b.start(trip_tenants >= 2) {
                b.q = q;
                b.started = true;
                return true;
            }
            return false;
        }
        let pq = p.quantile as f32;
        let step = p.step as f32;
        if x > b.q {
            if trip_tenants >= 2 && tenant == self.last_up_tenant {
                return false;
            }
            self.last_up_tenant = tenant;
            b.q = (b.q * (1.0 + step)).min(MAX_MS);
        } else {
            b.q = (b.q * (1.0 - step * (1.0 - pq) / pq)).max(1.0);
        }
        true
    }

    /// The estimate at load band `band`, ms: the largest among the bands up
    /// to it that have one (latency does not fall as load rises), or `None`
    /// when none has.
    #[inline]
    pub fn estimate_ms(&self, band: u8) -> Option<f64> {
        let upto = usize::from(band).min(BANDS - 1) + 1;
        self.bands
            .get(..upto)
            .unwrap_or_default()
            .iter()
            .filter(|b| b.started)
            .map(|b| f64::from(b.q))
            .reduce(f64::max)
    }

    /// Whether any band has an estimate.
    pub fn is_learned(&self) -> bool {
        self.bands.iter().any(|b| b.started)
    }
}

impl LearnPolicy {
    /// Check the tunables once: the quantile in (0.5, 1), the step in
    /// (0, 1); an error names the field (as the configuration spells it)
    /// and what it accepts.
    pub fn validate(&self) -> Result<(), crate::cost::InvalidCost> {
        if !(self.quantile.is_finite() && self.quantile > 0.5 && self.quantile < 1.0) {
            return Err(crate::cost::InvalidCost {
                field: "ttft_quantile",
                expected: "a fraction in (0.5, 1): the quantile of time to first token learned",
            });
        }
        if !(self.step.is_finite() && self.step > 0.0 && self.step < 1.0) {
            return Err(crate::cost::InvalidCost {
                field: "ttft_step",
                expected: "a fraction in (0, 1): the learned quantile's relative step",
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: LearnPolicy = LearnPolicy {
        quantile: 0.95,
        step: 0.05,
    };

    /// A deterministic spread of samples: `n` values evenly over
    /// `lo..=hi`, shuffled by a fixed stride.
    fn spread(n: u64, lo: u64, hi: u64) -> impl Iterator<Item = u64> + Clone {
        (0..n).map(move |i| lo + ((i * 7919) % n) * (hi - lo) / (n - 1))
    }

    #[test]
    fn bands_split_the_cap_in_eighths() {
        assert_eq!(band(0, Some(16)), 0);
        assert_eq!(band(2, Some(16)), 1);
        assert_eq!(band(15, Some(16)), 7);
        assert_eq!(band(100, Some(16)), 7);
        assert_eq!(band(100, None), 0);
        assert_eq!(band(100, Some(0)), 0);
    }

    #[test]
    fn nothing_is_learned_before_the_warmup() {
        let mut l = Learned::default();
        for _ in 0..WARMUP - 1 {
            l.observe(0, 500, 1, 1, &P);
        }
        assert_eq!(l.estimate_ms(0), None);
        l.observe(0, 500, 1, 1, &P);
        assert_eq!(l.estimate_ms(0), Some(500.0));
    }

    #[test]
    fn the_estimate_settles_at_the_quantile() {
        let mut l = Learned::default();
        // Uniform over 100..=1100 ms: the 0.95-quantile is 1050.
        for _ in 0..20 {
            for x in spread(1000, 100, 1100) {
                l.observe(0, x, 1, 1, &P);
            }
        }
        let q = l.estimate_ms(0).unwrap_or(0.0);
        assert!((950.0..=1100.0).contains(&q), "{q}");
    }

    #[test]
    fn an_outlier_moves_it_one_step() {
        let mut l = Learned::default();
        for x in spread(1000, 100, 1100).cycle().take(20_000) {
            l.observe(0, x, 1, 1, &P);
        }
        let before = l.estimate_ms(0).unwrap_or(0.0);
        l.observe(0, 10_000_000, 1, 1, &P);
        let after = l.estimate_ms(0).unwrap_or(0.0);
        assert!(after <= before * 1.051, "{before} -> {after}");
    }

    #[test]
    fn one_tenant_alone_cannot_raise_it_under_two_tenant_rules() {
        let mut l = Learned::default();
        // Honest answers from two tenants.
        for (i, x) in spread(1000, 100, 1100).cycle().take(20_000).enumerate() {
            l.observe(0, x, 1 + (i % 2) as u32, 2, &P);
        }
        let honest = l.estimate_ms(0).unwrap_or(0.0);
        assert!(honest > 900.0, "{honest}");
        // Tenant 9 sends nothing but slow requests: after its first step
        // every further one needs another tenant's step in between.
        for _ in 0..10_000 {
            l.observe(0, 60_000, 9, 2, &P);
        }
        let after = l.estimate_ms(0).unwrap_or(0.0);
        assert!(after <= honest * 1.051, "{honest} -> {after}");
    }

    #[test]
    fn one_tenant_alone_cannot_start_it_under_two_tenant_rules() {
        let mut l = Learned::default();
        for _ in 0..100 {
            l.observe(0, 60_000, 9, 2, &P);
        }
        assert_eq!(l.estimate_ms(0), None, "one tenant's answers start nothing");
        // Another tenant's answers start it at the smaller of the two
        // tenants' largest: the honest one's.
        l.observe(0, 80, 1, 2, &P);
        assert_eq!(l.estimate_ms(0), Some(80.0));
        // Single-tenant rules start at the second-largest of the ring.
        let mut one = Learned::default();
        for x in [10, 20, 30, 40, 50, 60, 70, 5000] {
            one.observe(0, x, 1, 1, &P);
        }
        assert_eq!(one.estimate_ms(0), Some(70.0));
    }

    #[test]
    fn higher_load_never_reads_faster() {
        let mut l = Learned::default();
        for _ in 0..WARMUP {
            l.observe(0, 900, 1, 1, &P);
            l.observe(5, 300, 1, 1, &P);
        }
        assert_eq!(l.estimate_ms(5), Some(900.0));
        assert_eq!(l.estimate_ms(3), Some(900.0));
        assert_eq!(Learned::default().estimate_ms(7), None);
    }

    #[test]
    fn bad_tunables_are_named() {
        let bad = LearnPolicy { quantile: 1.0, ..P };
        assert_eq!(bad.validate().map_err(|e| e.field), Err("ttft_quantile"));
        let bad = LearnPolicy { step: 0.0, ..P };
        assert_eq!(bad.validate().map_err(|e| e.field), Err("ttft_step"));
        assert_eq!(P.validate(), Ok(()));
    }
}
