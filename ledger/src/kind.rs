//! What the ledger does with each kind of event field: the type it reads
//! from the line, the check it makes, the type and SQL column it stores.
//!
//! The fields themselves are `ace_event::event_fields!` (see
//! `ace_event::schema`), each naming one of the kinds here: the reader
//! ([`crate::event::Event`]), the row ([`crate::row::Row`]) and the
//! store's columns are derived from that list and these kinds, so a new
//! field needs nothing in this crate.

use crate::money::{self, Nano};
use std::fmt::Debug;

/// The earliest `time_ms` booked: 2000-01-01T00:00:00Z. ACE did not
/// exist before; a smaller time (0, a clock never set) would stretch a
/// report's period, and with it every owned pool's charge, over decades.
pub const MIN_TIME_MS: u64 = 946_684_800_000;
/// The latest `time_ms` booked, exclusive: 2100-01-01T00:00:00Z. A fixed
/// bound (not "now"), so the same line is booked or refused the same way
/// on every ingest.
pub const MAX_TIME_MS: u64 = 4_102_444_800_000;
/// The longest `latency_ms` (and `slo_ms`) booked: one day. Latencies are
/// summed per pool, so an absurd one would claim a pool busy for ages.
pub const MAX_LATENCY_MS: u64 = 86_400_000;

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

/// `v`, which column `column` holds NOT NULL.
pub(crate) fn need<T>(v: Option<T>, column: &str) -> anyhow::Result<T> {
    v.ok_or_else(|| {
        anyhow::anyhow!("column `{column}` is NULL in the store; it is NOT NULL in the schema")
    })
}

/// `s` as text both stores hold: each NUL becomes `\u0000` (as the JSON
/// line spelled it).
pub fn storable(s: &mut String) {
    if s.contains('\0') {
        *s = s.replace('\0', "\\u0000");
    }
}

/// The filter's figure in nano-dollars, to store and to compare with the
/// ledger's.
pub fn filter_nano(usd: Option<f64>) -> Option<Nano> {
    usd.and_then(money::from_usd)
}

/// One kind of field (`ace_event::schema::Kind`).
pub trait Kind {
    /// As read from the line.
    type Read: serde::de::DeserializeOwned + Debug + Clone + PartialEq;
    /// As stored in a row.
    type Stored: Column + Debug + Clone + PartialEq + Eq + Default + serde::Serialize;
    /// The column's SQL type (valid in SQLite and PostgreSQL alike).
    const SQL: &'static str = <Self::Stored as Column>::SQL;
    /// The value an added `NOT NULL` column takes in rows stored before
    /// it existed (SQL).
    const EMPTY: &'static str = <Self::Stored as Column>::EMPTY;
    /// Refuse a value outside what the ledger books, naming the field (the
    /// line is then [`crate::event::LineError::Invalid`]).
    fn check(_name: &str, _v: &Self::Read) -> Result<(), String> {
        Ok(())
    }
    /// Make text storable in both stores (see [`storable`]).
    fn storable(_v: &mut Self::Read) {}
    /// The stored value.
    fn stored(v: Self::Read) -> Self::Stored;
    /// As a column value.
    fn val(v: &Self::Stored) -> Val {
        v.val()
    }
    /// Read column `i`, named `column`, back.
    fn get(c: &dyn Cols, i: usize, column: &str) -> anyhow::Result<Self::Stored> {
        Self::Stored::get(c, i, column)
    }
}

/// A value as a column holds it: `None` is NULL, and a column of a type
/// that is not an `Option` is NOT NULL.
pub trait Column: Sized {
    /// Its SQL type (valid in SQLite and PostgreSQL alike).
    const SQL: &'static str;
    /// The value an added column takes in rows stored before it existed
    /// (SQL).
    const EMPTY: &'static str = "NULL";
    /// As a column value.
    fn val(&self) -> Val;
    /// Read column `i`, named `column`, back.
    fn get(c: &dyn Cols, i: usize, column: &str) -> anyhow::Result<Self>;
}

/// A type whose column is NOT NULL: read as its `Option`, which must
/// hold a value.
pub trait NotNull: Clone {
    /// Its SQL type.
    const SQL: &'static str;
    /// Its empty value (SQL).
    const EMPTY: &'static str;
}

/// `$t` as a column of SQL type `$sql` NOT NULL, empty `$empty`, and
/// `Option<$t>` as one that may be NULL: bound as `Val::$val`, read by
/// `Cols::$read`.
macro_rules! column {
    ($t:ty, $sql:literal, $empty:literal, $val:ident, $read:ident) => {
        impl Column for Option<$t> {
            const SQL: &'static str = $sql;
            fn val(&self) -> Val {
                Val::$val(Clone::clone(self))
            }
            fn get(c: &dyn Cols, i: usize, _: &str) -> anyhow::Result<Self> {
                c.$read(i)
            }
        }

        impl NotNull for $t {
            const SQL: &'static str = concat!($sql, " NOT NULL");
            const EMPTY: &'static str = $empty;
        }
    };
}

