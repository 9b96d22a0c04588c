//! The rungs a request climbs once feasibility is done: the cache, model
//! routing, the merit order ([`Ask`]).

use super::Stop;
use crate::cache::{self, Entry, Pending};
use crate::counters::Fleet;
use crate::event::Event;
use crate::fleet::{FleetAnswer, FleetOp, FleetUnavailable};
use crate::host::Host;
use crate::routing::Routed;
use crate::setup::{Setup, Worker};
use crate::store;
use ace_config::{Api, Config};
use ace_core::dispatch::{Decision, Held, Refusal, Request};
use ace_core::fleet::LivePrices;

/// A claim through `host`: the decision, why there is none, or that the
/// fleet state could not be reached.
fn claim<H: Host>(
    host: &mut H,
    now_ms: u64,
    op: FleetOp<'_, '_>,
) -> Result<Result<(Decision, LivePrices), Refusal>, FleetUnavailable> {
    match host.fleet(now_ms, op)? {
        FleetAnswer::Claimed(d) => Ok(d),
        FleetAnswer::Settled(_) => Err(FleetUnavailable),
    }
}

/// What the rungs came to, inside the worker's buffers.
#[derive(Debug)]
pub enum Climbed {
    /// A destination claimed.
    Claimed(Claimed),
    /// The cache has an answer the request may have (in the worker's
    /// `entry` buffer).
    Hit,
}

/// A claim: the decision, the routing member served (when another than
/// the one named), a routed request's counterfactual, and the control
/// service's prices on the destination chosen.
#[derive(Debug)]
pub struct Claimed {
    /// The decision.
    pub decision: Decision,
    /// The routing member served, when another than the one named.
    pub served: Option<usize>,
    /// A routed request's counterfactual (the inner `None`: no
    /// pay-as-you-go destination may serve the model named).
    pub cf: Option<Option<Counterfactual>>,
    /// The control service's prices on the destination.
    pub live: LivePrices,
}

/// One request, feasibility done, as the rungs see it. The rungs are
/// tried in order, each on the feasible set the tables gave:
///
/// 1. [`Ask::cache_rung`]: an exact answer already given, that policy
///    lets this request have (`cached` true, from the producer's
///    destination);
/// 2. [`Ask::routed_rung`]: a permitted cheaper model (model routing),
///    each (destination, model) pair priced in one merit order;
/// 3. [`Ask::merit_rung`]: the merit order over the feasible
///    destinations, for the model named.
///
/// Nothing here adds a destination: every rung reads the tables' masks.
#[derive(Debug)]
pub struct Ask<'a> {
    pub setup: &'a Setup,
    pub event: &'a Event,
    pub req: &'a Request,
    /// The body as received (the cache key; the routing rewrite).
    pub raw: Option<&'a [u8]>,
    /// Model routing, where this request may be routed.
    pub routing: Option<&'a crate::routing::Routing>,
    /// The destination that failed this request (a re-run excludes it).
    pub excluded: Option<usize>,
    /// The API the client's path asks for.
    pub api: Option<Api>,
    /// What each destination holds of the prompt (prefix locality).
    pub held: Held<'a>,
    /// The destinations a soft budget allows (none: no soft budget).
    pub soft: Option<&'a [u64]>,
    /// A soft budget allows only a substitute model.
    pub substitution_only: bool,
    pub now: u64,
}

/// What the cache rung came to.
#[derive(Debug)]
pub enum CacheRung {
    /// Nothing to look up (no body or tables to key on).
    Skip,
    /// Answer from the entry in the worker's buffer.
    Hit,
    /// Go on up the rungs: a miss to store, or a hit to check upstream.
    Pending(Box<Pending>),
}

