//! The fleet's live state, shared by every Envoy worker, and this worker's
//! priced copy of it.
//!
//! Envoy runs one Wasm VM per worker thread, so a trip seen by one worker
//! must reach the others. The state (per destination: health, 40 bytes, and
//! requests in flight, 4 bytes) lives in one Envoy shared-data entry, keyed
//! by the configuration's fingerprint so a new destination set never reads
//! an old layout. Updates are compare-and-swap loops in the adapter; this
//! module holds no host calls.
//!
//! Every request reads the entry, but usually only one or two destinations
//! changed since this worker last looked (the in-flight counts of the ones
//! other requests went to). So [`Mirror::sync`] compares the entry with the
//! bytes it last saw, destination by destination, and decodes and reprices
//! only the ones that differ; an update rewrites only its destination's
//! bytes. The decision then runs on an up-to-date [`Slate`](ace_core::dispatch::Slate) without pricing
//! the whole fleet per request.
//!
//! Most requests need not read the entry at all. Envoy stamps each
//! successful write with the next value of one process-wide counter, so when
//! this worker stores the entry with compare-and-swap value `c` and nothing
//! writes in between, the entry holds `c + 1`. The mirror remembers that
//! [`Mirror::known_cas`]; the next update writes with it straight away, and
//! only if another worker wrote meanwhile does the write fail and the
//! update read, sync and try again. With one busy worker that saves the
//! shared-data read, the costliest host call on the path, on almost every
//! request.
//!
//! A request that ends quietly (a success within its SLO on a destination
//! with nothing to recover) changes nothing but its in-flight count, so
//! its release is owed ([`Mirror::owe_release`]) and paid with this
//! worker's next write, usually the next request's claim, or by the
//! plugin's tick when the worker goes idle. That saves a shared-data round
//! trip per request; other workers see the count high by this worker's
//! unpaid releases for that long, which only makes them more cautious.

use ace_core::cost::CostModel;
use ace_core::fleet::FleetState;
use ace_core::health::{Health, HealthPolicy, ENCODED_LEN};

/// Bytes per destination in the shared entry.
pub const STRIDE: usize = ENCODED_LEN + 4;

/// How long a known CAS value is trusted (ms). Far shorter than the time
/// any proxy needs to make 2^32 shared-data writes, so the counter cannot
/// wrap around to the same value unseen.
pub const TRUST_MS: u64 = 1_000;

/// A destination's bytes that no real encoding equals (its cap fraction
/// would be NaN): marks "re-read this one" in [`Mirror`]'s copy.
const UNSEEN: [u8; STRIDE] = [0xff; STRIDE];

/// What [`Mirror::sync`] found in the shared entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Synced {
    /// The entry held a state for this fleet.
    Read,
    /// There was no entry yet: everything starts healthy and idle.
    Fresh,
    /// The entry was not a state for this fleet (wrong size, or a
    /// destination's bytes did not decode): those parts start fresh, and the
    /// next write replaces the whole entry.
    Repaired,
}

/// This worker's copy of the shared state, priced for decisions.
#[derive(Clone, Debug)]
pub struct Mirror {
    /// The fleet as this worker last saw it, priced.
    pub state: FleetState,
    /// The entry's bytes as last synced (or written): what `state`
    /// reflects.
    seen: Vec<u8>,
    /// The next write must carry every destination, not just one.
    rewrite_all: bool,
    /// A healthy, idle destination's bytes.
    fresh: [u8; STRIDE],
    /// In-flight releases owed to the shared entry, per destination.
    owed: Vec<u32>,
    /// Destinations with releases owed.
    owed_mask: Vec<u64>,
    /// The entry's CAS value while `seen` is known to equal the entry, and
    /// when that became known (ms).
    known: Option<(u32, u64)>,
    /// A reused buffer for the entry about to be stored.
    spare: Vec<u8>,
}

impl Mirror {
    /// A mirror of `n` destinations that has seen nothing yet.
    pub fn new(n: usize) -> Mirror {
        let mut fresh = [0u8; STRIDE];
        if let Some(h) = fresh.get_mut(..ENCODED_LEN) {
            h.copy_from_slice(&Health::default().encode());
        }
        Mirror {
            fresh,
            state: FleetState::new(n),
            seen: UNSEEN.repeat(n),
            rewrite_all: true,
            owed: vec![0; n],
            owed_mask: vec![0; n.div_ceil(64)],
            known: None,
            spare: Vec::with_capacity(n * STRIDE),
        }
    }

