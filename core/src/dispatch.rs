//! The decision: feasible AND healthy AND under cap, then the lowest
//! effective cost.
//!
//! It runs in two steps, so the per-request step is a few multiply-adds
//! per candidate and nothing else:
//!
//! 1. **Price the fleet** ([`Slate::refresh`], [`Slate::refresh_one`]): when
//!    health or load changes, turn each destination's cost model, health
//!    and in-flight count into a [`Lane`] of numbers that hold until the
//!    next change: its per-token marginal prices now (a reserved block past
//!    its commitment prices at its overage, unless its provider's own
//!    word set the cap: then it is closed like any other), its queueing
//!    delay past the knee, its expected time to first token at the SLO's
//!    quantile (learned by load where it has answered enough, else
//!    declared: [`crate::latency`]), its rank multiplier (derate times
//!    bias); and a bit in the `open` mask when it can take a request
//!    (breaker not open, under its cap).
//! 2. **Decide** ([`decide`]), per request, over the candidates
//!    `feasible & open`:
//!
//! ```text
//! marginal(d)  = (tokens_in - held(d)) * per_in(d) + tokens_out * per_out(d)
//!                + (cold(d) unless warm)
//! late(d)      = ttft(d) - held_s(d) > the class's target
//! effective(d) = (marginal(d) + latency_value * (delay(d) - held_s(d))
//!                 + late_usd * late(d)) * rank(d)
//!                where rank(d) = derate(d) * bias(d)
//! choose the lowest effective; ties go to the lower index
//! ```
//!
//! `held(d)` and `held_s(d)` are what destination `d` already holds of
//! this request's prompt ([`Held`], prefix locality): the input tokens it
//! will not charge in full (its prompt cache's discount, in full-price
//! tokens) and the prefill seconds it will skip. Both are zero unless a
//! host passes them; they move a candidate's rank and its booked estimate,
//! never whether it is a candidate.
//!
//! The latency class prices latency twice, each as what it is worth to
//! the class: `latency_value` per second of queueing (a smooth
//! preference), and `late_usd`, what missing the class's time-to-first-
//! token target costs. So under load an interactive request leaves a
//! filling rung for the next one before its target breaks, while a batch
//! request, with no target, keeps the cheap capacity busy. A class that
//! refuses lateness (`refuse_late`) is never sent to a late rung: with no
//! rung on time it is refused ([`Refusal::NoTimelyDestination`]).
//!
//! The result carries the chosen destination, the runner-up, the true
//! marginal cost (what the ledger books; bias and derate never touch it), the
//! all-pay-as-you-go counterfactual, and a reason code. Nothing allocates
//! per decision: the inputs are borrowed and the output is a small `Copy`
//! value. Infeasible destinations are never looked at, so no cost, bias or
//! health state can make one win: compliance fails closed by construction.

use crate::cost::CostModel;
use crate::health::{Breaker, Health, HealthPolicy};
use crate::latency::{self, Learned};
use crate::signal::Live;
use alloc::vec;
use alloc::vec::Vec;

/// The fleet as the pricing step sees it: parallel slices, one entry per
/// destination, in table order.
#[derive(Clone, Copy, Debug)]
pub struct Fleet<'a> {
    /// Cost parameters (validated at load).
    pub models: &'a [CostModel],
    /// Current health.
    pub health: &'a [Health],
    /// Requests in flight now (summed over all workers).
    pub in_flight: &'a [u32],
    /// What the control service says of each destination; missing entries
    /// (an empty slice) say nothing.
    pub live: &'a [Live],
    /// Each destination's latency as learned from its answers; missing
    /// entries (an empty slice) have learned nothing.
    pub learned: &'a [Learned],
    /// Health tunables.
    pub policy: &'a HealthPolicy,
}

/// The request's side of the decision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Request {
    /// Estimated input tokens.
    pub tokens_in: u32,
    /// Estimated output tokens.
    pub tokens_out: u32,
    /// What a second of extra latency is worth for this request's class, USD.
    pub latency_usd_per_s: f64,
    /// The class's time-to-first-token target, seconds (infinite: none).
    pub ttft_target_s: f64,
    /// What missing that target costs, USD: added to a late rung's rank.
    pub late_usd: f64,
    /// Whether a late rung may serve the request at all.
    pub refuse_late: bool,
    /// The most the request's booked marginal cost may be, USD (a soft
    /// budget's ceiling): a dearer rung is not a candidate. Infinite (the
    /// usual case): no ceiling. NaN admits nothing.
    pub max_usd: f64,
}

impl Request {
    /// A request of `tokens_in` + `tokens_out` whose class values a second
    /// of queueing at `latency_usd_per_s` and has no time-to-first-token
    /// target.
    pub const fn untimed(tokens_in: u32, tokens_out: u32, latency_usd_per_s: f64) -> Request {
        Request {
            tokens_in,
            tokens_out,
            latency_usd_per_s,
            ttft_target_s: f64::INFINITY,
            late_usd: 0.0,
            refuse_late: false,
            max_usd: f64::INFINITY,
        }
    }
}

/// What each destination already holds of one request's prompt (prefix
/// locality), indexed like the slate; entries past a slice's end are
/// zero. Never a reason to become a candidate: it lowers the rank and the
/// estimate of destinations that already are (feasible and open).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Held<'a> {
    /// Input tokens the destination will not charge at full price: its
    /// expected cached tokens times one minus its cached-price factor. At
    /// most the request's input tokens (larger values are bounded).
    pub tokens: &'a [f64],
    /// Prefill seconds the destination will skip (earlier first token).
    pub seconds: &'a [f64],
}

impl Held<'_> {
    /// Nothing held anywhere.
    pub const NONE: Held<'static> = Held {
        tokens: &[],
        seconds: &[],
    };

    /// Whether nothing is held anywhere (the common decision).
    #[inline]
    pub fn is_none(&self) -> bool {
        self.tokens.is_empty() && self.seconds.is_empty()
    }

    /// Destination `d`'s tokens and seconds, each bounded to be finite,
    /// non-negative, and the tokens at most `tokens_in`.
    #[inline]
    pub fn at(&self, d: usize, tokens_in: f64) -> (f64, f64) {
        let clean = |v: Option<&f64>| {
            v.copied()
                .filter(|x| x.is_finite() && *x > 0.0)
                .unwrap_or(0.0)
        };
        (
            clean(self.tokens.get(d)).min(tokens_in),
            clean(self.seconds.get(d)),
        )
    }
}

