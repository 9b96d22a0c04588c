//! Tenant budgets in the request path: where a tenant's budgets stand,
//! what a soft one still allows, and the 429 an exhausted one (or a
//! minute's tokens) gets.
//!
//! Three figures make a budget's spend here: the control service's last
//! reading of the books ([`Reading`], per budget, from the snapshot), and
//! what this proxy booked since it ([`Cell`], in memory every worker of
//! the proxy shares: Envoy's shared data for the Wasm filter, the
//! module's own for the dynamic module). A reading replaces the one held
//! only when it was read later; then the spend counted since the old one
//! moves to a second counter that still counts, because the books lag the
//! proxy (the access log, the ingest): a cost is counted twice for at most
//! one reading rather than not at all. A stale snapshot keeps its
//! readings, so losing the control service or the store never lifts a
//! limit; each proxy keeps counting on top.
//!
//! What that leaves past a limit: each proxy stops its own tenants once
//! the reading plus its own spend reaches the amount, so the overshoot is
//! what the other proxies book between readings (one interval, plus the
//! ingest's lag), plus requests admitted in the same instant by two
//! workers of one proxy (the check and the reservation are separate
//! updates). A request reserves its estimated cost and tokens when it is
//! routed and settles them to what it booked when it ends, so requests in
//! flight count from their start.
//!
//! A budget only narrows: soft removes rungs (a tier mask, a ceiling on
//! the booked cost, substitutes only), exhausted and the token limit
//! refuse; nothing here touches the policy tables' feasible set except
//! to clear bits of it.

use crate::event;
use crate::request::Refused;
use ace_config::budget::{Budget, Period, State};
use ace_config::Config;
use ace_core::tables::Tables;
use std::sync::Arc;

/// Bytes of one budget's [`Cell`] in shared memory.
pub const CELL_BYTES: usize = 32;

/// The control service's reading of one budget, as this proxy holds it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Reading {
    /// Where the service put the budget.
    pub state: State,
    /// Spend since the period began, USD, as the books held it.
    pub spent_usd: f64,
    /// When the books were read, Unix ms (0: no reading yet).
    pub read_ms: u64,
    /// When the period resets, Unix ms (0: a rolling window, or unknown).
    pub resets_ms: u64,
}

impl Reading {
    /// `self`, or `newer` when it was read later: a reading is replaced
    /// only by a later one, so an old snapshot replayed never undoes it.
    pub fn or_newer(self, newer: Option<Reading>) -> Reading {
        match newer {
            Some(n) if n.read_ms > self.read_ms => n,
            _ => self,
        }
    }
}

/// What this proxy booked against one budget since its reading, shared
/// by its workers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cell {
    /// The reading `since_nano` counts from (its `read_ms`).
    pub reading_ms: u64,
    /// Booked since that reading, nano-USD (reservations included).
    pub since_nano: i64,
    /// Booked between the reading before it and that one: the books may
    /// not hold it yet.
    pub before_nano: i64,
    /// The minute `tokens` counts (minutes since the epoch).
    pub minute: u32,
    /// Tokens used in that minute (reservations included).
    pub tokens: u32,
}

impl Cell {
    /// The cell from its bytes (zeroes: nothing counted yet).
    pub fn decode(b: &[u8; CELL_BYTES]) -> Cell {
        let u64_at = |i: usize| {
            let a = b.get(i..i + 8).and_then(|s| <[u8; 8]>::try_from(s).ok());
            u64::from_le_bytes(a.unwrap_or_default())
        };
        let u32_at = |i: usize| {
            let a = b.get(i..i + 4).and_then(|s| <[u8; 4]>::try_from(s).ok());
            u32::from_le_bytes(a.unwrap_or_default())
        };
        Cell {
            reading_ms: u64_at(0),
            since_nano: u64_at(8) as i64,
            before_nano: u64_at(16) as i64,
            minute: u32_at(24),
            tokens: u32_at(28),
        }
    }

