//! The books against the bill: per provider, UTC day, model (and the
//! project or workspace a record names, where mapped to a tenant), what
//! the ledger booked from its stored rows (each priced once by
//! [`crate::price`], never again here) against what the provider's records
//! say, and each difference past the threshold named with its likely
//! cause ([`Cause`]).
//!
//! **Matching.** An event belongs to a provider through its destination:
//! the destination's `upstream.authority` (`api.openai.com` is `openai`,
//! `*.openai.azure.com` and other Azure hosts `azure`, `api.anthropic.com`
//! `anthropic`, `*.amazonaws.com` `aws`), or [`Options::providers`]. Only
//! served requests not answered from ACE's cache count (what a provider
//! processed). Its model is the one the upstream was sent
//! (`upstream_model`, else `model_served`); both sides' model names are
//! compared in lower case without a trailing snapshot date
//! (`gpt-4o-2024-08-06` and `gpt-4o` are one model; so are
//! `claude-sonnet-4-20250514` and `claude-sonnet-4`). A record's scope (an
//! OpenAI project, an Anthropic workspace, a FOCUS sub-account) splits the
//! comparison only where [`Options::scopes`] maps it to a tenant;
//! otherwise a day's scopes are added up.
//!
//! **Grain.** A record that names its model is compared per model; one
//! that does not (OpenAI's costs, a charge with no model) is compared per
//! day (model `*`), against everything the day booked for that provider,
//! the bill's side adding every line of the day that states the figure.
//! A day total's cost difference is put down to the tokens, not to a
//! price, where a model's usage record of the same provider and day
//! counts other tokens than the books (its cause theirs, no change
//! proposed). A line for a resource with no model and no tokens (a GPU VM
//! in a FOCUS export) is standing capacity, listed apart
//! ([`Reconciliation::capacity`]).
//!
//! **Tier.** The ledger books a provider's request at the destination's
//! configured price, its standard tier; a record at another service tier
//! (`flex`, `batch`, `priority`, a FOCUS pricing category other than
//! `Standard`) is a difference of its own ([`Cause::Tier`]).
//!
//! **Price.** When the tokens agree and only the money does not, the
//! configuration's price differs from the provider's: the difference
//! carries a [`Proposal`] per destination (the per-token price the bill
//! implies, from the bill's cost by kind of token where it splits it,
//! else the configured prices scaled by billed over booked cost). It is
//! printed, never applied; with a model routing `cost_factors` entry for
//! the model on the destination, divide the proposed price by it.

pub use super::Figures;
use super::{BillLine, TokenKind};
use crate::configs::Registry;
use crate::money::{usd, Nano};
use crate::row::Row;
use crate::store::Store;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// What to match and how close is close enough.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Options {
    /// A cost difference counts when over this many nano-dollars ...
    pub min_nano: Nano,
    /// ... and over this fraction of the larger side (tokens and requests
    /// too, with no absolute floor).
    pub fraction: f64,
    /// A record's scope (project, workspace, sub-account) to the tenant it
    /// is billed for.
    pub scopes: BTreeMap<String, String>,
    /// A destination to its provider, where its upstream's authority does
    /// not say.
    pub providers: BTreeMap<String, String>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            min_nano: 1_000,
            fraction: 0.001,
            scopes: BTreeMap::new(),
            providers: BTreeMap::new(),
        }
    }
}

/// Why the books and the bill differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// The configuration's price differs from the provider's (or lacks
    /// one): see the proposals.
    Price,
    /// Cached input tokens read differently from the provider's count.
    CachedTokens,
    /// The provider billed another service tier than the one booked.
    Tier,
    /// The bill has requests or tokens the log does not.
    MissingInLog,
    /// The log has requests or tokens the bill does not.
    MissingInBill,
    /// Charges the bill attributes to no model (a tool, a fee) that the
    /// ledger does not book.
    Unattributed,
}

impl Cause {
    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Price => "price",
            Cause::CachedTokens => "cached tokens",
            Cause::Tier => "tier",
            Cause::MissingInLog => "missing in the log",
            Cause::MissingInBill => "missing in the bill",
            Cause::Unattributed => "not attributed to a model",
        }
    }
}

/// One figure that differs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Difference {
    /// `cost`, `tokens_in`, `tokens_out`, `tokens_cached`, `requests` or
    /// `tier`.
    pub measure: String,
    /// The bill's figure (nano-dollars for cost; 0 for `tier`).
    pub billed: i64,
    /// The books' figure.
    pub booked: i64,
    /// The likely cause.
    pub cause: Cause,
    /// The cause in words, with the figures.
    pub why: String,
}

