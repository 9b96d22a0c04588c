//! The fleet's live state (health and in-flight counts per destination),
//! shared by every Envoy worker in process memory.
//!
//! A dynamic module is native code in Envoy's own process, so the workers
//! share one [`Fleet`] behind a mutex: a trip seen by one worker holds for
//! all at once, with none of the Wasm filter's shared-data round trips or
//! compare-and-swap retries (as `ace_filter::state` does for the Wasm VMs). The lock is held for a
//! decision (tens of nanoseconds of arithmetic) or one outcome, never across
//! a call into Envoy.
//!
//! State outlives a configuration update: configurations with the same
//! destination set ([`ace_config::Config::fingerprint`]) share one
//! fleet through a process-wide registry, so pushing new prices does not
//! forget that a destination is tripped. The Wasm filter gets the same from
//! keying its shared-data entry by the fingerprint.

use crate::published;
use ace_config::Config;
use ace_core::fleet::FleetState;
use ace_flow::control::{Consumer, Verdict};
use ace_flow::flow::{FleetAnswer, FleetOp};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// The process's state of one fleet, behind its lock.
#[derive(Debug)]
pub struct Fleet(Mutex<Inner>);

/// What the lock guards.
#[derive(Debug)]
struct Inner {
    /// Health, load and prices ([`FleetState`]).
    state: FleetState,
    /// The newest configuration (what the control service says is read
    /// against it).
    cfg: Config,
    /// What the control service said, as the newest configuration's
    /// consumer took it (nothing, for a configuration without `control`:
    /// it reads nothing published).
    consumer: Consumer,
    /// The [`published`] generation `consumer` has taken.
    generation: u64,
}

/// Every live fleet, by configuration fingerprint.
static REGISTRY: Mutex<Vec<(u64, Weak<Fleet>)>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic cannot happen while the lock is held (the crate denies the
    // panicking constructs), but a poisoned lock still holds good data.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Fleet {
    /// The fleet for `cfg`'s destination set ([`Config::fingerprint`]): the
    /// live one if another configuration with that set has it, else a
    /// fresh one (every destination healthy and idle). Either way priced
    /// with `cfg` at `now`, and reading the control service's snapshot
    /// with `cfg` from the next request on.
    pub fn shared(cfg: &Config, now: u64) -> Arc<Fleet> {
        let mut registry = lock(&REGISTRY);
        registry.retain(|(_, w)| w.strong_count() > 0);
        let n = cfg.destinations.len();
        let found = registry
            .iter()
            .find(|(f, _)| *f == cfg.fingerprint)
            .and_then(|(_, w)| w.upgrade())
            .filter(|f| lock(&f.0).state.len() == n);
        let fleet = found.unwrap_or_else(|| {
            let fleet = Arc::new(Fleet(Mutex::new(Inner {
                state: FleetState::new(n),
                cfg: cfg.clone(),
                consumer: Consumer::new(cfg, now),
                generation: 0,
            })));
            registry.push((cfg.fingerprint, Arc::downgrade(&fleet)));
            fleet
        });
        {
            let mut f = lock(&fleet.0);
            f.cfg = cfg.clone();
            f.consumer = Consumer::new(cfg, now);
            f.generation = 0;
            f.state
                .live
                .iter_mut()
                .for_each(|l| *l = Default::default());
            f.state.reprice_all(&cfg.models, &cfg.health, now);
        }
        fleet
    }

    /// Run the flow's `op` on this fleet at `now`, under the lock: the
    /// control service's news taken first, then the whole transaction
    /// ([`FleetOp::run`]).
    pub fn run(&self, cfg: &Config, now: u64, op: FleetOp<'_, '_>) -> FleetAnswer {
        let mut f = lock(&self.0);
        f.catch_up(now);
        let Inner {
            state, consumer, ..
        } = &mut *f;
        let warmth = &consumer.outside().warmth;
        op.run(state, warmth, &cfg.models, &cfg.health, now)
    }

    /// The control service's latest reading of budget `b`, with what the
    /// poller published since taken first.
    pub fn budget(&self, now: u64, b: u16) -> ace_flow::budget::Reading {
        let mut f = lock(&self.0);
        f.catch_up(now);
        f.consumer.outside().budget(b)
    }

    /// Requests in flight per destination.
    pub fn in_flight(&self) -> Vec<u32> {
        lock(&self.0).state.in_flight.clone()
    }

    /// Whether the snapshot in force is stale.
    pub fn stale(&self) -> bool {
        lock(&self.0).consumer.stale()
    }
}

