//! Tenant budgets: an amount of booked spend per period, a soft threshold
//! past which a tenant is served only on the rungs its budget allows, and
//! a token-per-minute limit.
//!
//! Why here: three programs read the same rule. The control service sums
//! each budget's spend over its period from the ledger's store and says
//! where it stands; the filter counts its own spend since that reading
//! and narrows or refuses; the ledger reports use against the amount. The
//! period's arithmetic ([`Period::window`]) and the thresholds
//! ([`Budget::state`]) are written once, here, for all of them.
//!
//! ```json
//! "budgets": [
//!   {"name": "team-a", "tenants": ["team-a"], "usd": 100.0, "period": "day",
//!    "soft_at": 0.8, "soft": {"tiers": ["inhouse", "reserved"]},
//!    "tokens_per_minute": 200000},
//!   {"name": "research", "tenants": ["lab-1", "lab-2"], "usd": 2000.0,
//!    "period": "month", "soft": {"max_usd_per_mtok": 0.5}}
//! ]
//! ```
//!
//! A budget only narrows: soft removes rungs, exhausted refuses, and a
//! token limit refuses for the rest of its minute. Nothing about a budget
//! can make a destination feasible that the policy tables do not allow.

use crate::{err, ConfigError};
use ace_core::cost::Tier;
use serde::{Deserialize, Serialize};

/// The most budgets a configuration may hold (the snapshot's limit).
pub const MAX_BUDGETS: usize = 4096;

/// The most tokens a minute a limit may allow (a billion).
pub const MAX_TOKENS_PER_MINUTE: u64 = 1_000_000_000;

/// One budget as configured.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetSettings {
    /// Its name: in the snapshot, the 429 body, the event and the report.
    pub name: String,
    /// The tenants whose spend it counts (one: a tenant's own budget;
    /// several: a group's).
    pub tenants: Vec<String>,
    /// The spend allowed per period, USD (none: only a token limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usd: Option<f64>,
    /// `day` (default), `week` or `month`, in UTC, or `rolling` (the last
    /// `window_s` seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<String>,
    /// The rolling window's length, seconds (with `period: "rolling"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_s: Option<u64>,
    /// The share of `usd` past which the budget is soft (default 0.8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soft_at: Option<f64>,
    /// What a soft budget still allows (default: the `inhouse` and
    /// `reserved` tiers, capacity already paid for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soft: Option<SoftSettings>,
    /// Tokens (in and out) its tenants may use per minute, per proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<u64>,
}

/// What a soft budget allows, as configured: every rule given applies.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SoftSettings {
    /// Only destinations on these tiers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tiers: Option<Vec<String>>,
    /// Only rungs whose booked marginal cost, at their price now, is at
    /// most this many USD per million tokens (in and out together).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_usd_per_mtok: Option<f64>,
    /// Only a substitute model (model routing's cheaper equivalents),
    /// never the model the request named.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub substitution_only: bool,
}

/// A budget's period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    /// A UTC day.
    Day,
    /// A UTC week, from Monday.
    Week,
    /// A UTC calendar month.
    Month,
    /// The last `ms` milliseconds.
    Rolling {
        /// The window's length, ms.
        ms: u64,
    },
}

const DAY_MS: u64 = 86_400_000;

impl Period {
    /// Its name in reports and error bodies.
    pub fn as_str(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Week => "week",
            Period::Month => "month",
            Period::Rolling { .. } => "rolling",
        }
    }

    /// The period holding `now_ms`: when it began and when it resets
    /// (Unix ms; a rolling window begins `ms` ago and resets never, 0).
    pub fn window(self, now_ms: u64) -> (u64, u64) {
        match self {
            Period::Day => {
                let start = now_ms - now_ms % DAY_MS;
                (start, start + DAY_MS)
            }
            Period::Week => {
                // 1970-01-01 was a Thursday: Mondays fall 4 days later.
                let days = now_ms / DAY_MS;
                let start = days.saturating_sub((days + 3) % 7) * DAY_MS;
                (start, start + 7 * DAY_MS)
            }
            Period::Month => {
                let (y, m, _) = civil(now_ms / DAY_MS);
                let start = days_from_civil(y, m, 1) * DAY_MS;
                let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                (start, days_from_civil(ny, nm, 1) * DAY_MS)
            }
            Period::Rolling { ms } => (now_ms.saturating_sub(ms), 0),
        }
    }
}

