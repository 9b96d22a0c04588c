//! The stored record of one event: what was logged plus the ledger's own
//! figures, in one flat shape that both stores hold column for column.
//!
//! The column list lives here once, with the conversions to and from
//! untyped column values, so SQLite and PostgreSQL cannot drift apart.

use crate::event::Event;
use crate::money::Nano;
use crate::price::{self, Priced};

/// One booked event.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Row {
    pub event_id: String,
    pub schema: String,
    pub config: String,
    pub request_id: Option<String>,
    pub time_ms: i64,
    pub tenant: Option<String>,
    pub data_class: Option<String>,
    pub latency_class: Option<String>,
    pub model_requested: Option<String>,
    pub model_served: Option<String>,
    pub destination: Option<String>,
    pub tier: Option<String>,
    pub tokens_in: i64,
    pub tokens_out: i64,
    pub tokens_estimated: bool,
    pub status: i64,
    pub latency_ms: i64,
    pub slo_ms: Option<i64>,
    pub slo_met: Option<bool>,
    pub warm: Option<bool>,
    pub overage: bool,
    pub usage_capped: bool,
    pub cached: bool,
    pub cache_false_hit: bool,
    pub reason: String,
    /// The filter's marginal cost, nano-dollars (compared, not booked).
    pub filter_marginal: Option<Nano>,
    /// The filter's counterfactual, nano-dollars (compared, not booked).
    pub filter_counterfactual: Option<Nano>,
    /// The ledger's true marginal cost.
    pub booked: Nano,
    /// Cheapest feasible pay-as-you-go, model asked for.
    pub counterfactual: Option<Nano>,
    /// Cheapest feasible pay-as-you-go, model served.
    pub served_counterfactual: Option<Nano>,
    /// The filter's figures that disagree with the ledger's, and
    /// [`CONFLICT_FLAG`] on an event booked apart because another event
    /// held its id (comma-separated).
    pub flags: String,
}

/// The flag of a row booked under a derived id because a different event
/// was stored under its `event_id` first (see `ingest`).
pub const CONFLICT_FLAG: &str = "event_id_conflict";

/// The columns, in order, with their SQL types (valid in SQLite and
/// PostgreSQL alike).
pub const COLUMNS: [(&str, &str); 31] = [
    ("event_id", "TEXT PRIMARY KEY"),
    ("schema", "TEXT NOT NULL"),
    ("config", "TEXT NOT NULL"),
    ("request_id", "TEXT"),
    ("time_ms", "BIGINT NOT NULL"),
    ("tenant", "TEXT"),
    ("data_class", "TEXT"),
    ("latency_class", "TEXT"),
    ("model_requested", "TEXT"),
    ("model_served", "TEXT"),
    ("destination", "TEXT"),
    ("tier", "TEXT"),
    ("tokens_in", "BIGINT NOT NULL"),
    ("tokens_out", "BIGINT NOT NULL"),
    ("tokens_estimated", "BOOLEAN NOT NULL"),
    ("status", "BIGINT NOT NULL"),
    ("latency_ms", "BIGINT NOT NULL"),
    ("slo_ms", "BIGINT"),
    ("slo_met", "BOOLEAN"),
    ("warm", "BOOLEAN"),
    ("overage", "BOOLEAN NOT NULL"),
    ("usage_capped", "BOOLEAN NOT NULL"),
    ("cached", "BOOLEAN NOT NULL"),
    ("cache_false_hit", "BOOLEAN NOT NULL"),
    ("reason", "TEXT NOT NULL"),
    ("filter_marginal_nano", "BIGINT"),
    ("filter_counterfactual_nano", "BIGINT"),
    ("booked_nano", "BIGINT NOT NULL"),
    ("counterfactual_nano", "BIGINT"),
    ("served_counterfactual_nano", "BIGINT"),
    ("flags", "TEXT NOT NULL"),
];

/// An untyped column value, as both stores bind it.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    Text(Option<String>),
    Int(Option<i64>),
    Bool(Option<bool>),
}

/// Reads a stored row's columns by index.
pub trait Cols {
    fn text(&self, i: usize) -> anyhow::Result<Option<String>>;
    fn int(&self, i: usize) -> anyhow::Result<Option<i64>>;
    fn boolean(&self, i: usize) -> anyhow::Result<Option<bool>>;
}

fn need<T>(v: Option<T>, i: usize) -> anyhow::Result<T> {
    v.ok_or_else(|| {
        let name = COLUMNS.get(i).map_or("?", |c| c.0);
        anyhow::anyhow!("column `{name}` is NULL in the store; it is NOT NULL in the schema")
    })
}

