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
//! add up to its total exactly, and sums of them to the sum of totals. A
//! request with no feasible pay-as-you-go destination has nothing to save
//! against: `C` is taken as `B`.

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
        self.utilisation + self.arbitrage + self.routing + self.caching
    }

    /// Add `o` into `self`.
    pub fn add(&mut self, o: &Split) {
        self.utilisation += o.utilisation;
        self.arbitrage += o.arbitrage;
        self.routing += o.routing;
        self.caching += o.caching;
    }

    /// The split of one request.
    pub fn of(r: &Row) -> Split {
        if !r.served() {
            return Split::default();
        }
        let b = r.booked;
        let c = r.counterfactual.unwrap_or(b);
        if r.cached {
            return Split {
                caching: c - b,
                ..Split::default()
            };
        }
        let cs = r.served_counterfactual.unwrap_or(c);
        let tier_part = cs - b;
        let owned = r
            .tier
            .as_deref()
            .and_then(Tier::parse)
            .is_some_and(Tier::is_sunk);
        Split {
            utilisation: if owned { tier_part } else { 0 },
            arbitrage: if owned { 0 } else { tier_part },
            routing: c - cs,
            caching: 0,
        }
    }
}
