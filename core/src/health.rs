//! Health: how a destination's outcomes change what it may take.
//!
//! Three responses, each matched to what the failure means:
//!
//! - **Trip** (5xx, refused or reset connections, timeouts): after
//!   `trip_after` consecutive failures the destination is out for a
//!   cool-down that doubles on each repeat trip (up to a ceiling); then it is
//!   half-open and exactly one probe request goes through. A successful probe
//!   closes it; a failed one opens it again for longer. With
//!   `trip_tenants: 2`, the run of failures must also span two tenants (or
//!   hold one failure that no tenant's input can cause, such as a refused
//!   connection or a timeout): one tenant whose inputs make a server fail
//!   then sees its own errors, and every other tenant keeps the
//!   destination.
//! - **Cap cut** (429): the destination is alive but full. Its capacity cap
//!   moves left multiplicatively (AIMD) and stays cut for at least
//!   `retry-after`; every success after that adds a step back.
//! - **Headroom** (a provider's own rate-limit figures on an answer,
//!   `x-ratelimit-remaining-*`, `anthropic-ratelimit-*`, a provisioned
//!   deployment's utilisation): alive, serving, and saying how much of its
//!   limit is left. Below `headroom_low` of it, the cap moves left in
//!   proportion until the limit resets; with nothing left, the destination
//!   is throttled until then, as a 429 would, so the next request spills
//!   before the 429 comes. Each answer's figures replace the last ones.
//!
//! A cap the provider's own word set (a 429, its figures) is the
//! provider's limit, and binds every tier: a reserved block's overage
//! price is for use past its commitment while its provider still has room
//! ([`Health::provider_limited`], [`crate::cost::CostModel::prices_at`]).
//! And however long a provider says to wait (a 429's `retry-after`, a
//! limit's reset), a destination is held back at most `max_cooldown_ms`,
//! the longest cool-down of a trip: a reset in the year 9999 or a wrong
//! clock costs one request per cool-down, never the destination.
//! - **Derate** (latency above the SLO): alive and serving, only slow. Its
//!   effective cost is multiplied by a factor that grows on each slow answer
//!   and decays back with a half-life. It is priced up, never cut.
//!
//! The state is a small `Copy` value with a fixed 40-byte encoding so the
//! filter can keep it in Envoy shared data, where every worker sees it.
//! Time is always passed in (milliseconds); nothing here reads a clock.

/// Tunables of the health model. [`HealthPolicy::default`] is a sane start.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HealthPolicy {
    /// Consecutive failures that trip a destination.
    pub trip_after: u16,
    /// Cool-down of the first trip, ms.
    pub base_cooldown_ms: u64,
    /// Longest cool-down, ms: of a trip, and the longest a provider's
    /// word (a 429's `retry-after`, a limit's reset) holds a destination
    /// back.
    pub max_cooldown_ms: u64,
    /// Multiplier applied to the capacity cap on a 429 (0..1).
    pub cap_cut: f64,
    /// Fraction of capacity given back per success once the throttle ends.
    pub cap_step: f64,
    /// Throttle window when a 429 carries no `retry-after`, ms.
    pub default_retry_after_ms: u64,
    /// Multiplier applied to the derate on each answer slower than the SLO.
    pub derate_step: f64,
    /// Largest derate.
    pub derate_max: f64,
    /// Half-life of the derate's decay back to 1, ms.
    pub derate_half_life_ms: u64,
    /// Tenants whose failures a trip needs: 1 (any failures trip) or 2
    /// (failures from two tenants, or one failure blamed on no tenant).
    /// The same rule holds for raising a learned latency
    /// ([`crate::latency`]).
    pub trip_tenants: u8,
    /// How answers' times to first byte are learned ([`crate::latency`]).
    pub learn: crate::latency::LearnPolicy,
    /// Fraction of a provider's rate limit left below which its cap moves
    /// left in proportion (0 to 1; 0: only an exhausted limit counts).
    pub headroom_low: f64,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        HealthPolicy {
            trip_after: 3,
            base_cooldown_ms: 5_000,
            max_cooldown_ms: 300_000,
            cap_cut: 0.5,
            cap_step: 0.05,
            default_retry_after_ms: 1_000,
            derate_step: 1.5,
            derate_max: 8.0,
            derate_half_life_ms: 10_000,
            trip_tenants: 1,
            learn: crate::latency::LearnPolicy::default(),
            headroom_low: 0.1,
        }
    }
}

