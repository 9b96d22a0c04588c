//! The one store every worker of a proxy shares, and its users.
//!
//! State a feature shares across Envoy's workers (the response cache, the
//! prefix locality table and its key, the budgets' counters) lives in one
//! keyed byte store with compare-and-swap, the only host capability for
//! it ([`Host::shared_get`], [`Host::shared_set`]): Envoy's shared data
//! in the Wasm filter, [`Memory`] in the dynamic module, the simulator
//! and the tests' mock. What a feature keeps there, under which key, and
//! how it retries a write another worker raced is written once, here; a
//! host adapter knows nothing of caches, tables or budgets. A new feature
//! with shared state adds its keys and its reader here and touches no
//! host.
//!
//! Keys carry the configuration's fingerprint where a value belongs to
//! one configuration (a cache slot, a locality slot), and a name where it
//! outlives configurations (a budget's counters survive a reload, so that
//! a reload neither forgets spend nor lifts a limit).

use crate::budget;
use crate::host::Host;
pub use crate::host::{Expect, Version, Written};
use crate::prefix;
use crate::request;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

/// How many times a read-modify-write is tried against other workers'
/// writes before it gives up (and is not counted).
const ATTEMPTS: usize = 16;

/// The key of prefix locality's secret: one for every worker and
/// configuration of the proxy.
pub const SECRET_KEY: &str = "ace.locality.secret";

/// A store in process memory, for a host whose workers share an address
/// space (the dynamic module), or that has one worker (the simulator, the
/// mock). Versions count every write of a key from 1.
#[derive(Debug, Default)]
pub struct Memory {
    map: Mutex<BTreeMap<Box<str>, Stored>>,
}

/// A value in [`Memory`], with its version.
type Stored = (Version, Vec<u8>);

impl Memory {
    /// An empty store.
    pub const fn new() -> Memory {
        Memory {
            map: Mutex::new(BTreeMap::new()),
        }
    }

    /// A store whose random draws (prefix locality's secret) are `seed`,
    /// not drawn: a simulation or a test that must be the same every run.
    pub fn deterministic(seed: [u64; 2]) -> Memory {
        let m = Memory::new();
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&seed[0].to_le_bytes());
        bytes[8..].copy_from_slice(&seed[1].to_le_bytes());
        m.set(SECRET_KEY, &bytes, Expect::Any);
        m
    }

    /// [`Host::shared_get`] on this store.
    pub fn get(&self, key: &str, into: &mut Vec<u8>) -> Option<Version> {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let (v, bytes) = map.get(key)?;
        into.extend_from_slice(bytes);
        Some(*v)
    }

    /// [`Host::shared_set`] on this store.
    pub fn set(&self, key: &str, value: &[u8], expect: Expect) -> Written {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        match (map.get_mut(key), expect) {
            (Some((v, bytes)), Expect::Any) => {
                *v = v.wrapping_add(1).max(1);
                bytes.clear();
                bytes.extend_from_slice(value);
                Written::Stored
            }
            (Some((v, bytes)), Expect::Version(want)) if *v == want => {
                *v = v.wrapping_add(1).max(1);
                bytes.clear();
                bytes.extend_from_slice(value);
                Written::Stored
            }
            (Some(_), _) => Written::Raced,
            (None, Expect::Version(_)) => Written::Raced,
            (None, Expect::Any | Expect::Absent) => {
                map.insert(key.into(), (1, value.to_vec()));
                Written::Stored
            }
        }
    }
}

/// A worker's buffers for the store: the key being written and the value
/// read, reused for every request.
#[derive(Debug, Default)]
pub struct Scratch {
    key: String,
    value: Vec<u8>,
    /// Prefix locality's secret, once read (it never changes once stored).
    secret: Option<prefix::Secret>,
}

impl Scratch {
    /// The key `prefix.{fingerprint}.{slot}`.
    fn slot_key(&mut self, prefix: &str, fingerprint: u64, slot: u32) -> &str {
        self.key.clear();
        let _ = write!(self.key, "{prefix}.{fingerprint:016x}.{slot}");
        &self.key
    }
}

/// The response cache's entry in `slot` (configuration `fingerprint`),
/// appended to `into`; false when there is none.
pub fn cache_get<H: Host>(
    host: &mut H,
    s: &mut Scratch,
    fingerprint: u64,
    slot: u32,
    into: &mut Vec<u8>,
) -> bool {
    let key = s.slot_key("ace.cache", fingerprint, slot);
    host.shared_get(key, into).is_some()
}

/// Store `entry` in the response cache's `slot`, replacing what it held.
pub fn cache_put<H: Host>(
    host: &mut H,
    s: &mut Scratch,
    fingerprint: u64,
    slot: u32,
    entry: &[u8],
) -> bool {
    let key = s.slot_key("ace.cache", fingerprint, slot);
    host.shared_set(key, entry, Expect::Any) == Written::Stored
}

