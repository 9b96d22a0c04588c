//! The bytes of a snapshot (format version 1, described in the crate
//! documentation): [`encode`], [`decode`] and [`etag`].
//!
//! One set of checks serves both directions: [`decode`] reads into a
//! [`Snapshot`] and then checks it with the same function [`encode`]
//! runs first, so what one accepts the other produces.

use crate::{
    Budget, BudgetState, Drain, DrainReason, Error, Load, Price, Problem, Report, Snapshot,
    MAX_BUDGETS, MAX_BYTES, MAX_DESTINATIONS, MAX_NAME, MAX_REQUESTS, MAX_SLOTS, MAX_SPENT_USD,
    MAX_USD_PER_HOUR, MAX_USD_PER_TOKEN, MAX_WARM,
};
use alloc::string::String;
use alloc::vec::Vec;

const MAGIC: &[u8; 4] = b"ACSN";
const FORMAT: u16 = 1;
const HEADER: usize = 4 + 2 + 2 + 8 + 8 + 4;
const TRAILER: usize = 4;

const LOAD: u8 = 1;
const CAPACITY: u8 = 2;
const PRICE: u8 = 4;
const DRAIN: u8 = 8;
const WARM: u8 = 16;
const HOURLY: u8 = 32;
const HELD: u8 = 64;
const KNOWN: u8 = LOAD | HELD | CAPACITY | PRICE | HOURLY | DRAIN | WARM;

/// Header flag: a budgets section follows the reports.
const BUDGETS: u16 = 1;
/// Bytes of one budget reading after its name.
const BUDGET_BYTES: usize = 1 + 8 + 8 + 8;

/// The snapshot as bytes, after the checks [`decode`] makes.
pub fn encode(s: &Snapshot) -> Result<Vec<u8>, Error> {
    check(s)?;
    let mut out = Vec::with_capacity(HEADER + TRAILER + 40 * s.reports.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT.to_le_bytes());
    let flags = if s.budgets.is_empty() { 0 } else { BUDGETS };
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&s.version.to_le_bytes());
    out.extend_from_slice(&s.generated_ms.to_le_bytes());
    out.extend_from_slice(&(s.reports.len() as u32).to_le_bytes());
    for r in &s.reports {
        name(&mut out, &r.name);
        let fields = (r.load.is_some() as u8 * LOAD)
            | (r.capacity.is_some() as u8 * CAPACITY)
            | (r.price.is_some() as u8 * PRICE)
            | (r.usd_per_hour.is_some() as u8 * HOURLY)
            | (r.drain.is_some() as u8 * DRAIN)
            | (r.warm.is_some() as u8 * WARM)
            | (r.load.is_some_and(|l| l.scraped_ms != 0) as u8 * HELD);
        out.push(fields);
        if let Some(l) = r.load {
            out.extend_from_slice(&l.running.to_le_bytes());
            out.extend_from_slice(&l.waiting.to_le_bytes());
            out.extend_from_slice(&l.kv_permille.to_le_bytes());
            out.push(l.stale as u8);
            if l.scraped_ms != 0 {
                out.extend_from_slice(&l.scraped_ms.to_le_bytes());
            }
        }
        if let Some(c) = r.capacity {
            out.extend_from_slice(&c.to_le_bytes());
        }
        if let Some(p) = r.price {
            out.extend_from_slice(&p.usd_per_input_token.to_le_bytes());
            out.extend_from_slice(&p.usd_per_output_token.to_le_bytes());
        }
        if let Some(h) = r.usd_per_hour {
            out.extend_from_slice(&h.to_le_bytes());
        }
        if let Some(d) = r.drain {
            out.extend_from_slice(&d.until_ms.to_le_bytes());
            out.push(d.reason as u8);
        }
        if let Some(w) = &r.warm {
            out.extend_from_slice(&(w.len() as u16).to_le_bytes());
            for m in w {
                name(&mut out, m);
            }
        }
    }
    if !s.budgets.is_empty() {
        out.extend_from_slice(&(s.budgets.len() as u32).to_le_bytes());
        for b in &s.budgets {
            name(&mut out, &b.name);
            out.push(b.state as u8);
            out.extend_from_slice(&b.spent_usd.to_le_bytes());
            out.extend_from_slice(&b.read_ms.to_le_bytes());
            out.extend_from_slice(&b.resets_ms.to_le_bytes());
        }
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    if out.len() > MAX_BYTES {
        return Err(Error {
            at: 0,
            destination: None,
            field: "snapshot",
            problem: Problem::TooLarge {
                found: out.len() as u64,
                max: MAX_BYTES as u64,
            },
        });
    }
    Ok(out)
}