/// Unix ms as an RFC 3339 UTC time to the second
/// (`2026-12-08T00:00:00Z`): when a period resets, in error bodies.
pub fn rfc3339(ms: u64) -> String {
    let (y, m, d) = civil(ms / DAY_MS);
    let s = (ms % DAY_MS) / 1000;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

/// Year, month (1-12) and day of a count of days since 1970-01-01
/// (Howard Hinnant's `civil_from_days`, for days on or after 1970).
fn civil(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + u64::from(m <= 2), m, d)
}

/// Days since 1970-01-01 of a date on or after it (`days_from_civil`).
fn days_from_civil(y: u64, m: u64, d: u64) -> u64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// A validated budget.
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    /// Its name.
    pub name: String,
    /// Its tenants.
    pub tenants: Vec<String>,
    /// The spend allowed per period, USD (none: no spend limit).
    pub usd: Option<f64>,
    /// Its period.
    pub period: Period,
    /// The share of `usd` past which it is soft.
    pub soft_at: f64,
    /// What it allows when soft.
    pub soft: Soft,
    /// Tokens per minute, per proxy (none: no limit).
    pub tokens_per_minute: Option<u64>,
}

/// What a soft budget allows, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Soft {
    /// Only destinations on these tiers (none: any tier).
    pub tiers: Option<Vec<Tier>>,
    /// The most booked marginal cost per token, USD (infinite: none).
    pub max_usd_per_token: f64,
    /// Only a substitute model.
    pub substitution_only: bool,
}

impl Budget {
    /// Where a spend of `spent_usd` leaves the budget (a budget with no
    /// amount is always [`State::Ok`]: its limit is in tokens).
    pub fn state(&self, spent_usd: f64) -> State {
        match self.usd {
            Some(usd) if spent_usd >= usd => State::Exhausted,
            Some(usd) if spent_usd >= usd * self.soft_at => State::Soft,
            _ => State::Ok,
        }
    }
}

/// Where a budget stands: the snapshot's own type, one set of states
/// for the service that reads the books and the filter that acts on them.
pub use ace_snapshot::BudgetState as State;

/// Every budget, and which apply to each tenant.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Budgets {
    /// In configuration order (a budget's index is its place here).
    pub list: Vec<Budget>,
    /// Per tenant, the indices of its budgets, sorted by tenant.
    by_tenant: Vec<(String, Vec<u16>)>,
    /// How far the books trail a proxy, ms (`budget_books_lag_ms`): a
    /// proxy counts its own spend on top of a reading for this long
    /// before the reading's time.
    pub lag_ms: u64,
}

/// The default of `budget_books_lag_ms`: Envoy's access-log flush (1 s),
/// `ace ledger ingest --follow`'s poll and commit, the control service's
/// read, with room to spare.
pub const DEFAULT_LAG_MS: u64 = 5_000;

impl Budgets {
    /// The budgets that count tenant `tenant`'s spend (none: empty).
    pub fn of(&self, tenant: &str) -> &[u16] {
        self.by_tenant
            .binary_search_by(|(t, _)| t.as_str().cmp(tenant))
            .ok()
            .and_then(|i| self.by_tenant.get(i))
            .map_or(&[], |(_, b)| b.as_slice())
    }

    /// The budget named `name`, with its index.
    pub fn named(&self, name: &str) -> Option<(usize, &Budget)> {
        self.list.iter().enumerate().find(|(_, b)| b.name == name)
    }

    /// Every tenant with a budget, sorted.
    pub fn tenants(&self) -> impl Iterator<Item = &str> {
        self.by_tenant.iter().map(|(t, _)| t.as_str())
    }

    /// Validate `raw`, naming the first bad field (`budgets[2].soft_at`).
    pub fn validate(raw: &[BudgetSettings]) -> Result<Budgets, ConfigError> {
        if raw.len() > MAX_BUDGETS {
            return Err(err(
                "budgets",
                format!("lists {} budgets; at most {MAX_BUDGETS}", raw.len()),
            ));
        }
        let mut list = Vec::with_capacity(raw.len());
        let mut by_tenant: Vec<(String, Vec<u16>)> = Vec::new();
        for (i, b) in raw.iter().enumerate() {
            b.validate_name(i, raw)?;
            b.add_tenants(i, &mut by_tenant)?;
            list.push(b.validate(i)?);
        }
        by_tenant.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(Budgets {
            list,
            by_tenant,
            lag_ms: DEFAULT_LAG_MS,
        })
    }
}