    /// Its bytes.
    pub fn encode(&self) -> [u8; CELL_BYTES] {
        let mut b = [0u8; CELL_BYTES];
        b[0..8].copy_from_slice(&self.reading_ms.to_le_bytes());
        b[8..16].copy_from_slice(&self.since_nano.to_le_bytes());
        b[16..24].copy_from_slice(&self.before_nano.to_le_bytes());
        b[24..28].copy_from_slice(&self.minute.to_le_bytes());
        b[28..32].copy_from_slice(&self.tokens.to_le_bytes());
        b
    }

    /// Brought up to `reading` and the minute of `now_ms`; `period_start`
    /// is when the reading's period began (0: a rolling window).
    fn roll(&mut self, reading: &Reading, period_start: u64, now_ms: u64) {
        if reading.read_ms > self.reading_ms {
            self.before_nano = if self.reading_ms != 0 && self.reading_ms < period_start {
                // The reading is of a new period: what was booked before
                // it belongs to the last one.
                0
            } else if self.reading_ms == 0 {
                // Counted before any reading: the books may lack all of it.
                self.before_nano.saturating_add(self.since_nano)
            } else {
                self.since_nano
            };
            self.since_nano = 0;
            self.reading_ms = reading.read_ms;
        }
        let minute = minute_of(now_ms);
        if self.minute != minute {
            self.minute = minute;
            self.tokens = 0;
        }
    }

    /// Spend this proxy counts on top of the reading, USD.
    fn own_usd(&self) -> f64 {
        self.since_nano.saturating_add(self.before_nano).max(0) as f64 / 1e9
    }
}

fn minute_of(now_ms: u64) -> u32 {
    u32::try_from(now_ms / 60_000).unwrap_or(u32::MAX)
}

/// Shared memory holding one [`Cell`] per budget, updated atomically with
/// respect to the proxy's other workers.
pub trait Cells {
    /// Run `f` on budget `slot`'s bytes (zeroes when never written) and
    /// store them when it returns `true`; `false` when the memory cannot
    /// be reached.
    fn update(&mut self, slot: u32, f: &mut dyn FnMut(&mut [u8; CELL_BYTES]) -> bool) -> bool;

    /// The control service's latest reading of budget `b`.
    fn reading(&mut self, b: u16) -> Reading;
}

/// The budgets of one configuration, built against its tables.
#[derive(Debug, Clone)]
pub struct Budgeting {
    /// Per value index of the tables' `tenant` attribute, its budgets.
    by_value: Vec<Vec<u16>>,
    /// Per budget, the destinations a soft budget allows (its tiers).
    soft_mask: Vec<Vec<u64>>,
    /// Per budget, its name (shared with the events).
    pub names: Vec<Arc<str>>,
}

/// What a tenant's budgets allow a request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Allowed {
    /// The first soft budget, if any is soft: it names the narrowing.
    pub soft: Option<u16>,
    /// The most the request's booked cost may be per token, USD.
    pub max_usd_per_token: f64,
    /// Only a substitute model may serve it.
    pub substitution_only: bool,
}

/// Why a budget refuses a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// Its spend reached its amount.
    Exhausted,
    /// The minute's tokens would pass its limit.
    Tokens,
    /// It is soft, and none of the rungs it allows can serve.
    Soft,
}

impl Why {
    /// The event's `budget_state`.
    pub fn state(self) -> &'static str {
        match self {
            Why::Exhausted => "exhausted",
            Why::Tokens => "tokens_per_minute",
            Why::Soft => "soft",
        }
    }
}

/// A budget's refusal: which, why, and what the client is told.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// The budget's index.
    pub budget: u16,
    /// Why.
    pub why: Why,
    /// Seconds until trying again may succeed (`retry-after`).
    pub retry_after_s: u64,
    /// The 429's JSON body.
    pub body: Vec<u8>,
}