/// Why the destination was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Lowest effective cost among several candidates.
    Cheapest,
    /// The only candidate.
    OnlyOption,
    /// A cheaper feasible destination is tripped, throttled or full, so the
    /// request spilled along the merit order.
    Spill,
    /// The destination is half-open and this request is its probe.
    Probe,
    /// No feasible open destination is expected to meet the class's
    /// time-to-first-token target: the cheapest late one, served late.
    Late,
}

impl Reason {
    /// Stable name for headers, events and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::Cheapest => "cheapest",
            Reason::OnlyOption => "only_option",
            Reason::Spill => "spill",
            Reason::Probe => "half_open_probe",
            Reason::Late => "late",
        }
    }
}

/// Why nothing was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Policy allows no destination for this request.
    NoFeasibleDestination,
    /// Some are allowed, but every one is tripped, throttled or full.
    NoHealthyDestination,
    /// Some are allowed and open, but none is expected to meet the class's
    /// time-to-first-token target, and the class refuses lateness.
    NoTimelyDestination,
    /// Some are allowed and open, but every one would cost more than the
    /// request's ceiling ([`Request::max_usd`]: a soft budget).
    NoAffordableDestination,
}

impl Refusal {
    /// Stable name for error bodies, events and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            Refusal::NoFeasibleDestination => "no_feasible_destination",
            Refusal::NoHealthyDestination => "no_healthy_destination",
            Refusal::NoTimelyDestination => "no_timely_destination",
            Refusal::NoAffordableDestination => "no_affordable_destination",
        }
    }
}

/// The outcome of one decision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decision {
    /// Chosen destination index.
    pub index: usize,
    /// Next-best candidate, if any.
    pub runner_up: Option<usize>,
    /// True marginal cost of the request on the chosen destination, USD.
    pub marginal_usd: f64,
    /// The rank the choice won with (marginal + latency, x derate, x bias).
    pub effective_usd: f64,
    /// What the cheapest feasible pay-as-you-go destination would have
    /// charged at list price (`None` when the fleet has no feasible payg).
    pub counterfactual_usd: Option<f64>,
    /// The pay-as-you-go destination the counterfactual was priced on.
    pub counterfactual_index: Option<usize>,
    /// Why.
    pub reason: Reason,
    /// The booked prices per input and output token (the winner's true
    /// marginal prices at the load it was chosen at), to book the request
    /// again once its real usage is known.
    pub per_in: f64,
    /// See [`Decision::per_in`].
    pub per_out: f64,
    /// The cold-load cost booked (0 when the model was resident).
    pub cold_usd: f64,
    /// Whether the model was resident on the winner.
    pub warm: bool,
    /// Whether the winner was a reserved block past its commitment, priced
    /// at its overage.
    pub overage: bool,
    /// Whether the winner was expected to miss the class's target.
    pub late: bool,
    /// The winner's load band when chosen ([`crate::latency::band`]): where
    /// its answer's time to first byte is learned.
    pub band: u8,
    /// The input tokens the winner was expected not to charge in full
    /// ([`Held::tokens`]): already out of `marginal_usd`.
    pub held_tokens: f64,
}

impl Decision {
    /// The true marginal cost of `tokens_in` + `tokens_out` at the prices
    /// this decision booked.
    pub fn cost_of(&self, tokens_in: u32, tokens_out: u32) -> f64 {
        self.cost_of_billed(f64::from(tokens_in), tokens_out)
    }

    /// [`Decision::cost_of`] with the input as billed
    /// ([`crate::cost::billed_input`]).
    pub fn cost_of_billed(&self, billed_in: f64, tokens_out: u32) -> f64 {
        billed_in * self.per_in + f64::from(tokens_out) * self.per_out + self.cold_usd
    }
}

/// Is bit `i` set in `mask`? Missing words read as zero (fail closed).
#[inline]
pub fn bit(mask: &[u64], i: usize) -> bool {
    mask.get(i / 64).is_some_and(|w| (w >> (i % 64)) & 1 == 1)
}

fn set_bit(mask: &mut [u64], i: usize, on: bool) {
    if let Some(w) = mask.get_mut(i / 64) {
        let b = 1u64 << (i % 64);
        if on {
            *w |= b;
        } else {
            *w &= !b;
        }
    }
}

/// One destination, priced at one instant (see [`Slate::lane`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Lane {
    /// True marginal price of an input token now, USD.
    pub per_in: f64,
    /// True marginal price of an output token now, USD.
    pub per_out: f64,
    /// Added when the model is not resident.
    pub cold: f64,
    /// Expected queueing delay past the knee, seconds.
    pub delay_s: f64,
    /// Expected time to first token at the SLO's quantile now, seconds.
    pub ttft_s: f64,
    /// Health derate (>= 1) times operator bias: the rank multiplier, which
    /// never touches the booked cost.
    pub rank: f64,
    /// Input-token price with room to spare (for pay-as-you-go: the list
    /// price, the counterfactual's basis).
    pub rest_in: f64,
    /// Output-token price with room to spare.
    pub rest_out: f64,
}

/// The fleet priced for [`decide`]: per destination, the numbers of a
/// [`Lane`], stored as one array per number so the per-request arithmetic
/// runs over contiguous memory in SIMD registers; plus bit masks. Built
/// once per configuration ([`Slate::new`]) and refreshed in place, so
/// pricing never allocates either.
#[derive(Clone, Debug, PartialEq)]
pub struct Slate {
    /// Destinations; the columns are padded to whole 64-lane words.
    n: usize,
    per_in: Vec<f64>,
    per_out: Vec<f64>,
    cold: Vec<f64>,
    delay_s: Vec<f64>,
    ttft_s: Vec<f64>,
    rank: Vec<f64>,
    rest_in: Vec<f64>,
    rest_out: Vec<f64>,
    /// Load band per destination ([`crate::latency::band`]).
    band: Vec<u8>,
    /// Destinations that can take a request now.
    open: Vec<u64>,
    /// Half-open destinations (a request there is the probe).
    probe: Vec<u64>,
    /// Pay-as-you-go destinations.
    payg: Vec<u64>,
    /// Destinations whose price can change with time alone (see
    /// [`Health::depends_on_time`]): [`Slate::refresh_timed`] reprices them.
    timed: Vec<u64>,
    /// Every destination (bits past the fleet are zero).
    all: Vec<u64>,
}

