//! Proof that the tables say what Cedar says.
//!
//! Why verify reads the compiled file rather than the in-memory result: the
//! claim worth proving is about the bytes the filter will load, through the
//! same `ace_core::tables` reader the filter uses. Why it asks
//! [`crate::oracle`] and not the compiler's project: a verify that shares
//! the compiler's entities and request building agrees with the compiler's
//! mistakes.
//!
//! Requests whose values are all known must match Cedar exactly. Requests
//! with an unknown value are asked of Cedar with values outside the domain;
//! there the tables must be no more permissive than Cedar (fail closed),
//! and anything they allow that Cedar denies is a mismatch.
//!
//! Coverage: when the request space times the destinations is at most
//! [`EXHAUSTIVE_DECISIONS`], every request is checked. Above it, the
//! checked requests are: every row of every factor (each combination of
//! the factor's attributes' known values) [`FILLS`] times, with the other
//! attributes at random known values; [`JOINT`] random requests with every
//! value known; and [`UNKNOWN_SAMPLES`] requests per attribute with that
//! attribute unknown. Every bit of every row is then exercised, but a wrong
//! bit can be hidden when another factor decides the same destination
//! the same way for the requests drawn; [`Report::coverage`] says what ran.

pub use crate::error::VerifyError;
use crate::oracle::Oracle;
use ace_core::tables::{Tables, UNKNOWN};

/// Above this many (request, destination) decisions, verify samples.
pub const EXHAUSTIVE_DECISIONS: u64 = 2_000_000;
/// Requests per factor row when sampling.
pub const FILLS: u64 = 2;
/// Random requests with every value known when sampling.
pub const JOINT: u64 = 1_000;
/// Requests per attribute with that attribute unknown when sampling.
pub const UNKNOWN_SAMPLES: u64 = 4;

/// One disagreement between the tables and Cedar.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// The request, spelled out.
    pub request: String,
    /// The destination name.
    pub destination: String,
    /// Cedar's answer.
    pub cedar: bool,
    /// The tables' answer.
    pub table: bool,
}

/// Which requests a sampled verify checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Coverage {
    /// Factor rows with every key known, each checked [`FILLS`] times.
    pub factor_rows: u64,
    /// Random requests with every value known.
    pub joint: u64,
    /// Requests with one attribute unknown.
    pub unknown: u64,
}

/// The outcome of [`verify`].
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Size of the request space, unknown values included (attributes
    /// without a domain count once).
    pub space: u64,
    /// Destinations per request.
    pub destinations: usize,
    /// Whether the request space was small enough to check whole (else it
    /// was sampled).
    pub exhaustive: bool,
    /// Whether the check stopped at its mismatch limit
    /// ([`verify_until`]) before the last request.
    pub stopped: bool,
    /// What a sampled verify checked (zero when exhaustive).
    pub coverage: Coverage,
    /// Requests checked.
    pub requests: u64,
    /// Of which all values known (checked for equality).
    pub known: u64,
    /// (request, destination) pairs checked.
    pub decisions: u64,
    /// Mismatches found (all of them are counted; `mismatches` keeps the
    /// first [`Report::KEEP`]).
    pub mismatch_count: u64,
    /// The first mismatches.
    pub mismatches: Vec<Mismatch>,
}

impl Report {
    /// Mismatches kept for printing.
    pub const KEEP: usize = 1000;

    /// One line saying what was checked.
    pub fn coverage_line(&self) -> String {
        if self.stopped {
            format!(
                "stopped at the first {} mismatches, after {} requests of {}",
                self.mismatch_count,
                self.requests,
                if self.exhaustive {
                    format!("the whole space ({})", self.space)
                } else {
                    "a sample".to_string()
                }
            )
        } else if self.exhaustive {
            format!(
                "exhaustive: all {} requests of the space (unknown values included)",
                self.space
            )
        } else {
            format!(
                "sampled ({} requests x {} destinations > {} decisions): every row of every factor ({} rows) x {FILLS} \
                 with the other attributes random and known, {} random requests with every value \
                 known, {} requests with one attribute unknown",
                self.space,
                self.destinations,
                EXHAUSTIVE_DECISIONS,
                self.coverage.factor_rows,
                self.coverage.joint,
                self.coverage.unknown
            )
        }
    }
}