impl BudgetSettings {
    /// Check budget `i`'s name: printable, and not another one's of `all`.
    fn validate_name(&self, i: usize, all: &[BudgetSettings]) -> Result<(), ConfigError> {
        let at = |f: &str| format!("budgets[{i}].{f}");
        if self.name.trim().is_empty() || self.name.len() > 256 {
            return Err(err(at("name"), "must be a name of 1 to 256 bytes"));
        }
        if self
            .name
            .chars()
            .any(|c| c.is_control() || c == '"' || c == '\\')
        {
            return Err(err(
                at("name"),
                "may not hold control characters, quotes or backslashes (it is written into \
                 headers and error bodies)",
            ));
        }
        if all.iter().take(i).any(|o| o.name == self.name) {
            return Err(err(
                at("name"),
                format!("`{}` names two budgets", self.name),
            ));
        }
        Ok(())
    }

    /// Check budget `i`'s tenants (some, none empty, none twice) and add
    /// `i` to each one's budgets in `by_tenant`.
    fn add_tenants(
        &self,
        i: usize,
        by_tenant: &mut Vec<(String, Vec<u16>)>,
    ) -> Result<(), ConfigError> {
        if self.tenants.is_empty() {
            return Err(err(
                format!("budgets[{i}].tenants"),
                "must name at least one tenant",
            ));
        }
        for (j, t) in self.tenants.iter().enumerate() {
            if t.trim().is_empty() {
                return Err(err(format!("budgets[{i}].tenants[{j}]"), "is empty"));
            }
            match by_tenant.iter_mut().find(|(n, _)| n == t) {
                Some((_, v)) if v.last() == Some(&(i as u16)) => {
                    return Err(err(
                        format!("budgets[{i}].tenants[{j}]"),
                        format!("`{t}` is listed twice"),
                    ))
                }
                Some((_, v)) => v.push(i as u16),
                None => by_tenant.push((t.clone(), vec![i as u16])),
            }
        }
        Ok(())
    }

    /// Check budget `i`'s limits, period and soft step (its name and
    /// tenants are checked apart).
    fn validate(&self, i: usize) -> Result<Budget, ConfigError> {
        let at = |f: &str| format!("budgets[{i}].{f}");
        if let Some(usd) = self.usd {
            if !(usd.is_finite() && usd > 0.0 && usd <= 1e9) {
                return Err(err(
                    at("usd"),
                    "must be a positive amount of USD, at most 1e9",
                ));
            }
        }
        if self.usd.is_none() && self.tokens_per_minute.is_none() {
            return Err(err(
                at("usd"),
                "is missing and so is tokens_per_minute: a budget must limit spend, tokens or \
                 both",
            ));
        }
        let period = self.period(i)?;
        let soft_at = self.soft_at.unwrap_or(0.8);
        if !(soft_at.is_finite() && soft_at > 0.0 && soft_at <= 1.0) {
            return Err(err(
                at("soft_at"),
                "must be a share of usd above 0 and at most 1 (1: no soft step)",
            ));
        }
        let soft = match &self.soft {
            None => Soft {
                tiers: Some(vec![Tier::InHouse, Tier::Reserved]),
                max_usd_per_token: f64::INFINITY,
                substitution_only: false,
            },
            Some(s) => s.validate(i)?,
        };
        if let Some(t) = self.tokens_per_minute {
            if !(1..=MAX_TOKENS_PER_MINUTE).contains(&t) {
                return Err(err(
                    at("tokens_per_minute"),
                    format!("must be from 1 to {MAX_TOKENS_PER_MINUTE}"),
                ));
            }
        }
        Ok(Budget {
            name: self.name.clone(),
            tenants: self.tenants.clone(),
            usd: self.usd,
            period,
            soft_at,
            soft,
            tokens_per_minute: self.tokens_per_minute,
        })
    }

    /// Budget `i`'s period (`window_s` only with `rolling`, and needed
    /// there).
    fn period(&self, i: usize) -> Result<Period, ConfigError> {
        let at = |f: &str| format!("budgets[{i}].{f}");
        match (self.period.as_deref(), self.window_s) {
            (None | Some("day"), None) => Ok(Period::Day),
            (Some("week"), None) => Ok(Period::Week),
            (Some("month"), None) => Ok(Period::Month),
            (Some("rolling"), Some(s)) if (5..=31 * 86_400).contains(&s) => {
                Ok(Period::Rolling { ms: s * 1000 })
            }
            (Some("rolling"), Some(_)) => Err(err(
                at("window_s"),
                "must be from 5 to 2678400 (31 days) seconds",
            )),
            (Some("rolling"), None) => Err(err(
                at("window_s"),
                "is missing: a rolling period needs its length in seconds",
            )),
            (Some("day" | "week" | "month") | None, Some(_)) => Err(err(
                at("window_s"),
                "is set but the period is not `rolling`; drop it or set period to rolling",
            )),
            (Some(p), _) => Err(err(
                at("period"),
                format!("`{p}` is not a period: day, week, month or rolling"),
            )),
        }
    }
}

