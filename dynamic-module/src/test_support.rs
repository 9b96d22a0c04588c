//! What a host that drives this module without Envoy needs (feature
//! `test-support`, used by `ace-conformance`'s fake Envoy): a clock it
//! sets, and a fresh process slot for the published snapshot between two
//! runs in one process. Envoy never sees either: the shipped library is
//! built without the feature, and with it an unset clock is the real one.

use std::sync::atomic::{AtomicU64, Ordering};

/// The clock a test set, ms since the Unix epoch (0: unset).
static CLOCK_MS: AtomicU64 = AtomicU64::new(0);

/// Make the module's clock read `now_ms` (0: the real clock again).
pub fn set_clock(now_ms: u64) {
    CLOCK_MS.store(now_ms, Ordering::Release);
}

/// The clock a test set, if it set one.
pub fn clock() -> Option<u64> {
    Some(CLOCK_MS.load(Ordering::Acquire)).filter(|&t| t > 0)
}

/// Forget the published snapshot and when the service was last heard, as
/// in a process that just started.
pub fn reset_published() {
    crate::published::reset();
}
