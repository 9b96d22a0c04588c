//! Cost curves: what one more request costs on a destination, by tier.
//!
//! Two numbers come out of here and they must not be confused:
//!
//! - the **marginal cost** is what the organisation really pays for this
//!   request on this destination (the ledger books it);
//! - the **effective cost** is what merit order ranks by: the marginal cost
//!   plus a latency penalty past the stutter knee, scaled by the health
//!   derate and the operator's preference bias. It moves the ranking only.
//!
//! All prices are US dollars. Utilisation is in-flight requests over the
//! destination's capacity (capacity 0 means unlimited, as for pay-as-you-go).

/// The kind of capacity a destination is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
    /// GPUs the organisation owns: operating cost per token up to what it owns.
    InHouse,
    /// A committed block (e.g. Azure PTU): sunk up to the commitment.
    Reserved,
    /// Spot GPUs: cheap per GPU-hour, with an eviction-risk premium.
    Spot,
    /// On-demand GPUs: per GPU-hour.
    OnDemand,
    /// Pay-as-you-go API: list price per token, capacity until throttled.
    Payg,
}

impl Tier {
    /// Every tier, in the usual merit order (cheapest kind first). A new
    /// tier goes here and in the matches below; [`Tier::position`] makes
    /// the compiler point at this list.
    pub const ALL: [Tier; 5] = [
        Tier::InHouse,
        Tier::Reserved,
        Tier::Spot,
        Tier::OnDemand,
        Tier::Payg,
    ];

    /// The tier's place in [`Tier::ALL`] (the test `all_lists_every_tier`
    /// holds the two together).
    pub const fn position(self) -> usize {
        match self {
            Tier::InHouse => 0,
            Tier::Reserved => 1,
            Tier::Spot => 2,
            Tier::OnDemand => 3,
            Tier::Payg => 4,
        }
    }

    /// The manifest and event name of the tier.
    pub const fn as_str(self) -> &'static str {
        match self {
            Tier::InHouse => "inhouse",
            Tier::Reserved => "reserved",
            Tier::Spot => "spot",
            Tier::OnDemand => "ondemand",
            Tier::Payg => "payg",
        }
    }

    /// Parse a manifest tier name.
    pub fn parse(s: &str) -> Option<Tier> {
        Tier::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// The accepted names, for error messages: "inhouse, reserved, spot,
    /// ondemand or payg".
    pub const EXPECTED: &'static str = "inhouse, reserved, spot, ondemand or payg";

    /// Capacity paid for whether it is used or not (owned GPUs, a committed
    /// block): a destination on it must say how much it holds, and what it
    /// saves is utilisation rather than arbitrage.
    pub const fn is_sunk(self) -> bool {
        match self {
            Tier::InHouse | Tier::Reserved => true,
            Tier::Spot | Tier::OnDemand | Tier::Payg => false,
        }
    }

    /// Capacity bought by the GPU-hour (spot, on-demand): its per-token
    /// price is the GPU-hour over measured throughput.
    pub const fn bills_gpu_hours(self) -> bool {
        match self {
            Tier::Spot | Tier::OnDemand => true,
            Tier::InHouse | Tier::Reserved | Tier::Payg => false,
        }
    }

    /// Past its capacity the destination may charge an overage price per
    /// token (a committed block) instead of taking nothing more.
    pub const fn has_overage(self) -> bool {
        match self {
            Tier::Reserved => true,
            Tier::InHouse | Tier::Spot | Tier::OnDemand | Tier::Payg => false,
        }
    }

    /// A pay-as-you-go API: its list price is the all-pay-as-you-go
    /// counterfactual's basis.
    pub const fn is_pay_as_you_go(self) -> bool {
        match self {
            Tier::Payg => true,
            Tier::InHouse | Tier::Reserved | Tier::Spot | Tier::OnDemand => false,
        }
    }

    /// The FOCUS `PricingCategory` of what this tier bills.
    pub const fn focus_pricing(self) -> &'static str {
        match self {
            Tier::Payg | Tier::OnDemand => "Standard",
            Tier::Spot => "Dynamic",
            Tier::Reserved => "Committed",
            Tier::InHouse => "Other",
        }
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for Tier {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Tier {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Tier, D::Error> {
        struct Name;
        impl serde::de::Visitor<'_> for Name {
            type Value = Tier;
            fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                write!(f, "a tier: {}", Tier::EXPECTED)
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Tier, E> {
                Tier::parse(v).ok_or_else(|| {
                    E::custom(format_args!("unknown tier {v:?}; use {}", Tier::EXPECTED))
                })
            }
        }
        d.deserialize_str(Name)
    }
}

impl core::fmt::Display for Tier {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A destination's cost parameters. Validated once at load
/// ([`CostModel::validate`]), then trusted.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostModel {
    /// The tier decides which curve applies.
    pub tier: Tier,
    /// Per input token: list price (payg) or operating cost (in-house,
    /// reserved: usually 0 since it is sunk).
    pub usd_per_input_token: f64,
    /// Per output token, as above.
    pub usd_per_output_token: f64,
    /// Spot and on-demand: price of one GPU-hour.
    pub usd_per_gpu_hour: f64,
    /// Spot and on-demand: measured tokens per second that one GPU-hour buys.
    pub tokens_per_second: f64,
    /// Spot: eviction-risk premium as a fraction of the GPU cost (0.2 = +20 %).
    pub eviction_premium: f64,
    /// Reserved: price per token past the commitment, if overage is allowed.
    pub overage_usd_per_token: Option<f64>,
    /// Concurrent requests the destination can hold; 0 = unlimited.
    pub capacity: u32,
    /// Utilisation (0..1] past which the latency penalty starts.
    pub knee: f64,
    /// Typical service time of one request, milliseconds (queueing model).
    pub service_ms: f64,
    /// Time to first token lightly loaded, at the SLO's quantile, ms, as
    /// declared (0: not declared): the prior of the learned latency
    /// ([`crate::latency`]), to which the queueing past the knee adds.
    pub ttft_ms: f64,
    /// Cost of loading a model that is not resident (cold start).
    pub cold_load_usd: f64,
    /// Preference weight on the rank only (1 = neutral, <1 preferred).
    pub bias: f64,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            tier: Tier::Payg,
            usd_per_input_token: 0.0,
            usd_per_output_token: 0.0,
            usd_per_gpu_hour: 0.0,
            tokens_per_second: 0.0,
            eviction_premium: 0.0,
            overage_usd_per_token: None,
            capacity: 0,
            knee: 0.8,
            service_ms: 1000.0,
            ttft_ms: 0.0,
            cold_load_usd: 0.0,
            bias: 1.0,
        }
    }
}