    /// The entry's CAS value, if this worker's copy is known to equal the
    /// entry: it read or stored the entry within [`TRUST_MS`] and nothing
    /// it knows of has written since (see the module docs). Writing with
    /// it either succeeds, and then the mirror was current, or fails with a
    /// CAS mismatch.
    pub fn known_cas(&self, now_ms: u64) -> Option<u32> {
        self.known
            .filter(|(_, at)| now_ms.saturating_sub(*at) <= TRUST_MS)
            .map(|(cas, _)| cas)
    }

    /// The entry was read with CAS value `cas` and synced as `outcome`.
    pub fn read_with(&mut self, cas: Option<u32>, outcome: Synced, now_ms: u64) {
        self.known = match outcome {
            Synced::Read => cas.map(|c| (c, now_ms)),
            // A repaired or missing entry differs from what the mirror holds.
            Synced::Fresh | Synced::Repaired => None,
        };
    }

    /// The entry was stored with compare-and-swap value `cas`: unless
    /// anything else writes, the entry now holds the counter's next value.
    /// An unconditional store (`None`) leaves the value unknown.
    pub fn stored_with(&mut self, cas: Option<u32>, now_ms: u64) {
        self.known = cas.map(|c| (next_cas(c), now_ms));
    }

    /// A store failed: the entry is no longer known.
    pub fn forget_cas(&mut self) {
        self.known = None;
    }

    /// The entry as this worker knows it (its last read or store), in a
    /// reused buffer; hand the buffer back with [`Mirror::recycle`].
    pub fn known_entry(&mut self) -> Vec<u8> {
        let mut out = std::mem::take(&mut self.spare);
        out.clear();
        out.extend_from_slice(&self.seen);
        out
    }

    /// Keep `buf` for the next [`Mirror::known_entry`].
    pub fn recycle(&mut self, buf: Vec<u8>) {
        self.spare = buf;
    }

    /// Reprice the destinations whose price moves with time, for a decision
    /// at `now_ms` without a read (what [`Mirror::sync`] does last).
    pub fn advance(&mut self, models: &[CostModel], policy: &HealthPolicy, now_ms: u64) {
        self.state.advance(models, policy, now_ms);
    }

    /// Record that a request on `d` ended quietly: its slot is released
    /// with the next write instead of a write of its own.
    pub fn owe_release(&mut self, d: usize) {
        if let (Some(o), Some(w)) = (self.owed.get_mut(d), self.owed_mask.get_mut(d / 64)) {
            *o = o.saturating_add(1);
            *w |= 1 << (d % 64);
        }
    }

    /// Whether releases are owed.
    pub fn owes(&self) -> bool {
        self.owed_mask.iter().any(|w| *w != 0)
    }

    /// Fold the owed releases into the synced counts and reprice (call
    /// right after [`Mirror::sync`], before deciding or writing).
    pub fn apply_owed(&mut self, models: &[CostModel], policy: &HealthPolicy, now_ms: u64) {
        self.each_dirty(None, |m, d| {
            let owed = m.owed.get(d).copied().unwrap_or(0);
            m.state.release(d, owed);
            m.state.reprice(d, models, policy, now_ms);
        });
    }

    /// The owed releases reached the shared entry.
    fn paid(&mut self) {
        self.owed.iter_mut().for_each(|o| *o = 0);
        self.owed_mask.iter_mut().for_each(|w| *w = 0);
    }

