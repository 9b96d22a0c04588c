//! The bytes of a snapshot (format version 1, described in the crate
//! documentation): [`encode`], [`decode`] and [`etag`].
//!
//! A report's sections and a budget reading are described once, in the
//! `wire!` invocation below (the macro is in [`codec`]): each section's flag bit, its fields in wire
//! order with their types, the names errors give them, and their checks.
//! Writing, reading, counting ([`encoded_len`]), the checks and the crate
//! documentation's table (held to it by a test) are all generated from
//! that one description, so none of them can leave a field out or take
//! the fields in another order than the others do.
//!
//! One set of checks serves both directions: [`decode`] reads into a
//! [`Snapshot`] and then checks it with the same function [`encode`]
//! runs first, so what one accepts the other produces.

use crate::{
    Budget, BudgetState, Drain, DrainReason, Error, Load, Price, Problem, Report, Snapshot,
    MAX_BUDGETS, MAX_BYTES, MAX_DESTINATIONS, MAX_REQUESTS, MAX_SLOTS, MAX_SPENT_USD,
    MAX_USD_PER_HOUR, MAX_USD_PER_TOKEN,
};
use alloc::string::String;
use alloc::vec::Vec;
use codec::{check_name, field, name, section, wire, Field, Reader, Wire};

mod codec;

const MAGIC: &[u8; 4] = b"ACSN";
const FORMAT: u16 = 1;
const HEADER: usize = 4 + 2 + 2 + 8 + 8 + 4;
const TRAILER: usize = 4;

/// Header flag: a budgets section follows the reports.
const BUDGETS: u16 = 1;

wire! {
    report {
        /// The model server's load ([`Load`]); its scrape time only when
        /// the figures are held (stale), under a flag of its own.
        LOAD = 1 => load(Load {
            running: u32 = "load.running" => requests,
            waiting: u32 = "load.waiting" => requests,
            kv_permille: u16 = "load.kv_permille" => permille,
            stale: bool = "load.stale",
            scraped_ms: u64 = "load.scraped_ms" if HELD = 64 else HeldNotStale => held,
        });
        /// Concurrent requests it can hold now.
        CAPACITY = 2 => capacity(u32 = "capacity" => slots);
        /// Its per-token prices ([`Price`]).
        PRICE = 4 => price(Price {
            usd_per_input_token: f64 = "price.input" => token_price,
            usd_per_output_token: f64 = "price.output" => token_price,
        });
        /// What its GPUs cost per hour.
        HOURLY = 32 => usd_per_hour(f64 = "usd_per_hour" => hourly_price);
        /// A drain ([`Drain`]).
        DRAIN = 8 => drain(Drain {
            until_ms: u64 = "drain.until_ms",
            reason: DrainReason = "drain.reason",
        });
        /// The models resident on it.
        WARM = 16 => warm(Vec<String> = "warm");
    }
    /// One budget reading ([`Budget`]), in the section the header's
    /// `BUDGETS` flag announces.
    budget(Budget {
        name: String = "budget.name",
        state: BudgetState = "budget.state",
        spent_usd: f64 = "budget.spent_usd" => spend,
        read_ms: u64 = "budget.read_ms",
        resets_ms: u64 = "budget.resets_ms",
    });
}

/// Bytes of one budget reading after its name.
#[cfg(test)]
const BUDGET_BYTES: usize = sections::budget::MIN - <String as Wire>::MIN;

// The checks the description names: a value, the section or reading it
// is in, and what is wrong with the value.

fn at_most(v: u64, max: u64) -> Result<(), Problem> {
    if v > max {
        return Err(Problem::TooLarge { found: v, max });
    }
    Ok(())
}

fn requests<S>(v: &u32, _: &S) -> Result<(), Problem> {
    at_most(u64::from(*v), u64::from(MAX_REQUESTS))
}

fn permille<S>(v: &u16, _: &S) -> Result<(), Problem> {
    at_most(u64::from(*v), 1000)
}

/// A scrape time travels only with held (stale) figures.
fn held(v: &u64, load: &Load) -> Result<(), Problem> {
    if *v != 0 && !load.stale {
        return Err(Problem::HeldNotStale);
    }
    Ok(())
}

fn slots<S>(v: &u32, _: &S) -> Result<(), Problem> {
    at_most(u64::from(*v), u64::from(MAX_SLOTS))
}

/// USD from 0 to `max`, and a number.
fn usd(v: f64, max: f64) -> bool {
    v.is_finite() && (0.0..=max).contains(&v)
}

fn token_price<S>(v: &f64, _: &S) -> Result<(), Problem> {
    usd(*v, MAX_USD_PER_TOKEN)
        .then_some(())
        .ok_or(Problem::NotAPrice)
}

fn hourly_price<S>(v: &f64, _: &S) -> Result<(), Problem> {
    usd(*v, MAX_USD_PER_HOUR)
        .then_some(())
        .ok_or(Problem::NotAnHourlyPrice)
}