/// A cost parameter that cannot be used, named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InvalidCost {
    /// The offending field.
    pub field: &'static str,
    /// What is accepted.
    pub expected: &'static str,
}

fn non_negative(v: f64) -> bool {
    v.is_finite() && v >= 0.0
}

impl CostModel {
    /// Check every parameter once, so that the hot path can trust them.
    pub fn validate(&self) -> Result<(), InvalidCost> {
        let bad = |field, expected| Err(InvalidCost { field, expected });
        if !non_negative(self.usd_per_input_token) {
            return bad("usd_per_input_token", "a finite number >= 0");
        }
        if !non_negative(self.usd_per_output_token) {
            return bad("usd_per_output_token", "a finite number >= 0");
        }
        if !non_negative(self.usd_per_gpu_hour) {
            return bad("usd_per_gpu_hour", "a finite number >= 0");
        }
        if self.tier.bills_gpu_hours()
            && !(self.tokens_per_second.is_finite() && self.tokens_per_second > 0.0)
        {
            return bad(
                "tokens_per_second",
                "a finite number > 0 for spot and on-demand destinations",
            );
        }
        if !non_negative(self.eviction_premium) {
            return bad("eviction_premium", "a finite number >= 0");
        }
        if let Some(o) = self.overage_usd_per_token {
            if !non_negative(o) {
                return bad("overage_usd_per_token", "a finite number >= 0");
            }
        }
        if !(self.knee.is_finite() && self.knee > 0.0 && self.knee <= 1.0) {
            return bad("knee", "a fraction in (0, 1]");
        }
        if !(self.service_ms.is_finite() && self.service_ms > 0.0) {
            return bad("service_ms", "a finite number > 0");
        }
        if !non_negative(self.ttft_ms) {
            return bad("ttft_ms", "a finite number of ms >= 0 (0: not declared)");
        }
        if !non_negative(self.cold_load_usd) {
            return bad("cold_load_usd", "a finite number >= 0");
        }
        if !(self.bias.is_finite() && self.bias > 0.0) {
            return bad("bias", "a finite number > 0");
        }
        if self.tier.is_sunk() && self.capacity == 0 {
            return bad(
                "capacity",
                "a number of concurrent requests > 0 for inhouse and reserved destinations \
                 (what is owned or committed)",
            );
        }
        Ok(())
    }

    /// Dollars per token when capacity is bought by the GPU-hour.
    fn gpu_usd_per_token(&self) -> f64 {
        if self.tokens_per_second > 0.0 {
            self.usd_per_gpu_hour / 3600.0 / self.tokens_per_second
        } else {
            0.0
        }
    }