/// How many bytes [`encode`] gives for a snapshot of `reports` and
/// `budgets` (when it gives any): lets a producer fit a snapshot to
/// [`MAX_BYTES`] before encoding it.
pub fn encoded_len(reports: &[Report], budgets: &[Budget]) -> usize {
    let mut n = HEADER + TRAILER;
    if !budgets.is_empty() {
        n += 4 + budgets
            .iter()
            .map(|b| 2 + b.name.len() + BUDGET_BYTES)
            .sum::<usize>();
    }
    for r in reports {
        n += 2 + r.name.len() + 1;
        n += r
            .load
            .map_or(0, |l| 4 + 4 + 2 + 1 + if l.scraped_ms != 0 { 8 } else { 0 });
        n += r.capacity.map_or(0, |_| 4);
        n += r.price.map_or(0, |_| 16);
        n += r.usd_per_hour.map_or(0, |_| 8);
        n += r.drain.map_or(0, |_| 9);
        n += r
            .warm
            .as_ref()
            .map_or(0, |w| 2 + w.iter().map(|m| 2 + m.len()).sum::<usize>());
    }
    n
}

fn name(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u16).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// An HTTP entity tag for encoded snapshot bytes: the version and the
/// checksum, quoted. `None` if the bytes are too short to be a snapshot.
pub fn etag(encoded: &[u8]) -> Option<String> {
    let version = encoded.get(8..16)?;
    let crc = encoded.get(encoded.len().checked_sub(TRAILER)?..)?;
    let version = u64::from_le_bytes(version.try_into().ok()?);
    let crc = u32::from_le_bytes(crc.try_into().ok()?);
    Some(alloc::format!("\"{version:x}-{crc:08x}\""))
}

/// The checksum an encoded snapshot's trailer carries (`None` if the
/// bytes are too short to be one): with the version, what tells two
/// snapshots apart, since a producer may reuse a version for other bytes.
pub fn checksum(encoded: &[u8]) -> Option<u32> {
    let crc = encoded.get(encoded.len().checked_sub(TRAILER)?..)?;
    Some(u32::from_le_bytes(crc.try_into().ok()?))
}

