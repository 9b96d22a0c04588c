//! The control snapshot: what ACE's control service tells every filter
//! about the fleet, and the bytes that carry it.
//!
//! Why a crate of its own: the control service writes snapshots and both
//! filter builds (and a fuzzer) read them, so the format and its checks
//! live in one place that none of them owns. It does no I/O.
//!
//! What a snapshot may say, per destination named in the fleet manifest:
//! the model server's load ([`Load`]), the concurrent requests it can hold
//! now ([`Report::capacity`], from the planner), its per-token prices
//! ([`Price`]), a drain ([`Drain`], an eviction notice or an operator),
//! and the models resident on it ([`Report::warm`]). What it can never
//! say: that a destination exists, or that one may serve a request.
//! Feasibility is the compiled policy tables' alone; a reader resolves a
//! snapshot's names against its own configuration and rejects a snapshot
//! that names one it does not know.
//!
//! # Wire format, version 1
//!
//! Little-endian throughout; sizes in bytes.
//!
//! ```text
//! header   magic "ACSN" (4) | format u16 = 1 | flags u16 (BUDGETS = 1)
//!          version u64 | generated_ms u64 | count u32
//! count x  name | fields u8 (the bits of the sections that follow), then
//!          each section whose bit is set, in this order:
//!          LOAD = 1     load.running u32, load.waiting u32, load.kv_permille u16, load.stale u8
//!          HELD = 64    load.scraped_ms u64 (only with LOAD)
//!          CAPACITY = 2 capacity u32
//!          PRICE = 4    price.input f64, price.output f64
//!          HOURLY = 32  usd_per_hour f64
//!          DRAIN = 8    drain.until_ms u64, drain.reason u8
//!          WARM = 16    warm u16, then that many names
//! budgets  (only with flag BUDGETS) count u32, then count x
//!          budget.name name, budget.state u8, budget.spent_usd f64,
//!          budget.read_ms u64, budget.resets_ms u64
//! trailer  CRC-32 (IEEE) of every byte before it, u32
//! ```
//!
//! A name is its length (u16), then that many bytes of UTF-8. A `u8`
//! that is a flag (`load.stale`) is 0 or 1; one that is a reason or a
//! state is its index in [`DrainReason::ALL`] or [`BudgetState::ALL`].
//! Each field is named as errors name it. The sections, their fields and
//! their checks are described once (`wire.rs`), and encoding, decoding,
//! [`encoded_len`] and the checks are generated from that description; a
//! test holds this table to it.
//!
//! Budgets ([`Budget`]) are per tenant budget of the plugin
//! configuration, not per destination: what the books say a budget has
//! spent in its period, read by the control service from the ledger's
//! store. Like every snapshot figure they can narrow what a request may
//! use, never widen it (the filter keeps the highest state it was told
//! until a newer reading, and counts its own spend on top).
//!
//! Compact because every Envoy worker copies it out of shared data and
//! decodes it (about 30 bytes per destination without warm models); a
//! CRC because it crosses a network and Envoy's shared memory; a
//! `version` so that a reader decodes each snapshot once and a poller can
//! be answered "not modified" ([`etag`]). [`decode`] checks everything,
//! including the [limits](MAX_BYTES), and names the destination and field
//! of the first problem; [`encode`] applies the same checks, so the
//! service can never publish what a filter would refuse.
#![no_std]
#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![deny(clippy::panic, clippy::indexing_slicing)]

extern crate alloc;

mod wire;

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

pub use wire::{checksum, decode, encode, encoded_len, etag};

/// The largest snapshot accepted, in bytes.
pub const MAX_BYTES: usize = 8 << 20;
/// The most destinations a snapshot may report on.
pub const MAX_DESTINATIONS: usize = 4096;
/// The longest destination or model name, in bytes.
pub const MAX_NAME: usize = 256;
/// The most warm models (base models and adapters) per destination.
pub const MAX_WARM: usize = 1024;
/// The most requests a load figure may report (running or waiting).
pub const MAX_REQUESTS: u32 = 1_000_000;
/// The most concurrent requests a capacity may give.
pub const MAX_SLOTS: u32 = 1_000_000;
/// The highest per-token price accepted, USD (10,000 USD per million
/// tokens: two orders of magnitude above any list price).
pub const MAX_USD_PER_TOKEN: f64 = 0.01;
/// The highest hourly price accepted for one destination's GPUs, USD.
pub const MAX_USD_PER_HOUR: f64 = 100_000.0;
/// The most tenant budgets a snapshot may report on.
pub const MAX_BUDGETS: usize = 4096;
/// The largest spend a budget reading may carry, USD (a billion: far
/// above any one period's inference bill).
pub const MAX_SPENT_USD: f64 = 1e9;

