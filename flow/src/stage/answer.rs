//! The answer stage of the response cache: a fresh answer compared with
//! the hit it checks, and stored for the next request. The entry's format
//! and what may be served are [`crate::cache`]'s; the slots live in the
//! shared store ([`crate::store::cache_put`]).

use crate::cache::{self, Entry, Pending};
use crate::counters::Fleet;
use crate::event::Event;
use crate::host::Host;
use crate::setup::Setup;
use crate::store;
use ace_core::dispatch::Decision;

/// The whole answer to a cacheable request arrived: compare it with the
/// hit it checks, if it checks one (a false hit counted and said in the
/// event), and store it.
pub fn store<H: Host>(setup: &Setup, host: &mut H, p: Pending, decision: &Decision, e: &mut Event) {
    if p.oversize && p.check.is_some() {
        // The fresh answer outgrew the bound the entry fits in: they
        // differ. Counted, and the entry dropped (nothing replaces it).
        host.count(Fleet::CacheChecks.into(), 1);
        host.count(Fleet::CacheFalseHits.into(), 1);
        e.cache_false_hit = true;
        let fingerprint = setup.config.fingerprint;
        store::cache_put(
            host,
            &mut store::Scratch::default(),
            fingerprint,
            p.slot,
            &[],
        );
        log::warn!("cache false hit: a checked entry's fresh answer outgrew the cache; dropped");
        return;
    }
    if !p.storable {
        return;
    }
    let digest = cache::content_digest(&p.body, p.sse);
    if let Some(check) = p.check {
        host.count(Fleet::CacheChecks.into(), 1);
        if check != digest {
            host.count(Fleet::CacheFalseHits.into(), 1);
            e.cache_false_hit = true;
            log::warn!(
                "cache false hit: a checked entry differs from the upstream's answer; replaced"
            );
        }
    }
    let model = e
        .text(&e.model_served)
        .or(e.text(&e.model_requested))
        .unwrap_or("");
    let status = u16::try_from(e.status).unwrap_or(200);
    let entry = Entry {
        key: p.key,
        created_ms: host.now_ms(),
        producer: decision.index,
        model,
        status,
        content_type: &p.content_type,
        tokens_in: e.tokens_in,
        tokens_out: e.tokens_out,
        estimated: e.tokens_estimated,
        digest,
        body: &p.body,
    };
    let bytes = entry.encode();
    let fingerprint = setup.config.fingerprint;
    if store::cache_put(
        host,
        &mut store::Scratch::default(),
        fingerprint,
        p.slot,
        &bytes,
    ) {
        host.count(Fleet::CacheStores.into(), 1);
    }
}
