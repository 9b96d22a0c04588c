//! The counters every host reports, each named once.
//!
//! Why a type and not positions: a host keeps one Envoy counter id per
//! counter in a table, and the flow says which to count. With the names
//! and the variants written side by side in one list ([`Fleet`],
//! [`PerDestination`]), a new counter is one line here, its name follows
//! it everywhere (the Wasm filter's and the dynamic module's definitions,
//! the mocks), and no list of positions can drift from a list of names.
//! [`Counter::index`] is the only place the table's layout is written.
//!
//! Envoy shows them under its own prefix (`wasmcustom.` for the Wasm
//! filter); dollars are counted in whole nano-USD ([`nano_usd`]).

use crate::event::Event;
use ace_config::Config;
use ace_core::dispatch::Decision;
use ace_core::health::{Change, Outcome};

/// An enum whose variants each carry their metric name, with `ALL` (in
/// index order) and `name()` derived from the one list.
macro_rules! named {
    ($(#[$m:meta])* pub enum $ty:ident {
        $( $(#[$d:meta])* $v:ident => $name:literal, )*
    }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $ty { $( $(#[$d])* $v, )* }

        impl $ty {
            /// Every one, in index order.
            pub const ALL: &'static [$ty] = &[$($ty::$v,)*];

            /// Its name in Envoy's stats.
            pub const fn name(self) -> &'static str {
                match self { $($ty::$v => $name,)* }
            }
        }
    };
}

named! {
    /// A fleet-wide counter.
    pub enum Fleet {
        /// Requests seen.
        Requests => "ace.requests",
        /// Requests refused with no feasible, healthy destination.
        NoDestination => "ace.no_destination",
        /// Destinations tripped out.
        Trips => "ace.trips",
        /// Capacity caps cut by a 429.
        CapCuts => "ace.cap_cuts",
        /// Destinations derated for slowness.
        Derates => "ace.derates",
        /// Booked (true marginal) cost, nano-USD.
        BookedNanoUsd => "ace.booked_nano_usd",
        /// The all-pay-as-you-go counterfactual, nano-USD.
        CounterfactualNanoUsd => "ace.counterfactual_nano_usd",
        /// Requests run again on the next destination (`retry_next`, the
        /// dynamic module); not counted again in [`Fleet::Requests`].
        Retries => "ace.retries",
        /// Requests routed with no policy tables (`allow_no_policy`).
        WithoutPolicy => "ace.requests_without_policy",
        /// Requests served by another model than the one they named.
        Substitutions => "ace.model_substitutions",
        /// Requests answered from the cache.
        CacheHits => "ace.cache.hits",
        /// Cacheable requests the cache had no answer for.
        CacheMisses => "ace.cache.misses",
        /// Answers stored in the cache.
        CacheStores => "ace.cache.stores",
        /// Hits sent upstream as well, to check them.
        CacheChecks => "ace.cache.checks",
        /// Checked hits whose fresh answer differed: the false-hit rate is
        /// this over [`Fleet::CacheChecks`].
        CacheFalseHits => "ace.cache.false_hits",
        /// Requests a tenant budget refused (429: exhausted, out of
        /// tokens for the minute, or soft with no rung it allows).
        BudgetRefused => "ace.budget.refused",
        /// Requests served under a soft budget, on the rungs it allows.
        BudgetSoft => "ace.budget.soft",
        /// Answers (2xx, whole) whose usage was not found or could not be
        /// read: booked at the request's estimate ([`crate::usage`]).
        UsageUnread => "ace.usage.unread",
    }
}

named! {
    /// A counter kept per destination, named
    /// `ace.destination.NAME.tier.TIER.` and this.
    pub enum PerDestination {
        /// Requests sent to it.
        Requests => "requests",
        /// Answers that count as failures against its health.
        Failures => "failures",
        /// Answers that throttled (429).
        Throttled => "throttled",
    }
}

/// One counter: fleet-wide, or one destination's (by its index in the
/// configuration).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Counter {
    /// A fleet-wide counter.
    Fleet(Fleet),
    /// Destination `.0`'s counter `.1`.
    Destination(usize, PerDestination),
}

impl From<Fleet> for Counter {
    #[inline]
    fn from(f: Fleet) -> Counter {
        Counter::Fleet(f)
    }
}

impl Counter {
    /// Its slot in a host's table of counter ids: the order of
    /// [`Counter::names`] (the fleet's, then each destination's in turn).
    #[inline]
    pub const fn index(self) -> usize {
        match self {
            Counter::Fleet(f) => f as usize,
            Counter::Destination(d, c) => {
                Fleet::ALL.len() + PerDestination::ALL.len() * d + c as usize
            }
        }
    }

    /// Every counter's name for `cfg`, in [`Counter::index`] order.
    pub fn names(cfg: &Config) -> Vec<String> {
        let mut names: Vec<String> = Fleet::ALL.iter().map(|f| f.name().to_string()).collect();
        for (d, m) in cfg.destinations.iter().zip(&cfg.models) {
            for c in PerDestination::ALL {
                names.push(format!(
                    "ace.destination.{}.tier.{}.{}",
                    d.name,
                    m.tier.as_str(),
                    c.name()
                ));
            }
        }
        names
    }

    /// What a decision counts: one request on its destination.
    #[inline]
    pub fn decided(decision: &Decision) -> [(Counter, u64); 1] {
        [(
            Counter::Destination(decision.index, PerDestination::Requests),
            1,
        )]
    }

    /// What a finished request books: the dollars of its final event (its
    /// reported usage when the upstream gave one, else the bounded
    /// estimate), so that the counters and the event log agree.
    pub fn booked(event: &Event) -> [(Counter, u64); 2] {
        let served = event.destination.is_some();
        let usd = |v: f64| if served { nano_usd(v) } else { 0 };
        [
            (
                Counter::Fleet(Fleet::BookedNanoUsd),
                usd(event.marginal_usd),
            ),
            (
                Counter::Fleet(Fleet::CounterfactualNanoUsd),
                usd(event.counterfactual_usd.unwrap_or(0.0)),
            ),
        ]
    }

    /// The per-destination counter an outcome on `d` counts in, if any.
    #[inline]
    pub fn outcome(d: usize, outcome: Option<Outcome>) -> Option<Counter> {
        match outcome? {
            Outcome::Failure { .. } => Some(Counter::Destination(d, PerDestination::Failures)),
            Outcome::Throttled { .. } => Some(Counter::Destination(d, PerDestination::Throttled)),
            Outcome::Success { .. } => None,
        }
    }

    /// The counter a health change counts in, if any.
    #[inline]
    pub fn change(change: Change) -> Option<Counter> {
        match change {
            Change::Tripped { .. } => Some(Counter::Fleet(Fleet::Trips)),
            Change::CapCut { .. } => Some(Counter::Fleet(Fleet::CapCuts)),
            Change::Derated { .. } => Some(Counter::Fleet(Fleet::Derates)),
            Change::Recovered | Change::None => None,
        }
    }
}

/// USD as whole nano-dollars for the dollar counters (0 when not positive).
pub fn nano_usd(usd: f64) -> u64 {
    if usd.is_finite() && usd > 0.0 {
        // Rounds half up (usd > 0); the cast saturates.
        (usd * 1e9 + 0.5) as u64
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_index_names_its_counter() {
        let cfg = Config::parse(
            br#"{"allow_no_policy":true,"destinations":[{"name":"a","cluster":"a"},{"name":"b","cluster":"b","tier":"payg","usd_per_input_token":1e-6,"usd_per_output_token":1e-6}]}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let names = Counter::names(&cfg);
        let at = |c: Counter| names.get(c.index()).map(String::as_str);
        for &f in Fleet::ALL {
            assert_eq!(at(f.into()), Some(f.name()));
        }
        assert_eq!(at(Fleet::Requests.into()), Some("ace.requests"));
        assert_eq!(
            at(Counter::Destination(1, PerDestination::Requests)),
            Some("ace.destination.b.tier.payg.requests")
        );
        let fail = Counter::outcome(1, Some(Outcome::Failure { tenant: 0 }));
        assert_eq!(
            fail.and_then(at),
            Some("ace.destination.b.tier.payg.failures")
        );
        let throttled = Counter::outcome(
            0,
            Some(Outcome::Throttled {
                retry_after_ms: None,
            }),
        );
        assert_eq!(
            throttled.and_then(at),
            Some("ace.destination.a.tier.payg.throttled")
        );
        assert_eq!(
            names.len(),
            Fleet::ALL.len() + 2 * PerDestination::ALL.len()
        );
    }

    #[test]
    fn nano_usd_rounds_and_floors_at_zero() {
        assert_eq!(nano_usd(1.5e-9), 2);
        assert_eq!(nano_usd(-1.0), 0);
        assert_eq!(nano_usd(f64::NAN), 0);
        assert_eq!(nano_usd(f64::INFINITY), 0);
    }
}