    /// The tier's price of one (input, output) token when the destination
    /// has room: per-token prices for in-house, reserved and pay-as-you-go
    /// (the list price, the counterfactual's basis); the GPU-hour over
    /// throughput for on-demand, plus the eviction premium for spot.
    #[inline]
    pub fn rest_prices(&self) -> (f64, f64) {
        match self.tier {
            Tier::Spot => {
                let p = self.gpu_usd_per_token() * (1.0 + self.eviction_premium);
                (p, p)
            }
            Tier::OnDemand => {
                let p = self.gpu_usd_per_token();
                (p, p)
            }
            Tier::InHouse | Tier::Reserved | Tier::Payg => {
                (self.usd_per_input_token, self.usd_per_output_token)
            }
        }
    }

    /// The cost of a request when the destination has room, before any
    /// cold-load cost (see [`CostModel::rest_prices`]).
    #[inline]
    pub fn rest_usd(&self, tokens_in: u32, tokens_out: u32) -> f64 {
        self.rest_usd_billed(f64::from(tokens_in), tokens_out)
    }

    /// [`CostModel::rest_usd`] with the input as billed ([`billed_input`]).
    #[inline]
    pub fn rest_usd_billed(&self, billed_in: f64, tokens_out: u32) -> f64 {
        let (pin, pout) = self.rest_prices();
        billed_in * pin + f64::from(tokens_out) * pout
    }

    /// The per-token prices (input, output) of one more request when
    /// `in_flight` requests are already running under `cap` (`None`:
    /// unlimited), or `None` when the destination takes nothing more.
    /// Under the cap: at rest ([`CostModel::rest_prices`]). Past it: a
    /// reserved block's overage price, when it has one and the cap is its
    /// commitment; when the provider's own word set the cap (`limited`: a
    /// 429, its rate-limit figures; [`crate::health::Health::provider_limited`]),
    /// nothing, whatever the tier. Overage is the price of use past the
    /// commitment while the provider still has room, never of use past
    /// what the provider says it will serve.
    #[inline]
    pub fn prices_at(&self, in_flight: u32, cap: Option<u32>, limited: bool) -> Option<(f64, f64)> {
        if cap.is_none_or(|c| in_flight < c) {
            Some(self.rest_prices())
        } else if self.tier.has_overage() && !limited {
            self.overage_usd_per_token.map(|o| (o, o))
        } else {
            None
        }
    }

    /// The true marginal cost of one request of `tokens_in` + `tokens_out`
    /// when `in_flight` requests are already running, or `None` when the
    /// destination has nothing more to give at that load: `cap` is the
    /// current capacity cap (`None` is unlimited), `limited` whether the
    /// provider's own word set it ([`CostModel::prices_at`]).
    pub fn marginal_usd(
        &self,
        tokens_in: u32,
        tokens_out: u32,
        warm: bool,
        in_flight: u32,
        cap: Option<u32>,
        limited: bool,
    ) -> Option<f64> {
        self.marginal_usd_billed(
            f64::from(tokens_in),
            tokens_out,
            warm,
            in_flight,
            cap,
            limited,
        )
    }

    /// [`CostModel::marginal_usd`] with the input as billed
    /// ([`billed_input`]).
    pub fn marginal_usd_billed(
        &self,
        billed_in: f64,
        tokens_out: u32,
        warm: bool,
        in_flight: u32,
        cap: Option<u32>,
        limited: bool,
    ) -> Option<f64> {
        let (pin, pout) = self.prices_at(in_flight, cap, limited)?;
        let base = billed_in * pin + f64::from(tokens_out) * pout;
        Some(if warm {
            base
        } else {
            base + self.cold_load_usd
        })
    }

    /// Expected extra queueing delay, seconds, at utilisation `rho` past the
    /// knee (an M/M/1-shaped curve measured from the knee; zero below it).
    pub fn queueing_delay_s(&self, in_flight: u32, cap: Option<u32>) -> f64 {
        let Some(cap) = cap.filter(|c| *c > 0) else {
            return 0.0;
        };
        let rho = (f64::from(in_flight) + 1.0) / f64::from(cap);
        if rho <= self.knee {
            return 0.0;
        }
        let wait = |r: f64| {
            let r = if r < 0.99 { r } else { 0.99 };
            r / (1.0 - r)
        };
        (wait(rho) - wait(self.knee)) * self.service_ms / 1000.0
    }
}

