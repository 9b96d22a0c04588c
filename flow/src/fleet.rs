//! The fleet's shared state as a request changes it: one [`FleetOp`] per
//! change, applied by the host as one transaction ([`crate::host::Host::fleet`]).

use crate::routing::Routed;
use ace_config::Warmth;
use ace_core::cost::CostModel;
use ace_core::dispatch::{Decision, Held, Refusal, Request};
use ace_core::fleet::{FleetState, LivePrices};
use ace_core::health::{Change, HealthPolicy, Outcome};

/// The fleet's shared state could not be read or written (the host has
/// logged why).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FleetUnavailable;

/// One change the flow makes to the fleet's shared state (health,
/// in-flight counts, prices): the only way a request touches it.
#[derive(Debug)]
pub enum FleetOp<'r, 'p> {
    /// Decide among the `feasible` destinations (warm for `model` as the
    /// control service last said) and claim a slot on the one chosen
    /// ([`FleetState::decide`]).
    Claim {
        /// Feasible destinations (a bitmask).
        feasible: &'r [u64],
        /// The model asked for, for warmth.
        model: Option<&'r str>,
        /// The request as the merit order sees it.
        req: &'r Request,
        /// What each destination holds of its prompt (prefix locality).
        held: Held<'r>,
    },
    /// Decide among a request's (destination, model) pairs under model
    /// routing, each destination warm for and priced at the model it would
    /// serve ([`FleetState::decide_scaled`]), and claim a slot.
    ClaimRouted {
        /// The pairs.
        routed: &'r mut Routed<'p>,
        /// The request as the merit order sees it.
        req: &'r Request,
        /// What each destination holds of its prompt (prefix locality).
        held: Held<'r>,
    },
    /// Fold an answer's outcome into destination `d`'s health, keeping
    /// its slot: a success still streaming holds its place in the
    /// server's batch until its last byte ([`FleetState::observe`]).
    Observe {
        /// The destination.
        d: usize,
        /// What happened.
        outcome: Outcome,
        /// The health tunables.
        policy: &'r HealthPolicy,
    },
    /// Learn from an answer's first byte on destination `d`
    /// ([`FleetState::learn`]): what this copy of the state expects of
    /// `d`'s time to first token. Never shared between copies: a host
    /// applies it to its own copy ([`FleetOp::is_local`]).
    Learn {
        /// The destination.
        d: usize,
        /// Its load band when the request was sent there.
        band: u8,
        /// From the request sent to the answer's first byte, ms.
        ttft_ms: u64,
        /// The request's tenant key.
        tenant: u32,
        /// The health tunables (the learning's among them).
        policy: &'r HealthPolicy,
    },
    /// Release destination `d`'s slot and fold in the request's outcome
    /// (`None`: the client went away, or the outcome was already
    /// observed: blame no one) ([`FleetState::settle`]).
    Settle {
        /// The destination.
        d: usize,
        /// What happened.
        outcome: Option<Outcome>,
        /// The health tunables.
        policy: &'r HealthPolicy,
    },
}

/// What a [`FleetOp`] came to.
#[derive(Clone, Debug, PartialEq)]
pub enum FleetAnswer {
    /// A claim's decision and the control service's prices on the
    /// destination chosen (what the request is priced with), or why no
    /// destination may take the request.
    Claimed(Result<(Decision, LivePrices), Refusal>),
    /// A settle's effect on the destination's health.
    Settled(Change),
}

impl FleetOp<'_, '_> {
    /// Apply the op to `state`, current at `now_ms`, with `warmth`: the
    /// destination it changed (to store and reprice; `None` for a refusal)
    /// and its answer.
    #[inline]
    pub fn apply(
        &mut self,
        state: &mut FleetState,
        warmth: &Warmth,
        now_ms: u64,
    ) -> (Option<usize>, FleetAnswer) {
        match self {
            FleetOp::Claim {
                feasible,
                model,
                req,
                held,
            } => {
                let warm = warmth.mask(*model);
                let d = if held.is_none() {
                    state.decide(feasible, warm, req, now_ms)
                } else {
                    state.decide_held(feasible, warm, &[], *held, req, now_ms)
                };
                claimed(state, d)
            }
            FleetOp::ClaimRouted { routed, req, held } => {
                let (feasible, warm, scale) = routed.parts(warmth);
                let d = state.decide_held(feasible, warm, scale, *held, req, now_ms);
                claimed(state, d)
            }
            FleetOp::Learn {
                d,
                band,
                ttft_ms,
                tenant,
                policy,
            } => {
                let moved = state.learn(*d, *band, *ttft_ms, *tenant, policy);
                (moved.then_some(*d), FleetAnswer::Settled(Change::None))
            }
            FleetOp::Observe { d, outcome, policy } => (
                Some(*d),
                FleetAnswer::Settled(state.observe(*d, *outcome, policy, now_ms)),
            ),
            FleetOp::Settle { d, outcome, policy } => (
                Some(*d),
                FleetAnswer::Settled(state.settle(*d, *outcome, policy, now_ms)),
            ),
        }
    }

    /// The whole transaction on a state the host holds in its own memory:
    /// for a claim, the slate brought up to `now_ms` under `models` and
    /// `policy` (a decision reads every destination's price at `now_ms`);
    /// the op applied; the destination it changed repriced. A settle
    /// changes one destination and reprices it, and leaves the others'
    /// timed changes to the next claim's advance, which sees them alike.
    pub fn run(
        mut self,
        state: &mut FleetState,
        warmth: &Warmth,
        models: &[CostModel],
        policy: &HealthPolicy,
        now_ms: u64,
    ) -> FleetAnswer {
        if !matches!(
            self,
            FleetOp::Settle { .. } | FleetOp::Observe { .. } | FleetOp::Learn { .. }
        ) {
            state.advance(models, policy, now_ms);
        }
        let (changed, answer) = self.apply(state, warmth, now_ms);
        if let Some(d) = changed {
            state.reprice(d, models, policy, now_ms);
        }
        answer
    }

    /// The destination a settle only releases a slot of, changing no
    /// health (a success within its SLO, or the client gone, on a
    /// destination with no failures to clear): a host that pays for every
    /// write may owe that release to its next write instead.
    #[inline]
    pub fn quiet_release(&self, state: &FleetState, now_ms: u64) -> Option<usize> {
        match self {
            FleetOp::Settle { d, outcome, policy } => {
                state.is_quiet(*d, *outcome, policy, now_ms).then_some(*d)
            }
            _ => None,
        }
    }

    /// Whether the op changes only the host's own copy of the state (what
    /// it learned), never the state its copies share.
    #[inline]
    pub fn is_local(&self) -> bool {
        matches!(self, FleetOp::Learn { .. })
    }

    /// Whether the op changes nothing at all: an observed outcome that is
    /// quiet (see [`FleetOp::quiet_release`]) on a destination it leaves
    /// as it was. A host that pays for every write skips it.
    #[inline]
    pub fn is_noop(&self, state: &FleetState, now_ms: u64) -> bool {
        match self {
            FleetOp::Observe { d, outcome, policy } => {
                state.is_quiet(*d, Some(*outcome), policy, now_ms)
            }
            _ => false,
        }
    }
}

#[inline]
fn claimed(state: &FleetState, d: Result<Decision, Refusal>) -> (Option<usize>, FleetAnswer) {
    let changed = d.as_ref().ok().map(|d| d.index);
    let d = d.map(|d| {
        let live = state.live_prices(d.index);
        (d, live)
    });
    (changed, FleetAnswer::Claimed(d))
}
