//! Reading access logs into the store.
//!
//! Idempotent by construction: every event has a key (its `event_id`) and
//! the store skips keys it holds, so a file ingested twice, or ingested
//! again after it grew, books each event once. The key is not trusted to
//! be unique: ids are predictable, and a line can be forged. A skipped
//! row is compared with the stored one, on what the lines logged only
//! ([`Row::logged`], so a change to the ledger's pricing never turns
//! ingesting a log again into conflicts); when they differ, the new event
//! is booked apart under a derived id (`<event_id>~<hash of what it
//! logged>`, flagged `event_id_conflict`) and reported ([`Conflict`]), so
//! an event can never hide another by taking its id first. `ace.event/1`
//! lines carry no id: see `Identity` for theirs. A last line without its
//! newline (a log cut mid-write by a crash) is not booked and not counted
//! as malformed: it is reported as incomplete and booked when it is
//! complete, on the next ingest or, with `follow`, as soon as Envoy
//! finishes it.
//!
//! Lines that are not events (Envoy's `-`, broken JSON, a time outside
//! the bounds in [`event`], an event its configuration cannot price, a
//! schema this ledger does not read, a configuration that is not
//! registered, a row the store refuses) are counted and kept with their
//! line numbers ([`Reject`]), never dropped silently, and the ingest goes
//! on: one bad line never stops the lines after it. An event refused for an
//! unregistered configuration is booked by a later ingest once it is
//! registered, and the report then no longer counts it.

use crate::configs::Registry;
use crate::event;
use crate::kind;
use crate::price;
use crate::row::{Row, CONFLICT_FLAG};
use crate::store::{Reject, Store};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::BufRead;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How to ingest.
#[derive(Debug, Clone)]
pub struct Options {
    /// The configuration id `ace.event/1` lines (which name none) are
    /// priced with.
    pub v1_config: Option<String>,
    /// Keep reading as the file grows, until interrupted or `stop` is set.
    pub follow: bool,
    /// Ends a `follow` at the next end of input once set.
    pub stop: Option<Arc<AtomicBool>>,
    /// Draw a progress bar (on a terminal; large inputs only).
    pub progress: bool,
    /// Rows per transaction.
    pub batch: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            v1_config: None,
            follow: false,
            stop: None,
            progress: false,
            batch: 10_000,
        }
    }
}

/// What one input gave.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Summary {
    /// The input's name.
    pub source: String,
    /// Complete lines read.
    pub lines: u64,
    /// Events booked now.
    pub new: u64,
    /// Events the store already held.
    pub already: u64,
    /// Lines that were not bookable events, with their numbers.
    pub rejected: Vec<Reject>,
    /// The number of a last line left unbooked because it has no newline
    /// yet.
    pub incomplete: Option<i64>,
    /// Events whose logged cost or counterfactual disagree with the
    /// ledger's re-derivation (booked at the ledger's figure).
    pub disagreements: u64,
    /// Events whose logged id the store held for a different event.
    pub conflicts: Vec<Conflict>,
}

/// Below this many bytes no progress bar is drawn.
const PROGRESS_FROM_BYTES: u64 = 16 << 20;

/// An event whose logged `event_id` the store held for a different event:
/// booked apart, under `booked_as`, and reported.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Conflict {
    /// The input's name.
    pub source: String,
    /// 1-based line number.
    pub line: i64,
    /// The id the line logged.
    pub event_id: String,
    /// The id it is booked under: `<event_id>~<16 hex digits of the
    /// SHA-256 of its row's logged fields>` ([`Row::logged`]).
    pub booked_as: String,
}

/// What makes the identity of lines that carry no unique id of their own:
/// rejected lines, and `ace.event/1` events.
#[derive(Default)]
struct Identity {
    /// SHA-256 of the input's first line: tells a rotated log, or another
    /// standard input, from the one ingested before under the same name.
    first: Option<[u8; 32]>,
    /// How often each rejected line's text has come so far.
    rejected: HashMap<[u8; 32], u64>,
    /// How often each `ace.event/1` line's key has come so far.
    v1: HashMap<String, u64>,
}

impl Identity {
    /// The key of rejected line `text` of `source` (see [`Reject::key`]).
    fn reject_key(&mut self, source: &str, text: &[u8]) -> String {
        let line: [u8; 32] = Sha256::digest(text).into();
        let n = self.rejected.entry(line).or_default();
        *n += 1;
        let mut h = Sha256::new();
        h.update(source.as_bytes());
        h.update([0]);
        h.update(self.first.unwrap_or_default());
        h.update(line);
        h.update(n.to_le_bytes());
        let key: [u8; 32] = h.finalize().into();
        hex(&key[..16])
    }

