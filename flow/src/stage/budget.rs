//! Budget: the tenant's budgets as a stage of routing. An exhausted
//! budget (or a minute's tokens) refuses the request with its 429; a soft
//! one narrows the feasible set to its tiers and caps the booked cost; a
//! request routed reserves its estimate, settled to what it booked when
//! it ends ([`release`]). The counters live in the shared store
//! ([`crate::store::Cells`]); the rules are [`crate::budget`]'s.

use super::{Climbed, Stop};
use crate::budget::{Budgeting, Refusal};
use crate::cache::Pending;
use crate::host::Host;
use crate::setup::{Setup, Worker};
use crate::store::{self, Cells};
use ace_core::dispatch::Request;

/// What a request a tenant budget counts reserved when it was routed:
/// settled to what it booked when it ends.
#[derive(Debug, Clone, Copy)]
pub struct Hold {
    /// The tenant's value index (its budgets: `Budgeting::of`).
    tenant: u32,
    /// Cost reserved, nano-USD.
    nano: i64,
    /// Tokens reserved.
    tokens: u32,
    /// The minute they count in.
    minute: u32,
    /// The soft budget it was served under, if any.
    pub soft: Option<u16>,
}

/// A tenant with budgets, admitted.
#[derive(Debug)]
pub struct Admitted<'a> {
    bg: &'a Budgeting,
    tenant: u32,
    mine: &'a [u16],
    tokens: u32,
    soft: Option<Soft<'a>>,
}

/// The soft budget a request is served under.
#[derive(Clone, Copy, Debug)]
pub struct Soft<'a> {
    bg: &'a Budgeting,
    b: u16,
    /// Whether anything was feasible before the budget narrowed it.
    feasible_before: bool,
    /// Only a substitute model may serve.
    pub substitution_only: bool,
}

impl<'a> Admitted<'a> {
    /// The soft budget, if one narrows the request.
    pub fn soft(&self) -> Option<Soft<'a>> {
        self.soft
    }
}

impl<'a> Soft<'a> {
    /// The destinations it allows.
    pub fn mask(self) -> &'a [u64] {
        self.bg.soft_mask(self.b)
    }
}

/// The tenant's budgets on this request: refused, narrowed (the worker's
/// mask, the request's `max_usd`) or let through; `None` when the tenant
/// has none.
pub fn admit<'s, H: Host>(
    setup: &'s Setup,
    w: &mut Worker,
    host: &mut H,
    req: &mut Request,
    now: u64,
) -> Result<Option<Admitted<'s>>, Refusal> {
    let cfg = &setup.config;
    let Some(bg) = setup.budgets.as_ref() else {
        return Ok(None);
    };
    let Some(tenant) = cfg
        .policy
        .as_ref()
        .and_then(|p| p.tenant)
        .and_then(|t| w.lookup.values.get(t).copied())
    else {
        return Ok(None);
    };
    let mine = bg.of(tenant);
    if mine.is_empty() {
        return Ok(None);
    }
    let tokens = req.tokens_in.saturating_add(req.tokens_out);
    let allowed = bg.admit(cfg, mine, tokens, now, &mut cells(setup, w, host))?;
    let soft = allowed.soft.map(|b| {
        let feasible_before = w.lookup.mask.iter().any(|m| *m != 0);
        for (a, m) in w.lookup.mask.iter_mut().zip(bg.soft_mask(b)) {
            *a &= m;
        }
        req.max_usd = allowed.max_usd_per_token * f64::from(tokens);
        Soft {
            bg,
            b,
            feasible_before,
            substitution_only: allowed.substitution_only,
        }
    });
    Ok(Some(Admitted {
        bg,
        tenant,
        mine,
        tokens,
        soft,
    }))
}

/// A soft budget left nothing that could serve a request its policy
/// allows: the budget's 429, not a fleet outage's 503.
pub fn refuse_soft<H: Host>(
    setup: &Setup,
    w: &mut Worker,
    host: &mut H,
    admitted: &Admitted<'_>,
    climbed: Result<(Climbed, Option<Box<Pending>>), Stop>,
    now: u64,
) -> Result<(Climbed, Option<Box<Pending>>), Stop> {
    match (&climbed, admitted.soft) {
        (Err(Stop::NoDestination(_)), Some(s)) if s.feasible_before => {
            let cfg = &setup.config;
            match s.bg.soft_refusal(cfg, s.b, now, &mut cells(setup, w, host)) {
                Some(r) => Err(Stop::Budget(r)),
                None => climbed,
            }
        }
        _ => climbed,
    }
}

/// Reserve the request's estimate, `marginal_usd`, against the tenant's
/// budgets: counted from now, settled when it ends.
pub fn reserve<H: Host>(
    setup: &Setup,
    w: &mut Worker,
    host: &mut H,
    a: Admitted<'_>,
    marginal_usd: f64,
    now: u64,
) -> Hold {
    let hold = Hold {
        tenant: a.tenant,
        nano: nano_usd(marginal_usd),
        tokens: a.tokens,
        minute: Budgeting::minute(now),
        soft: a.soft.map(|s| s.b),
    };
    let tokens = i64::from(hold.tokens);
    let cells = &mut cells(setup, w, host);
    a.bg.book(a.mine, hold.nano, tokens, hold.minute, now, cells);
    hold
}

/// Count what a request booked (`marginal_usd`, `tokens`) against its
/// tenant's budgets in place of what `h` reserved.
pub fn release<H: Host>(
    setup: &Setup,
    w: &mut Worker,
    host: &mut H,
    h: Hold,
    marginal_usd: f64,
    tokens: i64,
) {
    let Some(bg) = setup.budgets.as_ref() else {
        return;
    };
    let mine = bg.of(h.tenant);
    let now = host.now_ms();
    let (nano, tokens) = (
        nano_usd(marginal_usd) - h.nano,
        tokens - i64::from(h.tokens),
    );
    bg.book(
        mine,
        nano,
        tokens,
        h.minute,
        now,
        &mut cells(setup, w, host),
    );
}

/// The budgets' counters in the shared store.
fn cells<'a, H: Host>(setup: &'a Setup, w: &'a mut Worker, host: &'a mut H) -> Cells<'a, H> {
    store::Cells {
        host,
        scratch: &mut w.store,
        names: setup.budgets.as_ref().map_or(&[], |b| b.names.as_slice()),
    }
}

/// `usd` as whole nano-USD (what a budget's cell counts); 0 when not a
/// finite amount.
fn nano_usd(usd: f64) -> i64 {
    if usd.is_finite() {
        (usd * 1e9).round() as i64
    } else {
        0
    }
}

/// The response header that tells a tenant its budget is soft.
pub const BUDGET_HEADER: &str = "x-ace-budget";