/// A proposed configuration change: printed, never applied.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Proposal {
    pub destination: String,
    /// `usd_per_input_token` or `usd_per_output_token`.
    pub field: String,
    pub current: f64,
    pub proposed: f64,
    /// Where the proposed price comes from.
    pub from: String,
}

/// One comparison: a provider's day, model and scope.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    /// What it compares (in JSON, its fields at the comparison's top level).
    #[serde(flatten)]
    pub key: Key,
    pub billed: Figures,
    pub booked: Figures,
    /// The service tiers billed other than the standard one.
    pub tiers: Vec<String>,
    pub differences: Vec<Difference>,
    pub proposals: Vec<Proposal>,
}

/// The reconciliation.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Reconciliation {
    /// Bill lines stored.
    pub bill_lines: u64,
    /// Bill rows not imported (each named by `ace ledger import-bill`).
    pub rows_not_imported: u64,
    /// Every comparison, by provider, day, model, tenant.
    pub comparisons: Vec<Comparison>,
    /// How many comparisons differ.
    pub differing: u64,
    /// Standing capacity the bill charges: its lines for a resource with
    /// no model and no tokens (a GPU VM, a reservation), as stored.
    pub capacity: Vec<BillLine>,
    /// Destinations whose provider is unknown (no authority a provider
    /// is known by, none given): their events are not reconciled.
    pub unmatched_destinations: Vec<String>,
}

/// What a comparison is of: a provider's day, model and tenant.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Key {
    pub provider: String,
    pub day: String,
    /// The model (compared form); `*` for the day's total.
    pub model: String,
    /// The tenant a mapped scope is billed for.
    pub tenant: Option<String>,
}

impl Key {
    /// Whether `other` is of the same provider, day and tenant.
    fn same_day(&self, other: &Key) -> bool {
        self.provider == other.provider && self.day == other.day && self.tenant == other.tenant
    }

    /// Whether it is a day's total (model `*`).
    fn day_total(&self) -> bool {
        self.model == "*"
    }
}

#[derive(Default)]
struct BillAgg {
    fig: Figures,
    kind_cost: BTreeMap<TokenKind, Nano>,
    kind_qty: BTreeMap<TokenKind, i64>,
    tiers: BTreeSet<String>,
    no_model: BTreeSet<String>,
    modelless_cost: bool,
    usage: bool,
}

#[derive(Default)]
struct BookAgg {
    fig: Figures,
    destinations: BTreeSet<(String, String)>,
}

/// Whether `tier` is a provider's standard tier (what the ledger books).
pub fn standard_tier(tier: &str) -> bool {
    matches!(
        tier.to_ascii_lowercase().as_str(),
        "default" | "standard" | "auto" | "on_demand" | "ondemand"
    )
}

/// `model` as both sides are compared: lower case, without a trailing
/// snapshot date (`-2024-08-06`, `-20250514`).
pub fn model_key(model: &str) -> String {
    let m = model.trim().to_ascii_lowercase();
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if let Some((head, tail)) = m.rsplit_once('-') {
        if tail.len() == 8 && digits(tail) {
            return head.to_string();
        }
    }
    let parts: Vec<&str> = m.rsplitn(4, '-').collect();
    if let [d, mo, y, head] = parts.as_slice() {
        if y.len() == 4 && mo.len() == 2 && d.len() == 2 && digits(y) && digits(mo) && digits(d) {
            return (*head).to_string();
        }
    }
    m
}

/// The provider an upstream authority belongs to.
pub fn provider_of_authority(authority: &str) -> Option<&'static str> {
    let a = authority.to_ascii_lowercase();
    let host = a.split(':').next().unwrap_or("");
    if host == "api.openai.com" {
        Some("openai")
    } else if host.ends_with(".azure.com") || host.ends_with(".azure-api.net") {
        Some("azure")
    } else if host == "api.anthropic.com" {
        Some("anthropic")
    } else if host.ends_with(".amazonaws.com") {
        Some("aws")
    } else {
        None
    }
}