impl SoftSettings {
    /// Check budget `i`'s soft step: at least one rule, each valid.
    fn validate(&self, i: usize) -> Result<Soft, ConfigError> {
        let tiers = match &self.tiers {
            None => None,
            Some(names) => {
                let mut tiers = Vec::with_capacity(names.len());
                for (j, n) in names.iter().enumerate() {
                    let t = Tier::parse(n).ok_or_else(|| {
                        err(
                            format!("budgets[{i}].soft.tiers[{j}]"),
                            format!("`{n}` is not a tier: {}", Tier::EXPECTED),
                        )
                    })?;
                    tiers.push(t);
                }
                Some(tiers)
            }
        };
        let max_usd_per_token = match self.max_usd_per_mtok {
            None => f64::INFINITY,
            Some(m) if m.is_finite() && m >= 0.0 => m / 1e6,
            Some(_) => {
                return Err(err(
                    format!("budgets[{i}].soft.max_usd_per_mtok"),
                    "must be a non-negative number of USD per million tokens",
                ))
            }
        };
        if tiers.is_none() && self.max_usd_per_mtok.is_none() && !self.substitution_only {
            return Err(err(
                format!("budgets[{i}].soft"),
                "allows everything: give tiers, max_usd_per_mtok or substitution_only (or set \
                 soft_at to 1 for no soft step)",
            ));
        }
        Ok(Soft {
            tiers,
            max_usd_per_token,
            substitution_only: self.substitution_only,
        })
    }
}

/// The warning for budgets (`names`) that count spend by the `tenant`
/// attribute as the client's `x-ace-tenant` header gives it: a client that
/// names another tenant spends that tenant's budget and escapes its own.
/// `ace plugin-config` prints it, and the filter logs it once when it
/// loads such a configuration; `attribute_sources.tenant` (a source the
/// client cannot forge) silences it.
pub fn unverified_tenant(names: &[&str]) -> String {
    let listed: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    let (noun, verb) = if names.len() == 1 {
        ("budget", "counts")
    } else {
        ("budgets", "count")
    };
    format!(
        "{noun} {} {verb} spend by the `tenant` attribute, which this configuration takes from \
         the client's `x-ace-tenant` header: a client that sends another tenant's name spends \
         that tenant's budget and escapes its own. Verify the tenant: set \
         `attribute_sources.tenant` to a source the client cannot forge, the mTLS peer \
         ({{\"peer\": \"uri_san\"}}) or metadata an authentication filter before ACE wrote \
         ({{\"metadata\": {{\"namespace\": \"envoy.filters.http.ext_authz\", \"path\": \
         [\"tenant\"]}}}}), or have Envoy set `x-ace-tenant` itself after removing the \
         client's",
        listed.join(", ")
    )
}