/// Input tokens as a provider bills them, in full-price tokens: of
/// `input`, `cache_read` at `read_factor` of the input price and
/// `cache_write` at `write_factor` (a provider's cached price over its
/// input price: e.g. a tenth for Anthropic's reads, 1.25 for its writes);
/// the rest at the full price. Counts past `input` are bounded by it.
#[inline]
pub fn billed_input(
    input: u32,
    cache_read: u32,
    cache_write: u32,
    read_factor: f64,
    write_factor: f64,
) -> f64 {
    if cache_read == 0 && cache_write == 0 {
        return f64::from(input);
    }
    let read = cache_read.min(input);
    let write = cache_write.min(input - read);
    let full = input - read - write;
    f64::from(full) + f64::from(read) * read_factor + f64::from(write) * write_factor
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(tier: Tier) -> CostModel {
        CostModel {
            tier,
            usd_per_input_token: 1e-6,
            usd_per_output_token: 2e-6,
            usd_per_gpu_hour: 3.6,
            tokens_per_second: 1000.0,
            eviction_premium: 0.5,
            capacity: 10,
            ..CostModel::default()
        }
    }

    #[test]
    fn curves_by_tier() {
        let m = model(Tier::Payg);
        assert_eq!(
            m.marginal_usd(1000, 500, true, 0, None, false),
            Some(1000.0 * 1e-6 + 500.0 * 2e-6)
        );
        // Spot: $3.6/h over 1000 tok/s = 1e-6 $/token, +50 % premium.
        let s = model(Tier::Spot).marginal_usd(1000, 0, true, 0, Some(10), false);
        assert!(s.is_some_and(|c| (c - 1.5e-3).abs() < 1e-12), "{s:?}");
        let o = model(Tier::OnDemand).marginal_usd(1000, 0, true, 0, Some(10), false);
        assert!(o.is_some_and(|c| (c - 1e-3).abs() < 1e-12), "{o:?}");
    }

    #[test]
    fn owned_and_reserved_stop_at_their_cap() {
        assert_eq!(
            model(Tier::InHouse).marginal_usd(1, 1, true, 10, Some(10), false),
            None
        );
        assert_eq!(
            model(Tier::Reserved).marginal_usd(1, 1, true, 10, Some(10), false),
            None
        );
        let mut r = model(Tier::Reserved);
        r.overage_usd_per_token = Some(1e-5);
        assert_eq!(r.marginal_usd(1, 1, true, 10, Some(10), false), Some(2e-5));
        // Past a cap its provider set (a 429, nothing left of its limit),
        // a reserved block takes nothing more, overage or not; under it,
        // its price at rest.
        assert_eq!(r.prices_at(10, Some(10), true), None);
        assert_eq!(r.prices_at(0, Some(0), true), None);
        assert_eq!(r.marginal_usd(1, 1, true, 10, Some(10), true), None);
        assert_eq!(r.prices_at(4, Some(5), true), Some(r.rest_prices()));
        assert_eq!(r.prices_at(10, Some(10), false), Some((1e-5, 1e-5)));
        assert_eq!(r.prices_at(10, None, true), Some(r.rest_prices()));
    }

    #[test]
    fn a_cold_model_costs_its_load() {
        let mut m = model(Tier::InHouse);
        m.cold_load_usd = 0.25;
        let warm = m
            .marginal_usd(10, 10, true, 0, Some(10), false)
            .unwrap_or(f64::NAN);
        let cold = m
            .marginal_usd(10, 10, false, 0, Some(10), false)
            .unwrap_or(f64::NAN);
        assert!((cold - warm - 0.25).abs() < 1e-12);
    }

    #[test]
    fn no_delay_below_the_knee_and_growing_past_it() {
        let m = model(Tier::InHouse); // knee 0.8, cap 10
        assert_eq!(m.queueing_delay_s(6, Some(10)), 0.0); // rho 0.7
        let d8 = m.queueing_delay_s(8, Some(10)); // rho 0.9
        let d9 = m.queueing_delay_s(9, Some(10)); // rho 1.0 (clamped)
        assert!(d8 > 0.0 && d9 > d8, "{d8} {d9}");
    }

    #[test]
    fn validation_names_the_field() {
        let mut m = model(Tier::Spot);
        m.tokens_per_second = 0.0;
        assert_eq!(m.validate().map_err(|e| e.field), Err("tokens_per_second"));
        let mut m = model(Tier::InHouse);
        m.capacity = 0;
        assert_eq!(m.validate().map_err(|e| e.field), Err("capacity"));
        let mut m = model(Tier::Payg);
        m.knee = 1.5;
        assert_eq!(m.validate().map_err(|e| e.field), Err("knee"));
        assert_eq!(model(Tier::Payg).validate(), Ok(()));
    }
}

#[cfg(test)]
mod tier_tests {
    use super::Tier;

    #[test]
    fn all_lists_every_tier() {
        for (i, t) in Tier::ALL.into_iter().enumerate() {
            assert_eq!(t.position(), i, "{t}");
            assert_eq!(Tier::parse(t.as_str()), Some(t));
            assert!(Tier::EXPECTED.contains(t.as_str()), "{t}");
        }
        assert_eq!(Tier::parse("gpu"), None);
    }
}