/// Reconcile the bill lines in `store` with its booked rows.
pub fn run(
    store: &mut dyn Store,
    registry: &Registry,
    opts: &Options,
) -> anyhow::Result<Reconciliation> {
    let lines = store.bill_lines()?;
    let mut rec = Reconciliation {
        bill_lines: lines.len() as u64,
        rows_not_imported: store.bill_rejects()?.len() as u64,
        ..Reconciliation::default()
    };
    if lines.is_empty() {
        return Ok(rec);
    }
    let tenants: BTreeSet<&String> = opts.scopes.values().collect();
    let mut bill: BTreeMap<Key, BillAgg> = BTreeMap::new();
    // What the bill covers: (provider, day, scope) with model lines, and
    // with model-less ones.
    let mut covered: BTreeSet<(String, String, Option<String>, bool)> = BTreeSet::new();
    for l in &lines {
        let standing = l.model.is_none() && l.kind.is_none() && l.figures.tokens_in.is_none();
        if standing && l.resource.is_some() && l.figures.cost.is_some() {
            rec.capacity.push(l.clone());
            continue;
        }
        let scope = l.scope.as_ref().and_then(|s| opts.scopes.get(s)).cloned();
        let model = l.model.as_deref().map_or("*".to_string(), model_key);
        covered.insert((
            l.provider.clone(),
            l.day.clone(),
            scope.clone(),
            l.model.is_some(),
        ));
        let key = Key {
            provider: l.provider.clone(),
            day: l.day.clone(),
            model,
            tenant: scope,
        };
        add_line(bill.entry(key).or_default(), l);
    }
    bill.values_mut().for_each(finish);
    // The day's totals: every line of the day where a model-less line is.
    let day_keys: Vec<Key> = bill.keys().filter(|k| k.day_total()).cloned().collect();
    for k in &day_keys {
        let mut total = Figures::default();
        let mut tiers = BTreeSet::new();
        for (_, a) in bill.iter().filter(|(kk, _)| kk.same_day(k)) {
            total.add(&a.fig);
            tiers.extend(a.tiers.iter().cloned());
        }
        if let Some(a) = bill.get_mut(k) {
            a.fig.cost = total.cost.filter(|_| a.modelless_cost);
            a.tiers = tiers;
        }
    }
    let mut book: BTreeMap<Key, BookAgg> = BTreeMap::new();
    let mut unmatched = BTreeSet::new();
    store.scan(&mut |row: Row| {
        let Some(dest) = row.destination.as_deref() else {
            return Ok(());
        };
        if !row.served() || row.cached {
            return Ok(());
        }
        let Some(provider) = provider_of(registry, opts, &row.config, dest) else {
            unmatched.insert(dest.to_string());
            return Ok(());
        };
        let model = row
            .upstream_model
            .as_deref()
            .or(row.model_served.as_deref())
            .or(row.model_requested.as_deref())
            .map_or("*".to_string(), model_key);
        let day = super::day_of_ms(row.time_ms);
        let scope = row.tenant.clone().filter(|t| tenants.contains(t));
        let fig = Figures::from_all(
            [
                row.booked,
                row.tokens_in,
                row.tokens_out,
                row.tokens_cache_read,
                1,
            ]
            .map(Some),
        );
        for m in [model.clone(), "*".to_string()] {
            let key = Key {
                provider: provider.clone(),
                day: day.clone(),
                model: m,
                tenant: scope.clone(),
            };
            let b = book.entry(key).or_default();
            b.fig.add(&fig);
            b.destinations
                .insert((row.config.clone(), dest.to_string()));
        }
        Ok(())
    })?;
    rec.unmatched_destinations = unmatched.into_iter().collect();
    // The books' groups the bill covers but has no line for.
    for k in book.keys() {
        let cover = (
            k.provider.clone(),
            k.day.clone(),
            k.tenant.clone(),
            !k.day_total(),
        );
        if covered.contains(&cover) && !bill.contains_key(k) {
            bill.insert(k.clone(), BillAgg::default());
        }
    }
    let empty = BookAgg::default();
    for (k, a) in &bill {
        let b = book.get(k).unwrap_or(&empty);
        let mut c = compare(k, a, b, opts, registry);
        if k.day_total() {
            unattributed(&mut c, a, &bill, k);
        }
        rec.differing += u64::from(!c.differences.is_empty());
        rec.comparisons.push(c);
    }
    follow_usage(&mut rec.comparisons);
    Ok(rec)
}

