//! An engine-side prefix-aware router: SGLang's cache-aware router (and
//! llm-d's prefix-cache scorer, which scores the same thing) over the GPU
//! servers, behind the gateway a competent operator puts in front of it
//! to spill to pay-as-you-go.
//!
//! Source: SGLang's router, `sgl-project/sglang`,
//! `sgl-router/src/policies/cache_aware.rs` (`CacheAwarePolicy::
//! select_worker`) and its README (`rust/README.md`: `--cache-threshold`,
//! default 0.5). Per model, the router keeps an *approximate* radix tree
//! per worker of the prompts it sent there (not the engine's real cache,
//! which it never queries), bounded by `max_tree_size` with least recently
//! used leaves evicted. For each request:
//!
//! 1. the load (requests the router has pending on each healthy worker) is
//!    *imbalanced* when `max - min > balance_abs_threshold` and `max >
//!    min * balance_rel_threshold`: then the least loaded worker;
//! 2. else the worker whose tree holds the longest prefix of the prompt,
//!    if the match ratio (matched over the prompt's length) exceeds
//!    `cache_threshold`; else the worker with the smallest tree (the most
//!    room);
//! 3. the chosen worker's tree gains the prompt.
//!
//! Thresholds: `cache_threshold` 0.5 (the README's default, and the one
//! the brief names; recent releases default to 0.3),
//! `balance_abs_threshold` 64 and `balance_rel_threshold` 1.5 (the
//! current `RouterConfig` defaults), `max_tree_size` 2^26 characters, here
//! [`TREE_BLOCKS`] blocks of 512 tokens at four characters a token. The
//! tree is kept in blocks, as the trace names prompts: a match ratio is
//! matched blocks' tokens over the prompt's.
//!
//! What the router cannot do, and the operator adds: it knows no prices,
//! tiers, commitments or APIs, so the operator gives it the owned GPU
//! servers (in-house) that have the model resident as its workers
//! (health-checked: a downed server is out); rented capacity billed by the
//! hour or by commitment (spot, on-demand, reserved) is left out rather
//! than spread over by a router blind to its price (the first run, with
//! every GPU server as a worker, cost more than all pay-as-you-go: the
//! smallest-tree rule sends new conversations to idle on-demand servers). A competent operator puts it behind a gateway as one
//! deployment per model whose `max_parallel_requests` is the sum of its
//! workers' knees (the manifest's), with the cheapest pay-as-you-go API
//! serving the model as the fallback: past that cap, or after a failed
//! attempt on a worker (5xx, 429, a refused connection), the request goes
//! to the API once. A model no GPU server holds goes to the API directly.
//! Residency is the compliant operator's: EU personal data only to EU
//! destinations, PHI only to destinations with a BAA (one pool per
//! residency, as Envoy routes or LiteLLM tags would split them).

use super::{cheapest_payg, retryable, Candidates, Rules};
use crate::engine::{Answered, Next, Policy, Route, World};
use crate::fleet::PromptCache;
use ace_core::cost::Tier;

/// Match ratio above which the longest match wins.
pub const CACHE_THRESHOLD: f64 = 0.5;
/// Absolute load imbalance (pending requests) that switches to least-load.
pub const BALANCE_ABS_THRESHOLD: u32 = 64;
/// Relative load imbalance that switches to least-load.
pub const BALANCE_REL_THRESHOLD: f64 = 1.5;
/// A worker's tree, in 512-token blocks: `max_tree_size` 2^26 characters
/// at four a token.
pub const TREE_BLOCKS: u32 = (1 << 26) / (512 * 4);

/// The cache-aware router behind a spilling gateway.
#[derive(Debug)]
pub struct CacheAware {
    candidates: Candidates,
    /// Requests pending per destination, as the router counts them.
    in_flight: Vec<u32>,
    /// Per destination, the router's approximate tree.
    trees: Vec<PromptCache>,
    /// Blocks in each tree (its size).
    keys: Vec<u64>,
}

impl CacheAware {
    /// Over the destinations in `listed`.
    pub fn new(listed: Vec<bool>) -> CacheAware {
        let n = listed.len();
        CacheAware {
            candidates: Candidates::new(Rules::ALL, listed),
            in_flight: vec![0; n],
            trees: (0..n)
                .map(|_| PromptCache::of(Tier::InHouse, TREE_BLOCKS))
                .collect(),
            keys: Vec::new(),
        }
    }