impl Slate {
    /// A slate for `n` destinations, all closed until refreshed.
    pub fn new(n: usize) -> Slate {
        let words = n.div_ceil(64);
        let lanes = words * 64;
        let mut all = vec![0u64; words];
        (0..n).for_each(|d| set_bit(&mut all, d, true));
        Slate {
            n,
            per_in: vec![0.0; lanes],
            per_out: vec![0.0; lanes],
            cold: vec![0.0; lanes],
            delay_s: vec![0.0; lanes],
            ttft_s: vec![0.0; lanes],
            rank: vec![1.0; lanes],
            rest_in: vec![0.0; lanes],
            rest_out: vec![0.0; lanes],
            band: vec![0; lanes],
            open: vec![0; words],
            probe: vec![0; words],
            payg: vec![0; words],
            timed: vec![0; words],
            all,
        }
    }

    /// Price every destination at `now_ms`.
    pub fn refresh(&mut self, fleet: &Fleet<'_>, now_ms: u64) {
        for d in 0..self.len() {
            self.refresh_one(fleet, d, now_ms);
        }
    }

    /// Reprice, at `now_ms`, the destinations whose price can change with
    /// time alone (usually none). A slate kept current with
    /// [`Slate::refresh_one`] on every change and this before every decision
    /// is the slate [`Slate::refresh`] would build at `now_ms`.
    pub fn refresh_timed(&mut self, fleet: &Fleet<'_>, now_ms: u64) {
        for w in 0..self.timed.len() {
            let mut bits = self.timed.get(w).copied().unwrap_or(0);
            while bits != 0 {
                let b = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                self.refresh_one(fleet, w * 64 + b, now_ms);
            }
        }
    }

    /// Price destination `d` at `now_ms` (after its health or load changed).
    /// A destination missing from `fleet` is closed.
    pub fn refresh_one(&mut self, fleet: &Fleet<'_>, d: usize, now_ms: u64) {
        if d >= self.n {
            return;
        }
        let priced = match (fleet.models.get(d), fleet.health.get(d)) {
            (Some(model), Some(health)) => {
                let in_flight = fleet.in_flight.get(d).copied().unwrap_or(0);
                let live = fleet.live.get(d);
                let learned = fleet.learned.get(d);
                Some(price(
                    model,
                    health,
                    live,
                    learned,
                    in_flight,
                    now_ms,
                    fleet.policy,
                ))
            }
            _ => None,
        };
        let Some((lane, band, open, probe, payg)) = priced else {
            set_bit(&mut self.open, d, false);
            set_bit(&mut self.timed, d, false);
            return;
        };
        let timed = fleet
            .health
            .get(d)
            .is_some_and(|h| h.depends_on_time(now_ms))
            || fleet.live.get(d).is_some_and(|l| l.depends_on_time(now_ms));
        for (column, value) in [
            (&mut self.per_in, lane.per_in),
            (&mut self.per_out, lane.per_out),
            (&mut self.cold, lane.cold),
            (&mut self.delay_s, lane.delay_s),
            (&mut self.ttft_s, lane.ttft_s),
            (&mut self.rank, lane.rank),
            (&mut self.rest_in, lane.rest_in),
            (&mut self.rest_out, lane.rest_out),
        ] {
            if let Some(slot) = column.get_mut(d) {
                *slot = value;
            }
        }
        if let Some(slot) = self.band.get_mut(d) {
            *slot = band;
        }
        set_bit(&mut self.open, d, open);
        set_bit(&mut self.probe, d, probe);
        set_bit(&mut self.payg, d, payg);
        set_bit(&mut self.timed, d, timed);
    }

    /// The destinations priced.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether the slate prices no destination.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Destination `d`'s numbers.
    pub fn lane(&self, d: usize) -> Option<Lane> {
        if d >= self.n {
            return None;
        }
        Some(Lane {
            per_in: *self.per_in.get(d)?,
            per_out: *self.per_out.get(d)?,
            cold: *self.cold.get(d)?,
            delay_s: *self.delay_s.get(d)?,
            ttft_s: *self.ttft_s.get(d)?,
            rank: *self.rank.get(d)?,
            rest_in: *self.rest_in.get(d)?,
            rest_out: *self.rest_out.get(d)?,
        })
    }

    /// Whether destination `d` can take a request now.
    pub fn is_open(&self, d: usize) -> bool {
        bit(&self.open, d)
    }
}

/// One destination's lane at `now_ms`, its load band, and whether it is
/// open, half-open and pay-as-you-go.
fn price(
    model: &CostModel,
    health: &Health,
    live: Option<&Live>,
    learned: Option<&Learned>,
    in_flight: u32,
    now_ms: u64,
    policy: &HealthPolicy,
) -> (Lane, u8, bool, bool, bool) {
    let learned = learned.filter(|l| l.is_learned());
    match live.filter(|l| !l.is_neutral()) {
        // Most destinations carry no signal: priced from the configured
        // model itself (one pricing path per source of the model, so the
        // common one reads its fields where they are).
        None => price_model(model, health, learned, in_flight, false, now_ms, policy),
        Some(live) => {
            let (model, in_flight, drained) = live.adjust(model, in_flight, now_ms);
            price_model(&model, health, learned, in_flight, drained, now_ms, policy)
        }
    }
}

