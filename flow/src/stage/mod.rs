//! The stages a request is routed through, in order. Each is one narrow
//! step with one job, over the worker's buffers and the host; none adds a
//! destination (every stage only clears bits of the feasible set the
//! compiled tables gave), and each keeps what it shares across workers in
//! the one store ([`crate::store`]):
//!
//! 1. identity ([`identity`]): the request's attributes, verified where
//!    the policy says, looked up in the compiled tables (fail closed), and
//!    the destinations that serve the request's API as sent;
//! 2. budget ([`budget::admit`]): the tenant's budgets refuse it, or
//!    narrow a soft one to its tiers;
//! 3. locality ([`locality::held`]): what each feasible destination holds
//!    of the prompt;
//! 4. the rungs ([`rungs::Ask::climb`]): the cache, model routing, the
//!    merit order, and a claimed slot;
//! 5. after the claim: the budget's 429 where a soft budget left nothing
//!    ([`budget::refuse_soft`]), the prompt recorded where it went
//!    ([`locality::record`]), the request's reservation
//!    ([`budget::reserve`]).
//!
//! The response's stages run from the flow's response callbacks: the
//! answer's outcome for health and headroom ([`outcome::read`]), then
//! learned latency, usage, the cache's store ([`answer::store`]) and
//! the event.

pub mod answer;
pub mod budget;
pub mod identity;
pub mod locality;
pub mod outcome;
pub mod rungs;

use crate::budget::Refusal as BudgetRefusal;
use crate::cache::{self, Pending};
use crate::event::Event;
use crate::host::Host;
use crate::parking::Carry;
use crate::request::Refused;
use crate::routing::Routing;
use crate::setup::{Setup, Worker};
use ace_config::Api;
use ace_core::dispatch::{Held, Refusal, Request};
use budget::Admitted;
use rungs::{Ask, Climbed};

/// Why routing stopped before a decision.
#[derive(Debug)]
pub enum Stop {
    /// Refused before the rungs (policy, attributes).
    Refused(Refused),
    /// A tenant budget refuses it.
    Budget(BudgetRefusal),
    /// No destination may take the request.
    NoDestination(Refusal),
    /// The fleet's shared state could not be reached.
    Fleet,
}

/// What routing knows of a request before its stages: read from its
/// headers and body once, by the flow.
#[derive(Debug)]
pub struct Shape<'a> {
    /// The body as received (the cache key; the routing rewrite).
    pub raw: Option<&'a [u8]>,
    /// The model the body names.
    pub body_model: Option<&'a str>,
    /// The body's prompt fingerprint (prefix locality).
    pub fingerprint: Option<crate::prefix::Fingerprint>,
    /// The API the client's path asks for.
    pub api: Option<Api>,
    /// The body can say the model served (model routing may substitute).
    pub rewritable: bool,
    /// Model routing, where this request may be routed.
    pub routing: Option<&'a Routing>,
    /// The response cache, where this request may be answered from it.
    pub cacheable: Option<&'a cache::Cache>,
    /// What the run this one re-runs took over (its failed destination is
    /// not a candidate).
    pub carried: Option<&'a Carry>,
    /// Now, ms.
    pub now: u64,
}

/// What the stages came to: the rungs' result, with what the budget
/// reserved for the request (none from the cache: nothing booked
/// upstream).
#[derive(Debug)]
pub struct Routed {
    /// The climb's result.
    pub climbed: Result<(Climbed, Option<Box<Pending>>), Stop>,
    /// The budget's reservation.
    pub hold: Option<budget::Hold>,
}

/// The stages in order (see the module's docs).
pub fn route<H: Host>(
    setup: &Setup,
    w: &mut Worker,
    host: &mut H,
    event: &mut Event,
    req: &mut Request,
    shape: &Shape<'_>,
) -> Routed {
    if let Err(refused) = identity::feasible(setup, w, host, event, shape) {
        return Routed {
            climbed: Err(Stop::Refused(refused)),
            hold: None,
        };
    }
    let admitted = match budget::admit(setup, w, host, req, shape.now) {
        Ok(a) => a,
        Err(r) => {
            return Routed {
                climbed: Err(Stop::Budget(r)),
                hold: None,
            }
        }
    };
    let mut held = std::mem::take(&mut w.held);
    let local = locality::held(setup, w, host, event, shape, &mut held);
    let soft = admitted.as_ref().and_then(Admitted::soft);
    let ask = Ask {
        setup,
        event,
        req,
        raw: shape.raw,
        routing: shape.routing,
        excluded: shape.carried.map(|c| c.failed),
        api: shape.api,
        held: if local.as_ref().is_some_and(|l| l.any) {
            held.as_held()
        } else {
            Held::NONE
        },
        soft: soft.map(|s| s.mask()),
        substitution_only: soft.is_some_and(|s| s.substitution_only),
        now: shape.now,
    };
    let mut climbed = ask.climb(shape.cacheable, w, host);
    if let Some(a) = &admitted {
        climbed = budget::refuse_soft(setup, w, host, a, climbed, shape.now);
    }
    if let (Ok((Climbed::Claimed(claimed), _)), Some(l)) = (&climbed, &local) {
        locality::record(
            setup,
            w,
            host,
            event,
            l,
            claimed.decision.index,
            &held,
            shape,
        );
    }
    w.held = held;
    let hold = match &climbed {
        Ok((Climbed::Claimed(claimed), _)) => admitted
            .map(|a| budget::reserve(setup, w, host, a, claimed.decision.marginal_usd, shape.now)),
        _ => None,
    };
    Routed { climbed, hold }
}