/// A day total's cost difference (from a record that names no model,
/// such as OpenAI's costs) is no drift in price where a model's usage
/// record for the same provider, day and tenant counts other tokens than
/// the books: the cost follows those tokens, and no price is proposed
/// (the configured prices may be right and the usage misread).
fn follow_usage(comparisons: &mut [Comparison]) {
    let tokens: Vec<(Key, Cause)> = comparisons
        .iter()
        .filter(|c| !c.key.day_total())
        .filter_map(|c| {
            let d = c
                .differences
                .iter()
                .find(|d| d.measure != "cost" && d.measure != "tier")?;
            Some((c.key.clone(), d.cause))
        })
        .collect();
    for c in comparisons.iter_mut().filter(|c| c.key.day_total()) {
        let Some((Key { model, .. }, cause)) = tokens.iter().find(|t| t.0.same_day(&c.key)) else {
            continue;
        };
        let mut followed = false;
        for d in c.differences.iter_mut() {
            if d.measure == "cost" && d.cause == Cause::Price {
                d.cause = *cause;
                d.why = format!(
                    "billed ${}, booked ${}: the cost follows the tokens, which the usage record \
                     for {model} counts otherwise ({})",
                    usd(d.billed),
                    usd(d.booked),
                    cause.as_str()
                );
                followed = true;
            }
        }
        if followed {
            c.proposals.clear();
        }
    }
}

fn add_line(a: &mut BillAgg, l: &BillLine) {
    a.fig.add(&l.figures);
    if let (Some(k), Some(c)) = (l.kind, l.figures.cost) {
        let e = a.kind_cost.entry(k).or_default();
        *e = e.saturating_add(c);
    }
    if let (Some(k), Some(q)) = (l.kind, l.quantity) {
        let e = a.kind_qty.entry(k).or_default();
        *e = e.saturating_add(q);
    }
    if let Some(t) = l.tier.as_deref().filter(|t| !standard_tier(t)) {
        a.tiers.insert(t.to_string());
    }
    if l.model.is_none() {
        a.modelless_cost |= l.figures.cost.is_some();
        if let Some(d) = &l.description {
            a.no_model.insert(d.clone());
        }
    }
    a.usage |= l.figures.tokens_in.is_some() || l.figures.tokens_out.is_some();
}

/// A record that counts tokens only by the quantity of its cost lines (a
/// FOCUS export) states them through those.
fn finish(a: &mut BillAgg) {
    if a.usage || a.kind_qty.is_empty() {
        return;
    }
    let q = |k| a.kind_qty.get(&k).copied();
    let input = [TokenKind::Input, TokenKind::Cached, TokenKind::CacheWrite]
        .into_iter()
        .filter_map(q)
        .reduce(i64::saturating_add);
    a.fig.tokens_in = input;
    a.fig.tokens_out = q(TokenKind::Output);
    a.fig.tokens_cached = q(TokenKind::Cached).or(input.map(|_| 0));
}

/// The provider of destination `dest` under configuration `config`.
fn provider_of(registry: &Registry, opts: &Options, config: &str, dest: &str) -> Option<String> {
    if let Some(p) = opts.providers.get(dest) {
        return Some(p.clone());
    }
    let setup = registry.get(config)?;
    let d = setup.config.destinations.iter().find(|d| d.name == dest)?;
    provider_of_authority(d.upstream.authority.as_deref()?).map(str::to_string)
}

/// Whether `a` and `b` differ past the threshold (`nano`: money).
fn off(a: i64, b: i64, opts: &Options, nano: bool) -> bool {
    let d = a.abs_diff(b);
    let big = a.unsigned_abs().max(b.unsigned_abs()) as f64;
    d as f64 > big * opts.fraction && (!nano || d > opts.min_nano.unsigned_abs())
}