    /// The key of the `ace.event/1` line `text` whose line key is `key`:
    /// that key for its first occurrence in the input, so that ingesting
    /// the same log again books nothing twice; a hash of the line and its
    /// occurrence after that, so two requests that logged the same line (a
    /// client chooses its `x-request-id`) are two events.
    fn v1_key(&mut self, key: String, text: &[u8]) -> String {
        let n = self.v1.entry(key.clone()).or_default();
        *n += 1;
        if *n == 1 {
            return key;
        }
        let mut line = text.to_vec();
        line.extend_from_slice(format!("\n#{n}").as_bytes());
        event::line_key(&line)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

struct Batch<'a> {
    store: &'a mut dyn Store,
    rows: Vec<Row>,
    /// The line number of each of `rows`.
    lines: Vec<i64>,
    rejects: Vec<Reject>,
    size: usize,
    ids: Identity,
}

impl Batch<'_> {
    fn flush(&mut self, s: &mut Summary) -> anyhow::Result<()> {
        if !self.rows.is_empty() {
            let rows = std::mem::take(&mut self.rows);
            let lines = std::mem::take(&mut self.lines);
            let stored = self.insert(&rows, &lines, s)?;
            for ((row, line), new) in rows.into_iter().zip(lines).zip(stored) {
                match new {
                    Some(true) => s.new += 1,
                    Some(false) => self.settle(row, line, s)?,
                    None => {}
                }
            }
        }
        if !self.rejects.is_empty() {
            let mut rejects = std::mem::take(&mut self.rejects);
            self.store.put_rejects(&rejects)?;
            s.rejected.append(&mut rejects);
        }
        Ok(())
    }

    /// Insert `rows` in one transaction, per row whether it was new. When
    /// the store refuses the batch, each row is tried alone, so one line
    /// the store cannot hold is rejected, named by its line (`None`),
    /// instead of rolling back the rest; when it refuses every row, the
    /// store itself is failing and its error stops the ingest.
    fn insert(
        &mut self,
        rows: &[Row],
        lines: &[i64],
        s: &Summary,
    ) -> anyhow::Result<Vec<Option<bool>>> {
        let batch_error = match self.store.insert(rows) {
            Ok(new) => return Ok(new.into_iter().map(Some).collect()),
            Err(e) => e,
        };
        let mut out = Vec::with_capacity(rows.len());
        for (row, line) in rows.iter().zip(lines) {
            match self.store.insert(std::slice::from_ref(row)) {
                Ok(new) => out.push(new.first().copied()),
                Err(e) => {
                    out.push(None);
                    let text = format!("refused {}", row.event_id);
                    let key = self.ids.reject_key(&s.source, text.as_bytes());
                    self.rejects.push(reject(
                        key,
                        &s.source,
                        *line,
                        format!("the store refused event {}: {e:#}", row.event_id),
                        None,
                    ));
                }
            }
        }
        if rows.len() > 1 && out.iter().all(Option::is_none) {
            self.rejects.clear();
            return Err(batch_error);
        }
        Ok(out)
    }

    /// `row`, whose id the store already held: the same logged fields are
    /// an event booked before; different ones are a different event,
    /// booked apart under a derived id and reported, so that no event can
    /// hide another by taking its id.
    fn settle(&mut self, row: Row, line: i64, s: &mut Summary) -> anyhow::Result<()> {
        let said = row.logged();
        if self.store.get(&row.event_id)?.map(|r| r.logged()).as_ref() == Some(&said) {
            s.already += 1;
            return Ok(());
        }
        let digest: [u8; 32] = Sha256::digest(serde_json::to_vec(&said)?).into();
        let logged = row.event_id.clone();
        let mut apart = row;
        apart.event_id = format!("{logged}~{}", hex(&digest[..8]));
        if apart.flags.is_empty() {
            apart.flags = CONFLICT_FLAG.to_string();
        } else {
            apart.flags = format!("{},{CONFLICT_FLAG}", apart.flags);
        }
        if self.store.insert(std::slice::from_ref(&apart))?.first() == Some(&true) {
            s.new += 1;
        } else {
            s.already += 1;
        }
        s.conflicts.push(Conflict {
            source: s.source.clone(),
            line,
            event_id: logged,
            booked_as: apart.event_id,
        });
        Ok(())
    }
}

/// A rejected line, its text made storable.
fn reject(key: String, source: &str, line: i64, error: String, event_id: Option<String>) -> Reject {
    let mut source = source.to_string();
    let mut error = error;
    kind::storable(&mut source);
    kind::storable(&mut error);
    Reject {
        key,
        source,
        line,
        error,
        event_id,
    }
}