/// [`price`] of `model` as the signals left it (`drained`: closed by one).
#[inline(always)]
fn price_model(
    model: &CostModel,
    health: &Health,
    learned: Option<&Learned>,
    in_flight: u32,
    drained: bool,
    now_ms: u64,
    policy: &HealthPolicy,
) -> (Lane, u8, bool, bool, bool) {
    let (rest_in, rest_out) = model.rest_prices();
    let cap = health.cap(model.capacity, now_ms);
    // Past the commitment: the overage price, if there is one; past a cap
    // the provider's own word set, nothing.
    let now_prices = model.prices_at(in_flight, cap, health.provider_limited(now_ms));
    let open = !drained && health.admits(now_ms) && now_prices.is_some();
    let (per_in, per_out) = now_prices.unwrap_or((rest_in, rest_out));
    let sized = cap.or(Some(model.capacity));
    let band = latency::band(in_flight, sized);
    // The queueing past the knee, priced at the class's value of a
    // second. The time to first token: what answers taught at this load
    // (the SLO's quantile), else the declared prior, lightly loaded plus
    // that queueing. The first band whose learned quantile passes a
    // class's target is that class's knee, as the fleet really behaves.
    let delay_s = model.queueing_delay_s(in_flight, sized);
    let ttft_s = learned
        .and_then(|l| l.estimate_ms(band))
        .map_or(model.ttft_ms / 1000.0 + delay_s, |q| q / 1000.0);
    let lane = Lane {
        per_in,
        per_out,
        cold: model.cold_load_usd,
        delay_s,
        ttft_s,
        rank: health.derate(now_ms, policy) * model.bias,
        rest_in,
        rest_out,
    };
    let probe = health.breaker(now_ms) == Breaker::HalfOpen;
    (lane, band, open, probe, model.tier.is_pay_as_you_go())
}

/// Lanes `base..base + len` of one of the slate's columns.
#[inline]
fn lanes(column: &[f64], base: usize, len: usize) -> Option<&[f64]> {
    column.get(base..base + len)
}

/// Choose a destination for `req` on a priced fleet.
///
/// `feasible` is the policy bitmask (bit i = destination i may serve this
/// request); `warm` says which destinations have the requested model loaded.
/// Both are read as zero past their end.
pub fn decide(
    slate: &Slate,
    feasible: &[u64],
    warm: &[u64],
    req: &Request,
) -> Result<Decision, Refusal> {
    choose(slate, feasible, warm, req, &[], Held::NONE)
}

/// [`decide`] where destination `d`'s token prices are multiplied by
/// `scale[d]` (1 past the slice's end): the price of the model each
/// destination would serve this request with, relative to the price its
/// lane holds (model routing: a smaller model costs less per token on the
/// same destination). The scale moves the rank, the booked cost (the
/// decision's `per_in`, `per_out` and `marginal_usd`) and the
/// counterfactual alike; cold loads and queueing delay are the
/// destination's and are not scaled. Feasibility is `feasible`'s alone.
pub fn decide_scaled(
    slate: &Slate,
    feasible: &[u64],
    warm: &[u64],
    req: &Request,
    scale: &[f64],
) -> Result<Decision, Refusal> {
    choose(slate, feasible, warm, req, scale, Held::NONE)
}

/// [`decide_scaled`] with what each destination already holds of the
/// request's prompt ([`Held`]): a held destination's rank and booked
/// estimate drop by the input it will not charge in full and the prefill
/// time it will skip. Which destinations are candidates is `feasible`'s
/// and the slate's alone.
pub fn decide_held(
    slate: &Slate,
    feasible: &[u64],
    warm: &[u64],
    req: &Request,
    scale: &[f64],
    held: Held<'_>,
) -> Result<Decision, Refusal> {
    choose(slate, feasible, warm, req, scale, held)
}

/// [`decide_held`], written once and inlined into every entry point: in
/// [`decide`] the scale and the held prefix are known to be empty, so the
/// common decision carries none of their arithmetic.
///
/// One pass over the feasible set, 64 destinations (one word of the
/// masks) at a time; each word in steps: the ceiling
/// ([`within_ceiling`]), the rank of every lane ([`rank_lanes`]), the
/// held prefix ([`rank_held`]), cold loads ([`add_cold`]), then the
/// candidates taken in index order ([`Scan::take`]) and the rare paths
/// ([`Scan::rest`]). Every step is inlined here: the pass allocates
/// nothing, and its state stays in registers.
#[inline(always)]
fn choose(
    slate: &Slate,
    feasible: &[u64],
    warm: &[u64],
    req: &Request,
    scale: &[f64],
    held: Held<'_>,
) -> Result<Decision, Refusal> {
    let t = Terms::of(req);
    let mut scan = Scan::START;
    let mut eff = [0.0f64; 64];
    let words = feasible
        .iter()
        .zip(&slate.all)
        .zip(slate.open.iter().zip(&slate.payg));
    for (w, ((&f, &all), (&open, &is_payg))) in words.enumerate() {
        let f = f & all;
        scan.any_feasible |= f;
        let mut candidates = f & open;
        if candidates == 0 && f == 0 {
            continue;
        }
        let word = Word {
            base: w * 64,
            feasible: f,
            open,
            payg: is_payg,
            warm: warm.get(w).copied().unwrap_or(0),
        };
        // A ceiling (rare: a soft budget) keeps only the rungs whose
        // booked cost, as a decision books it, is within it.
        if t.capped {
            let kept = within_ceiling(slate, &t, scale, held, word, candidates);
            scan.priced_out |= kept != candidates;
            candidates = kept;
        }
        scan.any_open |= candidates != 0;
        rank_lanes(slate, &t, scale, word.base, candidates, &mut eff);
        // Prefix locality (rare: most requests hold none).
        if !held.is_none() {
            rank_held(slate, &t, scale, held, word.base, candidates, &mut eff);
        }
        add_cold(slate, word.base, candidates & !word.warm, &mut eff);
        scan.take(word.base, candidates, &eff);
        scan.rest(slate, &t, scale, word);
    }
    if scan.best == usize::MAX {
        return Err(scan.refusal());
    }
    Ok(decision(slate, warm, &t, scale, held, &scan))
}

/// The request's terms, as every step of [`choose`] reads them.
#[derive(Clone, Copy)]
struct Terms {
    /// Input and output tokens.
    tin: f64,
    tout: f64,
    /// USD a second of queueing costs.
    lv: f64,
    /// The time-to-first-token target, seconds (infinite: none), and
    /// whether there is one.
    target: f64,
    timed: bool,
    /// What a late rung adds to its rank (infinite for a class that
    /// refuses lateness: it never ranks a late rung).
    late_usd: f64,
    /// The booked cost's ceiling, and whether there is one (NaN is
    /// capped too, and admits nothing: no cost is below it).
    ceiling: f64,
    capped: bool,
}

impl Terms {
    #[inline(always)]
    fn of(req: &Request) -> Terms {
        Terms {
            tin: f64::from(req.tokens_in),
            tout: f64::from(req.tokens_out),
            lv: req.latency_usd_per_s,
            target: req.ttft_target_s,
            timed: req.ttft_target_s.is_finite(),
            late_usd: if req.refuse_late {
                f64::INFINITY
            } else {
                req.late_usd
            },
            ceiling: req.max_usd,
            capped: req.max_usd != f64::INFINITY,
        }
    }
}