/// One snapshot of the fleet, as the control service saw it.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Snapshot {
    /// Grows with every change the service publishes; a reader applies a
    /// snapshot once per version.
    pub version: u64,
    /// When the service built it (Unix ms).
    pub generated_ms: u64,
    /// One report per destination the service knows something about;
    /// a destination left out is one it has nothing to say of.
    pub reports: Vec<Report>,
    /// One reading per tenant budget the service could read from the
    /// books; a budget left out is one it has no reading of (a reader
    /// keeps its last).
    #[cfg_attr(feature = "serde", serde(default))]
    pub budgets: Vec<Budget>,
}

impl Snapshot {
    /// The report on destination `name`, if it has one.
    pub fn report(&self, name: &str) -> Option<&Report> {
        self.reports.iter().find(|r| r.name == name)
    }
}

/// What the books say of one tenant budget in its current period.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Budget {
    /// The budget's name in the plugin configuration.
    pub name: String,
    /// What the service makes of the spend against the budget.
    pub state: BudgetState,
    /// Booked (true marginal) cost of the budget's tenants since its
    /// period began, USD, as the ledger's store held it at `read_ms`.
    pub spent_usd: f64,
    /// When the store was read, Unix ms: a reader replaces a budget's
    /// reading only with a later one, and counts its own spend since.
    pub read_ms: u64,
    /// When the period ends and the spend starts again from zero, Unix
    /// ms; 0 for a rolling window (spend ages out instead).
    pub resets_ms: u64,
}

/// Where a budget stands; ordered, so that the stricter of two states is
/// the larger.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum BudgetState {
    /// Below its soft threshold: no limit.
    #[default]
    Ok = 0,
    /// Past its soft threshold: only what the budget's `soft` allows.
    Soft = 1,
    /// At or past its amount: refused.
    Exhausted = 2,
}

impl BudgetState {
    /// Every state, in wire order.
    pub const ALL: [BudgetState; 3] = [BudgetState::Ok, BudgetState::Soft, BudgetState::Exhausted];

    /// Its name in logs, events, headers and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetState::Ok => "ok",
            BudgetState::Soft => "soft",
            BudgetState::Exhausted => "exhausted",
        }
    }
}

/// What the control service knows of one destination. Every field but
/// the name is optional: `None` means "nothing to say", and a reader
/// keeps its configured figure.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Report {
    /// The destination's name in the fleet manifest.
    pub name: String,
    /// The model server's own load figures.
    pub load: Option<Load>,
    /// Concurrent requests it can hold now (owned GPUs the planner gave
    /// to batch work are not capacity for inference); 0 closes it.
    pub capacity: Option<u32>,
    /// Its per-token prices now (in-house, reserved and pay-as-you-go
    /// destinations, priced by the token).
    pub price: Option<Price>,
    /// What its GPUs cost per hour now, all of them together, USD (spot
    /// and on-demand destinations, priced by the GPU-hour).
    pub usd_per_hour: Option<f64>,
    /// No new requests until a time.
    pub drain: Option<Drain>,
    /// The models and adapters resident on it now (warm: no cold load).
    pub warm: Option<Vec<String>>,
}

/// A model server's load, from its metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Load {
    /// Requests running (in the batch).
    pub running: u32,
    /// Requests queued behind them.
    pub waiting: u32,
    /// KV-cache use, in thousandths (0-1000).
    pub kv_permille: u16,
    /// The last scrape failed or is late: these are the last good
    /// figures, held (never read as idle) until a scrape succeeds.
    pub stale: bool,
    /// When held figures were scraped, Unix ms: set only with `stale`
    /// (0 otherwise, and 0 when unknown). A reader prices held figures for
    /// a bound of its own from this instant, then stops: a server that
    /// stopped answering must not keep phantom requests priced forever.
    /// Fresh figures carry no time, so an unchanged fleet keeps its
    /// version (and its 304s) from one scrape to the next.
    pub scraped_ms: u64,
}

impl Load {
    /// Requests in the server: running and waiting.
    pub fn requests(&self) -> u32 {
        self.running.saturating_add(self.waiting)
    }
}

/// Per-token prices, USD.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Price {
    /// USD per input (prompt) token.
    pub usd_per_input_token: f64,
    /// USD per output (completion) token.
    pub usd_per_output_token: f64,
}

/// A drain: no new requests until `until_ms`; those in flight finish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Drain {
    /// Until when (Unix ms).
    pub until_ms: u64,
    /// Why.
    pub reason: DrainReason,
}