/// What a provider said of its own rate limit on an answer: the smallest
/// fraction left of any limit it reported, and when that limit resets.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Headroom {
    /// Fraction of the tightest limit left, 0 to 1.
    pub left: f64,
    /// ms from the answer until that limit resets (0: not said), as the
    /// provider said it: [`Health`] holds a destination back at most
    /// `max_cooldown_ms` whatever it says.
    pub reset_ms: u64,
}

/// What happened to one request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Outcome {
    /// Answered (2xx-4xx other than 429) in `latency_ms`.
    Success {
        /// End-to-end latency seen by the filter.
        latency_ms: u64,
        /// The destination's SLO for this request, if it has one.
        slo_ms: Option<u64>,
        /// The provider's rate-limit figures, if it gave any.
        headroom: Option<Headroom>,
    },
    /// 5xx, connection refused or reset, timeout.
    Failure {
        /// The tenant whose request failed (a small non-zero key), or
        /// [`ANY_TENANT`] when no tenant's input can have caused it (Envoy's
        /// own reply for a refused connection or a timeout).
        tenant: u32,
    },
    /// 429, with `retry-after` converted to milliseconds if present.
    Throttled {
        /// How long the destination asked us to back off.
        retry_after_ms: Option<u64>,
    },
}

/// The tenant key of a failure no tenant's input can cause (see
/// [`Outcome::Failure`]); tenant keys are at most [`MAX_TENANT`].
pub const ANY_TENANT: u32 = 0;
/// The largest tenant key (24 bits: it shares a word with a flag).
pub const MAX_TENANT: u32 = 0x00ff_ffff;

/// Whether a destination takes traffic now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Breaker {
    /// Healthy.
    Closed,
    /// Tripped, cooling down.
    Open,
    /// Cool-down over: one probe may go.
    HalfOpen,
}

/// One destination's health. `Health::default()` is fully healthy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Health {
    consecutive_failures: u16,
    trips: u16,
    probe_in_flight: bool,
    /// The tenant of the current failure run's first failure.
    run_tenant: u32,
    /// Whether the run spans two tenants or holds an [`ANY_TENANT`] failure.
    run_mixed: bool,
    open_until_ms: u64,
    throttled_until_ms: u64,
    cap_fraction: f64,
    derate: f64,
    derate_at_ms: u64,
    /// The cap fraction the provider's own figures allow, until
    /// `headroom_until_ms`.
    headroom: f64,
    headroom_until_ms: u64,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            consecutive_failures: 0,
            trips: 0,
            probe_in_flight: false,
            run_tenant: ANY_TENANT,
            run_mixed: false,
            open_until_ms: 0,
            throttled_until_ms: 0,
            cap_fraction: 1.0,
            derate: 1.0,
            derate_at_ms: 0,
            headroom: 1.0,
            headroom_until_ms: 0,
        }
    }
}

/// Size of [`Health::encode`]'s output.
pub const ENCODED_LEN: usize = 52;

impl Health {
    /// The breaker's state at `now_ms`.
    pub fn breaker(&self, now_ms: u64) -> Breaker {
        if self.open_until_ms == 0 {
            return Breaker::Closed;
        }
        if now_ms < self.open_until_ms {
            Breaker::Open
        } else {
            Breaker::HalfOpen
        }
    }

    /// Healthy, uncut and not derated at `now_ms`: nothing about the
    /// destination's health changes its price or its cap.
    #[inline]
    pub fn is_pristine(&self, now_ms: u64) -> bool {
        self.open_until_ms == 0
            && now_ms >= self.throttled_until_ms
            && self.cap_fraction >= 1.0
            && self.derate <= 1.0
            && self.room(now_ms) >= 1.0
    }