/// One word of the masks: destinations `base..base + 64`, which of them
/// are feasible, open, pay-as-you-go and warm.
#[derive(Clone, Copy)]
struct Word {
    base: usize,
    feasible: u64,
    open: u64,
    payg: u64,
    warm: u64,
}

/// The candidates of `word` whose booked cost, as a decision books it
/// (held input off, scaled, cold load on), is within the ceiling.
#[inline(always)]
fn within_ceiling(
    slate: &Slate,
    t: &Terms,
    scale: &[f64],
    held: Held<'_>,
    word: Word,
    candidates: u64,
) -> u64 {
    let (base, warm_word) = (word.base, word.warm);
    let mut kept = candidates;
    let mut c = candidates;
    while c != 0 {
        let b = c.trailing_zeros() as usize;
        c &= c - 1;
        let d = base + b;
        let within = slate.lane(d).is_some_and(|lane| {
            let cold = if (warm_word >> b) & 1 == 1 {
                0.0
            } else {
                lane.cold
            };
            let s = scale.get(d).copied().unwrap_or(1.0);
            let (held_tokens, _) = held.at(d, t.tin);
            let usd = ((t.tin - held_tokens) * lane.per_in + t.tout * lane.per_out) * s + cold;
            usd <= t.ceiling
        });
        if !within {
            kept &= !(1u64 << b);
        }
    }
    kept
}

/// The rank of every lane of one word up to its last candidate into
/// `eff`, densely: independent multiply-adds over equal-length slices,
/// which the compiler turns into SIMD with no bounds checks; cheaper than
/// picking the lanes one by one.
#[inline(always)]
fn rank_lanes(
    slate: &Slate,
    t: &Terms,
    scale: &[f64],
    base: usize,
    candidates: u64,
    eff: &mut [f64; 64],
) {
    let hi = 64 - candidates.leading_zeros() as usize;
    let (Some(pi), Some(po), Some(dl), Some(ts), Some(rk), Some(out)) = (
        lanes(&slate.per_in, base, hi),
        lanes(&slate.per_out, base, hi),
        lanes(&slate.delay_s, base, hi),
        lanes(&slate.ttft_s, base, hi),
        lanes(&slate.rank, base, hi),
        eff.get_mut(..hi),
    ) else {
        return;
    };
    let (tin, tout, lv) = (t.tin, t.tout, t.lv);
    if t.timed {
        let (target, late_usd) = (t.target, t.late_usd);
        let lanes = out.iter_mut().zip(pi).zip(po).zip(dl).zip(ts).zip(rk);
        for (((((e, pi), po), dl), ts), rk) in lanes {
            let late = if *ts > target { late_usd } else { 0.0 };
            *e = (tin * pi + tout * po + lv * dl + late) * rk;
        }
    } else {
        // No target (most classes): no lateness to read.
        let lanes = out.iter_mut().zip(pi).zip(po).zip(dl).zip(rk);
        for ((((e, pi), po), dl), rk) in lanes {
            *e = (tin * pi + tout * po + lv * dl) * rk;
        }
    }
    // Model routing: the token part of each lane at its model's price
    // (rare: most requests pass no scale).
    if let Some(sc) = scale.get(base..).filter(|s| !s.is_empty()) {
        let lanes = out.iter_mut().zip(pi).zip(po).zip(rk).zip(sc);
        for ((((e, pi), po), rk), s) in lanes {
            *e += (tin * pi + tout * po) * (s - 1.0) * rk;
        }
    }
}

/// Prefix locality: the candidates of one word that hold part of the
/// prompt, ranked again from their parts (input not charged in full,
/// prefill skipped).
#[inline(always)]
fn rank_held(
    slate: &Slate,
    t: &Terms,
    scale: &[f64],
    held: Held<'_>,
    base: usize,
    candidates: u64,
    eff: &mut [f64; 64],
) {
    let mut c = candidates;
    while c != 0 {
        let b = c.trailing_zeros() as usize;
        c &= c - 1;
        let d = base + b;
        let (held_tokens, secs) = held.at(d, t.tin);
        if held_tokens == 0.0 && secs == 0.0 {
            continue;
        }
        if let (Some(e), Some(lane)) = (eff.get_mut(b), slate.lane(d)) {
            let s = scale.get(d).copied().unwrap_or(1.0);
            let ttft = lane.ttft_s - secs;
            let late = if t.timed && ttft > t.target {
                t.late_usd
            } else {
                0.0
            };
            let tokens = ((t.tin - held_tokens) * lane.per_in + t.tout * lane.per_out) * s;
            *e = (tokens + t.lv * (lane.delay_s - secs) + late) * lane.rank;
        }
    }
}

/// A model not resident adds its cold load to the rank of each of `cold`
/// (the word's candidates without it), rank-scaled like the rest.
#[inline(always)]
fn add_cold(slate: &Slate, base: usize, cold: u64, eff: &mut [f64; 64]) {
    let mut cold = cold;
    while cold != 0 {
        let b = cold.trailing_zeros() as usize;
        cold &= cold - 1;
        if let (Some(e), Some(c), Some(r)) = (
            eff.get_mut(b),
            slate.cold.get(base + b),
            slate.rank.get(base + b),
        ) {
            *e += c * r;
        }
    }
}

/// What the pass over the feasible set has found so far. Indices are
/// `usize::MAX` until found.
struct Scan {
    /// A candidate was left out by the ceiling.
    priced_out: bool,
    /// Some feasible destination was open (and within the ceiling).
    any_open: bool,
    /// Some destination was feasible.
    any_feasible: u64,
    /// The lowest and second-lowest rank among the candidates.
    best: usize,
    best_eff: f64,
    second: usize,
    second_eff: f64,
    /// The cheapest feasible pay-as-you-go destination at list price (the
    /// counterfactual).
    payg: usize,
    payg_usd: f64,
    /// The cheapest at-rest marginal among feasible destinations skipped
    /// (closed).
    skipped_usd: f64,
}