/// Read a snapshot, checking the checksum, the format, every field's
/// range and the limits; an error names the first problem.
pub fn decode(bytes: &[u8]) -> Result<Snapshot, Error> {
    let top = |at, field, problem| Error {
        at,
        destination: None,
        field,
        problem,
    };
    if bytes.len() > MAX_BYTES {
        return Err(top(
            0,
            "snapshot",
            Problem::TooLarge {
                found: bytes.len() as u64,
                max: MAX_BYTES as u64,
            },
        ));
    }
    if bytes.len() < 4 || &bytes[..4] != MAGIC {
        return Err(top(0, "magic", Problem::NotASnapshot));
    }
    if bytes.len() < HEADER + TRAILER {
        return Err(top(bytes.len(), "header", Problem::Truncated));
    }
    let body_len = bytes.len() - TRAILER;
    let (body, trailer) = bytes.split_at(body_len);
    let stored = u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
    let computed = crc32fast::hash(body);
    if stored != computed {
        return Err(top(
            body_len,
            "checksum",
            Problem::Checksum { stored, computed },
        ));
    }
    let mut r = Reader {
        buf: body,
        at: 4,
        report: None,
    };
    let format = r.u16("format")?;
    if format != FORMAT {
        return Err(top(4, "format", Problem::UnknownFormat(format)));
    }
    let flags = r.u16("flags")?;
    if flags & !BUDGETS != 0 {
        return Err(top(
            6,
            "flags",
            Problem::Reserved(u64::from(flags & !BUDGETS)),
        ));
    }
    let version = r.u64("version")?;
    let generated_ms = r.u64("generated_ms")?;
    let count = r.u32("count")? as usize;
    if count > MAX_DESTINATIONS {
        return Err(r.fail(
            "count",
            Problem::TooLarge {
                found: count as u64,
                max: MAX_DESTINATIONS as u64,
            },
        ));
    }
    let mut reports = Vec::with_capacity(count);
    for i in 0..count {
        r.report = Some((i, None));
        let name = r.name("name")?;
        r.report = Some((i, Some(name.clone())));
        let fields = r.u8("fields")?;
        if fields & !KNOWN != 0 {
            return Err(r.fail("fields", Problem::Reserved(u64::from(fields & !KNOWN))));
        }
        let mut report = Report {
            name,
            ..Report::default()
        };
        if fields & LOAD != 0 {
            report.load = Some(Load {
                running: r.u32("load.running")?,
                waiting: r.u32("load.waiting")?,
                kv_permille: r.u16("load.kv_permille")?,
                stale: match r.u8("load.stale")? {
                    0 => false,
                    1 => true,
                    b => return Err(r.fail("load.stale", Problem::Reserved(u64::from(b)))),
                },
                scraped_ms: 0,
            });
        }
        if fields & HELD != 0 {
            let scraped_ms = r.u64("load.scraped_ms")?;
            match &mut report.load {
                Some(l) => l.scraped_ms = scraped_ms,
                None => return Err(r.fail("load.scraped_ms", Problem::HeldNotStale)),
            }
        }
        if fields & CAPACITY != 0 {
            report.capacity = Some(r.u32("capacity")?);
        }
        if fields & PRICE != 0 {
            report.price = Some(Price {
                usd_per_input_token: f64::from_bits(r.u64("price.input")?),
                usd_per_output_token: f64::from_bits(r.u64("price.output")?),
            });
        }
        if fields & HOURLY != 0 {
            report.usd_per_hour = Some(f64::from_bits(r.u64("usd_per_hour")?));
        }
        if fields & DRAIN != 0 {
            let until_ms = r.u64("drain.until_ms")?;
            let reason = r.u8("drain.reason")?;
            let Some(&reason) = DrainReason::ALL.get(usize::from(reason)) else {
                return Err(r.fail("drain.reason", Problem::Reserved(u64::from(reason))));
            };
            report.drain = Some(Drain { until_ms, reason });
        }
        if fields & WARM != 0 {
            let n = usize::from(r.u16("warm")?);
            if n > MAX_WARM {
                return Err(r.fail(
                    "warm",
                    Problem::TooLarge {
                        found: n as u64,
                        max: MAX_WARM as u64,
                    },
                ));
            }
            let mut warm = Vec::with_capacity(n);
            for _ in 0..n {
                warm.push(r.name("warm[]")?);
            }
            report.warm = Some(warm);
        }
        reports.push(report);
    }
    r.report = None;
    let mut budgets = Vec::new();
    if flags & BUDGETS != 0 {
        let count = r.u32("budgets")? as usize;
        if count > MAX_BUDGETS {
            let (found, max) = (count as u64, MAX_BUDGETS as u64);
            return Err(r.fail("budgets", Problem::TooLarge { found, max }));
        }
        // Each reading takes at least its fixed bytes: a count the bytes
        // cannot hold is refused before anything is reserved for it.
        if count.saturating_mul(2 + BUDGET_BYTES) > body.len() - r.at {
            return Err(r.fail("budgets", Problem::Truncated));
        }
        budgets.reserve(count);
        for i in 0..count {
            r.report = Some((i, None));
            let name = r.name("budget.name")?;
            r.report = Some((i, Some(name.clone())));
            let state = r.u8("budget.state")?;
            let Some(&state) = BudgetState::ALL.get(usize::from(state)) else {
                return Err(r.fail("budget.state", Problem::Reserved(u64::from(state))));
            };
            budgets.push(Budget {
                name,
                state,
                spent_usd: f64::from_bits(r.u64("budget.spent_usd")?),
                read_ms: r.u64("budget.read_ms")?,
                resets_ms: r.u64("budget.resets_ms")?,
            });
        }
        r.report = None;
    }
    if r.at != body.len() {
        return Err(r.fail("reports", Problem::TrailingBytes(body.len() - r.at)));
    }
    let s = Snapshot {
        version,
        generated_ms,
        reports,
        budgets,
    };
    check(&s).map_err(|mut e| {
        e.at = body_len;
        e
    })?;
    Ok(s)
}