    /// Bring the mirror up to `entry` (the shared bytes, if any) at
    /// `now_ms`: decode and reprice the destinations whose bytes changed,
    /// then reprice those whose price moves with time.
    pub fn sync(
        &mut self,
        entry: Option<&[u8]>,
        models: &[CostModel],
        policy: &HealthPolicy,
        now_ms: u64,
    ) -> Synced {
        let n = self.state.len();
        let mut outcome = Synced::Read;
        let entry = match entry {
            Some(b) if b.len() == n * STRIDE => Some(b),
            Some(_) => {
                outcome = Synced::Repaired;
                None
            }
            None => {
                outcome = Synced::Fresh;
                None
            }
        };
        let fresh = self.fresh;
        for d in 0..n {
            let at = d * STRIDE..(d + 1) * STRIDE;
            let new = match entry {
                Some(b) => b.get(at.clone()).unwrap_or(&UNSEEN),
                None => fresh.as_slice(),
            };
            let Some(seen) = self.seen.get_mut(at) else {
                continue;
            };
            if same(new, seen) {
                continue;
            }
            let (h, f) = new.split_at(ENCODED_LEN);
            let decoded = Health::decode(h).zip(<[u8; 4]>::try_from(f).ok());
            let (health, flight) = match decoded {
                Some((h, f)) => {
                    seen.copy_from_slice(new);
                    (h, u32::from_le_bytes(f))
                }
                None => {
                    outcome = Synced::Repaired;
                    seen.copy_from_slice(&fresh);
                    (Health::default(), 0)
                }
            };
            let state = &mut self.state;
            if let (Some(hs), Some(fs)) = (state.health.get_mut(d), state.in_flight.get_mut(d)) {
                *hs = health;
                *fs = flight;
            }
            state.reprice(d, models, policy, now_ms);
        }
        if outcome != Synced::Read {
            self.rewrite_all = true;
        }
        self.advance(models, policy, now_ms);
        outcome
    }

    /// Write destination `d`'s state into `out`, the entry about to be
    /// stored (every destination when the entry needs rebuilding). `out`
    /// is resized to the entry's length if it is not that already.
    pub fn write(&self, d: usize, out: &mut Vec<u8>) {
        let n = self.state.len();
        let whole = self.rewrite_all || out.len() != n * STRIDE;
        if whole {
            out.clear();
            out.resize(n * STRIDE, 0);
        }
        for i in 0..n {
            if !whole && i != d {
                continue;
            }
            let (Some(h), Some(f), Some(chunk)) = (
                self.state.health.get(i),
                self.state.in_flight.get(i),
                out.get_mut(i * STRIDE..(i + 1) * STRIDE),
            ) else {
                continue;
            };
            let (hb, fb) = chunk.split_at_mut(ENCODED_LEN);
            hb.copy_from_slice(&h.encode());
            fb.copy_from_slice(&f.to_le_bytes());
        }
    }

    /// The entry was stored with `d` changed (from [`Mirror::write`]):
    /// remember its bytes and reprice `d`.
    pub fn written(
        &mut self,
        d: usize,
        entry: &[u8],
        models: &[CostModel],
        policy: &HealthPolicy,
        now_ms: u64,
    ) {
        if self.rewrite_all {
            if let Some(all) = self.seen.get_mut(..entry.len()) {
                all.copy_from_slice(entry);
            }
            self.rewrite_all = false;
        } else if let (Some(seen), Some(new)) = (
            self.seen.get_mut(d * STRIDE..(d + 1) * STRIDE),
            entry.get(d * STRIDE..(d + 1) * STRIDE),
        ) {
            seen.copy_from_slice(new);
        }
        self.state.reprice(d, models, policy, now_ms);
    }

    /// Word `w` of the set this worker is about to write: every destination
    /// with releases owed, plus `changed`.
    fn dirty_word(&self, w: usize, changed: Option<usize>) -> u64 {
        let owed = self.owed_mask.get(w).copied().unwrap_or(0);
        match changed {
            Some(d) if d / 64 == w => owed | 1 << (d % 64),
            _ => owed,
        }
    }

    /// Calls `f` for each destination of the write set (see
    /// [`Mirror::dirty_word`]), without allocating.
    fn each_dirty(&mut self, changed: Option<usize>, mut f: impl FnMut(&mut Mirror, usize)) {
        for w in 0..self.owed_mask.len() {
            let mut bits = self.dirty_word(w, changed);
            while bits != 0 {
                f(self, w * 64 + bits.trailing_zeros() as usize);
                bits &= bits - 1;
            }
        }
    }

    /// Whether there is anything to write: a change, or releases owed.
    pub fn has_changes(&self, changed: Option<usize>) -> bool {
        changed.is_some() || self.owes()
    }

    /// [`Mirror::write`] for `changed` and every destination owed a release.
    pub fn write_changes(&mut self, changed: Option<usize>, out: &mut Vec<u8>) {
        self.each_dirty(changed, |m, d| m.write(d, out));
    }

    /// The entry holding [`Mirror::write_changes`]'s bytes was stored:
    /// remember them, reprice, and clear the releases they paid.
    pub fn stored_changes(
        &mut self,
        changed: Option<usize>,
        entry: &[u8],
        models: &[CostModel],
        policy: &HealthPolicy,
        now_ms: u64,
    ) {
        self.each_dirty(changed, |m, d| m.written(d, entry, models, policy, now_ms));
        self.paid();
    }