impl Scan {
    const START: Scan = Scan {
        priced_out: false,
        any_open: false,
        any_feasible: 0,
        best: usize::MAX,
        best_eff: f64::INFINITY,
        second: usize::MAX,
        second_eff: f64::INFINITY,
        payg: usize::MAX,
        payg_usd: f64::INFINITY,
        skipped_usd: f64::INFINITY,
    };

    /// The candidates of one word, in index order (ties go low), against
    /// the best two so far.
    #[inline(always)]
    fn take(&mut self, base: usize, candidates: u64, eff: &[f64; 64]) {
        let mut c = candidates;
        while c != 0 {
            let b = c.trailing_zeros() as usize;
            c &= c - 1;
            let e = eff.get(b & 63).copied().unwrap_or(f64::INFINITY);
            // A late rung for a class that refuses lateness ranks at
            // infinity: never below either bound, so never chosen.
            if e < self.best_eff {
                (self.second, self.second_eff) = (self.best, self.best_eff);
                (self.best, self.best_eff) = (base + b, e);
            } else if e < self.second_eff {
                (self.second, self.second_eff) = (base + b, e);
            }
        }
    }

    /// The rare paths of one word: the counterfactual (feasible
    /// pay-as-you-go, at list price) and the spill check (feasible but
    /// closed, at rest).
    #[inline(always)]
    fn rest(&mut self, slate: &Slate, t: &Terms, scale: &[f64], word: Word) {
        let (base, warm_word) = (word.base, word.warm);
        let at_rest = |b: usize, cold: bool| {
            let d = base + b;
            let (ri, ro) = (slate.rest_in.get(d), slate.rest_out.get(d));
            let c = if cold { slate.cold.get(d) } else { Some(&0.0) };
            let s = scale.get(d).copied().unwrap_or(1.0);
            match (ri, ro, c) {
                (Some(ri), Some(ro), Some(c)) => (t.tin * ri + t.tout * ro) * s + c,
                _ => f64::INFINITY,
            }
        };
        let mut list = word.feasible & word.payg;
        while list != 0 {
            let b = list.trailing_zeros() as usize;
            list &= list - 1;
            let usd = at_rest(b, false);
            if usd < self.payg_usd {
                (self.payg, self.payg_usd) = (base + b, usd);
            }
        }
        let mut closed = word.feasible & !word.open;
        while closed != 0 {
            let b = closed.trailing_zeros() as usize;
            closed &= closed - 1;
            self.skipped_usd = self.skipped_usd.min(at_rest(b, (warm_word >> b) & 1 == 0));
        }
    }

    /// Why no destination was chosen, the most telling reason first.
    #[inline(always)]
    fn refusal(&self) -> Refusal {
        if self.any_open {
            Refusal::NoTimelyDestination
        } else if self.priced_out {
            Refusal::NoAffordableDestination
        } else if self.any_feasible != 0 {
            Refusal::NoHealthyDestination
        } else {
            Refusal::NoFeasibleDestination
        }
    }
}

