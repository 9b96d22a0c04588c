//! All pay-as-you-go: every request to the cheapest API that serves its
//! model (list prices), one retry on the next cheapest after a 429 or a
//! 5xx. The counterfactual every saving is measured against, run as a
//! strategy so its latency and failures are measured too. Residency as a
//! LiteLLM-fronted deployment expresses it (EU personal data to EU APIs).
//!
//! Source: not a product but the ledger's own counterfactual (the
//! cheapest pay-as-you-go destination the compiled tables allow for the
//! request, at list price, `ace-pricing`; `ledger/README.md`), made a
//! strategy; the residency rule is LiteLLM's `region_name` pre-call check
//! (`litellm/utils.py` `is_region_allowed`, `sim/peers-source.md` §7),
//! which is all a gateway in front of APIs alone needs.

use super::{cheapest_payg, retryable, Candidates, Rules};
use crate::engine::{Answered, Next, Policy, Route, World};

/// The all-pay-as-you-go strategy.
#[derive(Debug)]
pub struct AllPayg {
    candidates: Candidates,
}

impl AllPayg {
    /// Over the destinations in `listed`.
    pub fn new(listed: Vec<bool>) -> AllPayg {
        AllPayg {
            candidates: Candidates::new(Rules::RESIDENCY, listed),
        }
    }
}

impl Policy for AllPayg {
    fn name(&self) -> String {
        "all-payg".into()
    }

    fn route(&mut self, w: &World<'_>, r: u32) -> Route {
        let c = self.candidates.of(w, r);
        cheapest_payg(w, r, c, &[]).map_or(Route::Refuse(503), Route::To)
    }

    fn answered(&mut self, w: &World<'_>, at: &Answered<'_>) -> Next {
        let (r, a, n, tried) = (at.r, at.answer, at.n, at.tried);
        if n >= 1 || !retryable(a.status) {
            return Next::Deliver;
        }
        let c = self.candidates.of(w, r);
        match cheapest_payg(w, r, c, tried) {
            Some(d) => Next::Retry {
                after_ms: 0,
                route: Route::To(d),
            },
            None => Next::Deliver,
        }
    }
}