impl Row {
    /// The row for event `e` priced `p` under configuration `config`.
    pub fn new(e: Event, config: String, p: Priced) -> Row {
        let flags = price::disagreements(&e, &p);
        Row {
            event_id: e.event_id.unwrap_or_default(),
            schema: e.schema,
            config,
            request_id: e.request_id,
            time_ms: e.time_ms.min(i64::MAX as u64) as i64,
            tenant: e.tenant,
            data_class: e.data_class,
            latency_class: e.latency_class,
            model_requested: e.model_requested,
            model_served: e.model_served,
            destination: e.destination,
            tier: e.tier,
            tokens_in: i64::from(e.tokens_in),
            tokens_out: i64::from(e.tokens_out),
            tokens_estimated: e.tokens_estimated,
            status: i64::from(e.status),
            latency_ms: e.latency_ms.min(i64::MAX as u64) as i64,
            slo_ms: e.slo_ms.map(|v| v.min(i64::MAX as u64) as i64),
            slo_met: e.slo_met,
            warm: e.warm,
            overage: e.overage,
            usage_capped: e.usage_capped,
            cached: e.cached,
            cache_false_hit: e.cache_false_hit,
            reason: e.reason,
            filter_marginal: price::filter_nano(e.marginal_usd),
            filter_counterfactual: price::filter_nano(e.counterfactual_usd),
            booked: p.booked,
            counterfactual: p.counterfactual,
            served_counterfactual: p.served_counterfactual,
            flags,
        }
    }

    /// The column values, in [`COLUMNS`] order.
    pub fn values(&self) -> [Val; 31] {
        use Val::{Bool as B, Int as I, Text as T};
        let s = |v: &Option<String>| T(v.clone());
        [
            T(Some(self.event_id.clone())),
            T(Some(self.schema.clone())),
            T(Some(self.config.clone())),
            s(&self.request_id),
            I(Some(self.time_ms)),
            s(&self.tenant),
            s(&self.data_class),
            s(&self.latency_class),
            s(&self.model_requested),
            s(&self.model_served),
            s(&self.destination),
            s(&self.tier),
            I(Some(self.tokens_in)),
            I(Some(self.tokens_out)),
            B(Some(self.tokens_estimated)),
            I(Some(self.status)),
            I(Some(self.latency_ms)),
            I(self.slo_ms),
            B(self.slo_met),
            B(self.warm),
            B(Some(self.overage)),
            B(Some(self.usage_capped)),
            B(Some(self.cached)),
            B(Some(self.cache_false_hit)),
            T(Some(self.reason.clone())),
            I(self.filter_marginal),
            I(self.filter_counterfactual),
            I(Some(self.booked)),
            I(self.counterfactual),
            I(self.served_counterfactual),
            T(Some(self.flags.clone())),
        ]
    }

    /// Read a row back from its columns.
    pub fn read(c: &dyn Cols) -> anyhow::Result<Row> {
        let t = |i| need(c.text(i)?, i);
        let n = |i| need(c.int(i)?, i);
        let b = |i| need(c.boolean(i)?, i);
        Ok(Row {
            event_id: t(0)?,
            schema: t(1)?,
            config: t(2)?,
            request_id: c.text(3)?,
            time_ms: n(4)?,
            tenant: c.text(5)?,
            data_class: c.text(6)?,
            latency_class: c.text(7)?,
            model_requested: c.text(8)?,
            model_served: c.text(9)?,
            destination: c.text(10)?,
            tier: c.text(11)?,
            tokens_in: n(12)?,
            tokens_out: n(13)?,
            tokens_estimated: b(14)?,
            status: n(15)?,
            latency_ms: n(16)?,
            slo_ms: c.int(17)?,
            slo_met: c.boolean(18)?,
            warm: c.boolean(19)?,
            overage: b(20)?,
            usage_capped: b(21)?,
            cached: b(22)?,
            cache_false_hit: b(23)?,
            reason: t(24)?,
            filter_marginal: c.int(25)?,
            filter_counterfactual: c.int(26)?,
            booked: n(27)?,
            counterfactual: c.int(28)?,
            served_counterfactual: c.int(29)?,
            flags: t(30)?,
        })
    }

    /// This row without the ledger's own figures (booked cost,
    /// counterfactuals, flags): what the line said, as the ingest read it.
    /// Two rows are the same event when these agree, so ingesting a log
    /// again after the ledger's pricing changed is still idempotent.
    pub fn logged(&self) -> Row {
        Row {
            booked: 0,
            counterfactual: None,
            served_counterfactual: None,
            flags: String::new(),
            ..self.clone()
        }
    }

    /// Whether the filter's logged figures disagree with the ledger's.
    pub fn disagrees(&self) -> bool {
        self.flags
            .split(',')
            .any(|f| !f.is_empty() && f != CONFLICT_FLAG)
    }

    /// Whether this row was booked apart from another event that holds its
    /// logged `event_id`.
    pub fn conflicted(&self) -> bool {
        self.flags.split(',').any(|f| f == CONFLICT_FLAG)
    }

    /// Whether the request was served: a destination (or the cache)
    /// answered with anything but a 5xx or a 429. Only served requests earn
    /// savings.
    pub fn served(&self) -> bool {
        (self.destination.is_some() || self.cached)
            && (1..500).contains(&self.status)
            && self.status != 429
    }
}