/// [`unverified_tenant`] for `cfg`, when its budgets count a tenant
/// attribute with no verified source.
pub fn unverified_tenant_in(cfg: &crate::Config) -> Option<String> {
    if cfg.budgets.list.is_empty() {
        return None;
    }
    let policy = cfg.policy.as_ref()?;
    let tenant = policy.attributes.get(policy.tenant?)?;
    if tenant.trusted.is_some() {
        return None;
    }
    let names: Vec<&str> = cfg.budgets.list.iter().map(|b| b.name.as_str()).collect();
    Some(unverified_tenant(&names))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<Budgets, ConfigError> {
        let raw: Vec<BudgetSettings> = serde_json::from_str(json).unwrap();
        Budgets::validate(&raw)
    }

    #[test]
    fn periods_begin_and_reset_on_utc_boundaries() {
        // 2026-12-07T01:30:00Z, a Monday.
        let now = 1_796_607_000_000;
        let day = Period::Day.window(now);
        assert_eq!(day, (1_796_601_600_000, 1_796_688_000_000));
        assert_eq!(
            Period::Week.window(now),
            (1_796_601_600_000, 1_797_206_400_000)
        );
        // December 2026: from the 1st to January 1st, 2027.
        assert_eq!(
            Period::Month.window(now),
            (1_796_083_200_000, 1_798_761_600_000)
        );
        // February of a leap year ends on the 29th.
        let feb = 1_709_208_000_000; // 2024-02-29T12:00:00Z
        assert_eq!(
            Period::Month.window(feb),
            (1_706_745_600_000, 1_709_251_200_000)
        );
        assert_eq!(
            Period::Rolling { ms: 3_600_000 }.window(now),
            (now - 3_600_000, 0)
        );
        assert_eq!(rfc3339(day.1), "2026-12-08T00:00:00Z");
        assert_eq!(rfc3339(now + 1_234), "2026-12-07T01:30:01Z");
        // A boundary belongs to the period it starts.
        assert_eq!(Period::Day.window(day.1).0, day.1);
    }

    #[test]
    fn a_budget_steps_from_ok_to_soft_to_exhausted() {
        let b = &parse(r#"[{"name":"a","tenants":["t"],"usd":100}]"#)
            .unwrap()
            .list[0];
        assert_eq!(b.state(79.99), State::Ok);
        assert_eq!(b.state(80.0), State::Soft);
        assert_eq!(b.state(100.0), State::Exhausted);
        assert_eq!(b.soft.tiers, Some(vec![Tier::InHouse, Tier::Reserved]));
        let tokens = &parse(r#"[{"name":"a","tenants":["t"],"tokens_per_minute":5}]"#).unwrap();
        assert_eq!(tokens.list[0].state(1e9), State::Ok);
    }

    #[test]
    fn a_tenant_finds_its_own_and_its_groups_budgets() {
        let b = parse(
            r#"[{"name":"a","tenants":["t1"],"usd":1},
                {"name":"g","tenants":["t2","t1"],"usd":5,"period":"month"}]"#,
        )
        .unwrap();
        assert_eq!(b.of("t1"), &[0, 1]);
        assert_eq!(b.of("t2"), &[1]);
        assert!(b.of("t3").is_empty());
        assert_eq!(b.tenants().collect::<Vec<_>>(), ["t1", "t2"]);
    }

    #[test]
    fn bad_budgets_are_named_by_field() {
        for (json, field) in [
            (
                r#"[{"name":"","tenants":["t"],"usd":1}]"#,
                "budgets[0].name",
            ),
            (
                r#"[{"name":"a\"b","tenants":["t"],"usd":1}]"#,
                "budgets[0].name",
            ),
            (
                r#"[{"name":"a","tenants":["t"],"usd":1},{"name":"a","tenants":["u"],"usd":1}]"#,
                "budgets[1].name",
            ),
            (
                r#"[{"name":"a","tenants":[],"usd":1}]"#,
                "budgets[0].tenants",
            ),
            (
                r#"[{"name":"a","tenants":["t","t"],"usd":1}]"#,
                "budgets[0].tenants[1]",
            ),
            (
                r#"[{"name":"a","tenants":["t"],"usd":-1}]"#,
                "budgets[0].usd",
            ),
            (r#"[{"name":"a","tenants":["t"]}]"#, "budgets[0].usd"),
            (
                r#"[{"name":"a","tenants":["t"],"usd":1,"period":"year"}]"#,
                "budgets[0].period",
            ),
            (
                r#"[{"name":"a","tenants":["t"],"usd":1,"period":"rolling"}]"#,
                "budgets[0].window_s",
            ),
            (
                r#"[{"name":"a","tenants":["t"],"usd":1,"period":"day","window_s":60}]"#,
                "budgets[0].window_s",
            ),
            (
                r#"[{"name":"a","tenants":["t"],"usd":1,"soft_at":1.5}]"#,
                "budgets[0].soft_at",
            ),
            (
                r#"[{"name":"a","tenants":["t"],"usd":1,"soft":{}}]"#,
                "budgets[0].soft",
            ),
            (
                r#"[{"name":"a","tenants":["t"],"usd":1,"soft":{"tiers":["gpu"]}}]"#,
                "budgets[0].soft.tiers[0]",
            ),
            (
                r#"[{"name":"a","tenants":["t"],"usd":1,"soft":{"max_usd_per_mtok":-1}}]"#,
                "budgets[0].soft.max_usd_per_mtok",
            ),
            (
                r#"[{"name":"a","tenants":["t"],"tokens_per_minute":0}]"#,
                "budgets[0].tokens_per_minute",
            ),
        ] {
            let e = parse(json).unwrap_err();
            assert_eq!(e.field, field, "{json}: {e:?}");
        }
    }
}