    /// The cap fraction the provider's figures allow at `now_ms`.
    #[inline]
    fn room(&self, now_ms: u64) -> f64 {
        if now_ms < self.headroom_until_ms {
            self.headroom
        } else {
            1.0
        }
    }

    /// Whether the destination's price or admission can change with time
    /// alone after `now_ms` (a breaker open or half-open, a throttle window
    /// still running, a derate decaying). Others change only when an
    /// outcome is observed or their load changes.
    pub fn depends_on_time(&self, now_ms: u64) -> bool {
        self.open_until_ms != 0
            || now_ms < self.throttled_until_ms
            || self.derate > 1.0
            || self.room(now_ms) < 1.0
    }

    /// Whether a request may be sent now (a half-open destination admits one probe).
    pub fn admits(&self, now_ms: u64) -> bool {
        match self.breaker(now_ms) {
            Breaker::Closed => true,
            Breaker::Open => false,
            Breaker::HalfOpen => !self.probe_in_flight,
        }
    }

    /// Record that a request was sent (claims the probe when half-open).
    pub fn on_dispatch(&mut self, now_ms: u64) {
        if self.breaker(now_ms) == Breaker::HalfOpen {
            self.probe_in_flight = true;
        }
    }

    /// The most requests the destination may hold at `now_ms`, for a
    /// destination of `capacity` (0 = unlimited). `None` means unlimited;
    /// `Some(0)` means it takes nothing now.
    pub fn cap(&self, capacity: u32, now_ms: u64) -> Option<u32> {
        let throttled = now_ms < self.throttled_until_ms;
        if capacity == 0 {
            // Unlimited until it throttles; then nothing until retry-after.
            return if throttled { Some(0) } else { None };
        }
        // Truncation is the floor here: the product is finite and >= 0.
        let c = f64::from(capacity) * self.cap_fraction.min(self.room(now_ms));
        Some(if c < 1.0 {
            // Cut below one request: none while throttled, one to probe after.
            u32::from(!throttled)
        } else if c >= f64::from(capacity) {
            capacity
        } else {
            c as u32
        })
    }

    /// Whether the destination is inside a throttle window (429) at `now_ms`.
    pub fn throttled(&self, now_ms: u64) -> bool {
        now_ms < self.throttled_until_ms
    }

    /// Whether the provider's own word holds the destination's cap below
    /// its capacity at `now_ms`: a 429's throttle window, the cut it left
    /// (not yet stepped back), or rate-limit figures below `headroom_low`.
    /// Past such a cap the destination takes nothing more at any price: a
    /// reserved block's overage is for use past its commitment, not past
    /// what its provider will serve.
    #[inline]
    pub fn provider_limited(&self, now_ms: u64) -> bool {
        self.throttled(now_ms) || self.cap_fraction < 1.0 || self.room(now_ms) < 1.0
    }

    /// The derate multiplier (>= 1) at `now_ms`.
    pub fn derate(&self, now_ms: u64, p: &HealthPolicy) -> f64 {
        if self.derate <= 1.0 || p.derate_half_life_ms == 0 {
            return 1.0;
        }
        let dt = now_ms.saturating_sub(self.derate_at_ms) as f64;
        let halves = dt / p.derate_half_life_ms as f64;
        1.0 + (self.derate - 1.0) * exp2_neg(halves)
    }

    /// Consecutive failures so far.
    pub fn consecutive_failures(&self) -> u16 {
        self.consecutive_failures
    }

    /// How many times the destination has tripped.
    pub fn trips(&self) -> u16 {
        self.trips
    }

    /// The fraction of capacity the destination may use (1 = uncut).
    pub fn cap_fraction(&self) -> f64 {
        self.cap_fraction
    }

