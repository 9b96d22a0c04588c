//! The four-way savings split of one request.
//!
//! With `C` the counterfactual for the model asked for, `Cs` the same for
//! the model served, and `B` the booked cost (all integer nano-dollars):
//!
//! ```text
//! total       = C - B                     (0 unless served, see Row::served)
//! caching     = C - B       if served from cache, else 0
//! routing     = C - Cs      otherwise (a cheaper model policy allowed)
//! utilisation = Cs - B      otherwise, when the tier is inhouse or reserved
//! arbitrage   = Cs - B      otherwise, when the tier is spot, ondemand or payg
//! ```
//!
//! Each request's parts are differences of the same three integers, so they
//! add up to its total exactly, and sums of them to the sum of totals.
//! Arithmetic saturates at the ends of `i64` instead of panicking: a stored
//! row may hold any value, and a report must still come out (no sane
//! figure comes near ±9.2 billion dollars). A
//! request with no feasible pay-as-you-go destination for the model it
//! asked for has nothing to save against: every part is 0 (`C` is taken as
//! `B`, whatever the model served could have cost).

use crate::money::Nano;
use crate::row::Row;
use ace_core::cost::Tier;

/// Savings by source, nano-dollars.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Split {
    /// Served on owned or reserved capacity.
    pub utilisation: Nano,
    /// Spot or on-demand (or a cheaper pay-as-you-go) instead of the
    /// cheapest pay-as-you-go.
    pub arbitrage: Nano,
    /// A cheaper model that policy allowed.
    pub routing: Nano,
    /// Served from cache.
    pub caching: Nano,
}

impl Split {
    /// The sum of the four.
    pub fn total(&self) -> Nano {
        self.utilisation
            .saturating_add(self.arbitrage)
            .saturating_add(self.routing)
            .saturating_add(self.caching)
    }

    /// Add `o` into `self`.
    pub fn add(&mut self, o: &Split) {
        self.utilisation = self.utilisation.saturating_add(o.utilisation);
        self.arbitrage = self.arbitrage.saturating_add(o.arbitrage);
        self.routing = self.routing.saturating_add(o.routing);
        self.caching = self.caching.saturating_add(o.caching);
    }

    /// The split of one request.
    pub fn of(r: &Row) -> Split {
        if !r.served() {
            return Split::default();
        }
        let b = r.booked;
        // Nothing to save against: the parts are all zero. (Taking `C` as
        // `B` and keeping a served model's `Cs` would book `Cs - B` to the
        // tier and its negative to routing: a zero total split into a
        // gain and a loss that never happened.)
        let Some(c) = r.counterfactual else {
            return Split::default();
        };
        if r.cached {
            return Split {
                caching: c.saturating_sub(b),
                ..Split::default()
            };
        }
        let cs = r.served_counterfactual.unwrap_or(c);
        let tier_part = cs.saturating_sub(b);
        let owned = r
            .tier
            .as_deref()
            .and_then(Tier::parse)
            .is_some_and(Tier::is_sunk);
        Split {
            utilisation: if owned { tier_part } else { 0 },
            arbitrage: if owned { 0 } else { tier_part },
            routing: c.saturating_sub(cs),
            caching: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(booked: Nano, c: Option<Nano>, cs: Option<Nano>, tier: &str, cached: bool) -> Row {
        Row {
            model_requested: Some("big".into()),
            model_served: Some("small".into()),
            destination: Some("d".into()),
            tier: Some(tier.into()),
            tokens_in: 1,
            tokens_out: 1,
            status: 200,
            latency_ms: 1,
            cached,
            booked,
            counterfactual: c,
            served_counterfactual: cs,
            ..Row::default()
        }
    }

    #[test]
    fn parts_by_source() {
        let s = Split::of(&row(10, Some(100), Some(40), "inhouse", false));
        assert_eq!((s.routing, s.utilisation, s.arbitrage), (60, 30, 0));
        let s = Split::of(&row(10, Some(100), Some(40), "spot", false));
        assert_eq!((s.routing, s.utilisation, s.arbitrage), (60, 0, 30));
        let s = Split::of(&row(0, Some(100), Some(40), "inhouse", true));
        assert_eq!((s.caching, s.total()), (100, 100));
    }

    #[test]
    fn no_counterfactual_for_the_model_asked_for_saves_nothing_anywhere() {
        // Only the substitute has a feasible pay-as-you-go destination.
        for tier in ["inhouse", "spot"] {
            for cached in [false, true] {
                let s = Split::of(&row(10, None, Some(40), tier, cached));
                assert_eq!(s, Split::default(), "{tier} cached={cached}");
            }
        }
    }
}