/// A small deterministic generator (splitmix64), so runs are repeatable.
#[derive(Debug)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform below `n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// Checks `tables` against `oracle` on the request space, exhaustively or
/// by the sampling described in the module docs.
pub fn verify(oracle: &Oracle, tables: &[u8]) -> Result<Report, VerifyError> {
    verify_with_progress(oracle, tables, &mut |_, _| {})
}

/// [`verify`], stopping once `mismatches` mismatches are found (at least
/// one): enough to fail a check, without the rest of the space. The
/// report says it stopped ([`Report::stopped`]); with no mismatch it is
/// the whole check.
pub fn verify_until(
    oracle: &Oracle,
    tables: &[u8],
    mismatches: u64,
) -> Result<Report, VerifyError> {
    check_space(oracle, tables, &mut |_, _| {}, mismatches.max(1))
}

/// Requests checked between two calls of a [`verify_with_progress`]
/// callback: often enough for a progress bar to move smoothly, rarely enough
/// that calling out (to JavaScript, in the playground) costs nothing.
pub const PROGRESS_EVERY: u64 = 256;

/// [`verify`], calling `progress(checked, total)` (in requests) every
/// [`PROGRESS_EVERY`] requests and once at the end, for callers that show
/// how far a long verify has got.
pub fn verify_with_progress(
    oracle: &Oracle,
    tables: &[u8],
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Report, VerifyError> {
    check_space(oracle, tables, progress, u64::MAX)
}

/// The request space (whole, or sampled when too large) checked until
/// `limit` mismatches.
fn check_space(
    oracle: &Oracle,
    tables: &[u8],
    progress: &mut dyn FnMut(u64, u64),
    limit: u64,
) -> Result<Report, VerifyError> {
    let t = Tables::load(tables).map_err(|e| VerifyError(e.to_string()))?;
    oracle.check_tables(&t)?;
    // Radix per attribute: known values plus unknown; 1 without a domain.
    let radices: Vec<u64> = oracle
        .attributes
        .iter()
        .map(|a| {
            if a.domain {
                a.values.len() as u64 + 1
            } else {
                1
            }
        })
        .collect();
    let space = radices
        .iter()
        .try_fold(1u64, |acc, &r| acc.checked_mul(r))
        .unwrap_or(u64::MAX);
    let exhaustive = space.saturating_mul(oracle.destinations.len() as u64) <= EXHAUSTIVE_DECISIONS;
    let mut coverage = Coverage::default();
    let requests: Vec<Vec<u32>> = if exhaustive {
        (0..space).map(|n| decode(n, &radices)).collect()
    } else {
        sample(oracle, &t, &radices, &mut coverage)
    };
    let total = requests.len() as u64;
    let mut report = Report::default();
    let mut out = vec![0u64; t.words()];
    for (n, idx) in requests.iter().enumerate() {
        if (n as u64).is_multiple_of(PROGRESS_EVERY) {
            progress(n as u64, total);
        }
        check_one(oracle, &t, idx, &mut out, &mut report)?;
        if report.mismatch_count >= limit && n + 1 < requests.len() {
            report.stopped = true;
            break;
        }
    }
    progress(total, total);
    report.space = space;
    report.destinations = oracle.destinations.len();
    report.exhaustive = exhaustive;
    report.coverage = coverage;
    Ok(report)
}

/// Mixed-radix decode of `n` (most significant attribute first).
fn decode(mut n: u64, radices: &[u64]) -> Vec<u32> {
    let mut idx = vec![0u32; radices.len()];
    for (o, &rad) in idx.iter_mut().zip(radices).rev() {
        *o = (n % rad) as u32;
        n /= rad;
    }
    idx
}

/// The sampled requests: factor rows, joint, one unknown.
fn sample(
    oracle: &Oracle,
    t: &Tables<'_>,
    radices: &[u64],
    coverage: &mut Coverage,
) -> Vec<Vec<u32>> {
    let mut rng = Rng(0x00ac_e5ee_d000_0002);
    let fill = |rng: &mut Rng| -> Vec<u32> {
        radices
            .iter()
            .map(|&r| {
                if r > 1 {
                    1 + rng.below(r - 1) as u32
                } else {
                    0
                }
            })
            .collect()
    };
    let mut out = Vec::new();
    for f in 0..t.factor_count() {
        let Some(factor) = t.factor(f) else { continue };
        let keys: Vec<usize> = factor.attributes().map(|a| a as usize).collect();
        let known: Vec<u64> = keys
            .iter()
            .map(|&k| radices.get(k).map_or(1, |r| r.saturating_sub(1).max(1)))
            .collect();
        let rows: u64 = known.iter().product();
        coverage.factor_rows += rows;
        for row in 0..rows {
            let key_values = decode(row, &known);
            for _ in 0..FILLS {
                let mut idx = fill(&mut rng);
                for (&k, &v) in keys.iter().zip(&key_values) {
                    if let Some(slot) = idx.get_mut(k) {
                        // Attributes without a domain stay unknown.
                        *slot = if radices.get(k).copied().unwrap_or(1) > 1 {
                            v + 1
                        } else {
                            0
                        };
                    }
                }
                out.push(idx);
            }
        }
    }
    for _ in 0..JOINT {
        out.push(fill(&mut rng));
        coverage.joint += 1;
    }
    for (a, attr) in oracle.attributes.iter().enumerate() {
        if !attr.domain {
            continue;
        }
        for _ in 0..UNKNOWN_SAMPLES {
            let mut idx = fill(&mut rng);
            if let Some(slot) = idx.get_mut(a) {
                *slot = UNKNOWN;
            }
            out.push(idx);
            coverage.unknown += 1;
        }
    }
    out
}

/// Checks `tables` against `oracle` on the given requests (value-index
/// vectors, one entry per attribute, `0` = unknown).
pub fn verify_requests(
    oracle: &Oracle,
    tables: &[u8],
    requests: impl IntoIterator<Item = Vec<u32>>,
) -> Result<Report, VerifyError> {
    let t = Tables::load(tables).map_err(|e| VerifyError(e.to_string()))?;
    oracle.check_tables(&t)?;
    check(oracle, &t, requests)
}

fn check(
    oracle: &Oracle,
    t: &Tables<'_>,
    requests: impl IntoIterator<Item = Vec<u32>>,
) -> Result<Report, VerifyError> {
    let mut report = Report::default();
    let mut out = vec![0u64; t.words()];
    for idx in requests {
        check_one(oracle, t, &idx, &mut out, &mut report)?;
    }
    Ok(report)
}

/// Whether every attribute with a domain has a known value in `idx`.
pub fn all_known(oracle: &Oracle, idx: &[u32]) -> bool {
    oracle
        .attributes
        .iter()
        .zip(idx)
        .all(|(a, &i)| !a.domain || i != UNKNOWN)
}

fn check_one(
    oracle: &Oracle,
    t: &Tables<'_>,
    idx: &[u32],
    out: &mut [u64],
    report: &mut Report,
) -> Result<(), VerifyError> {
    t.feasible(idx, out)
        .map_err(|e| VerifyError(e.to_string()))?;
    let known = all_known(oracle, idx);
    report.requests += 1;
    report.known += u64::from(known);
    let picks = if known { 1 } else { oracle.picks(idx) };
    for pick in 0..picks {
        let (principal, context) = oracle.principal_and_context(idx, pick)?;
        for d in 0..oracle.destinations.len() {
            let cedar = oracle.allows(&principal, &context, d)?;
            let table = out.get(d / 64).is_some_and(|w| w >> (d % 64) & 1 == 1);
            report.decisions += 1;
            let bad = if known {
                cedar != table
            } else {
                table && !cedar
            };
            if bad {
                report.mismatch_count += 1;
                if report.mismatches.len() < Report::KEEP {
                    report.mismatches.push(Mismatch {
                        request: oracle.describe(idx),
                        destination: t.destination_name(d).unwrap_or("?").to_string(),
                        cedar,
                        table,
                    });
                }
            }
        }
    }
    Ok(())
}