    /// Fold one outcome in. Returns what changed, for metrics.
    pub fn observe(&mut self, outcome: Outcome, now_ms: u64, p: &HealthPolicy) -> Change {
        match outcome {
            Outcome::Failure { tenant } => {
                let tenant = tenant.min(MAX_TENANT);
                self.consecutive_failures = self.consecutive_failures.saturating_add(1);
                if self.consecutive_failures == 1 {
                    self.run_tenant = tenant;
                    self.run_mixed = tenant == ANY_TENANT;
                } else if tenant == ANY_TENANT || tenant != self.run_tenant {
                    self.run_mixed = true;
                }
                let probe_failed = self.breaker(now_ms) == Breaker::HalfOpen && self.trips > 0;
                self.probe_in_flight = false;
                let enough_tenants = self.run_mixed || p.trip_tenants <= 1;
                if probe_failed
                    || (self.breaker(now_ms) == Breaker::Closed
                        && self.consecutive_failures >= p.trip_after
                        && enough_tenants)
                {
                    self.trips = self.trips.saturating_add(1);
                    let shift = u32::from(self.trips.saturating_sub(1)).min(20);
                    let cool = p
                        .base_cooldown_ms
                        .saturating_mul(1u64 << shift)
                        .min(p.max_cooldown_ms);
                    self.open_until_ms = now_ms.saturating_add(cool).max(1);
                    return Change::Tripped { cooldown_ms: cool };
                }
                Change::None
            }
            Outcome::Throttled { retry_after_ms } => {
                self.end_run();
                self.probe_in_flight = false;
                let wait = held_for(retry_after_ms, p);
                self.throttled_until_ms = self.throttled_until_ms.max(now_ms.saturating_add(wait));
                self.cap_fraction = (self.cap_fraction * p.cap_cut).max(0.0);
                Change::CapCut {
                    until_ms: self.throttled_until_ms,
                }
            }
            Outcome::Success {
                latency_ms,
                slo_ms,
                headroom,
            } => {
                self.end_run();
                if let Some(h) = headroom {
                    self.headroom_from(h, now_ms, p);
                }
                let mut change = Change::None;
                if self.trips > 0 && self.breaker(now_ms) == Breaker::HalfOpen {
                    // The probe came back: close the breaker.
                    self.probe_in_flight = false;
                    self.open_until_ms = 0;
                    change = Change::Recovered;
                }
                if !self.throttled(now_ms) && self.cap_fraction < 1.0 {
                    self.cap_fraction = (self.cap_fraction + p.cap_step).min(1.0);
                }
                if let Some(slo) = slo_ms {
                    if latency_ms > slo {
                        let current = self.derate(now_ms, p);
                        self.derate = (current * p.derate_step).min(p.derate_max);
                        self.derate_at_ms = now_ms;
                        if change == Change::None {
                            change = Change::Derated {
                                factor: self.derate,
                            };
                        }
                    }
                }
                change
            }
        }
    }

    /// Fold a provider's figures in: they replace the last ones.
    fn headroom_from(&mut self, h: Headroom, now_ms: u64, p: &HealthPolicy) {
        let left = if h.left.is_finite() {
            h.left.clamp(0.0, 1.0)
        } else {
            1.0
        };
        let reset = held_for((h.reset_ms != 0).then_some(h.reset_ms), p);
        let until = now_ms.saturating_add(reset);
        if left <= 0.0 {
            // Nothing left: no request until the limit resets, as after a
            // 429 with that `retry-after` (the cap itself is not cut).
            self.throttled_until_ms = self.throttled_until_ms.max(until);
            self.headroom = 0.0;
            self.headroom_until_ms = until;
        } else if left < p.headroom_low {
            self.headroom = left / p.headroom_low;
            self.headroom_until_ms = until;
        } else {
            self.headroom = 1.0;
            self.headroom_until_ms = 0;
        }
    }

    /// A success or a throttle ends a run of failures.
    fn end_run(&mut self) {
        self.consecutive_failures = 0;
        self.run_tenant = ANY_TENANT;
        self.run_mixed = false;
    }