fn compare(k: &Key, a: &BillAgg, b: &BookAgg, opts: &Options, registry: &Registry) -> Comparison {
    let mut c = Comparison {
        key: k.clone(),
        billed: a.fig.clone(),
        // The books state what the bill states.
        booked: b.fig.as_stated_by(&a.fig),
        tiers: a.tiers.iter().cloned().collect(),
        differences: Vec::new(),
        proposals: Vec::new(),
    };
    let booked = |v: Option<i64>| v.unwrap_or(0);
    if !c.tiers.is_empty() {
        c.differences.push(Difference {
            measure: "tier".into(),
            billed: 0,
            booked: 0,
            cause: Cause::Tier,
            why: format!(
                "billed at tier {}; the ledger books the destination's configured (standard \
                 tier) price",
                c.tiers.join(", ")
            ),
        });
    }
    // Every count (all but the cost): its name, the bill's, the books'.
    let pairs: Vec<(&str, Option<i64>, Option<i64>)> = Figures::NAMES
        .into_iter()
        .zip(a.fig.all().into_iter().zip(b.fig.all()))
        .skip(1)
        .map(|(name, (x, y))| (name, x, y))
        .collect();
    let d = |name: &str| {
        pairs
            .iter()
            .find(|p| p.0 == name)
            .and_then(|p| p.1.map(|x| x.saturating_sub(booked(p.2))))
    };
    let cached_d = d("tokens_cached").unwrap_or(0);
    let in_d = d("tokens_in").unwrap_or(0);
    let cached_only = cached_d != 0
        && off(
            booked(a.fig.tokens_cached),
            booked(b.fig.tokens_cached),
            opts,
            false,
        )
        && d("tokens_out").unwrap_or(0) == 0
        && (in_d == 0 || in_d == cached_d);
    let mut token_cause = None;
    for &(name, billed, book) in &pairs {
        let Some(billed) = billed else { continue };
        let book = booked(book);
        if !off(billed, book, opts, false) {
            continue;
        }
        let (cause, why) = if cached_only && (name == "tokens_cached" || name == "tokens_in") {
            (
                Cause::CachedTokens,
                format!(
                    "the bill counts {} cached input tokens, the log {}: cached tokens read \
                     differently",
                    booked(a.fig.tokens_cached),
                    booked(b.fig.tokens_cached)
                ),
            )
        } else if billed > book {
            (
                Cause::MissingInLog,
                format!("the bill has {billed} {name}, the log {book}: the bill has what the log does not"),
            )
        } else {
            (
                Cause::MissingInBill,
                format!("the log has {book} {name}, the bill {billed}: the log has what the bill does not"),
            )
        };
        token_cause = token_cause.or(Some(cause));
        c.differences.push(Difference {
            measure: name.into(),
            billed,
            booked: book,
            cause,
            why,
        });
    }
    if let Some(billed) = a.fig.cost {
        let book = booked(b.fig.cost);
        if off(billed, book, opts, true) {
            let (cause, why) = if !c.tiers.is_empty() {
                (
                    Cause::Tier,
                    format!("billed at tier {}", c.tiers.join(", ")),
                )
            } else if let Some(t) = token_cause {
                (t, "the cost follows the tokens".to_string())
            } else if b.fig.requests.is_none() {
                (
                    Cause::MissingInLog,
                    "the log has no request of this provider, day and model".to_string(),
                )
            } else {
                c.proposals = proposals(a, b, registry, opts);
                (
                    Cause::Price,
                    "the tokens agree, the money does not: the configured price differs from the \
                     provider's"
                        .to_string(),
                )
            };
            c.differences.push(Difference {
                measure: "cost".into(),
                billed,
                booked: book,
                cause,
                why: format!("billed ${}, booked ${}: {why}", usd(billed), usd(book)),
            });
        }
    }
    c
}

/// A day total's cost difference that the models' own comparisons
/// account for is charges with no model.
fn unattributed(c: &mut Comparison, a: &BillAgg, bill: &BTreeMap<Key, BillAgg>, k: &Key) {
    let models_cost = bill
        .iter()
        .any(|(kk, x)| kk.same_day(k) && !kk.day_total() && x.fig.cost.is_some());
    if !models_cost || a.no_model.is_empty() {
        return;
    }
    for d in c.differences.iter_mut().filter(|d| d.measure == "cost") {
        d.cause = Cause::Unattributed;
        d.why = format!(
            "billed ${}, booked ${}: charges with no model the ledger does not book ({})",
            usd(d.billed),
            usd(d.booked),
            a.no_model.iter().cloned().collect::<Vec<_>>().join(", ")
        );
        c.proposals.clear();
    }
}

