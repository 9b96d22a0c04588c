//! Identity: who is asking, for what, under which policy. The request's
//! attributes (verified ones from their sources, or from what the run a
//! re-run replaces read) looked up in the compiled tables, failing closed;
//! then only the destinations that serve the request's API as it will be
//! sent.

use super::Shape;
use crate::event::Event;
use crate::host::Host;
use crate::request::{self, Refused};
use crate::setup::{Setup, Worker};
use crate::upstream;

/// The feasible set, in the worker's lookup mask.
pub fn feasible<H: Host>(
    setup: &Setup,
    w: &mut Worker,
    host: &mut H,
    event: &mut Event,
    shape: &Shape<'_>,
) -> Result<(), Refused> {
    let cfg = &setup.config;
    request::feasible(
        cfg,
        setup.tables.as_ref(),
        event,
        shape.body_model,
        // A re-run reads what its first run verified: a filter before ACE
        // may have consumed the header it verified.
        |source| {
            shape
                .carried
                .and_then(|c| c.verified(cfg, source))
                .or_else(|| host.trusted(source))
        },
        &mut w.lookup,
    )?;
    let model = event.text(&event.model_requested);
    upstream::narrow(cfg, shape.api, model, shape.rewritable, &mut w.lookup.mask);
    Ok(())
}
