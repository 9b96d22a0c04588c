//! Outcome: what an answer's headers say of its destination, for health
//! (a failure trips, a 429 moves the cap, a slow answer derates) and for
//! a provider's headroom. The first of the response's stages; the rules
//! are [`ace_core::health`]'s and [`crate::headroom`]'s.

use crate::headers;
use crate::headroom;
use crate::host::Host;
use crate::request;
use ace_config::Config;
use ace_core::dispatch::Decision;
use ace_core::health::Outcome;

/// What an answer's headers came to.
#[derive(Debug, Clone, Copy)]
pub struct Answer {
    /// Its status (0: none could be read).
    pub status: u32,
    /// The upstream's own time, where an upstream answered and said it.
    pub upstream_ms: Option<u64>,
    /// What it means for the destination's health.
    pub outcome: Outcome,
}

/// Read the answer to a request `decision` sent `latency_ms` ago for
/// tenant key `tenant`, at `now`.
pub fn read<H: Host>(
    cfg: &Config,
    host: &mut H,
    decision: &Decision,
    tenant: u32,
    latency_ms: u64,
    now: u64,
) -> Answer {
    let status = host.response_header(":status", |v| headers::number::<u32>(v).unwrap_or(0));
    let slo_ms = cfg.destinations.get(decision.index).and_then(|d| d.slo_ms);
    // Present only on an upstream's answer; its value is the upstream's
    // own time.
    let service_time = host.response_header(request::UPSTREAM_TIME_HEADER, |v| {
        v.map(|v| headers::number::<u64>(Some(v)))
    });
    let upstream = matches!(status, 0 | 500..=599) && service_time.is_some();
    // What the provider says of its own limit: `retry-after-ms` or
    // `retry-after` on a 429, its rate-limit figures on an answer.
    let retry_after = (status == 429).then(|| {
        let ms = host.response_header("retry-after-ms", |v| headroom::retry_after_ms(v, None));
        ms.or_else(|| host.response_header("retry-after", |v| headroom::retry_after_ms(None, v)))
    });
    let mut reading = headroom::Reading::default();
    if (200..300).contains(&status) {
        host.each_response_header(|k, v| {
            if headroom::may_be(k) {
                reading.feed(k, v, now);
            }
        });
    }
    let outcome = request::outcome(
        status,
        retry_after.flatten(),
        upstream,
        tenant,
        latency_ms,
        slo_ms,
        reading.headroom(),
    );
    Answer {
        status,
        upstream_ms: service_time.flatten(),
        outcome,
    }
}