fn spend<S>(v: &f64, _: &S) -> Result<(), Problem> {
    usd(*v, MAX_SPENT_USD)
        .then_some(())
        .ok_or(Problem::NotASpend)
}

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
        put_sections(r, &mut out);
    }
    if !s.budgets.is_empty() {
        out.extend_from_slice(&(s.budgets.len() as u32).to_le_bytes());
        for b in &s.budgets {
            sections::budget::put(b, &mut out);
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
        n += 4 + budgets.iter().map(sections::budget::bytes).sum::<usize>();
    }
    for r in reports {
        n += 2 + r.name.len() + section_bytes(r);
    }
    n
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
    if bytes.get(..4) != Some(&MAGIC[..]) {
        return Err(top(0, "magic", Problem::NotASnapshot));
    }
    if bytes.len() < HEADER + TRAILER {
        return Err(top(bytes.len(), "header", Problem::Truncated));
    }
    let body_len = bytes.len() - TRAILER;
    let (body, trailer) = bytes.split_at(body_len);
    let Some(stored) = trailer.first_chunk::<4>().map(|b| u32::from_le_bytes(*b)) else {
        return Err(top(bytes.len(), "trailer", Problem::Truncated));
    };
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
        // Errors name the report, by its name once read.
        r.report = Some((i, None));
        let name = r.name("name")?;
        let fields = r.u8("fields")?;
        if fields & !KNOWN != 0 {
            return Err(r.fail("fields", Problem::Reserved(u64::from(fields & !KNOWN))));
        }
        let mut report = Report {
            name,
            ..Report::default()
        };
        get_sections(&mut r, fields, &mut report)?;
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
        if count.saturating_mul(sections::budget::MIN) > body.len() - r.at {
            return Err(r.fail("budgets", Problem::Truncated));
        }
        budgets.reserve(count);
        for i in 0..count {
            r.report = Some((i, None));
            budgets.push(sections::budget::get(&mut r, 0)?);
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
        check_sections(r).map_err(|(field, p)| fail(at, field, p))?;
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
        sections::budget::check(b).map_err(|(field, p)| fail(Some(i), field, p))?;
    }
    Ok(())
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

    /// The crate documentation's table of the wire format says what the
    /// description here generates, section by section and field by field.
    #[test]
    fn the_documented_table_is_the_description() {
        let doc: Vec<&str> = include_str!("lib.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("//!"))
            .skip_while(|l| l.trim() != "```text")
            .skip(1)
            .take_while(|l| l.trim() != "```")
            .collect();
        let words = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        let table = words(&doc.join(" "));
        let between = |from: &str, to: &str| {
            let start = table.find(from).map(|i| i + from.len());
            let end = table.find(to);
            match (start, end) {
                (Some(s), Some(e)) if s <= e => table[s..e].trim().to_string(),
                _ => panic!("the table has no `{from}` ... `{to}`:\n{table}"),
            }
        };
        assert_eq!(
            between("in this order:", "budgets "),
            words(&documented().join(" ")),
            "the report's sections"
        );
        assert_eq!(
            between("then count x", "trailer "),
            words(&documented_budget()),
            "a budget reading"
        );
        assert_eq!(
            documented()[1],
            "HELD = 64    load.scraped_ms u64 (only with LOAD)"
        );
    }

    /// Each bit of a report's `fields` byte is one section's or one
    /// field's, and a field with a flag is refused without its section.
    #[test]
    fn each_flag_bit_is_one_sections() {
        let bits = [
            LOAD,
            CAPACITY,
            PRICE,
            HOURLY,
            DRAIN,
            WARM,
            sections::load::FLAGS,
        ];
        assert_eq!(bits.iter().fold(0, |a, b| a | b), KNOWN);
        assert_eq!(
            bits.iter().map(|b| b.count_ones()).sum::<u32>(),
            KNOWN.count_ones()
        );
        let mut held = encode(&sample()).unwrap();
        // The first report (`eu-inhouse-h100`) with HELD set instead of
        // LOAD, its load figures taken out, the checksum redone.
        let at = HEADER + 2 + "eu-inhouse-h100".len();
        assert_eq!(held[at], LOAD | CAPACITY | WARM);
        held[at] = sections::load::FLAGS | CAPACITY | WARM;
        held.drain(at + 1..at + 1 + 11 - 8);
        let n = held.len() - TRAILER;
        let crc = crc32fast::hash(&held[..n]);
        held[n..].copy_from_slice(&crc.to_le_bytes());
        let e = decode(&held).unwrap_err();
        assert_eq!(
            (e.field, e.problem, e.at),
            ("load.scraped_ms", Problem::HeldNotStale, at + 1 + 8)
        );
    }

    #[test]
    fn an_empty_snapshot_is_valid() {
        let s = Snapshot::default();
        assert_eq!(decode(&encode(&s).unwrap()).unwrap(), s);
    }
}