    /// The store of [`Mirror::write_changes`]'s bytes failed: forget them.
    pub fn lost_changes(&mut self, changed: Option<usize>) {
        self.each_dirty(changed, |m, d| m.lost(d));
    }

    /// The store of a change to `d` failed (another worker wrote first):
    /// forget `d`'s local change so the next sync reads it again.
    pub fn lost(&mut self, d: usize) {
        if let Some(seen) = self.seen.get_mut(d * STRIDE..(d + 1) * STRIDE) {
            seen.copy_from_slice(&UNSEEN);
        }
    }
}

/// The CAS value Envoy gives the write after one that carried `cas`, when
/// nothing else wrote in between (its counter skips 0).
fn next_cas(cas: u32) -> u32 {
    match cas.wrapping_add(1) {
        0 => 1,
        n => n,
    }
}

/// `a == b` for one destination's bytes, a word at a time (a byte-wise
/// `memcmp` costs several times more inside a Wasm VM).
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.chunks(8)
        .zip(b.chunks(8))
        .all(|(x, y)| word(x) == word(y))
}

/// Up to eight bytes as one little-endian word (zero-padded).
fn word(c: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    if let Some(dst) = w.get_mut(..c.len()) {
        dst.copy_from_slice(c);
    }
    u64::from_le_bytes(w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ace_core::cost::Tier;
    use ace_core::dispatch::{decide, Fleet, Request, Slate};
    use ace_core::health::Outcome;

    fn models(n: usize) -> Vec<CostModel> {
        (0..n)
            .map(|i| CostModel {
                tier: if i == 0 { Tier::Payg } else { Tier::InHouse },
                usd_per_input_token: 1e-6 / (i + 1) as f64,
                capacity: if i == 0 { 0 } else { 4 },
                ..CostModel::default()
            })
            .collect()
    }

    /// Two workers sharing one entry, each with its own mirror; the result
    /// must match a slate priced from scratch.
    #[test]
    fn two_mirrors_stay_in_step_through_the_shared_bytes() {
        let p = HealthPolicy::default();
        let m = models(3);
        let mut entry: Option<Vec<u8>> = None;
        let mut a = Mirror::new(3);
        let mut b = Mirror::new(3);
        let steps: [(bool, usize, Option<Outcome>); 6] = [
            (true, 2, None),
            (false, 2, None),
            (true, 1, Some(Outcome::Failure { tenant: 0 })),
            (false, 1, Some(Outcome::Failure { tenant: 0 })),
            (true, 1, Some(Outcome::Failure { tenant: 0 })),
            (
                false,
                0,
                Some(Outcome::Throttled {
                    retry_after_ms: Some(50),
                }),
            ),
        ];
        for (t, (on_a, d, outcome)) in steps.into_iter().enumerate() {
            let now = t as u64 * 10;
            let w = if on_a { &mut a } else { &mut b };
            w.sync(entry.as_deref(), &m, &p, now);
            w.state.in_flight[d] += 1;
            if let Some(o) = outcome {
                w.state.health[d].observe(o, now, &p);
            }
            let mut out = entry.clone().unwrap_or_default();
            w.write(d, &mut out);
            w.written(d, &out, &m, &p, now);
            entry = Some(out);
        }
        for w in [&mut a, &mut b] {
            assert_eq!(w.sync(entry.as_deref(), &m, &p, 100), Synced::Read);
            let mut full = Slate::new(3);
            full.refresh(
                &Fleet {
                    models: &m,
                    health: &w.state.health,
                    in_flight: &w.state.in_flight,
                    live: &[],
                    learned: &[],
                    policy: &p,
                },
                100,
            );
            assert_eq!(w.state.slate, full);
            assert_eq!(w.state.in_flight, vec![1, 3, 2]);
        }
        // Destination 1 tripped after three failures; the decision skips it.
        let req = Request::untimed(10, 10, 0.0);
        let d = decide(&a.state.slate, &[0b110], &[u64::MAX], &req).map(|d| d.index);
        assert_eq!(d, Ok(2));
    }

    #[test]
    fn a_known_cas_is_trusted_briefly_and_only_after_a_clean_read_or_store() {
        let mut w = Mirror::new(2);
        assert_eq!(w.known_cas(0), None, "nothing read yet");
        w.read_with(Some(5), Synced::Read, 100);
        assert_eq!(w.known_cas(100 + TRUST_MS), Some(5));
        assert_eq!(w.known_cas(101 + TRUST_MS), None, "too old to trust");
        w.stored_with(Some(5), 200);
        assert_eq!(w.known_cas(200), Some(6), "Envoy's next counter value");
        w.stored_with(Some(u32::MAX), 200);
        assert_eq!(w.known_cas(200), Some(1), "the counter skips 0");
        w.stored_with(None, 200);
        assert_eq!(w.known_cas(200), None, "an unconditional store");
        for outcome in [Synced::Fresh, Synced::Repaired] {
            w.read_with(Some(5), outcome, 300);
            assert_eq!(w.known_cas(300), None, "{outcome:?}");
        }
        w.read_with(Some(5), Synced::Read, 300);
        w.forget_cas();
        assert_eq!(w.known_cas(300), None);
    }

    /// A fresh mirror of `n` destinations that has stored `flight`
    /// requests in flight on destination 1; returns it and the entry.
    fn stored(n: usize, flight: u32) -> (Mirror, Vec<u8>) {
        let (p, m) = (HealthPolicy::default(), models(n));
        let mut w = Mirror::new(n);
        w.sync(None, &m, &p, 0);
        w.state.in_flight[1] = flight;
        let mut entry = Vec::new();
        w.write(1, &mut entry);
        w.written(1, &entry, &m, &p, 0);
        (w, entry)
    }

    #[test]
    fn the_known_entry_is_what_the_mirror_last_saw() {
        let (mut w, entry) = stored(2, 3);
        let known = w.known_entry();
        assert_eq!(known, entry);
        w.recycle(known);
        assert_eq!(w.known_entry(), entry, "a recycled buffer is refilled");
    }

    #[test]
    fn word_compare_is_byte_compare() {
        let a: Vec<u8> = (0..STRIDE as u8).collect();
        for i in 0..STRIDE {
            let mut b = a.clone();
            b[i] ^= 1;
            assert!(!same(&a, &b), "byte {i}");
        }
        assert!(same(&a, &a.clone()));
        assert!(!same(&a, &a[1..]));
    }

    #[test]
    fn owed_releases_are_paid_with_the_next_write() {
        let p = HealthPolicy::default();
        let m = models(3);
        let (mut w, mut entry) = stored(3, 2);
        w.owe_release(1);
        w.owe_release(1);
        assert!(w.owes());
        // The next claim (on destination 2) syncs, folds the releases in,
        // and writes both destinations.
        w.sync(Some(&entry), &m, &p, 5);
        w.apply_owed(&m, &p, 5);
        assert_eq!(w.state.in_flight, vec![0, 0, 0]);
        w.state.in_flight[2] += 1;
        for d in [1, 2] {
            w.write(d, &mut entry);
        }
        for d in [1, 2] {
            w.written(d, &entry, &m, &p, 5);
        }
        w.paid();
        assert!(!w.owes());
        let mut other = Mirror::new(3);
        other.sync(Some(&entry), &m, &p, 5);
        assert_eq!(other.state.in_flight, vec![0, 0, 1]);
    }

    #[test]
    fn a_lost_update_is_read_again() {
        let (p, m) = (HealthPolicy::default(), models(2));
        let (mut w, entry) = stored(2, 0);
        // A local change that never reached the entry.
        w.state.in_flight[1] = 9;
        w.lost(1);
        w.sync(Some(&entry), &m, &p, 0);
        assert_eq!(w.state.in_flight, vec![0, 0]);
    }

    #[test]
    fn junk_entries_are_repaired_not_misread() {
        let p = HealthPolicy::default();
        let m = models(3);
        let mut w = Mirror::new(3);
        assert_eq!(w.sync(Some(&[1, 2, 3]), &m, &p, 0), Synced::Repaired);
        assert_eq!(w.sync(Some(&UNSEEN.repeat(3)), &m, &p, 0), Synced::Repaired);
        assert_eq!(w.state.in_flight, vec![0, 0, 0]);
        let mut out = UNSEEN.repeat(3);
        w.write(0, &mut out);
        assert!(
            out.chunks(STRIDE).all(|c| c != UNSEEN),
            "a repaired entry is rewritten whole"
        );
        w.written(0, &out, &m, &p, 0);
        assert_eq!(w.sync(Some(&out), &m, &p, 0), Synced::Read);
    }
}