/// Why a destination is drained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum DrainReason {
    /// The cloud gave notice that the (spot) machine will be reclaimed.
    Eviction = 0,
    /// An operator asked for it.
    Operator = 1,
}

impl DrainReason {
    /// Every reason, in wire order.
    pub const ALL: [DrainReason; 2] = [DrainReason::Eviction, DrainReason::Operator];

    /// Its name in logs and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            DrainReason::Eviction => "eviction",
            DrainReason::Operator => "operator",
        }
    }
}

/// A snapshot that cannot be encoded or decoded: where, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Error {
    /// Byte offset where decoding stopped (0 when encoding).
    pub at: usize,
    /// The report it was in (index, and name once read), or the budget
    /// reading (see `field`, which then starts with `budget`).
    pub destination: Option<(usize, Option<String>)>,
    /// The field, as the wire format names it (`price.input`, `warm[3]`).
    pub field: &'static str,
    /// What is wrong with it.
    pub problem: Problem,
}

/// What is wrong with a snapshot field.
#[derive(Clone, Debug, PartialEq)]
pub enum Problem {
    /// The bytes end inside it.
    Truncated,
    /// Not a snapshot: the magic is not `ACSN`.
    NotASnapshot,
    /// A format version this reader does not know.
    UnknownFormat(u16),
    /// Reserved bits are set.
    Reserved(u64),
    /// The checksum does not match: damaged in transit or in memory.
    Checksum {
        /// The CRC the trailer carries.
        stored: u32,
        /// The CRC of the bytes.
        computed: u32,
    },
    /// Larger than a limit.
    TooLarge {
        /// The value found.
        found: u64,
        /// The limit.
        max: u64,
    },
    /// An empty name.
    Empty,
    /// A name that is not UTF-8.
    NotUtf8,
    /// A name already given earlier.
    Duplicate,
    /// A per-token price that is not a finite number of dollars from 0 to
    /// [`MAX_USD_PER_TOKEN`] (NaN, infinite, negative, absurd).
    NotAPrice,
    /// An hourly price that is not a finite number of dollars from 0 to
    /// [`MAX_USD_PER_HOUR`].
    NotAnHourlyPrice,
    /// Bytes left over between the last report and the checksum.
    TrailingBytes(usize),
    /// A scrape time on figures that are not stale (or without a load).
    HeldNotStale,
    /// A budget's spend that is not a finite number of dollars from 0 to
    /// [`MAX_SPENT_USD`].
    NotASpend,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("control snapshot")?;
        match &self.destination {
            Some((i, Some(name))) if self.field.starts_with("budget") => {
                write!(f, ", budget {i} `{name}`")?
            }
            Some((i, None)) if self.field.starts_with("budget") => write!(f, ", budget {i}")?,
            Some((i, Some(name))) => write!(f, ", destination {i} `{name}`")?,
            Some((i, None)) => write!(f, ", destination {i}")?,
            None => {}
        }
        write!(f, ", field `{}`", self.field)?;
        if self.at > 0 {
            write!(f, " (byte {})", self.at)?;
        }
        f.write_str(": ")?;
        match &self.problem {
            Problem::Truncated => f.write_str("the snapshot ends inside this field"),
            Problem::NotASnapshot => f.write_str("not an ACE control snapshot (no `ACSN` magic)"),
            Problem::UnknownFormat(v) => write!(
                f,
                "format version {v} is unknown to this reader (it reads version 1): upgrade the filter or pin the control service"
            ),
            Problem::Reserved(bits) => write!(f, "reserved bits {bits:#x} are set"),
            Problem::Checksum { stored, computed } => write!(
                f,
                "checksum {stored:#010x} does not match the bytes ({computed:#010x}): the snapshot was damaged"
            ),
            Problem::TooLarge { found, max } => write!(f, "{found} is above the limit of {max}"),
            Problem::Empty => f.write_str("a name may not be empty"),
            Problem::NotUtf8 => f.write_str("a name must be UTF-8"),
            Problem::Duplicate => f.write_str("this name is given twice"),
            Problem::NotAPrice => write!(
                f,
                "a price must be a finite number of USD per token from 0 to {MAX_USD_PER_TOKEN}"
            ),
            Problem::NotAnHourlyPrice => write!(
                f,
                "an hourly price must be a finite number of USD from 0 to {MAX_USD_PER_HOUR}"
            ),
            Problem::TrailingBytes(n) => write!(f, "{n} bytes follow the last report"),
            Problem::HeldNotStale => {
                f.write_str("a scrape time is carried only with a stale load")
            }
            Problem::NotASpend => write!(
                f,
                "a budget's spend must be a finite number of USD from 0 to {MAX_SPENT_USD}"
            ),
        }
    }
}

impl core::error::Error for Error {}