/// Prefix locality's secret: drawn once at random by the first worker to
/// need it, and the same for every worker after (the first write wins).
/// `None` when the store cannot keep it: no locality then.
pub fn locality_secret<H: Host>(host: &mut H, s: &mut Scratch) -> Option<prefix::Secret> {
    if let Some(secret) = s.secret {
        return Some(secret);
    }
    let read = |host: &mut H, buf: &mut Vec<u8>| {
        buf.clear();
        host.shared_get(SECRET_KEY, buf)?;
        let (a, b) = (buf.get(..8)?, buf.get(8..16)?);
        Some(prefix::Secret([
            u64::from_le_bytes(a.try_into().ok()?),
            u64::from_le_bytes(b.try_into().ok()?),
        ]))
    };
    let secret = match read(host, &mut s.value) {
        Some(secret) => secret,
        None => {
            let mut bytes = [0u8; 16];
            bytes[..8].copy_from_slice(&request::random_u64().to_le_bytes());
            bytes[8..].copy_from_slice(&request::random_u64().to_le_bytes());
            // Another worker may have stored one first: theirs counts.
            let _ = host.shared_set(SECRET_KEY, &bytes, Expect::Absent);
            read(host, &mut s.value)?
        }
    };
    s.secret = Some(secret);
    Some(secret)
}

/// Prefix locality's table (configuration `fingerprint`) in the store.
pub struct Table<'a, H: Host> {
    /// The host.
    pub host: &'a mut H,
    /// The worker's buffers.
    pub scratch: &'a mut Scratch,
    /// The configuration's fingerprint.
    pub fingerprint: u64,
}

impl<H: Host> std::fmt::Debug for Table<'_, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Table({:016x})", self.fingerprint)
    }
}

impl<H: Host> prefix::Table for Table<'_, H> {
    fn get(&mut self, slot: u32, into: &mut [u8; prefix::RECORD_BYTES]) -> bool {
        let s = &mut *self.scratch;
        s.value.clear();
        s.key.clear();
        let _ = write!(s.key, "ace.loc.{:016x}.{slot}", self.fingerprint);
        if self.host.shared_get(&s.key, &mut s.value).is_none() {
            return false;
        }
        match <&[u8; prefix::RECORD_BYTES]>::try_from(s.value.as_slice()) {
            Ok(bytes) => {
                *into = *bytes;
                true
            }
            Err(_) => false,
        }
    }

    fn put(&mut self, slot: u32, bytes: &[u8; prefix::RECORD_BYTES]) -> bool {
        let key = self.scratch.slot_key("ace.loc", self.fingerprint, slot);
        self.host.shared_set(key, bytes, Expect::Any) == Written::Stored
    }
}

/// The budgets' counters in the store, by budget name, with the control
/// service's readings as the host holds them.
pub struct Cells<'a, H: Host> {
    /// The host.
    pub host: &'a mut H,
    /// The worker's buffers.
    pub scratch: &'a mut Scratch,
    /// The budgets' names, by slot.
    pub names: &'a [std::sync::Arc<str>],
}

impl<H: Host> std::fmt::Debug for Cells<'_, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cells({:?})", self.names)
    }
}

impl<H: Host> budget::Cells for Cells<'_, H> {
    fn update(
        &mut self,
        slot: u32,
        f: &mut dyn FnMut(&mut [u8; budget::CELL_BYTES]) -> bool,
    ) -> bool {
        let Some(name) = self.names.get(slot as usize) else {
            return false;
        };
        let s = &mut *self.scratch;
        s.key.clear();
        let _ = write!(s.key, "ace.budget.{name}");
        // Another worker's write between the read and this one's: read
        // again, a bounded number of times (then not counted).
        for _ in 0..ATTEMPTS {
            s.value.clear();
            let version = self.host.shared_get(&s.key, &mut s.value);
            let mut cell = [0u8; budget::CELL_BYTES];
            if let Ok(stored) = <&[u8; budget::CELL_BYTES]>::try_from(s.value.as_slice()) {
                cell = *stored;
            }
            if !f(&mut cell) {
                return true;
            }
            let expect = version.map_or(Expect::Absent, Expect::Version);
            match self.host.shared_set(&s.key, &cell, expect) {
                Written::Stored => return true,
                Written::Raced => continue,
                Written::Failed => return false,
            }
        }
        false
    }

    fn reading(&mut self, b: u16) -> budget::Reading {
        self.host.budget_reading(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_compare_and_swap() {
        let m = Memory::new();
        let mut buf = Vec::new();
        assert_eq!(m.get("k", &mut buf), None);
        assert_eq!(m.set("k", b"a", Expect::Version(1)), Written::Raced);
        assert_eq!(m.set("k", b"a", Expect::Absent), Written::Stored);
        assert_eq!(m.set("k", b"b", Expect::Absent), Written::Raced);
        assert_eq!(m.get("k", &mut buf), Some(1));
        assert_eq!(buf, b"a");
        assert_eq!(m.set("k", b"c", Expect::Version(2)), Written::Raced);
        assert_eq!(m.set("k", b"c", Expect::Version(1)), Written::Stored);
        assert_eq!(m.set("k", b"d", Expect::Any), Written::Stored);
        buf.clear();
        assert_eq!(m.get("k", &mut buf), Some(3));
        assert_eq!(buf, b"d");
    }
}
