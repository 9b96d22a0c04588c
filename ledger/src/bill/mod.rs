//! What the providers say they charged: their own machine-readable
//! records, read into one shape ([`BillLine`]), stored beside the events
//! and set against the books by [`reconcile`].
//!
//! | format ([`Format`]) | record | module |
//! | --- | --- | --- |
//! | `openai-costs` | OpenAI `GET /v1/organization/costs` answer | [`openai`] |
//! | `openai-usage` | OpenAI `GET /v1/organization/usage/completions` answer | [`openai`] |
//! | `anthropic-usage` | Anthropic `GET /v1/organizations/usage_report/messages` answer | [`anthropic`] |
//! | `anthropic-cost` | Anthropic `GET /v1/organizations/cost_report` answer | [`anthropic`] |
//! | `focus-csv` | a cloud's cost export in FOCUS form (Azure Cost Management, AWS CUR 2.0 FOCUS) | [`focus_csv`] |
//!
//! A bill is hostile input like a log: every row that cannot be read as
//! the format documents it is named ([`BadRow`]: file, row, field, what is
//! accepted) and kept ([`crate::store::Store::put_bill_rejects`]); the
//! rest is imported. Money is read from its decimal text into integer
//! nano-dollars exactly ([`nano`]); a currency other than USD is refused
//! (the ledger books USD).
//!
//! Import is idempotent: each line's key ([`BillLine::key`]) is a hash of
//! the format and what identifies the line in its record (its time
//! bucket or charge period and its grouping fields, not its figures) and
//! of how many lines with the same identity came before it in the file.
//! The same file (or an overlapping export) imported again adds nothing;
//! a line whose figures changed since (a provider's restatement) replaces
//! the stored one and is counted as restated.

pub mod anthropic;
pub mod focus_csv;
pub mod import;
mod json;
pub mod openai;
pub mod reconcile;

use crate::money::Nano;
use anyhow::Context;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::HashMap;

/// The formats read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Format {
    /// OpenAI's organisation Costs API answer.
    OpenaiCosts,
    /// OpenAI's organisation Usage API answer for completions.
    OpenaiUsage,
    /// Anthropic's Messages Usage Report answer.
    AnthropicUsage,
    /// Anthropic's Cost Report answer.
    AnthropicCost,
    /// A FOCUS cost and usage CSV export.
    FocusCsv,
}

impl Format {
    /// Every format, in the order `--format` lists them.
    pub const ALL: [Format; 5] = [
        Format::OpenaiCosts,
        Format::OpenaiUsage,
        Format::AnthropicUsage,
        Format::AnthropicCost,
        Format::FocusCsv,
    ];

    /// The name `--format` takes and the store keeps.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::OpenaiCosts => "openai-costs",
            Format::OpenaiUsage => "openai-usage",
            Format::AnthropicUsage => "anthropic-usage",
            Format::AnthropicCost => "anthropic-cost",
            Format::FocusCsv => "focus-csv",
        }
    }

    /// The format named `s`.
    pub fn parse(s: &str) -> anyhow::Result<Format> {
        Format::ALL
            .into_iter()
            .find(|f| f.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Format::ALL.iter().map(|f| f.as_str()).collect();
                anyhow::anyhow!("unknown bill format {s:?}; use one of {}", names.join(", "))
            })
    }
}

/// What a line of a bill charges for, where the record splits its cost by
/// kind of token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenKind {
    /// Input tokens not read from a prompt cache nor written to one.
    Input,
    /// Input tokens read from the provider's prompt cache.
    Cached,
    /// Input tokens written to the provider's prompt cache.
    CacheWrite,
    /// Output tokens.
    Output,
}

impl TokenKind {
    /// Its name in the store.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenKind::Input => "input",
            TokenKind::Cached => "cached",
            TokenKind::CacheWrite => "cache_write",
            TokenKind::Output => "output",
        }
    }

    /// The kind named `s` in the store.
    pub fn parse(s: &str) -> Option<TokenKind> {
        [
            TokenKind::Input,
            TokenKind::Cached,
            TokenKind::CacheWrite,
            TokenKind::Output,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }
}