impl Budgeting {
    /// The budgets of `cfg` against its `tables` (none configured: `None`).
    pub fn build(cfg: &Config, tables: Option<&Tables<'_>>) -> Option<Budgeting> {
        let list = &cfg.budgets.list;
        if list.is_empty() {
            return None;
        }
        // `Config::parse` refused budgets without a tenant to count; a
        // configuration parsed only to price its events has none to act on.
        let tenant = cfg.policy.as_ref().and_then(|p| p.tenant);
        let (Some(tables), Some(t)) = (tables, tenant) else {
            return None;
        };
        let t = t as u32;
        let mut by_value = vec![Vec::new(); tables.value_count(t) as usize + 1];
        for (i, b) in list.iter().enumerate() {
            for name in &b.tenants {
                let v = tables.value_index(t, name) as usize;
                if let Some(slot) = by_value.get_mut(v).filter(|_| v != 0) {
                    slot.push(i as u16);
                }
            }
        }
        let words = cfg.destinations.len().div_ceil(64);
        let soft_mask = list
            .iter()
            .map(|b| {
                let mut m = vec![0u64; words];
                for (d, model) in cfg.models.iter().enumerate() {
                    let allowed = b
                        .soft
                        .tiers
                        .as_ref()
                        .is_none_or(|t| t.contains(&model.tier));
                    if let Some(w) = m.get_mut(d / 64).filter(|_| allowed) {
                        *w |= 1 << (d % 64);
                    }
                }
                m
            })
            .collect();
        Some(Budgeting {
            by_value,
            soft_mask,
            names: list.iter().map(|b| Arc::from(b.name.as_str())).collect(),
        })
    }

    /// The budgets of the tenant with value index `value`.
    pub fn of(&self, value: u32) -> &[u16] {
        self.by_value
            .get(value as usize)
            .map_or(&[], |v| v.as_slice())
    }

    /// The destinations soft budget `b` allows.
    pub fn soft_mask(&self, b: u16) -> &[u64] {
        self.soft_mask
            .get(usize::from(b))
            .map_or(&[], |m| m.as_slice())
    }

    /// Where `budgets` (a tenant's) stand for a request of `tokens`
    /// (estimated, in and out) at `now_ms`: allowed (perhaps only on a
    /// soft budget's rungs) or refused. Reads and rolls the cells; counts
    /// nothing ([`Budgeting::book`] does, once the request is routed).
    /// A cell that cannot be reached counts as nothing booked here: the
    /// reading alone still holds.
    pub fn admit(
        &self,
        cfg: &Config,
        budgets: &[u16],
        tokens: u32,
        now_ms: u64,
        cells: &mut impl Cells,
    ) -> Result<Allowed, Refusal> {
        let mut allowed = Allowed {
            soft: None,
            max_usd_per_token: f64::INFINITY,
            substitution_only: false,
        };
        for &b in budgets {
            let Some(budget) = cfg.budgets.list.get(usize::from(b)) else {
                continue;
            };
            let r = cells.reading(b);
            let period_start = match budget.period {
                Period::Rolling { .. } => 0,
                p => p.window(r.read_ms).0,
            };
            let mut cell = Cell::default();
            cells.update(u32::from(b), &mut |bytes| {
                cell = Cell::decode(bytes);
                let before = cell;
                cell.roll(&r, period_start, now_ms);
                *bytes = cell.encode();
                cell != before
            });
            let spent = r.spent_usd + cell.own_usd();
            let state = r.state.max(budget.state(spent));
            if state == State::Exhausted {
                return Err(self.refusal(budget, b, Why::Exhausted, &r, spent, tokens, now_ms));
            }
            if let Some(limit) = budget.tokens_per_minute {
                if u64::from(cell.tokens).saturating_add(u64::from(tokens)) > limit {
                    return Err(self.refusal(budget, b, Why::Tokens, &r, spent, tokens, now_ms));
                }
            }
            if state == State::Soft {
                allowed.soft.get_or_insert(b);
                allowed.max_usd_per_token =
                    allowed.max_usd_per_token.min(budget.soft.max_usd_per_token);
                allowed.substitution_only |= budget.soft.substitution_only;
            }
        }
        Ok(allowed)
    }