/// The checks both directions make on a whole snapshot.
fn check(s: &Snapshot) -> Result<(), Error> {
    let fail = |i: Option<usize>, field, problem| Error {
        at: 0,
        destination: i.map(|i| (i, s.reports.get(i).map(|r| r.name.clone()))),
        field,
        problem,
    };
    if s.reports.len() > MAX_DESTINATIONS {
        let found = s.reports.len() as u64;
        let max = MAX_DESTINATIONS as u64;
        return Err(fail(None, "count", Problem::TooLarge { found, max }));
    }
    // Names sorted once to find duplicates without quadratic work.
    let mut names: Vec<(&str, usize)> = s
        .reports
        .iter()
        .enumerate()
        .map(|(i, r)| (r.name.as_str(), i))
        .collect();
    names.sort_unstable();
    for pair in names.windows(2) {
        if let [(a, _), (b, i)] = pair {
            if a == b {
                return Err(fail(Some(*i), "name", Problem::Duplicate));
            }
        }
    }
    for (i, r) in s.reports.iter().enumerate() {
        let at = Some(i);
        check_name(&r.name).map_err(|p| fail(at, "name", p))?;
        if let Some(l) = r.load {
            for (field, v) in [("load.running", l.running), ("load.waiting", l.waiting)] {
                if v > MAX_REQUESTS {
                    let (found, max) = (u64::from(v), u64::from(MAX_REQUESTS));
                    return Err(fail(at, field, Problem::TooLarge { found, max }));
                }
            }
            if l.scraped_ms != 0 && !l.stale {
                return Err(fail(at, "load.scraped_ms", Problem::HeldNotStale));
            }
            if l.kv_permille > 1000 {
                let found = u64::from(l.kv_permille);
                return Err(fail(
                    at,
                    "load.kv_permille",
                    Problem::TooLarge { found, max: 1000 },
                ));
            }
        }
        if let Some(c) = r.capacity {
            if c > MAX_SLOTS {
                let (found, max) = (u64::from(c), u64::from(MAX_SLOTS));
                return Err(fail(at, "capacity", Problem::TooLarge { found, max }));
            }
        }
        if let Some(p) = r.price {
            for (field, v) in [
                ("price.input", p.usd_per_input_token),
                ("price.output", p.usd_per_output_token),
            ] {
                if !(v.is_finite() && (0.0..=MAX_USD_PER_TOKEN).contains(&v)) {
                    return Err(fail(at, field, Problem::NotAPrice));
                }
            }
        }
        if let Some(h) = r.usd_per_hour {
            if !(h.is_finite() && (0.0..=MAX_USD_PER_HOUR).contains(&h)) {
                return Err(fail(at, "usd_per_hour", Problem::NotAnHourlyPrice));
            }
        }
        if let Some(w) = &r.warm {
            if w.len() > MAX_WARM {
                let (found, max) = (w.len() as u64, MAX_WARM as u64);
                return Err(fail(at, "warm", Problem::TooLarge { found, max }));
            }
            for m in w {
                check_name(m).map_err(|p| fail(at, "warm[]", p))?;
            }
        }
    }
    check_budgets(&s.budgets)
}