/// One line of what a provider says it charged, in one shape whatever the
/// record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct BillLine {
    /// Natural key (see the [module docs](self)).
    pub key: String,
    /// The file it was imported from.
    pub source: String,
    /// Where in the file: the CSV line, or the result's ordinal in a JSON
    /// answer (1-based, buckets in order).
    pub line: i64,
    /// Its [`Format`] name.
    pub format: String,
    /// Who charged: `openai`, `anthropic`, `azure`, `aws`, or a FOCUS
    /// provider's name in lower case.
    pub provider: String,
    /// The UTC day charged, `YYYY-MM-DD`.
    pub day: String,
    /// The model, as the record names it (none: not split by model).
    pub model: Option<String>,
    /// The project, workspace or sub-account (none: not split by one).
    pub scope: Option<String>,
    /// The kind of token a cost line charges for, where the record says.
    pub kind: Option<TokenKind>,
    /// How many tokens of [`BillLine::kind`] the cost line charges for.
    pub quantity: Option<i64>,
    /// The provider's service tier or pricing category, where the record
    /// says (`default`, `flex`, `batch`, `priority`, `standard`,
    /// FOCUS `Standard`, `Committed`, ...).
    pub tier: Option<String>,
    /// The resource charged (a VM, an account), where the record names one.
    pub resource: Option<String>,
    /// The record's own words for the charge (a line item, a meter).
    pub description: Option<String>,
    /// What it cost and counts.
    #[serde(flatten)]
    pub figures: Figures,
}

/// What a bill line, or a group of lines or of booked requests, costs and
/// counts; `None` where it does not state the figure.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Figures {
    /// What it cost, nano-dollars (none: a usage record, no money).
    pub cost: Option<Nano>,
    /// Input tokens, cached and cache writes included.
    pub tokens_in: Option<i64>,
    /// Output tokens.
    pub tokens_out: Option<i64>,
    /// Of the input, tokens read from the prompt cache.
    pub tokens_cached: Option<i64>,
    /// Requests.
    pub requests: Option<i64>,
}

impl Figures {
    /// The names of the figures, in [`Figures::all`] order (a stored
    /// column's name, and a difference's measure).
    pub const NAMES: [&'static str; 5] = [
        "cost",
        "tokens_in",
        "tokens_out",
        "tokens_cached",
        "requests",
    ];

    /// Every figure, in [`Figures::NAMES`] order.
    pub fn all(&self) -> [Option<i64>; 5] {
        [
            self.cost,
            self.tokens_in,
            self.tokens_out,
            self.tokens_cached,
            self.requests,
        ]
    }

    /// A cost alone, nano-dollars.
    pub fn of_cost(cost: Nano) -> Figures {
        Figures {
            cost: Some(cost),
            ..Figures::default()
        }
    }

    /// The figures `all` holds, in [`Figures::NAMES`] order.
    pub fn from_all(all: [Option<i64>; 5]) -> Figures {
        let [cost, tokens_in, tokens_out, tokens_cached, requests] = all;
        Figures {
            cost,
            tokens_in,
            tokens_out,
            tokens_cached,
            requests,
        }
    }

    /// Adds `other`'s figures to these (saturating); a figure either
    /// states is stated.
    pub fn add(&mut self, other: &Figures) {
        let mut sum = self.all();
        for (a, b) in sum.iter_mut().zip(other.all()) {
            if let Some(b) = b {
                *a = Some(a.unwrap_or(0).saturating_add(b));
            }
        }
        *self = Figures::from_all(sum);
    }

    /// These figures where `other` states one (0 where these do not),
    /// none where it does not: one side stating what the other states.
    pub fn as_stated_by(&self, other: &Figures) -> Figures {
        let mut out = other.all();
        for (o, v) in out.iter_mut().zip(self.all()) {
            *o = o.map(|_| v.unwrap_or(0));
        }
        Figures::from_all(out)
    }
}

/// A row of a bill that was not imported, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BadRow {
    /// The file.
    pub source: String,
    /// Where: a CSV line number, or for JSON the 1-based ordinal of the
    /// result (0 for the answer as a whole).
    pub line: i64,
    /// The JSON path or CSV column.
    pub field: String,
    /// What was wrong and what is accepted.
    pub error: String,
}

impl BadRow {
    /// The row's key in the store: the file, the place and the error.
    pub fn key(&self) -> String {
        hex16(&[
            self.source.as_bytes(),
            &self.line.to_le_bytes(),
            self.field.as_bytes(),
            self.error.as_bytes(),
        ])
    }

    /// The values of [`crate::store::PUT_BILL_REJECT`]'s parameters.
    pub fn values(&self) -> Vec<crate::kind::Val> {
        use crate::kind::Val;
        vec![
            Val::Text(Some(self.key())),
            Val::Text(Some(self.source.clone())),
            Val::Int(Some(self.line)),
            Val::Text(Some(self.field.clone())),
            Val::Text(Some(self.error.clone())),
        ]
    }