/// Ingest `input` (named `source`, `len` bytes if known) into `store`,
/// pricing each event with `registry`.
pub fn ingest(
    store: &mut dyn Store,
    registry: &Registry,
    source: &str,
    mut input: impl BufRead,
    len: Option<u64>,
    opts: &Options,
) -> anyhow::Result<Summary> {
    let bar = match len.filter(|l| opts.progress && *l >= PROGRESS_FROM_BYTES) {
        Some(l) => {
            let bar = indicatif::ProgressBar::new(l);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{msg} {wide_bar} {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
            ) {
                bar.set_style(style);
            }
            bar.set_message(source.to_string());
            bar
        }
        None => indicatif::ProgressBar::hidden(),
    };
    let mut s = Summary {
        source: source.to_string(),
        ..Summary::default()
    };
    let mut batch = Batch {
        store,
        rows: Vec::with_capacity(opts.batch),
        lines: Vec::with_capacity(opts.batch),
        rejects: Vec::new(),
        size: opts.batch.max(1),
        ids: Identity::default(),
    };
    let mut buf = Vec::with_capacity(1024);
    loop {
        let n = input.read_until(b'\n', &mut buf)?;
        bar.inc(n as u64);
        if buf.last() != Some(&b'\n') {
            // End of input, with `buf` holding a line cut short (or nothing).
            let stopped = opts
                .stop
                .as_ref()
                .is_some_and(|f| f.load(Ordering::Relaxed));
            if opts.follow && !stopped {
                batch.flush(&mut s)?;
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
            if !buf.is_empty() {
                let number = s.lines as i64 + 1;
                if event::parse(&buf, opts.v1_config.as_deref()).is_ok() {
                    // A whole event with no newline at the end of the file.
                    s.lines += 1;
                    line(&buf, number, source, registry, opts, &mut batch, &mut s)?;
                } else {
                    s.incomplete = Some(number);
                }
            }
            break;
        }
        s.lines += 1;
        let number = s.lines as i64;
        line(&buf, number, source, registry, opts, &mut batch, &mut s)?;
        buf.clear();
        if batch.rows.len() >= batch.size {
            batch.flush(&mut s)?;
        }
    }
    batch.flush(&mut s)?;
    bar.finish_and_clear();
    Ok(s)
}

fn line(
    text: &[u8],
    number: i64,
    source: &str,
    registry: &Registry,
    opts: &Options,
    batch: &mut Batch<'_>,
    s: &mut Summary,
) -> anyhow::Result<()> {
    let text = text.strip_suffix(b"\n").unwrap_or(text);
    let text = text.strip_suffix(b"\r").unwrap_or(text);
    if text.trim_ascii().is_empty() {
        return Ok(());
    }
    if batch.ids.first.is_none() {
        batch.ids.first = Some(Sha256::digest(text).into());
    }
    let refuse = |batch: &mut Batch<'_>, error: String, event_id: Option<String>| {
        let key = batch.ids.reject_key(source, text);
        batch
            .rejects
            .push(reject(key, source, number, error, event_id));
    };
    let mut e = match event::parse(text, opts.v1_config.as_deref()) {
        Ok(e) => e,
        Err(err) => {
            refuse(batch, err.to_string(), None);
            return Ok(());
        }
    };
    if e.schema == event::SCHEMA_V1 {
        let key = e.event_id.take().unwrap_or_default();
        e.event_id = Some(batch.ids.v1_key(key, text));
    }
    let Some(id) = e.config.clone() else {
        let error = format!(
            "an {} line names no configuration; pass the id of the configuration that filter \
             ran with as --v1-config (registered with --config FILE), and ingest again",
            event::SCHEMA_V1
        );
        refuse(batch, error, e.event_id);
        return Ok(());
    };
    let Some(cfg) = registry.get(&id) else {
        let known = registry.ids().join(", ");
        let error = format!(
            "field `config` is {id:?}, a configuration this ledger does not hold (it holds: \
             {}); register it with `ace ledger ingest --config plugin-config.json ...`, giving \
             the exact JSON the filter loaded (`ace plugin-config` output), and ingest again",
            if known.is_empty() { "none" } else { &known }
        );
        refuse(batch, error, e.event_id);
        return Ok(());
    };
    price::bound_tokens(&mut e, &cfg.config);
    match price::price(&e, cfg, &id) {
        Ok(p) => {
            let row = Row::new(e, id, p);
            s.disagreements += u64::from(row.disagrees());
            batch.rows.push(row);
            batch.lines.push(number);
        }
        Err(err) => refuse(batch, err.to_string(), None),
    }
    Ok(())
}
