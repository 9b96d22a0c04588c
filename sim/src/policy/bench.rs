//! The fleet, requests and profiles a policy's tests put in front of it.

use crate::engine::World;
use crate::fleet::{Params, Upstream};
use crate::mix::Profile;
use crate::rng::Rng;
use crate::trace::Req;

/// A fleet, its requests and their profiles.
pub(crate) struct Bench {
    pub up: Vec<Upstream>,
    pub reqs: Vec<Req>,
    pub profiles: Vec<Profile>,
}

impl Bench {
    /// The upstreams of `params` (started from seed 1) and `profiles`, with a
    /// request of each profile in `requests` (100 prompt and 50 output
    /// tokens, all arriving at 0).
    pub fn new(
        params: Vec<Params>,
        profiles: Vec<Profile>,
        requests: impl IntoIterator<Item = u32>,
    ) -> Bench {
        let mut rng = Rng::new(1);
        let up = params
            .into_iter()
            .map(|p| Upstream::new(p, &mut rng, 1))
            .collect();
        let reqs = requests
            .into_iter()
            .map(|profile| Req {
                at_ms: 0,
                prompt: 100,
                output: 50,
                profile,
                blocks: Default::default(),
            })
            .collect();
        Bench { up, reqs, profiles }
    }

    /// What a policy sees at `now`.
    pub fn world(&self, now: u64) -> World<'_> {
        World {
            now,
            up: &self.up,
            reqs: &self.reqs,
            profiles: &self.profiles,
            block_ids: &[],
        }
    }
}

/// Tenant `t`'s requests for `model`, of `data_class` and `latency_class`,
/// feasible everywhere.
pub(crate) fn profile(model: &str, data_class: &str, latency_class: &str) -> Profile {
    Profile {
        tenant: "t".into(),
        data_class: data_class.into(),
        latency_class: latency_class.into(),
        model: model.into(),
        tp_degree: 1,
        headers: Vec::new(),
        feasible: vec![u64::MAX],
        substitutes: Vec::new(),
    }
}