    /// A row read back from the columns
    /// [`crate::store::GET_BILL_REJECTS`] selects.
    pub fn read(c: &dyn crate::kind::Cols) -> anyhow::Result<BadRow> {
        use crate::kind::need;
        Ok(BadRow {
            source: need(c.text(0)?, "source")?,
            line: need(c.int(1)?, "line")?,
            field: need(c.text(2)?, "field")?,
            error: need(c.text(3)?, "error")?,
        })
    }
}

impl std::fmt::Display for BadRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}: `{}`: {}",
            self.source, self.line, self.field, self.error
        )
    }
}

/// What one file's import did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// The file.
    pub source: String,
    /// Its format.
    pub format: String,
    /// Lines read.
    pub lines: u64,
    /// Lines stored for the first time.
    pub new: u64,
    /// Lines the store held already, the same.
    pub already: u64,
    /// Lines the store held with other figures, replaced (a restated
    /// bill).
    pub restated: u64,
    /// Rows not imported, each named.
    pub rejected: Vec<BadRow>,
}

/// What a parser gives: the lines read and the rows refused.
#[derive(Debug, Default)]
pub struct Parsed {
    pub lines: Vec<BillLine>,
    pub bad: Vec<BadRow>,
}

/// Which format `bytes` hold: a FOCUS CSV (its header names
/// `ChargePeriodStart` and `BilledCost`), or a JSON answer told apart by
/// its results' `object` (OpenAI) or fields (Anthropic).
pub fn detect(source: &str, bytes: &[u8]) -> anyhow::Result<Format> {
    let text = std::str::from_utf8(bytes)
        .with_context(|| format!("{source}: a bill is UTF-8 text (JSON or CSV)"))?;
    let text = text.trim_start_matches('\u{feff}').trim_start();
    if !text.starts_with('{') {
        let header = text.lines().next().unwrap_or("");
        if header.contains("ChargePeriodStart") && header.contains("BilledCost") {
            return Ok(Format::FocusCsv);
        }
        anyhow::bail!(
            "{source}: neither a JSON answer nor a FOCUS CSV (whose header names \
             ChargePeriodStart and BilledCost); pass --format"
        );
    }
    let v: serde_json::Value =
        serde_json::from_str(text).with_context(|| format!("{source}: not valid JSON"))?;
    let first = v
        .get("data")
        .and_then(|d| d.as_array())
        .into_iter()
        .flatten()
        .filter_map(|b| b.get("results").and_then(|r| r.as_array()))
        .flatten()
        .next();
    let Some(first) = first else {
        anyhow::bail!("{source}: an answer with no results does not say its format; pass --format");
    };
    match first.get("object").and_then(|o| o.as_str()) {
        Some("organization.costs.result") => return Ok(Format::OpenaiCosts),
        Some("organization.usage.completions.result") => return Ok(Format::OpenaiUsage),
        _ => {}
    }
    if first.get("uncached_input_tokens").is_some() {
        return Ok(Format::AnthropicUsage);
    }
    if first.get("amount").is_some_and(|a| a.is_string()) {
        return Ok(Format::AnthropicCost);
    }
    anyhow::bail!(
        "{source}: a JSON answer of no format this ledger reads (OpenAI costs or completions \
         usage, Anthropic usage or cost report); pass --format"
    )
}

/// Read `bytes` (named `source`) as `format`.
pub fn parse(format: Format, source: &str, bytes: &[u8]) -> anyhow::Result<Parsed> {
    let mut p = match format {
        Format::OpenaiCosts => openai::costs(source, bytes)?,
        Format::OpenaiUsage => openai::usage(source, bytes)?,
        Format::AnthropicUsage => anthropic::usage(source, bytes)?,
        Format::AnthropicCost => anthropic::cost(source, bytes)?,
        Format::FocusCsv => focus_csv::parse(source, bytes)?,
    };
    for l in &mut p.lines {
        l.format = format.as_str().to_string();
        l.source = source.to_string();
    }
    Ok(p)
}

