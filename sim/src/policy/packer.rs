//! Owned first: a GPU packer's view (Run:ai, KAI scheduler). Requests fill
//! the owned GPUs that serve their model to 100% of their slots, blind to
//! the knee, to spot, reserved and on-demand capacity and to price; what
//! does not fit overflows to the cheapest pay-as-you-go API through a
//! gateway (EU personal data to the EU). No retries: a packer places work,
//! it does not resend it.
//!
//! Source: the KAI Scheduler's README (`NVIDIA/KAI-Scheduler`, summarised
//! in `shared/docs/competitors.md`, its reference X5, and `shared/docs/scheduling.md`'s
//! scheduler table): it places pods on GPUs (bin-pack or spread, queues,
//! quotas, consolidation) and never sees a request, a price or another
//! tier. A packed fleet therefore runs its owned GPUs as full as their
//! serving engines admit, and whatever routes requests in front of it
//! sends the overflow elsewhere; the overflow rule here is the simplest
//! such gateway (the cheapest API serving the model, with the residency
//! rule a LiteLLM `region_name` expresses, `litellm/utils.py`
//! `is_region_allowed`; `sim/peers-source.md` §7).

use super::{cheapest_payg, Candidates, Rules};
use crate::engine::{Answered, Policy, Route, World};
use ace_core::cost::Tier;

/// The owned-first packer.
#[derive(Debug)]
pub struct OwnedFirst {
    candidates: Candidates,
    in_flight: Vec<u32>,
}

impl OwnedFirst {
    /// Over the destinations in `listed`.
    pub fn new(listed: Vec<bool>) -> OwnedFirst {
        let n = listed.len();
        OwnedFirst {
            candidates: Candidates::new(Rules::RESIDENCY, listed),
            in_flight: vec![0; n],
        }
    }
}

impl Policy for OwnedFirst {
    fn name(&self) -> String {
        "owned-first".into()
    }

    fn route(&mut self, w: &World<'_>, r: u32) -> Route {
        let in_flight = &self.in_flight;
        let c = self.candidates.of(w, r);
        let owned = c
            .iter()
            .copied()
            .filter(|d| {
                w.up.get(*d).is_some_and(|u| {
                    u.p.tier == Tier::InHouse
                        && u.p
                            .slots
                            .is_some_and(|s| in_flight.get(*d).copied().unwrap_or(0) < s)
                })
            })
            .min_by_key(|d| (in_flight.get(*d).copied().unwrap_or(0), *d));
        let route = match owned.or_else(|| cheapest_payg(w, r, c, &[])) {
            Some(d) => Route::To(d),
            None => Route::Refuse(503),
        };
        if let Route::To(d) = route {
            if let Some(n) = self.in_flight.get_mut(d) {
                *n += 1;
            }
        }
        route
    }

    fn answered(&mut self, _w: &World<'_>, at: &Answered<'_>) -> crate::engine::Next {
        let (d, a) = (at.dest, at.answer);
        if !(200..300).contains(&a.status) {
            if let Some(n) = self.in_flight.get_mut(d) {
                *n = n.saturating_sub(1);
            }
        }
        crate::engine::Next::Deliver
    }

    fn done(&mut self, _w: &World<'_>, _r: u32, d: usize, _ok: bool) {
        if let Some(n) = self.in_flight.get_mut(d) {
            *n = n.saturating_sub(1);
        }
    }
}
