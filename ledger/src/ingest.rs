//! Reading access logs into the store.
//!
//! Idempotent by construction: every event has a key (its `event_id`) and
//! the store skips keys it holds, so a file ingested twice, or ingested
//! again after it grew, books each event once. A last line without its
//! newline (a log cut mid-write by a crash) is not booked and not counted
//! as malformed: it is reported as incomplete and booked when it is
//! complete, on the next ingest or, with `follow`, as soon as Envoy
//! finishes it.
//!
//! Lines that are not events (Envoy's `-`, broken JSON, an event its
//! configuration cannot price) are counted and kept with their line numbers
//! ([`Reject`]), never dropped silently. Two things stop the ingest instead,
//! because no later line could be booked right either: a schema this
//! ledger does not read, and a configuration id that is not registered.
//! What was read before them is committed, and ingesting again is safe.

use crate::configs::Registry;
use crate::event::{self, LineError};
use crate::price;
use crate::row::Row;
use crate::store::{Reject, Store};
use anyhow::bail;
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
}

/// Below this many bytes no progress bar is drawn.
const PROGRESS_FROM_BYTES: u64 = 16 << 20;

struct Batch<'a> {
    store: &'a mut dyn Store,
    rows: Vec<Row>,
    rejects: Vec<Reject>,
    size: usize,
}

impl Batch<'_> {
    fn flush(&mut self, s: &mut Summary) -> anyhow::Result<()> {
        if !self.rows.is_empty() {
            let new = self.store.insert(&self.rows)?;
            s.new += new;
            s.already += self.rows.len() as u64 - new;
            self.rows.clear();
        }
        if !self.rejects.is_empty() {
            self.store.put_rejects(&self.rejects)?;
            s.rejected.append(&mut self.rejects);
        }
        Ok(())
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
        rejects: Vec::new(),
        size: opts.batch.max(1),
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
    let reject = |error: String| Reject {
        source: source.to_string(),
        line: number,
        error,
    };
    let e = match event::parse(text, opts.v1_config.as_deref()) {
        Ok(e) => e,
        Err(LineError::UnknownSchema(found)) => {
            batch.flush(s)?;
            bail!(
                "{source}:{number}: {}; the {} events before it are booked, and ingesting \
                 again later is safe",
                LineError::UnknownSchema(found),
                s.new + s.already
            )
        }
        Err(err) => {
            batch.rejects.push(reject(err.to_string()));
            return Ok(());
        }
    };
    let Some(id) = e.config.clone() else {
        batch.flush(s)?;
        bail!(
            "{source}:{number}: an {} line names no configuration; pass the id of the \
             configuration that filter ran with as --v1-config (registered with --config FILE)",
            event::SCHEMA_V1
        )
    };
    let Some(cfg) = registry.get(&id) else {
        batch.flush(s)?;
        let known = registry.ids().join(", ");
        bail!(
            "{source}:{number}: field `config` is {id:?}, a configuration this ledger does not \
             hold (it holds: {}); register it with `ace ledger ingest --config \
             plugin-config.json ...`, giving the exact JSON the filter loaded (`ace \
             plugin-config` output)",
            if known.is_empty() { "none" } else { &known }
        )
    };
    match price::price(&e, cfg, &id) {
        Ok(p) => {
            let row = Row::new(e, id, p);
            s.disagreements += u64::from(!row.flags.is_empty());
            batch.rows.push(row);
        }
        Err(err) => batch.rejects.push(reject(err.to_string())),
    }
    Ok(())
}