/// The columns of a stored bill line, in [`BillLine::values`] order
/// (SQL valid in SQLite and PostgreSQL alike).
pub const COLUMNS: [(&str, &str); 18] = [
    ("key", "TEXT PRIMARY KEY"),
    ("source", "TEXT NOT NULL"),
    ("line", "BIGINT NOT NULL"),
    ("format", "TEXT NOT NULL"),
    ("provider", "TEXT NOT NULL"),
    ("day", "TEXT NOT NULL"),
    ("model", "TEXT"),
    ("scope", "TEXT"),
    ("kind", "TEXT"),
    ("quantity", "BIGINT"),
    ("tier", "TEXT"),
    ("resource", "TEXT"),
    ("description", "TEXT"),
    ("cost_nano", "BIGINT"),
    ("tokens_in", "BIGINT"),
    ("tokens_out", "BIGINT"),
    ("tokens_cached", "BIGINT"),
    ("requests", "BIGINT"),
];

impl BillLine {
    /// The column values, in [`COLUMNS`] order, text made storable in
    /// both stores ([`crate::kind::storable`]).
    pub fn values(&self) -> Vec<crate::kind::Val> {
        use crate::kind::Val;
        let text = |s: &str| {
            let mut s = s.to_string();
            crate::kind::storable(&mut s);
            Val::Text(Some(s))
        };
        let opt = |s: &Option<String>| s.as_deref().map_or(Val::Text(None), text);
        vec![
            text(&self.key),
            text(&self.source),
            Val::Int(Some(self.line)),
            text(&self.format),
            text(&self.provider),
            text(&self.day),
            opt(&self.model),
            opt(&self.scope),
            Val::Text(self.kind.map(|k| k.as_str().to_string())),
            Val::Int(self.quantity),
            opt(&self.tier),
            opt(&self.resource),
            opt(&self.description),
        ]
        .into_iter()
        .chain(self.figures.all().map(Val::Int))
        .collect()
    }

    /// A stored line read back from its columns.
    pub fn read(c: &dyn crate::kind::Cols) -> anyhow::Result<BillLine> {
        let need = |i: usize| -> anyhow::Result<String> {
            let name = COLUMNS.get(i).map_or("?", |c| c.0);
            crate::kind::need(c.text(i)?, name)
        };
        Ok(BillLine {
            key: need(0)?,
            source: need(1)?,
            line: crate::kind::need(c.int(2)?, "line")?,
            format: need(3)?,
            provider: need(4)?,
            day: need(5)?,
            model: c.text(6)?,
            scope: c.text(7)?,
            kind: c.text(8)?.as_deref().and_then(TokenKind::parse),
            quantity: c.int(9)?,
            tier: c.text(10)?,
            resource: c.text(11)?,
            description: c.text(12)?,
            figures: Figures::from_all([
                c.int(13)?,
                c.int(14)?,
                c.int(15)?,
                c.int(16)?,
                c.int(17)?,
            ]),
        })
    }

    /// Whether `other` says the same as this line: everything but where
    /// it was read from (an overlapping export holds the same line in
    /// another file).
    pub fn same_as(&self, other: &BillLine) -> bool {
        let mut a = self.clone();
        a.source.clone_from(&other.source);
        a.line = other.line;
        a == *other
    }
}

/// What storing one line did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// Not held before.
    New,
    /// Held, the same.
    Same,
    /// Held with other figures; replaced.
    Restated,
}

/// Gives each line its key: `format`, its identity, and how many lines of
/// the same identity came before it in the file.
#[derive(Debug, Default)]
pub(crate) struct Keys {
    seen: HashMap<String, u64>,
}

impl Keys {
    /// The key of the next line whose identity is `identity`.
    pub(crate) fn key(&mut self, format: Format, identity: &str) -> String {
        let n = self.seen.entry(identity.to_string()).or_default();
        let key = hex16(&[
            format.as_str().as_bytes(),
            identity.as_bytes(),
            &n.to_le_bytes(),
        ]);
        *n += 1;
        key
    }
}