    /// Fixed little-endian encoding for shared memory.
    pub fn encode(&self) -> [u8; ENCODED_LEN] {
        let mut b = [0u8; ENCODED_LEN];
        let fields: [&[u8]; 10] = [
            &self.consecutive_failures.to_le_bytes(),
            &self.trips.to_le_bytes(),
            // One word: bit 0 the probe, bit 1 a mixed run, bits 8.. the
            // run's tenant.
            &(u32::from(self.probe_in_flight)
                | u32::from(self.run_mixed) << 1
                | self.run_tenant.min(MAX_TENANT) << 8)
                .to_le_bytes(),
            &self.open_until_ms.to_le_bytes(),
            &self.throttled_until_ms.to_le_bytes(),
            &(self.cap_fraction as f32).to_le_bytes(),
            &(self.derate as f32).to_le_bytes(),
            &self.derate_at_ms.to_le_bytes(),
            &(self.headroom as f32).to_le_bytes(),
            &self.headroom_until_ms.to_le_bytes(),
        ];
        let mut at = 0;
        for f in fields {
            if let Some(dst) = b.get_mut(at..at + f.len()) {
                dst.copy_from_slice(f);
            }
            at += f.len();
        }
        b
    }

    /// Decode [`Health::encode`]'s output; `None` if the bytes are not one.
    pub fn decode(b: &[u8]) -> Option<Health> {
        if b.len() != ENCODED_LEN {
            return None;
        }
        let u16_at = |i: usize| Some(u16::from_le_bytes(b.get(i..i + 2)?.try_into().ok()?));
        let u32_at = |i: usize| Some(u32::from_le_bytes(b.get(i..i + 4)?.try_into().ok()?));
        let u64_at = |i: usize| Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?));
        let f32_at = |i: usize| Some(f32::from_le_bytes(b.get(i..i + 4)?.try_into().ok()?));
        let cap_fraction = f64::from(f32_at(24)?);
        let derate = f64::from(f32_at(28)?);
        let headroom = f64::from(f32_at(40)?);
        if !((0.0..=1.0).contains(&cap_fraction)
            && derate.is_finite()
            && derate >= 1.0
            && (0.0..=1.0).contains(&headroom))
        {
            return None;
        }
        let flags = u32_at(4)?;
        if flags & 0xfc != 0 {
            return None;
        }
        Some(Health {
            consecutive_failures: u16_at(0)?,
            trips: u16_at(2)?,
            probe_in_flight: flags & 1 != 0,
            run_mixed: flags & 2 != 0,
            run_tenant: flags >> 8,
            open_until_ms: u64_at(8)?,
            throttled_until_ms: u64_at(16)?,
            cap_fraction,
            derate,
            derate_at_ms: u64_at(32)?,
            headroom,
            headroom_until_ms: u64_at(44)?,
        })
    }
}

/// How long a provider's word holds a destination back, ms: what it said
/// (a 429's `retry-after`, a limit's reset), else the policy's default,
/// and never longer than the longest cool-down. One rule for every header
/// that says when to come back.
#[inline]
fn held_for(said_ms: Option<u64>, p: &HealthPolicy) -> u64 {
    said_ms
        .unwrap_or(p.default_retry_after_ms)
        .min(p.max_cooldown_ms)
}

/// What an observation changed (for metrics and logs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Change {
    /// Nothing worth counting.
    None,
    /// The breaker opened for this long.
    Tripped {
        /// Cool-down, ms.
        cooldown_ms: u64,
    },
    /// A half-open probe succeeded; the breaker closed.
    Recovered,
    /// The capacity cap was cut until this time.
    CapCut {
        /// End of the throttle window, ms.
        until_ms: u64,
    },
    /// The derate grew to this factor.
    Derated {
        /// New derate multiplier.
        factor: f64,
    },
}