impl Ask<'_> {
    #[inline]
    fn model(&self) -> Option<&str> {
        self.event.text(&self.event.model_requested)
    }

    /// The rungs in order: the cache (when `cacheable`), model routing,
    /// the merit order.
    pub fn climb<H: Host>(
        &self,
        cacheable: Option<&cache::Cache>,
        w: &mut Worker,
        host: &mut H,
    ) -> Result<(Climbed, Option<Box<Pending>>), Stop> {
        let pending = match cacheable {
            Some(c) => match self.cache_rung(c, w, host) {
                CacheRung::Hit => return Ok((Climbed::Hit, None)),
                CacheRung::Pending(p) => Some(p),
                CacheRung::Skip => None,
            },
            None => None,
        };
        let claimed = match self.routed_rung(w, host) {
            Some(routed) => routed?,
            // Only a substitute may serve, and none can.
            None if self.substitution_only => {
                return Err(Stop::NoDestination(Refusal::NoFeasibleDestination));
            }
            None => self.merit_rung(w, host)?,
        };
        Ok((Climbed::Claimed(claimed), pending))
    }

    /// The cache: an entry for this exact request, young enough, that
    /// policy lets this request have. A cached answer is checked against
    /// the configured classes even where this request cannot be routed
    /// (trailers, a body that cannot be replaced): an entry a substitute
    /// produced is then still `substituted` to the model named.
    pub fn cache_rung<H: Host>(&self, c: &cache::Cache, w: &mut Worker, host: &mut H) -> CacheRung {
        let (cfg, event, now) = (&self.setup.config, self.event, self.now);
        let (Some(raw), Some(tables)) = (self.raw, self.setup.tables.as_ref()) else {
            return CacheRung::Skip;
        };
        let configured = self.setup.routing.as_ref();
        let named = configured.zip(self.model()).and_then(|(r, m)| r.asked(m));
        let key = cache::key(
            &cfg.id,
            &w.lookup.values,
            event.bytes(&event.tenant),
            event.bytes(&event.data_class),
            event.headers.get(":path"),
            raw,
        );
        let slot = c.slot(&key);
        let found = {
            w.entry.clear();
            let fingerprint = cfg.fingerprint;
            store::cache_get(host, &mut w.store, fingerprint, slot, &mut w.entry)
        };
        let hit = found
            .then(|| Entry::decode(&w.entry))
            .flatten()
            .filter(|e| e.key == key && now.saturating_sub(e.created_ms) < c.ttl_ms)
            .filter(|e| {
                cache::may_serve(
                    cfg,
                    tables,
                    &mut w.lookup,
                    &mut w.scratch,
                    c,
                    configured,
                    named,
                    e,
                )
            })
            .map(|e| e.digest);
        let mut p = Box::new(Pending {
            key,
            slot,
            ..Pending::default()
        });
        match hit {
            Some(digest) => {
                w.hits = w.hits.wrapping_add(1);
                if c.check_every > 0 && w.hits.is_multiple_of(c.check_every) {
                    // Checked: answered upstream, then compared.
                    p.check = Some(digest);
                } else {
                    return CacheRung::Hit;
                }
            }
            None => host.count(Fleet::CacheMisses.into(), 1),
        }
        CacheRung::Pending(p)
    }

    /// Model routing: every (destination, model) pair the tables allow
    /// for the models that may stand in for the one named, in one merit
    /// order, each at its model's price there; `None` when this request is
    /// not routed.
    pub fn routed_rung<H: Host>(
        &self,
        w: &mut Worker,
        host: &mut H,
    ) -> Option<Result<Claimed, Stop>> {
        let r = self.routing?;
        let asked = r.asked(self.model()?)?;
        let tables = self.setup.tables.as_ref()?;
        // A soft budget that allows substitutes only: never the model
        // named, each destination at the cheapest substitute it serves.
        let named = self
            .substitution_only
            .then(|| {
                asked.member.or_else(|| {
                    r.reference(asked)
                        .and_then(|m| r.members.iter().position(|x| x == m))
                })
            })
            .flatten();
        r.expand_without(tables, &mut w.lookup.values, asked, named, &mut w.pairs);
        // Only destinations serving the request's API (a routed body is
        // always rewritable, so every upstream name can be sent).
        self.setup
            .config
            .serving
            .narrow(self.api, &mut w.pairs.mask);
        // A soft budget: its tiers only.
        if let Some(m) = self.soft {
            for (a, b) in w.pairs.mask.iter_mut().zip(m) {
                *a &= b;
            }
        }
        // The counterfactual: the model named (a class's reference model),
        // not substituted, at its price.
        if asked.member.is_none()
            && tables
                .feasible(&w.lookup.values, &mut w.lookup.mask)
                .is_err()
        {
            w.lookup.mask.fill(0);
        }
        let reference = r.reference(asked).map_or(usize::MAX, |m| {
            r.members.iter().position(|x| x == m).unwrap_or(usize::MAX)
        });
        let cf = counterfactual(&self.setup.config, &w.lookup.mask, self.req, |d| {
            r.factor(reference, d)
        });
        if let Some(d) = self.excluded {
            clear_bit(&mut w.pairs.mask, d);
        }
        let mut routed = Routed::new(&mut w.pairs, r);
        let op = FleetOp::ClaimRouted {
            routed: &mut routed,
            req: self.req,
            held: self.held,
        };
        let (decision, live) = match claim(host, self.now, op) {
            Ok(Ok(d)) => d,
            Ok(Err(refusal)) => return Some(Err(Stop::NoDestination(refusal))),
            Err(FleetUnavailable) => return Some(Err(Stop::Fleet)),
        };
        let served = w
            .pairs
            .member(decision.index)
            .filter(|m| Some(*m) != asked.member);
        Some(Ok(Claimed {
            decision,
            served,
            cf: Some(cf),
            live,
        }))
    }

    /// The merit order over the feasible destinations.
    pub fn merit_rung<H: Host>(&self, w: &mut Worker, host: &mut H) -> Result<Claimed, Stop> {
        if let Some(d) = self.excluded {
            // The destination that just failed this request.
            clear_bit(&mut w.lookup.mask, d);
        }
        let op = FleetOp::Claim {
            feasible: &w.lookup.mask,
            model: self.model(),
            req: self.req,
            held: self.held,
        };
        let (decision, live) = claim(host, self.now, op)
            .map_err(|_| Stop::Fleet)?
            .map_err(Stop::NoDestination)?;
        Ok(Claimed {
            decision,
            served: None,
            cf: None,
            live,
        })
    }
}

