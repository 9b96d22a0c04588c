//! Locality: what each feasible destination already holds of the
//! request's prompt (prefix locality), read before the rungs so the merit
//! order can price the prefill a destination skips, and recorded for the
//! destination chosen after. The table and its secret live in the shared
//! store ([`crate::store::Table`]); the rules are [`crate::prefix`]'s.

use super::Shape;
use crate::event::Event;
use crate::host::Host;
use crate::prefix::{self, Fingerprint, HeldBuf, Locality, Secret, Whose};
use crate::setup::{Setup, Worker};
use crate::store;

/// What the locality stage read of a request.
#[derive(Debug)]
pub struct Local<'s> {
    l: &'s Locality,
    fp: Fingerprint,
    secret: Secret,
    /// Whether any feasible destination holds part of the prompt.
    pub any: bool,
}

/// What each feasible destination holds of the prompt, into `held`;
/// `None` when locality is off, the request names no prefix, or the
/// store cannot keep the table's secret.
pub fn held<'s, H: Host>(
    setup: &'s Setup,
    w: &mut Worker,
    host: &mut H,
    event: &Event,
    shape: &Shape<'_>,
    held: &mut HeldBuf,
) -> Option<Local<'s>> {
    let l = setup.locality.as_ref()?;
    let mut fp = shape.fingerprint.unwrap_or_default();
    if let Some(v) = l
        .session_header
        .as_deref()
        .and_then(|h| event.headers.get(h))
    {
        fp.hint_from_header(v);
    }
    if fp.is_empty() {
        return None;
    }
    let secret = store::locality_secret(host, &mut w.store)?;
    let mut table = store::Table {
        host,
        scratch: &mut w.store,
        fingerprint: setup.config.fingerprint,
    };
    let who = Whose::of(event);
    let any = l.held(
        &mut table,
        &secret,
        who,
        &fp,
        &w.lookup.mask,
        shape.now,
        held,
    );
    Some(Local { l, fp, secret, any })
}

/// The destination `d` the prompt was sent to holds it from now; the
/// event says how much of it was already there.
#[allow(clippy::too_many_arguments)]
pub fn record<H: Host>(
    setup: &Setup,
    w: &mut Worker,
    host: &mut H,
    event: &mut Event,
    local: &Local<'_>,
    d: usize,
    held: &HeldBuf,
    shape: &Shape<'_>,
) {
    let mut table = store::Table {
        host,
        scratch: &mut w.store,
        fingerprint: setup.config.fingerprint,
    };
    let who = prefix::Whose::of(event);
    local.l.record(
        &mut table,
        &local.secret,
        who,
        &local.fp,
        d,
        shape.now,
        held,
    );
    event.tokens_prefix_held = held.cached.get(d).copied().unwrap_or(0);
}
