//! The fleet's live state, shared by every Envoy worker.
//!
//! Envoy runs one Wasm VM per worker thread, so a trip seen by one worker
//! must reach the others. The state (per destination: health, 40 bytes, and
//! requests in flight, 4 bytes) lives in one Envoy shared-data entry, keyed
//! by the configuration's fingerprint so a new destination set never reads
//! an old layout. Updates are compare-and-swap loops; this module only
//! encodes and decodes, the host calls stay in the adapter.

use ace_core::health::{Health, ENCODED_LEN};

/// Bytes per destination in the shared entry.
pub const STRIDE: usize = ENCODED_LEN + 4;

/// Health and in-flight counts, parallel to the configured destinations.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetState {
    /// Health per destination.
    pub health: Vec<Health>,
    /// Requests in flight per destination, summed over all workers.
    pub in_flight: Vec<u32>,
}

impl FleetState {
    /// A fresh state: everything healthy and idle.
    pub fn new(n: usize) -> FleetState {
        FleetState {
            health: vec![Health::default(); n],
            in_flight: vec![0; n],
        }
    }

    /// Overwrite `self` from `bytes`; false (and `self` reset to fresh) when
    /// the bytes are not a state for this many destinations.
    pub fn load(&mut self, bytes: &[u8]) -> bool {
        let n = self.health.len();
        if bytes.len() != n * STRIDE {
            *self = FleetState::new(n);
            return false;
        }
        for (i, chunk) in bytes.chunks_exact(STRIDE).enumerate() {
            let (h, f) = chunk.split_at(ENCODED_LEN);
            let health = Health::decode(h);
            let flight = <[u8; 4]>::try_from(f).ok().map(u32::from_le_bytes);
            match (
                health,
                flight,
                self.health.get_mut(i),
                self.in_flight.get_mut(i),
            ) {
                (Some(h), Some(f), Some(hs), Some(fs)) => {
                    *hs = h;
                    *fs = f;
                }
                _ => {
                    *self = FleetState::new(n);
                    return false;
                }
            }
        }
        true
    }

    /// Encode into `out` (cleared first).
    pub fn store(&self, out: &mut Vec<u8>) {
        out.clear();
        for (h, f) in self.health.iter().zip(&self.in_flight) {
            out.extend_from_slice(&h.encode());
            out.extend_from_slice(&f.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ace_core::health::{HealthPolicy, Outcome};

    #[test]
    fn round_trips_and_resets_on_junk() {
        let mut s = FleetState::new(3);
        s.in_flight[1] = 7;
        s.health[2].observe(
            Outcome::Throttled {
                retry_after_ms: Some(9),
            },
            1,
            &HealthPolicy::default(),
        );
        let mut bytes = Vec::new();
        s.store(&mut bytes);
        assert_eq!(bytes.len(), 3 * STRIDE);
        let mut t = FleetState::new(3);
        assert!(t.load(&bytes));
        assert_eq!(t, s);
        assert!(!t.load(&bytes[..10]));
        assert_eq!(t, FleetState::new(3));
        let mut other = FleetState::new(2);
        assert!(
            !other.load(&bytes),
            "a different fleet size is never misread"
        );
    }
}
