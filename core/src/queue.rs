//! Waiting as a rung: whether a request should wait at the proxy for a
//! cheaper destination to come back below its knee, rather than take the
//! rung the merit order chose now ([`crate::dispatch::decide`]).
//!
//! A destination past its knee (or at its cap) is dear now: its queueing
//! delay is priced at the class's value of a second, and a class with a
//! target pays `late_usd` where it would miss it. Waiting for it to drop
//! below the knee is one more option, priced the same way:
//!
//! ```text
//! slots(d)   = the slots below the knee: floor(cap(d) * knee(d)), at least 1
//! excess(d)  = in_flight(d) + 1 - slots(d) + ahead(d)   (> 0: past its knee)
//! wait(d)    = excess(d) * service(d) / in_flight(d)   (one slot frees every
//!              service(d) / in_flight(d) seconds)
//! wait_usd(d) = (marginal(d) at the knee + latency_value * wait(d)) * rank(d)
//! ```
//!
//! The request waits for the cheapest such destination when its
//! `wait_usd` is below the effective cost of the rung chosen now, its
//! wait is within the class's bound, and, for a class with a target, the
//! wait plus the destination's unloaded time to first token meets the
//! target: a wait that would make the request late is never taken (the
//! late rung is already priced by the merit order). A destination is a
//! candidate only where it already is for the merit order (feasible, not
//! excluded, its breaker not open): waiting never widens the feasible set.
//!
//! The host re-runs the decision when a slot may have freed; by then the
//! destination waited for is below its knee, so the merit order itself
//! chooses it. Nothing allocates.

use crate::dispatch::{bit, Fleet, Request, Slate};

/// The wait [`wait_for`] found worth taking.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Wait {
    /// The destination waited for.
    pub index: usize,
    /// Expected wait, seconds.
    pub wait_s: f64,
    /// What waiting is priced at: its marginal cost at the knee plus the
    /// wait at the class's value of a second, times the rank.
    pub effective_usd: f64,
}

/// What [`wait_for`] weighs a wait against.
#[derive(Clone, Copy, Debug)]
pub struct Options<'a> {
    /// The candidates the merit order had: the policy's bits with
    /// excluded destinations cleared.
    pub feasible: &'a [u64],
    /// The destinations with the model resident.
    pub warm: &'a [u64],
    /// Requests already waiting for each destination (0 past the end).
    pub ahead: &'a [u32],
    /// The effective cost of the rung the merit order chose now (infinite
    /// when it chose none).
    pub chosen_usd: f64,
    /// The class's bound on waiting, seconds.
    pub max_wait_s: f64,
    /// Now, ms.
    pub now_ms: u64,
}

/// The cheapest wait for a destination past its knee, where it beats the
/// rung chosen now (see the module's docs).
pub fn wait_for(fleet: &Fleet<'_>, slate: &Slate, req: &Request, o: &Options<'_>) -> Option<Wait> {
    let (feasible, warm, ahead, chosen_usd, max_wait_s, now_ms) = (
        o.feasible,
        o.warm,
        o.ahead,
        o.chosen_usd,
        o.max_wait_s,
        o.now_ms,
    );
    let mut best: Option<Wait> = None;
    for (w, word) in feasible.iter().enumerate() {
        let mut bits = *word;
        while bits != 0 {
            let d = w * 64 + bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let ahead = ahead.get(d).copied().unwrap_or(0);
            let cold = !bit(warm, d);
            let at = Candidate { d, cold, ahead };
            let Some(wait) = price_wait(fleet, slate, at, req, max_wait_s, now_ms) else {
                continue;
            };
            if wait.effective_usd < chosen_usd
                && best.is_none_or(|b| wait.effective_usd < b.effective_usd)
            {
                best = Some(wait);
            }
        }
    }
    best
}

/// A destination one might wait for.
#[derive(Clone, Copy)]
struct Candidate {
    d: usize,
    /// The model is not resident there.
    cold: bool,
    /// Requests waiting for it before this one.
    ahead: u32,
}