/// 2^-x for x >= 0, without std (a few terms are plenty for a decay).
fn exp2_neg(x: f64) -> f64 {
    if !(x.is_finite()) || x > 60.0 {
        return 0.0;
    }
    let whole = x as u32;
    let frac = x - f64::from(whole);
    // 2^-frac = e^(-frac ln2), by a short Taylor series (frac in [0,1)).
    let y = -frac * core::f64::consts::LN_2;
    let mut term = 1.0;
    let mut sum = 1.0;
    for k in 1..10 {
        term *= y / f64::from(k);
        sum += term;
    }
    sum / (1u64 << whole) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: HealthPolicy = HealthPolicy {
        trip_after: 3,
        base_cooldown_ms: 1_000,
        max_cooldown_ms: 8_000,
        cap_cut: 0.5,
        cap_step: 0.25,
        default_retry_after_ms: 500,
        derate_step: 2.0,
        derate_max: 8.0,
        derate_half_life_ms: 1_000,
        trip_tenants: 1,
        learn: crate::latency::LearnPolicy {
            quantile: 0.95,
            step: 0.05,
        },
        headroom_low: 0.1,
    };

    fn figures(left: f64, reset_ms: u64) -> Outcome {
        Outcome::Success {
            latency_ms: 1,
            slo_ms: None,
            headroom: Some(Headroom { left, reset_ms }),
        }
    }

    #[test]
    fn a_providers_figures_move_the_cap_before_it_answers_429() {
        let mut h = Health::default();
        h.observe(figures(0.5, 1_000), 0, &P);
        assert!(h.is_pristine(0), "plenty left changes nothing");
        assert_eq!(h.cap(10, 0), Some(10));
        // 5 % left, below the 10 % mark: half the cap until the reset.
        h.observe(figures(0.05, 1_000), 0, &P);
        assert_eq!(h.cap(10, 10), Some(5));
        assert_eq!(h.cap(0, 10), None, "an unlimited destination keeps going");
        assert!(h.depends_on_time(10) && !h.is_pristine(10));
        assert_eq!(h.cap(10, 1_000), Some(10), "reset");
        // Nothing left: throttled until the reset, limited or not.
        h.observe(figures(0.0, 2_000), 100, &P);
        assert_eq!((h.cap(10, 200), h.cap(0, 200)), (Some(0), Some(0)));
        assert!(h.throttled(2_099) && !h.throttled(2_100));
        assert_eq!(h.cap(10, 2_100), Some(10));
        assert_eq!(h.cap_fraction(), 1.0, "no 429 was seen: the AIMD cap stays");
        // Fresh figures replace the last.
        h.observe(figures(0.02, 5_000), 3_000, &P);
        h.observe(figures(0.9, 5_000), 3_001, &P);
        assert!(h.is_pristine(3_002));
        // No reset said: the default retry-after; nonsense is no figure.
        h.observe(figures(0.05, 0), 4_000, &P);
        assert_eq!((h.cap(10, 4_499), h.cap(10, 4_500)), (Some(5), Some(10)));
        h.observe(figures(f64::NAN, 0), 5_000, &P);
        assert!(h.is_pristine(5_000));
        let back = Health::decode(&h.encode()).unwrap();
        assert_eq!(back, h);
        h.observe(figures(0.03, 9_000), 6_000, &P);
        let back = Health::decode(&h.encode()).unwrap();
        assert_eq!(back.encode(), h.encode(), "stored as f32");
        assert_eq!(back.cap(10, 6_001), Some(3));
    }

    #[test]
    fn no_word_of_a_provider_holds_a_destination_back_past_the_longest_cool_down() {
        // A reset at the end of time (Anthropic's `-reset:
        // 9999-12-31T23:59:59Z`), a 429's `retry-after` of a year: each
        // holds the destination back `max_cooldown_ms` (8 s here), as the
        // longest trip would; a shorter word is taken as said.
        let far = 253_402_300_799_000;
        let year = 365 * 86_400_000;
        for outcome in [
            figures(0.0, far),
            Outcome::Throttled {
                retry_after_ms: Some(year),
            },
        ] {
            let mut h = Health::default();
            h.observe(outcome, 1_000, &P);
            assert_eq!(h.cap(0, 8_999), Some(0), "{outcome:?}");
            assert!(h.throttled(8_999) && !h.throttled(9_000), "{outcome:?}");
            assert_eq!(h.cap(0, 9_000), None, "{outcome:?}");
        }
        let mut h = Health::default();
        h.observe(figures(0.05, far), 0, &P);
        assert_eq!((h.cap(10, 7_999), h.cap(10, 8_000)), (Some(5), Some(10)));
        h.observe(figures(0.0, 3_000), 10_000, &P);
        assert!(h.throttled(12_999) && !h.throttled(13_000), "as said");
        // The default wait is held to the same bound.
        let p = HealthPolicy {
            default_retry_after_ms: 60_000,
            ..P
        };
        let mut h = Health::default();
        h.observe(figures(0.0, 0), 0, &p);
        assert!(h.throttled(7_999) && !h.throttled(8_000));
    }

    #[test]
    fn the_provider_limits_the_cap_while_its_word_holds() {
        let mut h = Health::default();
        assert!(!h.provider_limited(0));
        // Figures with room to spare say nothing; below the mark they limit
        // until the reset.
        h.observe(figures(0.5, 1_000), 0, &P);
        assert!(!h.provider_limited(0));
        h.observe(figures(0.05, 1_000), 0, &P);
        assert!(h.provider_limited(999) && !h.provider_limited(1_000));
        h.observe(figures(0.0, 1_000), 2_000, &P);
        assert!(h.provider_limited(2_999) && !h.provider_limited(3_000));
        // A 429: its window, then the cut until successes step it back.
        h.observe(
            Outcome::Throttled {
                retry_after_ms: Some(1_000),
            },
            4_000,
            &P,
        );
        assert!(h.provider_limited(5_500), "cut to half, not stepped back");
        let ok = Outcome::Success {
            latency_ms: 1,
            slo_ms: None,
            headroom: None,
        };
        for _ in 0..2 {
            h.observe(ok, 5_500, &P);
        }
        assert!(!h.provider_limited(5_500), "stepped back to the whole cap");
        // A trip is a failure, not the provider's limit.
        let mut h = Health::default();
        for _ in 0..3 {
            h.observe(Outcome::Failure { tenant: 0 }, 0, &P);
        }
        assert!(!h.provider_limited(0));
    }

    #[test]
    fn one_tenants_failures_trip_nothing_when_two_are_required() {
        let p = HealthPolicy {
            trip_tenants: 2,
            ..P
        };
        let fail = |tenant| Outcome::Failure { tenant };
        let mut h = Health::default();
        for _ in 0..50 {
            assert_eq!(h.observe(fail(7), 0, &p), Change::None);
        }
        assert!(h.admits(0), "one tenant's poisoned inputs trip nothing");
        assert_eq!(
            h.observe(fail(9), 0, &p),
            Change::Tripped { cooldown_ms: 1_000 },
            "a second tenant failing too trips it"
        );
        // A failure no tenant can cause (a refused connection) counts as
        // evidence on its own.
        let mut h = Health::default();
        h.observe(fail(7), 0, &p);
        h.observe(fail(ANY_TENANT), 0, &p);
        assert!(matches!(h.observe(fail(7), 0, &p), Change::Tripped { .. }));
        // A success ends the run, and its tenants with it.
        let mut h = Health::default();
        h.observe(fail(7), 0, &p);
        h.observe(fail(9), 0, &p);
        let ok = Outcome::Success {
            latency_ms: 1,
            slo_ms: None,
            headroom: None,
        };
        h.observe(ok, 0, &p);
        for _ in 0..5 {
            assert_eq!(h.observe(fail(9), 0, &p), Change::None);
        }
        // The run's tenants survive the shared-memory encoding.
        let mut h = Health::default();
        h.observe(fail(MAX_TENANT), 0, &p);
        let back = Health::decode(&h.encode());
        assert_eq!(back, Some(h));
        h.observe(fail(3), 0, &p);
        assert_eq!(Health::decode(&h.encode()), Some(h));
    }

    #[test]
    fn trips_after_consecutive_failures_then_probes_once() {
        let mut h = Health::default();
        for _ in 0..2 {
            assert_eq!(
                h.observe(Outcome::Failure { tenant: 0 }, 0, &P),
                Change::None
            );
        }
        assert!(h.admits(0));
        assert_eq!(
            h.observe(Outcome::Failure { tenant: 0 }, 0, &P),
            Change::Tripped { cooldown_ms: 1_000 }
        );
        assert!(!h.admits(999));
        assert_eq!(h.breaker(1_000), Breaker::HalfOpen);
        assert!(h.admits(1_000));
        h.on_dispatch(1_000);
        assert!(!h.admits(1_001), "only one probe at a time");
        // The probe fails: open again, twice as long.
        assert_eq!(
            h.observe(Outcome::Failure { tenant: 0 }, 1_100, &P),
            Change::Tripped { cooldown_ms: 2_000 }
        );
        assert!(!h.admits(3_000));
        assert!(h.admits(3_100));
        h.on_dispatch(3_100);
        let ok = Outcome::Success {
            latency_ms: 1,
            slo_ms: None,
            headroom: None,
        };
        assert_eq!(h.observe(ok, 3_200, &P), Change::Recovered);
        assert_eq!(h.breaker(3_200), Breaker::Closed);
        assert!(h.admits(3_200));
    }

    #[test]
    fn cooldown_is_capped() {
        let mut h = Health::default();
        let mut now = 0;
        for _ in 0..10 {
            for _ in 0..3 {
                h.observe(Outcome::Failure { tenant: 0 }, now, &P);
            }
            now += 100_000;
        }
        assert!(h.open_until_ms <= now + P.max_cooldown_ms);
    }

    #[test]
    fn throttle_cuts_the_cap_for_retry_after_then_recovers_additively() {
        let mut h = Health::default();
        assert_eq!(h.cap(8, 0), Some(8));
        h.observe(
            Outcome::Throttled {
                retry_after_ms: Some(2_000),
            },
            0,
            &P,
        );
        assert_eq!(h.cap(8, 100), Some(4));
        assert!(h.throttled(1_999));
        let ok = Outcome::Success {
            latency_ms: 1,
            slo_ms: None,
            headroom: None,
        };
        h.observe(ok, 1_000, &P); // inside the window: no recovery
        assert_eq!(h.cap(8, 1_000), Some(4));
        h.observe(ok, 2_000, &P);
        assert_eq!(h.cap(8, 2_000), Some(6));
        h.observe(ok, 2_001, &P);
        assert_eq!(h.cap(8, 2_001), Some(8));
    }

    #[test]
    fn unlimited_destinations_pause_while_throttled() {
        let mut h = Health::default();
        assert_eq!(h.cap(0, 0), None, "capacity 0 = unlimited");
        h.observe(
            Outcome::Throttled {
                retry_after_ms: None,
            },
            0,
            &P,
        );
        assert_eq!(h.cap(0, 10), Some(0));
        assert_eq!(h.cap(0, 500), None);
    }

    #[test]
    fn slow_answers_derate_and_the_derate_decays() {
        let mut h = Health::default();
        let slow = Outcome::Success {
            latency_ms: 900,
            slo_ms: Some(500),
            headroom: None,
        };
        assert!(matches!(h.observe(slow, 0, &P), Change::Derated { .. }));
        assert!((h.derate(0, &P) - 2.0).abs() < 1e-9);
        assert!(
            (h.derate(1_000, &P) - 1.5).abs() < 1e-6,
            "{}",
            h.derate(1_000, &P)
        );
        assert!(h.derate(60_000, &P) < 1.0001);
        assert!(h.admits(0), "slow is derated, never tripped");
    }

    #[test]
    fn encoding_round_trips_and_rejects_junk() {
        let mut h = Health::default();
        h.observe(
            Outcome::Throttled {
                retry_after_ms: Some(5),
            },
            7,
            &P,
        );
        for _ in 0..3 {
            h.observe(Outcome::Failure { tenant: 0 }, 9, &P);
        }
        let b = h.encode();
        assert_eq!(Health::decode(&b), Some(h));
        assert_eq!(Health::decode(&b[..39]), None);
        let mut bad = b;
        bad[24..28].copy_from_slice(&7.0f32.to_le_bytes());
        assert_eq!(Health::decode(&bad), None);
    }
}