/// The checks on a snapshot's budget readings.
fn check_budgets(budgets: &[Budget]) -> Result<(), Error> {
    let fail = |i: Option<usize>, field, problem| Error {
        at: 0,
        destination: i.map(|i| (i, budgets.get(i).map(|b| b.name.clone()))),
        field,
        problem,
    };
    if budgets.len() > MAX_BUDGETS {
        let (found, max) = (budgets.len() as u64, MAX_BUDGETS as u64);
        return Err(fail(None, "budgets", Problem::TooLarge { found, max }));
    }
    let mut names: Vec<(&str, usize)> = budgets
        .iter()
        .enumerate()
        .map(|(i, b)| (b.name.as_str(), i))
        .collect();
    names.sort_unstable();
    for pair in names.windows(2) {
        if let [(a, _), (b, i)] = pair {
            if a == b {
                return Err(fail(Some(*i), "budget.name", Problem::Duplicate));
            }
        }
    }
    for (i, b) in budgets.iter().enumerate() {
        check_name(&b.name).map_err(|p| fail(Some(i), "budget.name", p))?;
        if !(b.spent_usd.is_finite() && (0.0..=MAX_SPENT_USD).contains(&b.spent_usd)) {
            return Err(fail(Some(i), "budget.spent_usd", Problem::NotASpend));
        }
    }
    Ok(())
}

fn check_name(name: &str) -> Result<(), Problem> {
    if name.is_empty() {
        return Err(Problem::Empty);
    }
    if name.len() > MAX_NAME {
        return Err(Problem::TooLarge {
            found: name.len() as u64,
            max: MAX_NAME as u64,
        });
    }
    Ok(())
}

/// A cursor over the snapshot's body that fails, never panics, at its end.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
    report: Option<(usize, Option<String>)>,
}