/// Bring every live fleet whose configuration has `control` up to what was
/// published and to `now` (the poller does on its timer, so that a fleet
/// with no traffic still ages), and return the oldest age (ms) among them
/// and whether any is stale: the `ace.control.*` gauges. `None`: no such
/// fleet.
pub fn catch_up_all(now: u64) -> Option<(u64, bool)> {
    let fleets: Vec<Arc<Fleet>> = lock(&REGISTRY)
        .iter()
        .filter_map(|(_, w)| w.upgrade())
        .collect();
    let mut worst: Option<(u64, bool)> = None;
    for fleet in fleets {
        let mut f = lock(&fleet.0);
        if f.cfg.control.is_some() {
            f.catch_up(now);
            let (age, stale) = worst.unwrap_or((0, false));
            let c = &f.consumer;
            worst = Some((age.max(c.age_ms(now)), stale || c.stale()));
        }
    }
    worst
}

impl Inner {
    /// Take what the poller published since the last call, through this
    /// configuration's consumer, and age the snapshot to `now`. One atomic
    /// load and no more when nothing changed.
    fn catch_up(&mut self, now: u64) {
        if self.cfg.control.is_none() {
            return;
        }
        let consumer = &mut self.consumer;
        let generation = published::generation();
        // The common case: nothing new, and the snapshot's freshness does
        // not change now.
        if generation == self.generation
            && (consumer.stale() || consumer.age_ms(now) <= consumer.stale_after_ms())
        {
            return;
        }
        let mut changed = false;
        if generation != self.generation {
            let (new, generation) = published::since(self.generation);
            self.generation = generation;
            for d in &new {
                let (verdict, c) = consumer.deliver(&self.cfg, d.delivery(), now);
                changed |= c;
                if matches!(verdict, Verdict::Refused { first: true, .. }) {
                    published::refused(1);
                }
            }
        }
        changed |= consumer.age(now);
        if changed {
            consumer.apply_to(&mut self.state, &self.cfg, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ace_core::dispatch::Request;
    use ace_core::health::Outcome;

    fn config(extra: &str) -> Config {
        Config::parse(
            format!(
                r#"{{"allow_no_policy":true,{extra}"destinations":[
                {{"name":"a","cluster":"ca","tier":"payg","usd_per_input_token":1e-6,"usd_per_output_token":1e-6}},
                {{"name":"b","cluster":"cb","tier":"payg","usd_per_input_token":2e-6,"usd_per_output_token":2e-6}}]}}"#
            )
            .as_bytes(),
        )
        .unwrap()
    }

    #[test]
    fn a_trip_seen_once_holds_for_every_configuration_of_that_fleet() {
        let cfg = config("");
        let p = cfg.health;
        let a = Fleet::shared(&cfg, 0);
        let b = Fleet::shared(&config(r#""response_headers":true,"#), 0);
        assert!(Arc::ptr_eq(&a, &b), "same destination set, same state");
        let mut three = config("");
        three.fingerprint ^= 1;
        let other = Fleet::shared(&three, 0);
        assert!(!Arc::ptr_eq(&a, &other));
        let req = Request::untimed(10, 10, 0.0);
        let all = [0b11u64];
        let claim = |f: &Fleet, now| {
            let op = FleetOp::Claim {
                feasible: &all,
                model: None,
                req: &req,
                held: ace_core::dispatch::Held::NONE,
            };
            match f.run(&cfg, now, op) {
                FleetAnswer::Claimed(Ok((d, _))) => d.index,
                other => panic!("{other:?}"),
            }
        };
        let settle = |f: &Fleet, d, outcome, now| {
            let op = FleetOp::Settle {
                d,
                outcome,
                policy: &p,
            };
            f.run(&cfg, now, op)
        };
        for _ in 0..p.trip_after {
            assert_eq!(claim(&a, 1), 0, "the cheaper one until it trips");
            settle(&a, 0, Some(Outcome::Failure { tenant: 0 }), 1);
        }
        assert_eq!(claim(&b, 2), 1, "tripped for the other configuration too");
        settle(&b, 1, None, 2);
        assert_eq!(b.in_flight(), vec![0, 0], "every slot released");
    }
}