/// The decision for the pass's winner: its booked cost (its true
/// marginal, without rank), why it won, and the counterfactual.
#[inline(always)]
fn decision(
    slate: &Slate,
    warm: &[u64],
    t: &Terms,
    scale: &[f64],
    held: Held<'_>,
    scan: &Scan,
) -> Decision {
    let best = scan.best;
    let warm_best = bit(warm, best);
    let lane = slate.lane(best).unwrap_or(Lane {
        per_in: f64::INFINITY,
        per_out: f64::INFINITY,
        cold: 0.0,
        delay_s: 0.0,
        ttft_s: 0.0,
        rank: 1.0,
        rest_in: f64::INFINITY,
        rest_out: f64::INFINITY,
    });
    let cold_usd = if warm_best { 0.0 } else { lane.cold };
    let s = scale.get(best).copied().unwrap_or(1.0);
    let (per_in, per_out) = (lane.per_in * s, lane.per_out * s);
    let (held_tokens, held_s) = held.at(best, t.tin);
    let marginal_usd = (t.tin - held_tokens) * per_in + t.tout * per_out + cold_usd;
    let late = lane.ttft_s - held_s > t.target;
    let reason = if bit(&slate.probe, best) {
        Reason::Probe
    } else if late {
        Reason::Late
    } else if scan.skipped_usd < marginal_usd {
        Reason::Spill
    } else if scan.second != usize::MAX {
        Reason::Cheapest
    } else {
        Reason::OnlyOption
    };
    let payg = (scan.payg != usize::MAX).then_some(scan.payg);
    Decision {
        index: best,
        runner_up: (scan.second != usize::MAX).then_some(scan.second),
        marginal_usd,
        effective_usd: scan.best_eff,
        counterfactual_usd: payg.map(|_| scan.payg_usd),
        counterfactual_index: payg,
        reason,
        per_in,
        per_out,
        cold_usd,
        warm: warm_best,
        overage: lane.per_in != lane.rest_in || lane.per_out != lane.rest_out,
        late,
        band: slate.band.get(best).copied().unwrap_or(0),
        held_tokens,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::cost::Tier;
    use crate::health::Outcome;

    fn owned(cap: u32) -> CostModel {
        CostModel {
            tier: Tier::InHouse,
            usd_per_input_token: 1e-8,
            usd_per_output_token: 1e-8,
            capacity: cap,
            ..CostModel::default()
        }
    }
    fn reserved(cap: u32) -> CostModel {
        CostModel {
            tier: Tier::Reserved,
            usd_per_input_token: 2e-8,
            usd_per_output_token: 2e-8,
            capacity: cap,
            ..CostModel::default()
        }
    }
    fn payg() -> CostModel {
        CostModel {
            tier: Tier::Payg,
            usd_per_input_token: 1e-6,
            usd_per_output_token: 4e-6,
            ..CostModel::default()
        }
    }
    const REQ: Request = Request::untimed(1000, 200, 0.001);

    /// A fleet of `models`, healthy and idle until a test says otherwise
    /// (the queue's tests use it too).
    pub(crate) struct World {
        pub(crate) models: Vec<CostModel>,
        pub(crate) health: Vec<Health>,
        pub(crate) in_flight: Vec<u32>,
        pub(crate) policy: HealthPolicy,
    }
    impl World {
        pub(crate) fn new(models: Vec<CostModel>) -> World {
            let n = models.len();
            World {
                models,
                health: vec![Health::default(); n],
                in_flight: vec![0; n],
                policy: HealthPolicy::default(),
            }
        }
        /// The fleet as pricing sees it.
        pub(crate) fn fleet(&self) -> Fleet<'_> {
            Fleet {
                models: &self.models,
                health: &self.health,
                in_flight: &self.in_flight,
                live: &[],
                learned: &[],
                policy: &self.policy,
            }
        }
        pub(crate) fn slate(&self, now_ms: u64) -> Slate {
            let mut slate = Slate::new(self.models.len());
            slate.refresh(&self.fleet(), now_ms);
            slate
        }
        fn decide(&self, feasible: u64) -> Result<Decision, Refusal> {
            decide(&self.slate(0), &[feasible], &[u64::MAX], &REQ)
        }
    }

    #[test]
    fn owned_fills_to_its_knee_then_reserved_then_payg() {
        let mut w = World::new(vec![payg(), reserved(10), owned(10)]);
        let mut order = Vec::new();
        for _ in 0..25 {
            let d = w.decide(0b111).map(|d| d.index).unwrap_or(99);
            order.push(d);
            if let Some(x) = w.in_flight.get_mut(d) {
                *x += 1;
            }
        }
        // Owned first up to its knee (8 of 10), then reserved to its knee.
        assert_eq!(&order[..8], &[2; 8]);
        assert_eq!(&order[8..16], &[1; 8]);
        assert!(
            order[16..].contains(&0),
            "payg takes the overflow: {order:?}"
        );
        assert!(!order.contains(&99));
    }

    /// Owned (capacity 10) whose first token takes `owned_ms` at every
    /// load, and pay-as-you-go at 800 ms, both as learned from answers.
    fn learned_world(owned_ms: u64) -> (Vec<CostModel>, Vec<Learned>) {
        let mut learned = vec![Learned::default(); 2];
        let p = HealthPolicy::default();
        for _ in 0..crate::latency::WARMUP {
            learned[0].observe(0, 800, 1, 1, &p.learn);
            for band in 0..crate::latency::BANDS as u8 {
                learned[1].observe(band, owned_ms, 1, 1, &p.learn);
            }
        }
        (vec![payg(), owned(10)], learned)
    }

    fn learned_slate(models: &[CostModel], learned: &[Learned], in_flight: &[u32]) -> Slate {
        let health = vec![Health::default(); models.len()];
        let policy = HealthPolicy::default();
        let fleet = Fleet {
            models,
            health: &health,
            in_flight,
            live: &[],
            learned,
            policy: &policy,
        };
        let mut slate = Slate::new(models.len());
        slate.refresh(&fleet, 0);
        slate
    }

    fn timed(target_ms: f64, refuse_late: bool) -> Request {
        Request {
            ttft_target_s: target_ms / 1000.0,
            late_usd: 0.05,
            refuse_late,
            ..REQ
        }
    }

    #[test]
    fn a_class_leaves_a_rung_expected_late_for_it_and_a_class_without_a_target_stays() {
        let (models, learned) = learned_world(1500);
        let slate = learned_slate(&models, &learned, &[0, 2]);
        // Owned answers in 1.5 s: late for a 1 s target, on time for 3 s.
        let interactive = decide(&slate, &[0b11], &[0b11], &timed(1000.0, false));
        assert_eq!(interactive.map(|d| (d.index, d.late)), Ok((0, false)));
        let standard = decide(&slate, &[0b11], &[0b11], &timed(3000.0, false));
        assert_eq!(standard.map(|d| (d.index, d.late)), Ok((1, false)));
        let batch = decide(&slate, &[0b11], &[0b11], &REQ);
        assert_eq!(batch.map(|d| d.index), Ok(1));
        // The booked cost is the true marginal: lateness only ranks.
        let booked = interactive.map(|d| d.marginal_usd).unwrap_or(f64::NAN);
        assert_eq!(booked, 1000.0 * 1e-6 + 200.0 * 4e-6);
    }

    #[test]
    fn with_no_rung_on_time_a_class_is_served_late_or_refused_as_configured() {
        let (models, learned) = learned_world(1500);
        let slate = learned_slate(&models, &learned, &[0, 2]);
        let late = decide(&slate, &[0b11], &[0b11], &timed(500.0, false));
        assert_eq!(
            late.map(|d| (d.index, d.late, d.reason)),
            Ok((1, true, Reason::Late)),
            "the cheapest, late"
        );
        let refused = decide(&slate, &[0b11], &[0b11], &timed(500.0, true));
        assert_eq!(refused, Err(Refusal::NoTimelyDestination));
        // Refusing lateness never refuses what is on time, nor widens
        // anything: an infeasible rung stays out.
        let on_time = decide(&slate, &[0b01], &[0b11], &timed(1000.0, true));
        assert_eq!(on_time.map(|d| d.index), Ok(0));
        let none = decide(&slate, &[0], &[0b11], &timed(1000.0, true));
        assert_eq!(none, Err(Refusal::NoFeasibleDestination));
    }

    #[test]
    fn the_declared_time_to_first_token_is_the_prior_and_the_knee_adds_to_it() {
        let mut o = owned(10);
        o.ttft_ms = 600.0;
        let models = vec![payg(), o];
        let quiet = learned_slate(&models, &[], &[0, 2]);
        let lane = quiet.lane(1).map(|l| l.ttft_s);
        assert_eq!(lane, Some(0.6));
        // Past the knee (0.8 of 10) the queueing adds.
        let busy = learned_slate(&models, &[], &[0, 9]);
        assert!(busy.lane(1).is_some_and(|l| l.ttft_s > 0.6 + 1.0));
        let d = decide(&busy, &[0b11], &[0b11], &timed(1000.0, false));
        assert_eq!(d.map(|d| d.index), Ok(0));
    }

    #[test]
    fn infeasible_destinations_are_never_chosen() {
        let w = World::new(vec![payg(), owned(10)]);
        assert_eq!(w.decide(0b01).map(|d| d.index), Ok(0));
        assert_eq!(w.decide(0), Err(Refusal::NoFeasibleDestination));
    }

    #[test]
    fn a_tripped_destination_spills_to_the_next_and_returns_after_cooldown() {
        let mut w = World::new(vec![payg(), owned(10)]);
        let p = w.policy;
        for _ in 0..3 {
            w.health[1].observe(Outcome::Failure { tenant: 0 }, 0, &p);
        }
        let d = w.decide(0b11);
        assert_eq!(d.map(|d| (d.index, d.reason)), Ok((0, Reason::Spill)));
        assert_eq!(w.decide(0b10), Err(Refusal::NoHealthyDestination));
        let later = w.slate(p.base_cooldown_ms);
        let d = decide(&later, &[0b11], &[u64::MAX], &REQ);
        assert_eq!(d.map(|d| (d.index, d.reason)), Ok((1, Reason::Probe)));
    }

    #[test]
    fn overage_is_past_the_commitment_never_past_the_providers_limit() {
        // A reserved block priced past its commitment (capacity 10) at a
        // fraction of pay-as-you-go.
        let mut block = reserved(10);
        block.overage_usd_per_token = Some(1e-7);
        let mut w = World::new(vec![payg(), block]);
        let p = w.policy;
        // Work that values its time at nothing, so queueing past the
        // knee ranks nothing here.
        let batch = Request::untimed(1000, 200, 0.0);
        let at = |w: &World, now: u64, feasible: u64| {
            decide(&w.slate(now), &[feasible], &[u64::MAX], &batch)
        };
        // Full to its commitment, its provider with room: overage.
        w.in_flight[1] = 10;
        let d = at(&w, 0, 0b11);
        assert_eq!(d.map(|d| (d.index, d.overage)), Ok((1, true)));
        // Its provider says nothing is left (`x-ratelimit-remaining-tokens:
        // 0`, a deployment at 100.5 %): closed, whatever its load, as a
        // block without overage would be; the next request spills.
        for in_flight in [0, 10] {
            w.in_flight[1] = in_flight;
            w.health[1] = Health::default();
            let nothing_left = Outcome::Success {
                latency_ms: 1,
                slo_ms: None,
                headroom: Some(crate::health::Headroom {
                    left: 0.0,
                    reset_ms: 1_000,
                }),
            };
            w.health[1].observe(nothing_left, 0, &p);
            let d = at(&w, 0, 0b11);
            assert_eq!(d.map(|d| (d.index, d.reason)), Ok((0, Reason::Spill)));
            assert_eq!(at(&w, 0, 0b10), Err(Refusal::NoHealthyDestination));
            let d = at(&w, 1_000, 0b11);
            assert_eq!(d.map(|d| d.index), Ok(1), "back when its limit resets");
        }
        // Little left (5 %, half of `headroom_low`): half the cap, and
        // nothing past it at overage either.
        w.health[1] = Health::default();
        w.health[1].observe(
            Outcome::Success {
                latency_ms: 1,
                slo_ms: None,
                headroom: Some(crate::health::Headroom {
                    left: 0.05,
                    reset_ms: 1_000,
                }),
            },
            0,
            &p,
        );
        w.in_flight[1] = 4;
        assert_eq!(
            at(&w, 0, 0b11).map(|d| (d.index, d.overage)),
            Ok((1, false))
        );
        w.in_flight[1] = 5;
        assert_eq!(at(&w, 0, 0b11).map(|d| d.index), Ok(0));
        // A 429: closed past its cut, as any tier.
        w.health[1] = Health::default();
        w.health[1].observe(
            Outcome::Throttled {
                retry_after_ms: Some(1_000),
            },
            0,
            &p,
        );
        assert_eq!(at(&w, 0, 0b11).map(|d| d.index), Ok(0));
    }

    #[test]
    fn bias_moves_the_rank_but_not_the_booked_cost() {
        let mut w = World::new(vec![reserved(10), owned(10)]);
        let unbiased = w.decide(0b11);
        assert_eq!(unbiased.map(|d| d.index), Ok(1));
        w.models[0].bias = 0.1;
        let d = w.decide(0b11);
        assert_eq!(d.map(|d| d.index), Ok(0));
        let booked = d.map(|d| d.marginal_usd).unwrap_or(f64::NAN);
        let true_cost = reserved(10)
            .marginal_usd(1000, 200, true, 0, Some(10), false)
            .unwrap_or(0.0);
        assert_eq!(booked, true_cost);
    }

    #[test]
    fn counterfactual_is_the_cheapest_feasible_payg_list_price() {
        let w = World::new(vec![payg(), owned(10)]);
        let d = w.decide(0b11);
        let expected = 1000.0 * 1e-6 + 200.0 * 4e-6;
        assert_eq!(d.map(|d| d.counterfactual_usd), Ok(Some(expected)));
        assert_eq!(w.decide(0b10).map(|d| d.counterfactual_usd), Ok(None));
    }

    #[test]
    fn a_scale_prices_each_destination_at_its_models_price() {
        let w = World::new(vec![payg(), reserved(10)]);
        let slate = w.slate(0);
        let plain = decide(&slate, &[0b11], &[0b11], &REQ);
        assert_eq!(plain.map(|d| d.index), Ok(1));
        // The pay-as-you-go destination serves a model at a hundredth of
        // its lane's price: now it is the cheaper one, booked at that price.
        let d = decide_scaled(&slate, &[0b11], &[0b11], &REQ, &[0.001, 1.0]);
        assert_eq!(d.map(|d| d.index), Ok(0));
        let expected = (1000.0 * 1e-6 + 200.0 * 4e-6) * 0.001;
        let close = |x: f64| (x - expected).abs() < 1e-18;
        let got = d.map(|d| (d.marginal_usd, d.cost_of(1000, 200), d.counterfactual_usd));
        assert!(
            got.is_ok_and(|(m, c, f)| close(m) && close(c) && f.is_some_and(close)),
            "{got:?}"
        );
        assert_eq!(
            decide_scaled(&slate, &[0b10], &[0b11], &REQ, &[0.001]).map(|d| d.index),
            Ok(1),
            "a scale never widens the feasible set"
        );
    }

    #[test]
    fn cold_models_cost_their_load() {
        let mut a = owned(10);
        a.cold_load_usd = 1.0;
        let b = reserved(10);
        let w = World::new(vec![a, b]);
        let slate = w.slate(0);
        // Model warm only on destination 1: the reserved block wins.
        assert_eq!(
            decide(&slate, &[0b11], &[0b10], &REQ).map(|d| d.index),
            Ok(1)
        );
        assert_eq!(
            decide(&slate, &[0b11], &[0b11], &REQ).map(|d| d.index),
            Ok(0)
        );
    }
}
