//! Tenant budgets in the request path: where a tenant's budgets stand,
//! what a soft one still allows, and the 429 an exhausted one (or a
//! minute's tokens) gets.
//!
//! Two figures make a budget's spend here: the control service's last
//! reading of the books ([`Reading`], per budget, from the snapshot), and
//! what this proxy booked that the books may not hold yet ([`Cell`]: its
//! spend in time buckets, in memory every worker of the proxy shares:
//! Envoy's shared data for the Wasm filter, the module's own for the
//! dynamic module). The books trail the proxy (the access log's flush,
//! the ingest, the service's read) by up to `budget_books_lag_ms`, so the
//! proxy adds what it booked after the reading's time less that lag: a
//! cost is counted twice for a while rather than not at all. A reading
//! replaces the one held only when it was read later, and nothing booked
//! leaves the count until a reading covers it, so losing the control
//! service or the store never lifts a limit.
//!
//! What that leaves past a limit: each proxy stops its own tenants once
//! the reading plus its own spend reaches the amount, so the overshoot is
//! what the other proxies book before a reading carries it (at most the
//! amount once per other proxy), plus requests admitted in the same
//! instant by two workers of one proxy (the check and the reservation are
//! separate updates). A request reserves its estimated cost and tokens when it is
//! routed and settles them to what it booked when it ends, so requests in
//! flight count from their start.
//!
//! A budget only narrows: soft removes rungs (a tier mask, a ceiling on
//! the booked cost, substitutes only), exhausted and the token limit
//! refuse; nothing here touches the policy tables' feasible set except
//! to clear bits of it.

use crate::event;
use ace_config::budget::{Budget, Period, State};
use ace_config::Config;
use ace_core::tables::Tables;
use std::sync::Arc;

/// Buckets of a [`Cell`]: its own spend over the last few spans of the
/// books' lag.
pub const BUCKETS: usize = 8;

/// Bytes of one budget's [`Cell`] in shared memory.
pub const CELL_BYTES: usize = 24 + BUCKETS * 12;

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