/// The first 32 hex digits of the SHA-256 of `parts`, each
/// length-prefixed (no two lists share a hash).
fn hex16(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    let d: [u8; 32] = h.finalize().into();
    d.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// The amount in decimal `text` times 10^`shift`, rounded half away from
/// zero to an integer: [`nano`] reads dollars with `shift` 9. Exact for
/// any decimal (`0.06`, `-1.5e-3`, `123.45`); `None` when `text` is not
/// a decimal number or the result leaves `i64`.
pub fn scaled(text: &str, shift: i32) -> Option<i64> {
    let t = text.trim();
    let (neg, t) = match t.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let (mantissa, exp) = match t.find(['e', 'E']) {
        Some(i) => (t.get(..i)?, t.get(i + 1..)?.parse::<i32>().ok()?),
        None => (t, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int.is_empty() && frac.is_empty()
        || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let digits = format!("{int}{frac}");
    let digits = digits.trim_start_matches('0');
    // value = digits × 10^(exp − frac.len()); times 10^shift.
    let mut e = i64::from(exp) - frac.len() as i64 + i64::from(shift);
    let mut keep = digits.to_string();
    let mut round_up = false;
    if e < 0 {
        let drop = usize::try_from(-e).ok()?;
        if drop > keep.len() {
            keep.clear();
        } else {
            let (k, dropped) = keep.split_at(keep.len() - drop);
            round_up = dropped.bytes().next().is_some_and(|b| b >= b'5');
            keep = k.to_string();
        }
        e = 0;
    }
    if keep.len() + usize::try_from(e).ok()? > 19 {
        return if keep.is_empty() && !round_up {
            Some(0)
        } else {
            None
        };
    }
    let mut v: i64 = if keep.is_empty() {
        0
    } else {
        keep.parse().ok()?
    };
    for _ in 0..e {
        v = v.checked_mul(10)?;
    }
    if round_up {
        v = v.checked_add(1)?;
    }
    Some(if neg { -v } else { v })
}

/// USD in decimal `text` as nano-dollars, exactly ([`scaled`]).
pub fn nano(text: &str) -> Option<Nano> {
    scaled(text, 9)
}

/// Days since the epoch of an RFC 3339 time (or a bare date) in UTC:
/// `2025-01-08T00:00:00Z`, `2024-01-01T00:00Z`, `2025-01-08 00:00:00`,
/// `2025-01-08`. A time with another offset than `Z` or `+00:00` is
/// refused, so a bill's day is never shifted.
pub fn utc_day(text: &str) -> Option<String> {
    let t = text.trim();
    let date = t.get(..10)?;
    let rest = t.get(10..)?;
    let b = date.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|s| s.iter().all(u8::is_ascii_digit));
    if !(digits(0..4)
        && b.get(4) == Some(&b'-')
        && digits(5..7)
        && b.get(7) == Some(&b'-')
        && digits(8..10))
    {
        return None;
    }
    let month: u32 = date.get(5..7)?.parse().ok()?;
    let day: u32 = date.get(8..10)?.parse().ok()?;
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    let utc = rest.is_empty()
        || ((rest.starts_with('T') || rest.starts_with(' '))
            && (rest.ends_with('Z') || rest.ends_with("+00:00") || !rest.contains(['+', '-'])));
    utc.then(|| date.to_string())
}

/// The UTC day `YYYY-MM-DD` of `secs` since the epoch.
pub fn day_of_secs(secs: i64) -> String {
    let (y, m, d) = crate::time::civil(secs.div_euclid(86_400));
    format!("{y:04}-{m:02}-{d:02}")
}

/// The UTC day `YYYY-MM-DD` of `ms` since the epoch.
pub fn day_of_ms(ms: i64) -> String {
    day_of_secs(ms.div_euclid(1000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_are_read_exactly() {
        assert_eq!(nano("0.06"), Some(60_000_000));
        assert_eq!(nano("0.13080438"), Some(130_804_380));
        assert_eq!(nano("1e-9"), Some(1));
        assert_eq!(nano("4e-10"), Some(0));
        assert_eq!(nano("5e-10"), Some(1));
        assert_eq!(nano("-1.5"), Some(-1_500_000_000));
        assert_eq!(scaled("123.45", 7), Some(1_234_500_000), "cents");
        assert_eq!(nano("12"), Some(12_000_000_000));
        for bad in [
            "",
            ".",
            "abc",
            "1.2.3",
            "1e",
            "0x10",
            "99999999999999999999",
        ] {
            assert_eq!(nano(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn days_are_utc() {
        assert_eq!(
            utc_day("2025-01-08T00:00:00Z").as_deref(),
            Some("2025-01-08")
        );
        assert_eq!(utc_day("2024-01-01T00:00Z").as_deref(), Some("2024-01-01"));
        assert_eq!(utc_day("2024-01-01").as_deref(), Some("2024-01-01"));
        assert_eq!(
            utc_day("2024-01-01T00:00:00+00:00").as_deref(),
            Some("2024-01-01")
        );
        assert_eq!(utc_day("2024-01-01T00:00:00+02:00"), None);
        assert_eq!(utc_day("2024-13-01"), None);
        assert_eq!(day_of_secs(1_730_419_200), "2024-11-01");
    }
}