/// The configuration changes the bill implies for the destinations that
/// served the group: per kind of token where the bill prices one (its
/// cost over its tokens), else the configured prices scaled by billed
/// over booked cost.
fn proposals(a: &BillAgg, b: &BookAgg, registry: &Registry, opts: &Options) -> Vec<Proposal> {
    let qty = |k: TokenKind| match k {
        TokenKind::Output => a.kind_qty.get(&k).copied().or(a.fig.tokens_out),
        _ => a.kind_qty.get(&k).copied(),
    };
    let kind_price = |k: TokenKind| -> Option<(f64, String)> {
        let cost = *a.kind_cost.get(&k)?;
        let q = qty(k).filter(|q| *q > 0)?;
        Some((
            crate::money::usd_f64(cost) / q as f64,
            format!("billed ${} for {q} {} tokens", usd(cost), k.as_str()),
        ))
    };
    let scale = match (a.fig.cost, b.fig.cost) {
        (Some(x), Some(y)) if y > 0 => Some(x as f64 / y as f64),
        _ => None,
    };
    let mut out = Vec::new();
    for (config, dest) in &b.destinations {
        let Some(d) = registry
            .get(config)
            .and_then(|s| s.config.destinations.iter().find(|d| &d.name == dest))
        else {
            continue;
        };
        let fields = [
            (
                "usd_per_input_token",
                d.usd_per_input_token,
                TokenKind::Input,
            ),
            (
                "usd_per_output_token",
                d.usd_per_output_token,
                TokenKind::Output,
            ),
        ];
        let by_kind = fields.iter().any(|f| kind_price(f.2).is_some());
        for (field, current, kind) in fields {
            let found = if by_kind {
                kind_price(kind)
            } else {
                scale.map(|s| {
                    (
                        current * s,
                        format!(
                            "billed ${} for what the configuration prices at ${}",
                            usd(a.fig.cost.unwrap_or(0)),
                            usd(b.fig.cost.unwrap_or(0))
                        ),
                    )
                })
            };
            let Some((proposed, from)) = found else {
                continue;
            };
            // Six significant digits: a price, not a float's noise.
            let proposed = format!("{proposed:.5e}").parse().unwrap_or(proposed);
            let diff = (proposed - current).abs();
            if diff > current.abs().max(proposed.abs()) * opts.fraction {
                let p = Proposal {
                    destination: dest.clone(),
                    field: field.into(),
                    current,
                    proposed,
                    from,
                };
                if !out.contains(&p) {
                    out.push(p);
                }
            }
        }
    }
    out
}

impl Reconciliation {
    /// Every difference, with what its comparison compares.
    pub fn differences(&self) -> impl Iterator<Item = (&Key, &Difference)> {
        self.comparisons
            .iter()
            .flat_map(|c| c.differences.iter().map(move |d| (&c.key, d)))
    }

    /// The report's section (nothing when no bill is stored).
    pub fn table(&self, s: &mut String) {
        use crate::text::terminal;
        use std::fmt::Write as _;
        if self.bill_lines == 0 && self.rows_not_imported == 0 {
            return;
        }
        let _ = writeln!(
            s,
            "\nbooks against the bill: {} bill lines, {} rows not imported, {} comparisons, {} differing",
            self.bill_lines,
            self.rows_not_imported,
            self.comparisons.len(),
            self.differing
        );
        for c in &self.comparisons {
            let tenant = c
                .key
                .tenant
                .as_deref()
                .map(|t| format!(" tenant {}", terminal(t)))
                .unwrap_or_default();
            let money = |f: &Figures| f.cost.map_or("-".into(), |n| format!("${}", usd(n)));
            let _ = writeln!(
                s,
                "  {} {} {}{tenant}: billed {} booked {}{}",
                terminal(&c.key.provider),
                c.key.day,
                terminal(&c.key.model),
                money(&c.billed),
                money(&c.booked),
                if c.differences.is_empty() {
                    ", agree"
                } else {
                    ""
                }
            );
            for d in &c.differences {
                let _ = writeln!(
                    s,
                    "    {} [{}]: {}",
                    d.measure,
                    d.cause.as_str(),
                    terminal(&d.why)
                );
            }
            for p in &c.proposals {
                let _ = writeln!(
                    s,
                    "    proposed (not applied): destination {} {}: {:e} -> {:e} ({})",
                    terminal(&p.destination),
                    p.field,
                    p.current,
                    p.proposed,
                    p.from
                );
            }
        }
        for l in &self.capacity {
            let _ = writeln!(
                s,
                "  capacity {} {} {}: ${}{}",
                terminal(&l.provider),
                l.day,
                terminal(l.resource.as_deref().unwrap_or_default()),
                usd(l.figures.cost.unwrap_or(0)),
                l.description
                    .as_deref()
                    .map(|d| format!(" ({})", terminal(d)))
                    .unwrap_or_default()
            );
        }
        if !self.unmatched_destinations.is_empty() {
            let _ = writeln!(
                s,
                "  destinations of no known provider, not reconciled: {}",
                terminal(&self.unmatched_destinations.join(", "))
            );
        }
    }
}
