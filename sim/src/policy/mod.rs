//! The strategies `ace sim` compares, one module each, each documented
//! against the source that describes it.
//!
//! | policy | what it is |
//! | --- | --- |
//! | [`ace`] | ACE: the filter's own request flow, over the simulated fleet |
//! | [`payg`] | everything to the cheapest pay-as-you-go API |
//! | [`litellm`] | LiteLLM's router: five strategies, retries, cool-downs |
//! | [`priority`] | Envoy AI Gateway's priority fallback, as its docs configure it |
//! | [`packer`] | owned GPUs filled to 100%, overflow to pay-as-you-go |
//! | [`prefix`] | SGLang's cache-aware router over the owned GPU servers, spilling to pay-as-you-go |
//!
//! Residency applies to each the way it can say it ([`Rules`]): ACE by the
//! compiled Cedar tables; the gateways by the rules they have a place for
//! (LiteLLM's region filter, Envoy's header-matched routes). A destination
//! no request may ever use (the sanctioned region) is not listed in any
//! gateway at all, as an operator would leave it out.

pub mod ace;
#[cfg(test)]
mod bench;
pub mod litellm;
pub mod packer;
pub mod payg;
pub mod prefix;
pub mod priority;

use crate::engine::World;
use crate::fleet::Upstream;
use crate::mix::Profile;
use ace_core::cost::Tier;

/// The residency and compliance rules a gateway can express.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Rules {
    /// `personal_eu` data only to EU destinations (LiteLLM's
    /// region-based routing; an Envoy route matching the data-class
    /// header).
    pub eu_personal_data: bool,
    /// `phi` only to destinations with a BAA (an Envoy route matching the
    /// data-class header; LiteLLM has no place for it).
    pub phi_needs_baa: bool,
}

impl Rules {
    /// Both rules: a gateway whose routes match the data-class header.
    pub const ALL: Rules = Rules {
        eu_personal_data: true,
        phi_needs_baa: true,
    };
    /// Residency only: a gateway with no place to say that `phi` needs a
    /// BAA.
    pub const RESIDENCY: Rules = Rules {
        eu_personal_data: true,
        phi_needs_baa: false,
    };
}

/// The candidate destinations a gateway has for each profile: those that
/// serve the model, are listed, and pass its rules. Computed once per
/// profile.
#[derive(Clone, Debug, Default)]
pub struct Candidates {
    rules: Rules,
    listed: Vec<bool>,
    cache: Vec<Option<Vec<usize>>>,
}

impl Candidates {
    /// Candidates under `rules`, listing only the destinations in `listed`.
    pub fn new(rules: Rules, listed: Vec<bool>) -> Candidates {
        Candidates {
            rules,
            listed,
            cache: Vec::new(),
        }
    }

    /// Request `r`'s candidates.
    pub fn of(&mut self, w: &World<'_>, r: u32) -> &[usize] {
        let p = w.req(r).profile as usize;
        if self.cache.len() <= p {
            self.cache.resize(p + 1, None);
        }
        let (rules, listed) = (self.rules, &self.listed);
        let slot = match self.cache.get_mut(p) {
            Some(s) => s,
            None => return &[],
        };
        if slot.is_none() {
            let list = match w.profiles.get(p) {
                Some(profile) => {
                    w.up.iter()
                        .enumerate()
                        .filter(|(d, u)| {
                            listed.get(*d).copied().unwrap_or(false) && passes(rules, profile, u)
                        })
                        .map(|(d, _)| d)
                        .collect()
                }
                None => Vec::new(),
            };
            *slot = Some(list);
        }
        slot.as_deref().unwrap_or(&[])
    }
}

/// Whether `u` is a deployment of `profile`'s model and passes `rules`
/// for it. A gateway lists a GPU server for the models deployed on it
/// (the manifest's resident models), an API for the models it offers: an
/// operator does not point a gateway at a server that would have to load
/// the model first.
pub fn passes(rules: Rules, profile: &Profile, u: &Upstream) -> bool {
    let deployed = if u.p.slots.is_some() {
        &u.p.warm
    } else {
        &u.p.models
    };
    if !deployed.contains(&profile.model) {
        return false;
    }
    if rules.eu_personal_data && profile.data_class == "personal_eu" && !u.p.eu {
        return false;
    }
    if rules.phi_needs_baa && profile.data_class == "phi" && !u.p.baa {
        return false;
    }
    true
}

/// The destinations an operator lists in a gateway: those the compiled
/// tables allow for at least one of the mix's profiles.
pub fn listed(up: &[Upstream], profiles: &[Profile]) -> Vec<bool> {
    (0..up.len())
        .map(|d| profiles.iter().any(|p| p.allows(d)))
        .collect()
}

/// A destination's list price per token (input, output) as a gateway is
/// configured with it: the tier's price at rest.
pub fn list_price(u: &Upstream) -> (f64, f64) {
    u.p.cost.rest_prices()
}

/// Whether `status` is worth another attempt (LiteLLM and Envoy retry
/// both).
pub fn retryable(status: u16) -> bool {
    status == 429 || status >= 500
}

/// Whether destination `d` is a pay-as-you-go API.
pub fn is_payg(w: &World<'_>, d: usize) -> bool {
    w.up.get(d).is_some_and(|u| u.p.tier == Tier::Payg)
}

/// The cheapest pay-as-you-go candidate for request `r` not in `skip`.
pub fn cheapest_payg(w: &World<'_>, r: u32, candidates: &[usize], skip: &[usize]) -> Option<usize> {
    let req = w.req(r);
    candidates
        .iter()
        .copied()
        .filter(|d| is_payg(w, *d) && !skip.contains(d))
        .min_by(|a, b| {
            let cost = |d: usize| {
                w.up.get(d).map_or(f64::MAX, |u| {
                    let (i, o) = list_price(u);
                    f64::from(req.prompt) * i + f64::from(req.output) * o
                })
            };
            cost(*a).total_cmp(&cost(*b)).then(a.cmp(b))
        })
}