/// Waiting for a candidate, priced; `None` where it is not fit for
/// waiting (below its knee already, no cap, breaker open, the wait past
/// the bound or the target, its price past the request's ceiling).
#[inline]
fn price_wait(
    fleet: &Fleet<'_>,
    slate: &Slate,
    at: Candidate,
    req: &Request,
    max_wait_s: f64,
    now_ms: u64,
) -> Option<Wait> {
    let Candidate { d, cold, ahead } = at;
    let model = fleet.models.get(d)?;
    let health = fleet.health.get(d)?;
    if !health.admits(now_ms) {
        return None;
    }
    let cap = health.cap(model.capacity, now_ms).filter(|c| *c > 0)?;
    let in_flight = fleet.in_flight.get(d).copied().unwrap_or(0);
    // The slots below the knee, and how far past them this request is.
    let slots = ((f64::from(cap) * model.knee) as u32).clamp(1, cap);
    let excess = (in_flight + 1 + ahead)
        .checked_sub(slots)
        .filter(|e| *e > 0)?;
    let wait_s = f64::from(excess) * model.service_ms / 1000.0 / f64::from(in_flight.max(1));
    if wait_s.is_nan() || wait_s > max_wait_s {
        return None;
    }
    let lane = slate.lane(d)?;
    // Served below the knee: its unloaded time to first token, after the wait.
    let unloaded_s = (lane.ttft_s - lane.delay_s).max(0.0);
    if wait_s + unloaded_s > req.ttft_target_s {
        return None;
    }
    let (per_in, per_out) =
        model.prices_at(slots - 1, Some(cap), health.provider_limited(now_ms))?;
    let marginal = f64::from(req.tokens_in) * per_in + f64::from(req.tokens_out) * per_out;
    if marginal > req.max_usd {
        return None;
    }
    let cold_usd = if cold { lane.cold } else { 0.0 };
    let effective_usd = (marginal + cold_usd + req.latency_usd_per_s * wait_s) * lane.rank;
    Some(Wait {
        index: d,
        wait_s,
        effective_usd,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::{CostModel, Tier};
    use crate::dispatch::decide;
    use crate::dispatch::tests::World;
    use alloc::vec;
    use alloc::vec::Vec;

    /// Owned GPUs, ten slots, a knee at eight, a second a request, 300 ms
    /// to first token unloaded; and a pay-as-you-go API.
    fn models() -> Vec<CostModel> {
        vec![
            CostModel {
                tier: Tier::InHouse,
                usd_per_input_token: 1e-8,
                usd_per_output_token: 1e-8,
                capacity: 10,
                knee: 0.8,
                service_ms: 1000.0,
                ttft_ms: 300.0,
                ..CostModel::default()
            },
            CostModel {
                tier: Tier::Payg,
                usd_per_input_token: 1e-5,
                usd_per_output_token: 1e-5,
                ttft_ms: 500.0,
                ..CostModel::default()
            },
        ]
    }

    /// An interactive request: 1,000 + 200 tokens, a cent a second, a
    /// two-second target.
    fn interactive() -> Request {
        Request {
            ttft_target_s: 2.0,
            late_usd: 0.05,
            ..Request::untimed(1000, 200, 0.01)
        }
    }

    /// The owned server with `owned_in_flight` requests, and the API.
    fn loaded(owned_in_flight: u32) -> World {
        let mut w = World::new(models());
        w.in_flight[0] = owned_in_flight;
        w
    }

    /// The merit order's choice now on `w` and the wait, if any, for
    /// `feasible` with `ahead` waiting and a bound of `max_wait_s`.
    fn ask(
        w: &World,
        req: &Request,
        feasible: u64,
        ahead: u32,
        max_wait_s: f64,
    ) -> (usize, Option<Wait>) {
        let slate = w.slate(0);
        let chosen = decide(&slate, &[feasible], &[u64::MAX], req).unwrap();
        let options = Options {
            feasible: &[feasible],
            warm: &[u64::MAX],
            ahead: &[ahead],
            chosen_usd: chosen.effective_usd,
            max_wait_s,
            now_ms: 0,
        };
        (chosen.index, wait_for(&w.fleet(), &slate, req, &options))
    }

    #[test]
    fn a_request_waits_for_owned_gpus_past_their_knee_when_the_wait_is_cheaper() {
        // Full: the merit order spills to the API; three past the knee,
        // a slot a tenth of a second: 0.3 s, worth USD 0.003, against the
        // API's USD 0.012.
        let (chosen, wait) = ask(&loaded(10), &interactive(), 0b11, 0, 5.0);
        assert_eq!(chosen, 1);
        let wait = wait.unwrap();
        assert_eq!(wait.index, 0);
        assert!((wait.wait_s - 0.3).abs() < 1e-9, "{wait:?}");
        assert!((wait.effective_usd - (1200.0 * 1e-8 + 0.003)).abs() < 1e-12);
    }

    #[test]
    fn no_wait_below_the_knee_past_the_bound_or_the_target_or_dearer_than_now() {
        // Below its knee: the merit order takes it now.
        let (chosen, wait) = ask(&loaded(3), &interactive(), 0b11, 0, 5.0);
        assert_eq!((chosen, wait), (0, None));
        // Past the class's bound on waiting.
        assert_eq!(ask(&loaded(10), &interactive(), 0b11, 0, 0.2).1, None);
        // Forty waiting ahead: 4.3 s plus 0.3 s misses the 2 s target.
        assert_eq!(ask(&loaded(10), &interactive(), 0b11, 40, 60.0).1, None);
        // A class that values a second at a dollar pays more to wait than
        // the API costs.
        let dear = Request {
            latency_usd_per_s: 1.0,
            ..interactive()
        };
        assert_eq!(ask(&loaded(10), &dear, 0b11, 0, 5.0).1, None);
    }

    #[test]
    fn waiting_never_widens_the_feasible_set() {
        // The owned GPUs are not feasible for this request: never waited for.
        let (chosen, wait) = ask(&loaded(10), &interactive(), 0b10, 0, 5.0);
        assert_eq!((chosen, wait), (1, None));
        // Tripped: not waited for either.
        let mut w = loaded(10);
        let policy = w.policy;
        for t in 0..10 {
            w.health[0].observe(crate::health::Outcome::Failure { tenant: 1 }, t, &policy);
        }
        assert_eq!(ask(&w, &interactive(), 0b11, 0, 5.0).1, None);
    }
}