column!(String, "TEXT", "''", Text, text);
column!(i64, "BIGINT", "0", Int, int);
column!(bool, "BOOLEAN", "FALSE", Bool, boolean);

impl<T: NotNull> Column for T
where
    Option<T>: Column,
{
    const SQL: &'static str = <T as NotNull>::SQL;
    const EMPTY: &'static str = <T as NotNull>::EMPTY;
    fn val(&self) -> Val {
        Some(self.clone()).val()
    }
    fn get(c: &dyn Cols, i: usize, column: &str) -> anyhow::Result<Self> {
        need(Option::<T>::get(c, i, column)?, column)
    }
}

/// A string, never null.
#[derive(Debug)]
pub struct Str;
/// An id: hex in current lines, absent from older ones.
#[derive(Debug)]
pub struct Id;
/// A string or null.
#[derive(Debug)]
pub struct StrOrNull;
/// An integer below 2^32.
#[derive(Debug)]
pub struct U32;
/// ms since the epoch, 2000 to 2100.
#[derive(Debug)]
pub struct EpochMs;
/// A duration, up to a day.
#[derive(Debug)]
pub struct Ms;
/// A duration or null.
#[derive(Debug)]
pub struct MsOrNull;
/// A boolean.
#[derive(Debug)]
pub struct Bool;
/// A boolean or null.
#[derive(Debug)]
pub struct BoolOrNull;
/// A dollar amount the filter computed (checked, never booked), stored in
/// nano-dollars.
#[derive(Debug)]
pub struct Usd;

/// A price the request was decided on (USD per token or per hour),
/// stored in picodollars: the line's twelve decimals, exactly. Its range
/// is pricing's to check ([`ace_pricing::price`]), which refuses the line.
#[derive(Debug)]
pub struct Rate;

/// Picodollars per dollar.
const PICO_PER_USD: f64 = 1e12;

fn clamp(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

fn within_a_day(name: &str, v: u64) -> Result<(), String> {
    if v > MAX_LATENCY_MS {
        return Err(format!(
            "field `{name}` is {v}, more than the ledger books ({MAX_LATENCY_MS} ms, \
             one day); the line is wrong"
        ));
    }
    Ok(())
}

impl Kind for Str {
    type Read = String;
    type Stored = String;
    fn storable(v: &mut String) {
        storable(v);
    }
    fn stored(v: String) -> String {
        v
    }
}

impl Kind for Id {
    type Read = Option<String>;
    type Stored = String;
    fn storable(v: &mut Option<String>) {
        v.iter_mut().for_each(storable);
    }
    fn stored(v: Option<String>) -> String {
        v.unwrap_or_default()
    }
}

impl Kind for StrOrNull {
    type Read = Option<String>;
    type Stored = Option<String>;
    fn storable(v: &mut Option<String>) {
        v.iter_mut().for_each(storable);
    }
    fn stored(v: Option<String>) -> Option<String> {
        v
    }
}

impl Kind for U32 {
    type Read = u32;
    type Stored = i64;
    fn stored(v: u32) -> i64 {
        i64::from(v)
    }
}

impl Kind for EpochMs {
    type Read = u64;
    type Stored = i64;
    fn check(name: &str, v: &u64) -> Result<(), String> {
        if !(MIN_TIME_MS..MAX_TIME_MS).contains(v) {
            return Err(format!(
                "field `{name}` is {v}, outside the times the ledger books \
                 ({MIN_TIME_MS}..{MAX_TIME_MS}: 2000-01-01 to 2100-01-01 UTC, in ms since the \
                 epoch); the writer's clock or the line is wrong"
            ));
        }
        Ok(())
    }
    fn stored(v: u64) -> i64 {
        clamp(v)
    }
}

impl Kind for Ms {
    type Read = u64;
    type Stored = i64;
    fn check(name: &str, v: &u64) -> Result<(), String> {
        within_a_day(name, *v)
    }
    fn stored(v: u64) -> i64 {
        clamp(v)
    }
}

impl Kind for MsOrNull {
    type Read = Option<u64>;
    type Stored = Option<i64>;
    fn check(name: &str, v: &Option<u64>) -> Result<(), String> {
        v.map_or(Ok(()), |v| within_a_day(name, v))
    }
    fn stored(v: Option<u64>) -> Option<i64> {
        v.map(clamp)
    }
}

impl Kind for Bool {
    type Read = bool;
    type Stored = bool;
    fn stored(v: bool) -> bool {
        v
    }
}

impl Kind for BoolOrNull {
    type Read = Option<bool>;
    type Stored = Option<bool>;
    fn stored(v: Option<bool>) -> Option<bool> {
        v
    }
}

impl Kind for Rate {
    type Read = Option<f64>;
    type Stored = Option<i64>;
    fn stored(v: Option<f64>) -> Option<i64> {
        v.map(|usd| (usd * PICO_PER_USD).round())
            .filter(|p| p.is_finite() && p.abs() < 9.0e18)
            .map(|p| p as i64)
    }
}

impl Kind for Usd {
    type Read = Option<f64>;
    type Stored = Option<Nano>;
    fn stored(v: Option<f64>) -> Option<Nano> {
        filter_nano(v)
    }
}