impl Reader<'_> {
    fn fail(&self, field: &'static str, problem: Problem) -> Error {
        Error {
            at: self.at,
            destination: self.report.clone(),
            field,
            problem,
        }
    }

    fn take<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], Error> {
        let bytes = self
            .at
            .checked_add(N)
            .and_then(|end| self.buf.get(self.at..end))
            .and_then(|b| <[u8; N]>::try_from(b).ok())
            .ok_or_else(|| self.fail(field, Problem::Truncated))?;
        self.at += N;
        Ok(bytes)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, Error> {
        self.take::<1>(field).map(|[b]| b)
    }

    fn u16(&mut self, field: &'static str) -> Result<u16, Error> {
        self.take(field).map(u16::from_le_bytes)
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, Error> {
        self.take(field).map(u32::from_le_bytes)
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, Error> {
        self.take(field).map(u64::from_le_bytes)
    }

    fn name(&mut self, field: &'static str) -> Result<String, Error> {
        let len = usize::from(self.u16(field)?);
        if len > MAX_NAME {
            let found = len as u64;
            let max = MAX_NAME as u64;
            return Err(self.fail(field, Problem::TooLarge { found, max }));
        }
        let bytes = self
            .buf
            .get(self.at..self.at + len)
            .ok_or_else(|| self.fail(field, Problem::Truncated))?;
        let s = core::str::from_utf8(bytes).map_err(|_| self.fail(field, Problem::NotUtf8))?;
        self.at += len;
        Ok(String::from(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;
    use alloc::vec;

    fn sample() -> Snapshot {
        Snapshot {
            version: 7,
            generated_ms: 1_764_000_000_000,
            reports: vec![
                Report {
                    name: "eu-inhouse-h100".to_string(),
                    load: Some(Load {
                        running: 12,
                        waiting: 3,
                        kv_permille: 640,
                        stale: false,
                        scraped_ms: 0,
                    }),
                    capacity: Some(48),
                    warm: Some(vec!["llama-3.1-70b".to_string(), "sql-lora".to_string()]),
                    ..Report::default()
                },
                Report {
                    name: "us-spot-a100".to_string(),
                    usd_per_hour: Some(14.2),
                    drain: Some(Drain {
                        until_ms: 1_764_000_120_000,
                        reason: DrainReason::Eviction,
                    }),
                    ..Report::default()
                },
                Report {
                    name: "openai".to_string(),
                    price: Some(Price {
                        usd_per_input_token: 2.5e-6,
                        usd_per_output_token: 1e-5,
                    }),
                    ..Report::default()
                },
            ],
            budgets: vec![],
        }
    }

    fn with_budgets() -> Snapshot {
        let mut s = sample();
        s.budgets = vec![
            Budget {
                name: "team-a".to_string(),
                state: BudgetState::Soft,
                spent_usd: 81.25,
                read_ms: 1_764_000_000_100,
                resets_ms: 1_764_028_800_000,
            },
            Budget {
                name: "research".to_string(),
                state: BudgetState::Ok,
                spent_usd: 0.0,
                read_ms: 1_764_000_000_100,
                resets_ms: 0,
            },
        ];
        s
    }

    #[test]
    fn a_snapshot_round_trips() {
        let s = sample();
        let bytes = encode(&s).unwrap();
        assert_eq!(decode(&bytes).unwrap(), s);
        assert_eq!(etag(&bytes).unwrap().len(), 2 + 1 + 1 + 8);
        assert!(etag(&bytes).unwrap().starts_with("\"7-"));
    }

    #[test]
    fn held_figures_carry_their_scrape_time_and_fresh_ones_do_not() {
        let mut s = sample();
        let fresh = encode(&s).unwrap();
        if let Some(l) = &mut s.reports[0].load {
            l.stale = true;
            l.scraped_ms = 1_764_000_000_500;
        }
        let held = encode(&s).unwrap();
        assert_eq!(held.len(), fresh.len() + 8);
        assert_eq!(decode(&held).unwrap(), s);
        // A scrape time on fresh figures is refused, naming the field.
        if let Some(l) = &mut s.reports[0].load {
            l.stale = false;
        }
        let e = encode(&s).unwrap_err();
        assert_eq!(
            (e.field, e.problem),
            ("load.scraped_ms", Problem::HeldNotStale)
        );
    }

    #[test]
    fn every_flipped_bit_is_caught() {
        let bytes = encode(&sample()).unwrap();
        for i in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[i / 8] ^= 1 << (i % 8);
            assert!(decode(&b).is_err(), "bit {i} flipped and accepted");
        }
    }

    #[test]
    fn every_truncation_is_an_error() {
        let bytes = encode(&sample()).unwrap();
        for n in 0..bytes.len() {
            assert!(decode(&bytes[..n]).is_err());
        }
    }

    #[test]
    fn absurd_figures_are_refused_naming_the_destination_and_field() {
        type Spoil = fn(&mut Report);
        let cases: [(Spoil, &str); 8] = [
            (|r| r.usd_per_hour = Some(f64::INFINITY), "usd_per_hour"),
            (|r| r.usd_per_hour = Some(-0.5), "usd_per_hour"),
            (
                |r| {
                    r.price = Some(Price {
                        usd_per_input_token: f64::NAN,
                        usd_per_output_token: 0.0,
                    })
                },
                "price.input",
            ),
            (
                |r| {
                    r.price = Some(Price {
                        usd_per_input_token: 0.0,
                        usd_per_output_token: -1e-6,
                    })
                },
                "price.output",
            ),
            (
                |r| {
                    r.price = Some(Price {
                        usd_per_input_token: 1.0,
                        usd_per_output_token: 0.0,
                    })
                },
                "price.input",
            ),
            (|r| r.capacity = Some(MAX_SLOTS + 1), "capacity"),
            (
                |r| {
                    r.load = Some(Load {
                        running: 0,
                        waiting: 0,
                        kv_permille: 1001,
                        stale: false,
                        scraped_ms: 0,
                    })
                },
                "load.kv_permille",
            ),
            (|r| r.warm = Some(vec![String::new()]), "warm[]"),
        ];
        for (spoil, field) in cases {
            let mut s = sample();
            spoil(&mut s.reports[1]);
            let e = encode(&s).unwrap_err();
            assert_eq!(e.field, field);
            assert_eq!(e.destination, Some((1, Some("us-spot-a100".to_string()))));
            let msg = e.to_string();
            assert!(msg.contains("us-spot-a100") && msg.contains(field), "{msg}");
        }
    }

    #[test]
    fn a_duplicate_name_is_refused() {
        let mut s = sample();
        s.reports[2].name = s.reports[0].name.clone();
        assert_eq!(encode(&s).unwrap_err().problem, Problem::Duplicate);
    }

    #[test]
    fn foreign_bytes_are_not_a_snapshot() {
        for junk in [&b""[..], b"{\"version\":1}", b"ACS", &[0u8; 64]] {
            assert!(decode(junk).is_err());
        }
        let e = decode(b"{\"version\":1}").unwrap_err();
        assert_eq!(e.problem, Problem::NotASnapshot);
    }

    #[test]
    fn a_later_format_is_named() {
        let mut b = encode(&sample()).unwrap();
        b[4] = 2;
        let n = b.len() - TRAILER;
        let crc = crc32fast::hash(&b[..n]);
        b[n..].copy_from_slice(&crc.to_le_bytes());
        let e = decode(&b).unwrap_err();
        assert_eq!(e.problem, Problem::UnknownFormat(2));
        assert!(e.to_string().contains("upgrade the filter"));
    }

    #[test]
    fn budget_readings_round_trip_and_are_counted_by_encoded_len() {
        let s = with_budgets();
        let bytes = encode(&s).unwrap();
        assert_eq!(decode(&bytes).unwrap(), s);
        assert_eq!(encoded_len(&s.reports, &s.budgets), bytes.len());
        let plain = sample();
        assert_eq!(
            encoded_len(&plain.reports, &[]),
            encode(&plain).unwrap().len()
        );
        for at in 0..bytes.len() {
            assert!(decode(&bytes[..at]).is_err(), "truncated at {at}");
        }
    }

    #[test]
    fn absurd_budget_readings_are_refused_naming_the_budget() {
        for spent in [f64::NAN, f64::INFINITY, -0.01, MAX_SPENT_USD * 2.0] {
            let mut s = with_budgets();
            s.budgets[1].spent_usd = spent;
            let e = encode(&s).unwrap_err();
            assert_eq!(e.problem, Problem::NotASpend);
            let msg = e.to_string();
            assert!(
                msg.contains("budget 1 `research`") && msg.contains("spent_usd"),
                "{msg}"
            );
        }
        let mut s = with_budgets();
        s.budgets[1].name = "team-a".to_string();
        assert_eq!(encode(&s).unwrap_err().problem, Problem::Duplicate);
        // An unknown state byte: patched in and the checksum redone.
        let s = with_budgets();
        let mut b = encode(&s).unwrap();
        let at = b.len() - TRAILER - 2 * (2 + BUDGET_BYTES) - "team-a".len() - "research".len()
            + 2
            + "team-a".len();
        assert_eq!(b[at], BudgetState::Soft as u8);
        b[at] = 3;
        let n = b.len() - TRAILER;
        let crc = crc32fast::hash(&b[..n]);
        b[n..].copy_from_slice(&crc.to_le_bytes());
        let e = decode(&b).unwrap_err();
        assert_eq!(
            (e.field, e.problem.clone()),
            ("budget.state", Problem::Reserved(3))
        );
        assert!(e.to_string().contains("budget 0 `team-a`"), "{e}");
    }

    #[test]
    fn an_empty_snapshot_is_valid() {
        let s = Snapshot::default();
        assert_eq!(decode(&encode(&s).unwrap()).unwrap(), s);
    }
}