    /// Count `nano` (booked cost, nano-USD, perhaps a correction below
    /// zero) and `tokens` against each of `budgets` at `now_ms`; tokens
    /// count only in `minute` (a correction for a minute gone is dropped).
    pub fn book(
        &self,
        budgets: &[u16],
        nano: i64,
        tokens: i64,
        minute: u32,
        cells: &mut impl Cells,
    ) {
        for &b in budgets {
            cells.update(u32::from(b), &mut |bytes| {
                let mut cell = Cell::decode(bytes);
                cell.since_nano = cell.since_nano.saturating_add(nano);
                if cell.minute == minute {
                    let t = i64::from(cell.tokens).saturating_add(tokens);
                    cell.tokens = u32::try_from(t.max(0)).unwrap_or(u32::MAX);
                }
                *bytes = cell.encode();
                true
            });
        }
    }

    /// The minute `now_ms` falls in, as cells count it.
    pub fn minute(now_ms: u64) -> u32 {
        minute_of(now_ms)
    }

    /// A soft budget's refusal: none of its rungs can serve now.
    pub fn soft_refusal(
        &self,
        cfg: &Config,
        b: u16,
        reading: &Reading,
        now_ms: u64,
    ) -> Option<Refusal> {
        let budget = cfg.budgets.list.get(usize::from(b))?;
        Some(self.refusal(budget, b, Why::Soft, reading, reading.spent_usd, 0, now_ms))
    }

    #[allow(clippy::too_many_arguments)]
    fn refusal(
        &self,
        budget: &Budget,
        b: u16,
        why: Why,
        r: &Reading,
        spent: f64,
        tokens: u32,
        now_ms: u64,
    ) -> Refusal {
        let resets_ms = match (r.resets_ms, budget.period) {
            (_, Period::Rolling { .. }) => 0,
            (0, p) => p.window(now_ms).1,
            (t, _) => t,
        };
        let until_s = |t: u64| t.saturating_sub(now_ms).div_ceil(1000).max(1);
        let (retry_after_s, resets) = match why {
            Why::Tokens => (until_s((u64::from(minute_of(now_ms)) + 1) * 60_000), None),
            _ if resets_ms == 0 => (60, None),
            _ => (until_s(resets_ms), Some(resets_ms)),
        };
        let name = &budget.name;
        let period = match budget.period {
            Period::Rolling { ms } => format!("the last {} s", ms / 1000),
            p => format!("a {}", p.as_str()),
        };
        let amount = budget
            .usd
            .map_or(String::new(), |u| format!("USD {u:.2} per {period}"));
        let when = match resets {
            Some(t) => format!("it resets at {}", ace_config::budget::rfc3339(t)),
            None => format!("spend ages out of {period}; retry in {retry_after_s} s"),
        };
        let message = match why {
            Why::Exhausted => format!(
                "the budget `{name}` ({amount}) is exhausted: USD {spent:.2} booked; {when}"
            ),
            Why::Tokens => format!(
                "the budget `{name}` allows {} tokens a minute on this proxy, and this request's \
                 estimated {tokens} would pass it; retry in {retry_after_s} s",
                budget.tokens_per_minute.unwrap_or(0)
            ),
            Why::Soft => format!(
                "the budget `{name}` ({amount}) is past its soft threshold (USD {spent:.2} \
                 booked): only {} may serve this tenant, and none can now; {when}",
                soft_rungs(budget)
            ),
        };
        let (kind, code) = match why {
            Why::Tokens => ("tokens", "rate_limit_exceeded"),
            _ => ("budget_exceeded", "budget_exceeded"),
        };
        let mut body = Vec::with_capacity(256 + message.len());
        body.extend_from_slice(b"{\"error\":{\"message\":");
        event::string(&mut body, message.as_bytes());
        body.extend_from_slice(b",\"type\":");
        event::string(&mut body, kind.as_bytes());
        body.extend_from_slice(b",\"param\":null,\"code\":");
        event::string(&mut body, code.as_bytes());
        body.extend_from_slice(b",\"reason\":");
        event::string(&mut body, reason(why).as_bytes());
        body.extend_from_slice(b",\"budget\":");
        event::string(&mut body, name.as_bytes());
        body.extend_from_slice(b",\"period\":");
        event::string(&mut body, budget.period.as_str().as_bytes());
        body.extend_from_slice(b",\"resets_at\":");
        match resets {
            Some(t) => event::string(&mut body, ace_config::budget::rfc3339(t).as_bytes()),
            None => body.extend_from_slice(b"null"),
        }
        body.extend_from_slice(b"}}");
        Refusal {
            budget: b,
            why,
            retry_after_s,
            body,
        }
    }
}