    fn load(&self, d: usize) -> u32 {
        self.in_flight.get(d).copied().unwrap_or(0)
    }

    /// The worker the router picks among `workers` for request `r`.
    fn select(&mut self, w: &World<'_>, r: u32, workers: &[usize]) -> Option<usize> {
        let req = w.req(r);
        let model = w.profile(r).map_or("", |p| p.model.as_str());
        self.keys.clear();
        self.keys.extend(w.blocks(r));
        let loads: Vec<u32> = workers.iter().map(|d| self.load(*d)).collect();
        let (max, min) = (
            loads.iter().copied().max().unwrap_or(0),
            loads.iter().copied().min().unwrap_or(0),
        );
        let imbalanced = max.saturating_sub(min) > BALANCE_ABS_THRESHOLD
            && f64::from(max) > f64::from(min) * BALANCE_REL_THRESHOLD;
        let chosen = if imbalanced {
            workers.iter().copied().min_by_key(|d| (self.load(*d), *d))
        } else {
            let held = |d: usize| {
                self.trees
                    .get(d)
                    .map_or(0, |t| t.held_blocks(w.now, model, &self.keys))
            };
            let best = workers
                .iter()
                .copied()
                .max_by_key(|d| (held(*d), std::cmp::Reverse(*d)));
            let rate = best.map_or(0.0, |d| {
                f64::from(held(d) * crate::trace::BLOCK_TOKENS) / f64::from(req.prompt.max(1))
            });
            if rate > CACHE_THRESHOLD {
                best
            } else {
                workers
                    .iter()
                    .copied()
                    .min_by_key(|d| (self.trees.get(*d).map_or(0, PromptCache::len), *d))
            }
        };
        if let Some(t) = chosen.and_then(|d| self.trees.get_mut(d)) {
            t.serve(w.now, model, &self.keys, req.prompt);
        }
        chosen
    }
}

impl Policy for CacheAware {
    fn name(&self) -> String {
        "sglang-cache-aware".into()
    }

    fn route(&mut self, w: &World<'_>, r: u32) -> Route {
        let c = self.candidates.of(w, r).to_vec();
        let workers: Vec<usize> = c
            .iter()
            .copied()
            .filter(|d| {
                w.up.get(*d).is_some_and(|u| {
                    u.p.tier == Tier::InHouse && u.p.slots.is_some() && u.up(w.now)
                })
            })
            .collect();
        // The gateway's cap on the router's deployment: its workers' knees.
        let cap: u32 = workers
            .iter()
            .filter_map(|d| w.up.get(*d))
            .map(|u| (f64::from(u.p.slots.unwrap_or(0)) * u.p.cost.knee).floor() as u32)
            .sum();
        let pending: u32 = workers.iter().map(|d| self.load(*d)).sum();
        let to = if !workers.is_empty() && pending < cap {
            self.select(w, r, &workers)
        } else {
            None
        };
        match to.or_else(|| cheapest_payg(w, r, &c, &[])) {
            Some(d) => {
                if let Some(n) = self.in_flight.get_mut(d) {
                    *n += 1;
                }
                Route::To(d)
            }
            None => Route::Refuse(503),
        }
    }

    fn answered(&mut self, w: &World<'_>, at: &Answered<'_>) -> Next {
        let (r, d, a, n, tried) = (at.r, at.dest, at.answer, at.n, at.tried);
        if (200..300).contains(&a.status) {
            return Next::Deliver;
        }
        if let Some(x) = self.in_flight.get_mut(d) {
            *x = x.saturating_sub(1);
        }
        if n >= 1 || !retryable(a.status) {
            return Next::Deliver;
        }
        let c = self.candidates.of(w, r).to_vec();
        match cheapest_payg(w, r, &c, tried) {
            Some(p) => {
                if let Some(x) = self.in_flight.get_mut(p) {
                    *x += 1;
                }
                Next::Retry {
                    after_ms: 0,
                    route: Route::To(p),
                }
            }
            None => Next::Deliver,
        }
    }

    fn done(&mut self, _w: &World<'_>, _r: u32, d: usize, _ok: bool) {
        if let Some(n) = self.in_flight.get_mut(d) {
            *n = n.saturating_sub(1);
        }
    }
}
