//! Where a host keeps what a re-run takes over from the run it replaces
//! ([`Carry`]) between the two runs: a bounded list every worker shares
//! ([`Parking`]). What a carry holds and when it is taken is the re-run's
//! business ([`crate::rerun`]).

use crate::config::{Config, Trusted};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// How many carries a host keeps at once. Envoy starts the re-run inside
/// the call that asks for it, so a carry is taken back at once; the bound
/// only keeps a re-run Envoy never started from holding memory.
pub const PARKED: usize = 64;

/// What a re-run takes over from the first run of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Carry {
    /// The destination that failed (the re-run excludes it).
    pub failed: usize,
    /// The body as the client sent it, where ACE rewrote it for the
    /// destination that failed (model name, stream options).
    pub body: Option<Vec<u8>>,
    /// The values the first run read from verified sources, by attribute
    /// index in the policy.
    pub verified: Vec<(usize, Vec<u8>)>,
}

impl Carry {
    /// The first run's value for verified source `source`, if it read one.
    pub fn verified(&self, cfg: &Config, source: &Trusted) -> Option<Vec<u8>> {
        let attributes = &cfg.policy.as_ref()?.attributes;
        self.verified.iter().find_map(|(i, v)| {
            let a = attributes.get(*i)?;
            (a.trusted.as_ref() == Some(source)).then(|| v.clone())
        })
    }
}

/// Where a host keeps carries between a run and its re-run: a bounded
/// list shared by every worker (the oldest goes when it is full), keyed
/// by a counter.
#[derive(Debug)]
pub struct Parking {
    slots: Mutex<VecDeque<(u64, Box<Carry>)>>,
    next: AtomicU64,
}

impl Default for Parking {
    fn default() -> Parking {
        Parking::new()
    }
}

impl Parking {
    /// An empty parking.
    pub const fn new() -> Parking {
        Parking {
            slots: Mutex::new(VecDeque::new()),
            next: AtomicU64::new(1),
        }
    }

    /// Keep `carry`; its key.
    pub fn park(&self, carry: Box<Carry>) -> u64 {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        while slots.len() >= PARKED {
            slots.pop_front();
        }
        slots.push_back((key, carry));
        key
    }

    /// Take back the carry kept under `key`, if it is still kept.
    pub fn take(&self, key: u64) -> Option<Box<Carry>> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let at = slots.iter().position(|(k, _)| *k == key)?;
        slots.remove(at).map(|(_, c)| c)
    }

    /// How many carries are kept.
    pub fn len(&self) -> usize {
        self.slots.lock().map_or(0, |s| s.len())
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