/// The event's and the error's `reason` for a budget's refusal.
pub fn reason(why: Why) -> &'static str {
    match why {
        Why::Exhausted => "budget_exhausted",
        Why::Tokens => "budget_tokens_per_minute",
        Why::Soft => "budget_soft",
    }
}

/// What a soft budget allows, in words.
fn soft_rungs(b: &Budget) -> String {
    let mut parts = Vec::new();
    if let Some(t) = &b.soft.tiers {
        let names: Vec<&str> = t.iter().map(|t| t.as_str()).collect();
        parts.push(format!("destinations on {}", names.join(", ")));
    }
    if b.soft.max_usd_per_token.is_finite() {
        parts.push(format!(
            "rungs at most USD {:.4} per million tokens",
            b.soft.max_usd_per_token * 1e6
        ));
    }
    if b.soft.substitution_only {
        parts.push("a substitute model".to_string());
    }
    parts.join(" and ")
}

/// A refusal as the flow answers it.
pub fn refused(r: &Refusal) -> Refused {
    Refused {
        status: 429,
        kind: "budget_exceeded",
        reason: reason(r.why),
        message: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Mem(Vec<[u8; CELL_BYTES]>);

    impl Cells for Mem {
        fn update(&mut self, slot: u32, f: &mut dyn FnMut(&mut [u8; CELL_BYTES]) -> bool) -> bool {
            let i = slot as usize;
            if self.0.len() <= i {
                self.0.resize(i + 1, [0; CELL_BYTES]);
            }
            let mut b = self.0[i];
            if f(&mut b) {
                self.0[i] = b;
            }
            true
        }

        fn reading(&mut self, _b: u16) -> Reading {
            Reading::default()
        }
    }

    #[test]
    fn a_cell_round_trips_and_rolls_to_a_later_reading() {
        let mut c = Cell {
            reading_ms: 5,
            since_nano: 700,
            before_nano: 100,
            minute: 3,
            tokens: 9,
        };
        assert_eq!(Cell::decode(&c.encode()), c);
        let r = Reading {
            read_ms: 6,
            ..Reading::default()
        };
        c.roll(&r, 0, 3 * 60_000 + 5);
        assert_eq!(
            (c.reading_ms, c.since_nano, c.before_nano, c.tokens),
            (6, 0, 700, 9)
        );
        c.roll(&r, 0, 4 * 60_000);
        assert_eq!((c.minute, c.tokens), (4, 0));
        // An older reading changes nothing.
        c.since_nano = 50;
        c.roll(&Reading { read_ms: 2, ..r }, 0, 4 * 60_000);
        assert_eq!((c.reading_ms, c.since_nano), (6, 50));
        // A reading of a new period forgets the last one's spend.
        c.roll(&Reading { read_ms: 100, ..r }, 50, 4 * 60_000);
        assert_eq!((c.reading_ms, c.since_nano, c.before_nano), (100, 0, 0));
        let old = Reading { read_ms: 9, ..r };
        assert_eq!(old.or_newer(Some(r)), old);
        assert_eq!(r.or_newer(Some(old)), old);
    }

    #[test]
    fn cells_count_what_the_books_may_lack() {
        let mut mem = Mem::default();
        let mut c = Cell::default();
        let mut f = |b: &mut [u8; CELL_BYTES]| {
            c = Cell::decode(b);
            c.since_nano += 1_000_000_000;
            *b = c.encode();
            true
        };
        mem.update(0, &mut f);
        let mut cell = Cell::decode(&mem.0[0]);
        // Before any reading: kept past the first one.
        cell.roll(
            &Reading {
                read_ms: 10,
                ..Reading::default()
            },
            0,
            0,
        );
        assert_eq!(cell.own_usd(), 1.0);
        cell.since_nano = 2_000_000_000;
        cell.roll(
            &Reading {
                read_ms: 20,
                ..Reading::default()
            },
            0,
            0,
        );
        assert_eq!(cell.own_usd(), 2.0);
    }
}
