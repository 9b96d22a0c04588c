//! What the control service's poller delivered, as the process's poller
//! published it for every configuration's fleet to consume.
//!
//! The poller runs once per Envoy, on the main thread (the bootstrap
//! extension in `poller`); the fleets read on the request path and on the
//! poller's timer. So the request path only compares a generation number
//! with an atomic load, and takes the lock on what was published only when
//! the number moved. The poller only moves bytes: each fleet feeds what was
//! published to its own configuration's consumer
//! (`ace_flow::control::Consumer`), which decides; one configuration's
//! rejection of a snapshot never touches another's.

use ace_flow::control::Delivery;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Bumped on every delivery published; 0: none yet.
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// Snapshots the fleets refused for the first time, not yet counted.
static REFUSED: AtomicU64 = AtomicU64::new(0);
/// The newest snapshot and the newest "not modified", with the generation
/// each was published at.
static LATEST: Mutex<Latest> = Mutex::new(Latest {
    snapshot: None,
    unchanged: None,
});

#[derive(Debug)]
struct Latest {
    snapshot: Option<(u64, Published)>,
    unchanged: Option<(u64, Published)>,
}

/// One published delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Published {
    /// A snapshot's bytes, received at `at_ms`.
    Snapshot(Arc<Vec<u8>>, u64),
    /// "Not modified" for the snapshot with this ETag, at `at_ms`.
    Unchanged(String, u64),
}

impl Published {
    /// As a consumer takes it.
    pub fn delivery(&self) -> Delivery<'_> {
        match self {
            Published::Snapshot(bytes, at_ms) => Delivery::Snapshot {
                bytes,
                at_ms: *at_ms,
            },
            Published::Unchanged(etag, at_ms) => Delivery::Unchanged {
                etag,
                at_ms: *at_ms,
            },
        }
    }
}

/// The generation of the newest delivery (0: none).
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// Publish a delivery.
pub fn publish(delivery: Published) {
    let mut latest = LATEST.lock().unwrap_or_else(|p| p.into_inner());
    let generation = GENERATION.load(Ordering::Acquire) + 1;
    match delivery {
        d @ Published::Snapshot(..) => latest.snapshot = Some((generation, d)),
        d @ Published::Unchanged(..) => latest.unchanged = Some((generation, d)),
    }
    GENERATION.store(generation, Ordering::Release);
}

/// What was published after generation `seen`, oldest first (at most the
/// newest snapshot and the newest "not modified"), and the generation it
/// brings the reader to.
pub fn since(seen: u64) -> (Vec<Published>, u64) {
    let latest = LATEST.lock().unwrap_or_else(|p| p.into_inner());
    let mut new: Vec<&(u64, Published)> = [&latest.snapshot, &latest.unchanged]
        .into_iter()
        .flatten()
        .filter(|(g, _)| *g > seen)
        .collect();
    new.sort_by_key(|(g, _)| *g);
    let generation = GENERATION.load(Ordering::Acquire);
    (
        new.into_iter().map(|(_, d)| d.clone()).collect(),
        generation,
    )
}

/// A fleet refused `n` snapshots for the first time.
pub fn refused(n: u64) {
    REFUSED.fetch_add(n, Ordering::AcqRel);
}

/// The fleets' first refusals since the last call (for
/// `ace.control.errors`).
pub fn take_refused() -> u64 {
    REFUSED.swap(0, Ordering::AcqRel)
}

/// Forget everything published (a fresh process), for
/// [`crate::test_support`]. The generation keeps counting, so no fleet
/// mistakes an old snapshot for a new one.
#[cfg(feature = "test-support")]
pub(crate) fn reset() {
    let mut latest = LATEST.lock().unwrap_or_else(|p| p.into_inner());
    latest.snapshot = None;
    latest.unchanged = None;
    REFUSED.store(0, Ordering::Release);
    GENERATION.fetch_add(1, Ordering::AcqRel);
}