/// What this proxy booked against one budget, by when, shared by its
/// workers: the spend of the last [`BUCKETS`] spans of time in buckets,
/// and what left them in one sum with the end of its newest span. A
/// reading holds the books as of its `read_ms`, and the books trail the
/// proxy by their lag; so the spend this proxy adds to a reading is every
/// bucket that ends after `read_ms` less the lag.
/// Nothing is forgotten until a reading covers it: without a newer
/// reading, everything booked since the last one's cut stays counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cell {
    /// The minute `tokens` counts (minutes since the epoch).
    pub minute: u32,
    /// Tokens used in that minute (reservations included).
    pub tokens: u32,
    /// Spend that left the buckets, nano-USD.
    pub older_nano: i64,
    /// The span after the newest that left (0: none).
    pub older_end: u32,
    /// Per bucket: its span (ms since the epoch over the span's width)
    /// and the spend booked in it, nano-USD (reservations and their
    /// corrections).
    pub buckets: [(u32, i64); BUCKETS],
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
        let mut buckets = [(0, 0); BUCKETS];
        for (k, slot) in buckets.iter_mut().enumerate() {
            let at = 24 + k * 12;
            *slot = (u32_at(at), u64_at(at + 4) as i64);
        }
        Cell {
            minute: u32_at(0),
            tokens: u32_at(4),
            older_nano: u64_at(8) as i64,
            older_end: u32_at(16),
            buckets,
        }
    }

    /// Its bytes.
    pub fn encode(&self) -> [u8; CELL_BYTES] {
        let mut b = [0u8; CELL_BYTES];
        let mut put = |at: usize, bytes: &[u8]| {
            if let Some(d) = b.get_mut(at..at + bytes.len()) {
                d.copy_from_slice(bytes);
            }
        };
        put(0, &self.minute.to_le_bytes());
        put(4, &self.tokens.to_le_bytes());
        put(8, &self.older_nano.to_le_bytes());
        put(16, &self.older_end.to_le_bytes());
        for (k, (span, nano)) in self.buckets.iter().enumerate() {
            put(24 + k * 12, &span.to_le_bytes());
            put(24 + k * 12 + 4, &nano.to_le_bytes());
        }
        b
    }

    /// Brought to the minute of `now_ms`.
    fn roll(&mut self, now_ms: u64) {
        let minute = minute_of(now_ms);
        if self.minute != minute {
            self.minute = minute;
            self.tokens = 0;
        }
    }

    /// Count `nano` in the span of `now_ms` (`width_ms` long); the oldest
    /// bucket makes room, its spend kept in the sum.
    fn add(&mut self, nano: i64, now_ms: u64, width_ms: u64) {
        let span = u32::try_from(now_ms / width_ms.max(1)).unwrap_or(u32::MAX);
        let at = match self.buckets.iter().position(|(s, _)| *s == span) {
            Some(i) => i,
            None => {
                let (i, _) = self
                    .buckets
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, (s, _))| *s)
                    .unwrap_or((0, &(0, 0)));
                if let Some((s, n)) = self.buckets.get(i).copied() {
                    if n != 0 || s != 0 {
                        self.older_nano = self.older_nano.saturating_add(n);
                        self.older_end = self.older_end.max(s.saturating_add(1));
                    }
                }
                i
            }
        };
        if let Some(b) = self.buckets.get_mut(at) {
            if b.0 != span {
                *b = (span, 0);
            }
            b.1 = b.1.saturating_add(nano);
        }
    }

    /// What this proxy booked that the books may lack, USD: every span
    /// ending after `cut_ms` (a reading's time less the books' lag, or
    /// the period's start when later).
    fn own_usd(&self, cut_ms: u64, width_ms: u64) -> f64 {
        let ends_after = |span: u32| u64::from(span).saturating_add(1) * width_ms > cut_ms;
        let mut nano = self
            .buckets
            .iter()
            .filter(|(s, n)| *n != 0 && ends_after(*s))
            .fold(0i64, |a, (_, n)| a.saturating_add(*n));
        if self.older_end != 0 && u64::from(self.older_end) * width_ms > cut_ms {
            nano = nano.saturating_add(self.older_nano);
        }
        nano.max(0) as f64 / 1e9
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
    /// How far the books trail this proxy, ms (`budget_books_lag_ms`).
    lag_ms: u64,
    /// The width of a cell's buckets, ms: eight of them span twice the
    /// lag (at least a second each).
    width_ms: u64,
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
        let lag_ms = cfg.budgets.lag_ms;
        Some(Budgeting {
            by_value,
            soft_mask,
            names: list.iter().map(|b| Arc::from(b.name.as_str())).collect(),
            lag_ms,
            width_ms: (lag_ms * 2).div_ceil(BUCKETS as u64).max(1_000),
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
            let (spend, cell) = self.spend(budget, b, now_ms, true, cells);
            let state = spend.reading.state.max(budget.state(spend.total()));
            if state == State::Exhausted {
                return Err(self.refusal(budget, b, Why::Exhausted, &spend, tokens, now_ms));
            }
            if let Some(limit) = budget.tokens_per_minute {
                if u64::from(cell.tokens).saturating_add(u64::from(tokens)) > limit {
                    return Err(self.refusal(budget, b, Why::Tokens, &spend, tokens, now_ms));
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

    /// Where budget `b` (`budget`) stands at `now_ms`: the control
    /// service's reading and what this proxy booked that it may lack
    /// (counted on top of it: nothing from before the period, a day's, a
    /// week's, a month's start, a rolling window's, now), with its cell,
    /// brought to the minute of `now_ms` when `roll` (else only read).
    fn spend(
        &self,
        budget: &Budget,
        b: u16,
        now_ms: u64,
        roll: bool,
        cells: &mut impl Cells,
    ) -> (Spend, Cell) {
        let reading = cells.reading(b);
        let start = budget.period.window(now_ms).0;
        let cut = reading.read_ms.saturating_sub(self.lag_ms).max(start);
        let mut cell = Cell::default();
        cells.update(u32::from(b), &mut |bytes| {
            cell = Cell::decode(bytes);
            let before = cell;
            if roll {
                cell.roll(now_ms);
            }
            *bytes = cell.encode();
            cell != before
        });
        let own_usd = cell.own_usd(cut, self.width_ms);
        (Spend { reading, own_usd }, cell)
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
        now_ms: u64,
        cells: &mut impl Cells,
    ) {
        for &b in budgets {
            cells.update(u32::from(b), &mut |bytes| {
                let mut cell = Cell::decode(bytes);
                cell.add(nano, now_ms, self.width_ms);
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

    /// A soft budget's refusal: none of its rungs can serve now. Its
    /// spend as [`Budgeting::admit`] counted it: the reading and this
    /// proxy's own since (read, not changed).
    pub fn soft_refusal(
        &self,
        cfg: &Config,
        b: u16,
        now_ms: u64,
        cells: &mut impl Cells,
    ) -> Option<Refusal> {
        let budget = cfg.budgets.list.get(usize::from(b))?;
        let (spend, _) = self.spend(budget, b, now_ms, false, cells);
        Some(self.refusal(budget, b, Why::Soft, &spend, 0, now_ms))
    }

    fn refusal(
        &self,
        budget: &Budget,
        b: u16,
        why: Why,
        spend: &Spend,
        tokens: u32,
        now_ms: u64,
    ) -> Refusal {
        let r = &spend.reading;
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
        let spent = spend.words();
        let message = match why {
            Why::Exhausted => {
                format!("the budget `{name}` ({amount}) is exhausted: {spent}; {when}")
            }
            Why::Tokens => format!(
                "the budget `{name}` allows {} tokens a minute on this proxy, and this request's \
                 estimated {tokens} would pass it; retry in {retry_after_s} s",
                budget.tokens_per_minute.unwrap_or(0)
            ),
            Why::Soft => format!(
                "the budget `{name}` ({amount}) is past its soft threshold ({spent}): only {} \
                 may serve this tenant, and none can now; {when}",
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

/// A budget's spend as this proxy counts it: the control service's last
/// reading of the books, and what this proxy booked that the books may
/// not hold yet.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Spend {
    /// The reading (`read_ms` 0: none yet).
    reading: Reading,
    /// This proxy's own spend since the reading's cut, USD.
    own_usd: f64,
}

impl Spend {
    /// The two together, what the limits are held to.
    fn total(&self) -> f64 {
        self.reading.spent_usd + self.own_usd
    }

    /// Both figures in words, for a refusal: a client told only the books'
    /// figure ("USD 0.00 booked" after spending USD 0.90 here) cannot see
    /// why it was refused.
    fn words(&self) -> String {
        let own = self.own_usd;
        match self.reading.read_ms {
            0 => format!("no reading of the books yet, USD {own:.2} booked by this proxy"),
            t => format!(
                "USD {:.2} booked as of {}, USD {own:.2} by this proxy since",
                self.reading.spent_usd,
                ace_config::budget::rfc3339(t)
            ),
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

/// [`Cells::update`] on a cell a host keeps in its own memory (behind its
/// own lock): `f` on a copy, stored when it says so.
pub fn update_in(cell: &mut [u8; CELL_BYTES], f: &mut dyn FnMut(&mut [u8; CELL_BYTES]) -> bool) {
    let mut c = *cell;
    if f(&mut c) {
        *cell = c;
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
    fn a_cell_round_trips_and_keeps_what_the_books_may_lack() {
        let w = 1_000;
        let mut c = Cell::default();
        c.add(5, 10_500, w);
        c.add(7, 10_900, w);
        c.add(11, 12_000, w);
        assert_eq!(Cell::decode(&c.encode()), c);
        // A reading whose cut is at 11 s: the 10 s span is in the books.
        assert_eq!(c.own_usd(11_000, w), 11e-9);
        assert_eq!(c.own_usd(10_999, w), 23e-9);
        // Spans past the ring's eight fall into the sum, still counted
        // until a reading's cut passes them.
        for k in 0..8u64 {
            c.add(1, 20_000 + k * 1_000, w);
        }
        assert_eq!(c.own_usd(0, w), 31e-9);
        assert_eq!(c.own_usd(13_000, w), 8e-9);
        assert_eq!(c.own_usd(30_000, w), 0.0);
        c.roll(5 * 60_000);
        c.tokens = 9;
        c.roll(5 * 60_000 + 1);
        assert_eq!((c.minute, c.tokens), (5, 9));
        c.roll(6 * 60_000);
        assert_eq!(c.tokens, 0);
    }

    #[test]
    fn readings_are_replaced_only_by_later_ones() {
        let r = Reading {
            read_ms: 6,
            ..Reading::default()
        };
        let old = Reading { read_ms: 9, ..r };
        assert_eq!(old.or_newer(Some(r)), old);
        assert_eq!(r.or_newer(Some(old)), old);
        assert_eq!(r.or_newer(None), r);
    }

    /// One budget's cells in memory, and the books' reading of it.
    struct One(Mem, Reading);

    impl Cells for One {
        fn update(&mut self, slot: u32, f: &mut dyn FnMut(&mut [u8; CELL_BYTES]) -> bool) -> bool {
            self.0.update(slot, f)
        }
        fn reading(&mut self, _b: u16) -> Reading {
            self.1
        }
    }

    /// Budget `b`, its soft mask the first destination, the books 2 s
    /// behind.
    fn one_budget() -> Budgeting {
        Budgeting {
            by_value: vec![],
            soft_mask: vec![vec![1]],
            names: vec![Arc::from("b")],
            lag_ms: 2_000,
            width_ms: 1_000,
        }
    }

    #[test]
    fn a_budget_counts_its_own_spend_until_a_reading_covers_it() {
        let cfg = ace_config::Config::parse_for_pricing(
            br#"{"allow_no_policy":true,"destinations":[{"name":"a","cluster":"a"}],
                "budgets":[{"name":"b","tenants":["t"],"usd":1.0,"soft_at":1.0}],
                "budget_books_lag_ms":2000}"#,
        )
        .unwrap();
        assert_eq!(cfg.budgets.lag_ms, 2_000);
        let bg = one_budget();
        let day = 86_400_000;
        let t = 20_000 * day + 3_600_000;
        let mut cells = One(Mem::default(), Reading::default());
        bg.book(&[0], 900_000_000, 0, 0, t, &mut cells);
        assert!(bg.admit(&cfg, &[0], 0, t + 10, &mut cells).is_ok());
        bg.book(&[0], 200_000_000, 0, 0, t + 10, &mut cells);
        // USD 1.1 booked here, none in the books yet: exhausted.
        let e = bg.admit(&cfg, &[0], 0, t + 20, &mut cells).unwrap_err();
        assert_eq!(e.why, Why::Exhausted);
        // A reading from before the spend reached the books: still.
        cells.1 = Reading {
            read_ms: t + 1_000,
            ..Reading::default()
        };
        assert!(bg.admit(&cfg, &[0], 0, t + 1_500, &mut cells).is_err());
        // The books hold it: counted once, still exhausted.
        cells.1 = Reading {
            read_ms: t + 5_000,
            spent_usd: 1.1,
            state: State::Exhausted,
            ..Reading::default()
        };
        assert!(bg.admit(&cfg, &[0], 0, t + 5_500, &mut cells).is_err());
        // The next day's reading: lifted.
        cells.1 = Reading {
            read_ms: t + day,
            ..Reading::default()
        };
        assert!(bg.admit(&cfg, &[0], 0, t + day + 1, &mut cells).is_ok());
        // No reading at all, in the same day: what was booked stays.
        let mut cells = One(Mem::default(), Reading::default());
        bg.book(&[0], 1_100_000_000, 0, 0, t, &mut cells);
        assert!(bg.admit(&cfg, &[0], 0, t + 3_600_000, &mut cells).is_err());
    }

    /// Row (issue 50): "The soft-budget 429 states the control service's
    /// reading only ('USD 0.00 booked' after USD 0.90 booked here)." Each
    /// refusal states the books' reading and this proxy's own spend since.
    #[test]
    fn a_refusal_states_the_books_and_this_proxys_own_spend() {
        let cfg = ace_config::Config::parse_for_pricing(
            br#"{"allow_no_policy":true,"destinations":[{"name":"a","cluster":"a"}],
                "budgets":[{"name":"b","tenants":["t"],"usd":1.0,"soft_at":0.5}],
                "budget_books_lag_ms":2000}"#,
        )
        .unwrap();
        let bg = one_budget();
        // 2026-12-07T01:30:00Z.
        let t = 1_796_607_000_000;
        let message = |r: Refusal| {
            let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            v["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        };
        // No reading yet: this proxy's USD 0.90 alone.
        let mut cells = One(Mem::default(), Reading::default());
        bg.book(&[0], 900_000_000, 0, 0, t, &mut cells);
        let m = message(bg.soft_refusal(&cfg, 0, t + 10, &mut cells).unwrap());
        assert!(
            m.contains("(no reading of the books yet, USD 0.90 booked by this proxy)"),
            "{m}"
        );
        // A reading of nothing from before that spend: both figures.
        cells.1 = Reading {
            read_ms: t - 10_000,
            ..Reading::default()
        };
        assert_eq!(
            bg.admit(&cfg, &[0], 0, t + 10, &mut cells).unwrap().soft,
            Some(0)
        );
        let m = message(bg.soft_refusal(&cfg, 0, t + 10, &mut cells).unwrap());
        assert!(
            m.contains("USD 0.00 booked as of 2026-12-07T01:29:50Z, USD 0.90 by this proxy since"),
            "{m}"
        );
        bg.book(&[0], 200_000_000, 0, 0, t + 20, &mut cells);
        let e = bg.admit(&cfg, &[0], 0, t + 30, &mut cells).unwrap_err();
        assert_eq!(e.why, Why::Exhausted);
        let m = message(e);
        assert!(m.contains("is exhausted: USD 0.00 booked as of"), "{m}");
        assert!(m.contains("USD 1.10 by this proxy since"), "{m}");
        // The books have it: counted once, and said so.
        cells.1 = Reading {
            read_ms: t + 10_000,
            spent_usd: 1.1,
            state: State::Exhausted,
            ..Reading::default()
        };
        let m = message(bg.admit(&cfg, &[0], 0, t + 10_001, &mut cells).unwrap_err());
        assert!(
            m.contains("USD 1.10 booked as of 2026-12-07T01:30:10Z, USD 0.00 by this proxy since"),
            "{m}"
        );
    }
}