/// The counterfactual of a routed request: the cheapest pay-as-you-go
/// destination the tables allow for the model named, at that model's
/// price there.
#[derive(Clone, Copy, Debug)]
pub struct Counterfactual {
    /// The destination.
    pub index: usize,
    /// Its price, USD.
    pub usd: f64,
    /// The named model's price factor there.
    pub scale: f64,
}

/// Clear destination `d`'s bit in `mask`.
pub fn clear_bit(mask: &mut [u64], d: usize) {
    if let Some(word) = mask.get_mut(d / 64) {
        *word &= !(1u64 << (d % 64));
    }
}

/// The cheapest pay-as-you-go destination in `mask` for `req`'s tokens,
/// at its list price times `scale(d)` (the named model's factor there).
pub fn counterfactual(
    cfg: &Config,
    mask: &[u64],
    req: &Request,
    scale: impl Fn(usize) -> f64,
) -> Option<Counterfactual> {
    let mut best: Option<Counterfactual> = None;
    for (d, m) in cfg.models.iter().enumerate() {
        if !m.tier.is_pay_as_you_go() || !ace_core::dispatch::bit(mask, d) {
            continue;
        }
        let s = scale(d);
        let usd = m.rest_usd(req.tokens_in, req.tokens_out) * s;
        if best.is_none_or(|b| usd < b.usd) {
            best = Some(Counterfactual {
                index: d,
                usd,
                scale: s,
            });
        }
    }
    best
}
