//! The control service's latest answer, as the process's poller
//! published it for every configuration's fleet to read.
//!
//! The poller runs once per Envoy, on the main thread (the bootstrap
//! extension in `poller`); the fleets read on the request path. So the
//! request path only compares a generation number with an atomic load, and
//! takes the lock on the snapshot's bytes only when the number moved. Each
//! fleet resolves the bytes against its own configuration
//! (`ace_flow::control::decode`), so one configuration's rejection of a
//! snapshot never touches another's.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Bumped on every new snapshot; 0: none yet.
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// When the service last answered (a snapshot or "not modified"), ms.
static HEARD_MS: AtomicU64 = AtomicU64::new(0);
/// The newest snapshot's bytes.
static SNAPSHOT: Mutex<Option<Arc<Vec<u8>>>> = Mutex::new(None);

/// The generation of the newest snapshot (0: none).
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// When the service last answered, ms (0: never).
pub fn heard_ms() -> u64 {
    HEARD_MS.load(Ordering::Acquire)
}

/// The newest snapshot's bytes.
pub fn snapshot() -> Option<Arc<Vec<u8>>> {
    SNAPSHOT.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Publish a new snapshot heard at `now_ms`.
pub fn publish(bytes: Vec<u8>, now_ms: u64) {
    *SNAPSHOT.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(bytes));
    HEARD_MS.fetch_max(now_ms, Ordering::AcqRel);
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// The service answered "not modified" at `now_ms`.
pub fn heard(now_ms: u64) {
    HEARD_MS.fetch_max(now_ms, Ordering::AcqRel);
}

/// Forget everything published (a fresh process), for
/// [`crate::test_support`]. The generation keeps counting, so no fleet
/// mistakes an old snapshot for a new one.
#[cfg(feature = "test-support")]
pub(crate) fn reset() {
    *SNAPSHOT.lock().unwrap_or_else(|p| p.into_inner()) = None;
    HEARD_MS.store(0, Ordering::Release);
    GENERATION.fetch_add(1, Ordering::AcqRel);
}
