//! What the service knows, how each source's poll updates it, and how it
//! becomes a published snapshot.
//!
//! Every source writes into [`Inputs`] under one mutex; a publisher turns
//! them into reports every interval (and at once after a pushed notice).
//! The snapshot's `version` changes only when the reports change, so an
//! unchanged fleet is answered 304 by ETag. A new version is
//! `max(previous + 1, now in Unix ms)`: it grows with every change and
//! across restarts (as long as the clock does not step back), so a filter
//! that has seen version `v` from an earlier run of the service never
//! mistakes a new snapshot for one it has already applied.
//!
//! Budget readings ([`crate::budgets`]) are published as the last good
//! read left them; each good read carries a new `read_ms`, so it is a new
//! version once per read.
//!
//! Drains: an eviction notice for time `T` drains the destination until
//! `T + --eviction-hold` (default one hour). The instance is gone after
//! `T`, and its metadata service with it, so the poll fails from then on;
//! a failed poll keeps the notice, and the hold keeps the destination out
//! of the merit order while it is gone. A replacement instance that
//! answers "no notice" lifts the drain at once.

use crate::eviction::{self, Answer};
use crate::load::{self, Engine};
use crate::plan::{self, Plan};
use crate::prices::{GpuPrices, TokenPrices};
use crate::{models, Error};
use ace_snapshot::{
    Budget, Drain, DrainReason, Load, Price, Report, Snapshot, MAX_SLOTS, MAX_USD_PER_HOUR,
};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

/// One destination, as the manifest's control table resolves it.
#[derive(Clone, Debug)]
pub(crate) struct Dest {
    pub name: String,
    pub gpus: u32,
    pub engine: Engine,
    pub metrics: Option<String>,
    pub models: Option<String>,
    /// The cloud, its metadata base URL and (Azure) the VM's name.
    pub eviction: Option<(eviction::Cloud, String, Option<String>)>,
    pub price_key: Option<String>,
    pub gpu_price_key: Option<String>,
    /// (RT app, slots per GPU).
    pub plan: Option<(u32, u32)>,
    /// The file holding the model server's API key, sent as a bearer
    /// token with its metrics and model-list requests.
    pub api_key_file: Option<PathBuf>,
    /// The engine's batch token budget, for KV use reported in tokens.
    pub kv_token_budget: Option<u64>,
}

/// What the sources said of one destination.
#[derive(Clone, Debug, Default)]
pub(crate) struct Live {
    /// The last good load and when it was scraped (Unix ms).
    pub load: Option<(Load, u64)>,
    /// When the model server's process started, Unix seconds, as its last
    /// good scrape said (`process_start_time_seconds`).
    pub started_s: Option<f64>,
    /// The last scrape failed.
    pub load_failed: bool,
    pub adapters: Option<Vec<String>>,
    pub models: Option<Vec<String>>,
    /// A polled eviction notice: when the instance goes (Unix ms).
    pub notice: Option<u64>,
    /// A pushed notice (`POST /v1/notice`).
    pub pushed: Option<Drain>,
    /// The last good per-token price.
    pub price: Option<Price>,
}

/// Everything the sources have read.
#[derive(Debug, Default)]
pub(crate) struct Inputs {
    pub live: Vec<Live>,
    /// Per destination, its model server's API key, when it has one.
    pub keys: Vec<Option<String>>,
    pub token_prices: Option<TokenPrices>,
    pub gpu_prices: Option<GpuPrices>,
    pub plan: Option<Plan>,
    /// The last good budget readings from the ledger's store (none before
    /// the first good read).
    pub budgets: Option<Vec<Budget>>,
}

/// A snapshot as served.
#[derive(Debug)]
pub(crate) struct Published {
    pub snapshot: Snapshot,
    pub bytes: Vec<u8>,
    pub etag: String,
}

/// The service's own counters, for `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub ok: AtomicU64,
    pub not_modified: AtomicU64,
    pub unauthorized: AtomicU64,
    pub notices: AtomicU64,
    /// Snapshots that could not be published (the last one stayed).
    pub publish_failures: AtomicU64,
    pub scrape_failures: Vec<AtomicU64>,
    pub source_errors: Mutex<BTreeMap<&'static str, u64>>,
    /// Reads of the ledger's store that succeeded, and that failed.
    pub ledger_reads_ok: AtomicU64,
    pub ledger_reads_failed: AtomicU64,
    /// Whether the last read of the ledger's store succeeded.
    pub ledger_up: AtomicBool,
}

/// Service-wide settings, resolved.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub stale_after_ms: u64,
    pub eviction_hold_ms: u64,
    pub token: Option<String>,
    /// (start, step length), Unix ms and ms.
    pub plan_clock: Option<(u64, u64)>,
    /// The ledger's store as logs show it, when budgets are read from it.
    pub ledger: Option<String>,
}

/// The running service's shared state.
#[derive(Debug)]
pub(crate) struct Service {
    pub dests: Vec<Dest>,
    pub index: HashMap<String, usize>,
    pub settings: Settings,
    pub inputs: Mutex<Inputs>,
    pub published: RwLock<Arc<Published>>,
    problems: Mutex<BTreeMap<String, String>>,
    pub counters: Counters,
    pub wake: tokio::sync::Notify,
    /// One publish at a time (the publisher's tick and the webhook's).
    publishing: Mutex<()>,
    /// The server's connections.
    pub conns: Arc<crate::listen::Stats>,
}

/// Unix ms now.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means a panic elsewhere; the data is plain.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Service {
    pub fn new(dests: Vec<Dest>, settings: Settings, inputs: Inputs) -> Service {
        let index = dests
            .iter()
            .enumerate()
            .map(|(i, d)| (d.name.clone(), i))
            .collect();
        let empty = Snapshot::default();
        let bytes = ace_snapshot::encode(&empty).unwrap_or_default();
        let etag = ace_snapshot::etag(&bytes).unwrap_or_default();
        let counters = Counters {
            scrape_failures: dests.iter().map(|_| AtomicU64::new(0)).collect(),
            ..Counters::default()
        };
        Service {
            dests,
            index,
            settings,
            inputs: Mutex::new(inputs),
            published: RwLock::new(Arc::new(Published {
                snapshot: empty,
                bytes,
                etag,
            })),
            problems: Mutex::new(BTreeMap::new()),
            counters,
            wake: tokio::sync::Notify::new(),
            publishing: Mutex::new(()),
            conns: Arc::default(),
        }
    }

    pub fn inputs(&self) -> std::sync::MutexGuard<'_, Inputs> {
        lock(&self.inputs)
    }

    pub fn current(&self) -> Arc<Published> {
        self.published
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Records the outcome of one attempt of `source` at `key` (the
    /// destination and URL, or the file): an error is counted every time
    /// and logged once per change of message; a recovery is logged once.
    pub fn note(&self, source: &'static str, key: &str, result: Result<(), &str>) {
        let mut problems = lock(&self.problems);
        let key = format!("{source}: {key}");
        let key = key.as_str();
        match result {
            Err(msg) => {
                *lock(&self.counters.source_errors)
                    .entry(source)
                    .or_insert(0) += 1;
                if problems.get(key).map(String::as_str) != Some(msg) {
                    crate::log(&format!("{key}: {msg}"));
                    problems.insert(key.to_string(), msg.to_string());
                }
            }
            Ok(()) => {
                if problems.remove(key).is_some() {
                    crate::log(&format!("{key}: recovered"));
                }
            }
        }
    }

    /// Scrapes destination `d`'s metrics once.
    pub async fn poll_metrics(&self, d: usize, client: &reqwest::Client) {
        let Some(dest) = self.dests.get(d) else {
            return;
        };
        let Some(url) = &dest.metrics else {
            return;
        };
        let key = format!("destination `{}`", dest.name);
        let api_key = self.api_key(d);
        let got = async {
            let body =
                crate::get_text(client, url, crate::MAX_METRICS_BYTES, api_key.as_deref()).await?;
            load::read(dest.engine, &body, dest.kv_token_budget)
                .map_err(|e| Error::new(format!("{url}: {e}")))
        }
        .await;
        let now = now_ms();
        let mut inputs = self.inputs();
        let Some(live) = inputs.live.get_mut(d) else {
            return;
        };
        match got {
            Ok(f) => {
                // A new process: what the old one had loaded is gone
                // until the server lists it again.
                let restarted =
                    matches!((live.started_s, f.started_s), (Some(a), Some(b)) if a != b);
                if restarted {
                    live.models = None;
                }
                live.started_s = f.started_s.or(live.started_s);
                live.load = Some((f.load, now));
                live.load_failed = false;
                live.adapters = f.adapters;
                drop(inputs);
                if restarted {
                    crate::log(&format!(
                        "metrics: destination `{}`: the model server restarted; its held figures and loaded models are dropped",
                        dest.name
                    ));
                }
                self.note("metrics", &key, Ok(()));
            }
            Err(e) => {
                live.load_failed = true;
                drop(inputs);
                if let Some(failures) = self.counters.scrape_failures.get(d) {
                    failures.fetch_add(1, Ordering::Relaxed);
                }
                self.note("metrics", &key, Err(&e.0));
            }
        }
    }

    /// Destination `d`'s model-server API key, if it has one.
    fn api_key(&self, d: usize) -> Option<String> {
        self.inputs().keys.get(d).cloned().flatten()
    }

    /// Reads destination `d`'s model list once.
    pub async fn poll_models(&self, d: usize, client: &reqwest::Client) {
        let Some(dest) = self.dests.get(d) else {
            return;
        };
        let Some(url) = &dest.models else {
            return;
        };
        let key = format!("destination `{}`", dest.name);
        let api_key = self.api_key(d);
        let got = async {
            let body =
                crate::get_bytes(client, url, crate::MAX_MODELS_BYTES, api_key.as_deref()).await?;
            models::read(&body).map_err(|e| Error::new(format!("{url}: {e}")))
        }
        .await;
        match got {
            Ok(ids) => {
                if let Some(live) = self.inputs().live.get_mut(d) {
                    live.models = Some(ids);
                }
                self.note("models", &key, Ok(()));
            }
            Err(e) => self.note("models", &key, Err(&e.0)),
        }
    }

    /// Polls destination `d`'s eviction notices once.
    pub async fn poll_eviction(
        &self,
        d: usize,
        poller: &mut eviction::Poller,
        client: &reqwest::Client,
    ) {
        let Some(dest) = self.dests.get(d) else {
            return;
        };
        let key = format!("destination `{}`", dest.name);
        match poller.poll(client, now_ms()).await {
            Ok(answer) => {
                let at = match answer {
                    Answer::Clear => None,
                    Answer::Notice { at_ms, what } => Some((at_ms, what)),
                };
                let before = match self.inputs().live.get_mut(d) {
                    Some(live) => std::mem::replace(&mut live.notice, at.as_ref().map(|(t, _)| *t)),
                    None => return,
                };
                match (&before, &at) {
                    (None, Some((_, what))) => {
                        self.counters.notices.fetch_add(1, Ordering::Relaxed);
                        crate::log(&format!(
                            "eviction: destination `{}`: {what}: drained",
                            dest.name
                        ));
                    }
                    (Some(_), None) => crate::log(&format!(
                        "eviction: destination `{}`: the notice is gone: drain lifted",
                        dest.name
                    )),
                    _ => {}
                }
                self.note("eviction", &key, Ok(()));
            }
            Err(e) => self.note("eviction", &key, Err(&e.0)),
        }
    }

    /// Takes a freshly read price table: each destination's price is
    /// looked up now; one whose entry is missing or bad keeps its last
    /// good price.
    pub fn set_token_prices(&self, t: TokenPrices, source: &str) {
        let mut results = Vec::new();
        {
            let mut inputs = self.inputs();
            for (dest, live) in self.dests.iter().zip(inputs.live.iter_mut()) {
                if let Some(k) = &dest.price_key {
                    let key = format!("destination `{}` price_key in {source}", dest.name);
                    match t.price(k) {
                        Ok(p) => {
                            live.price = Some(p);
                            results.push((key, Ok(())));
                        }
                        Err(e) => results.push((key, Err(e))),
                    }
                }
            }
            inputs.token_prices = Some(t);
        }
        for (key, r) in results {
            self.note(
                "prices",
                &key,
                r.as_ref().map(|_| ()).map_err(String::as_str),
            );
        }
    }

    /// Takes a freshly read GPU price feed.
    pub fn set_gpu_prices(&self, f: GpuPrices, source: &str) {
        for dest in &self.dests {
            if let Some(k) = &dest.gpu_price_key {
                let key = format!("destination `{}` gpu_price_key in {source}", dest.name);
                let r = if f.has(k) {
                    Ok(())
                } else {
                    Err(format!("no `{k}` in the GPU price feed"))
                };
                self.note(
                    "gpu_prices",
                    &key,
                    r.as_ref().map(|_| ()).map_err(String::as_str),
                );
            }
        }
        self.inputs().gpu_prices = Some(f);
    }

    /// Takes a `POST /v1/notice`: destination `d` drained as given (a time
    /// in the past lifts it).
    pub fn push_notice(&self, d: usize, drain: Drain) {
        let Some(dest) = self.dests.get(d) else {
            return;
        };
        let lifted = drain.until_ms <= now_ms();
        if let Some(live) = self.inputs().live.get_mut(d) {
            live.pushed = (!lifted).then_some(drain);
        }
        if !lifted && drain.reason == DrainReason::Eviction {
            self.counters.notices.fetch_add(1, Ordering::Relaxed);
        }
        crate::log(&format!(
            "notice: destination `{}`: {} until {} ({})",
            dest.name,
            if lifted { "lifted" } else { "drained" },
            drain.until_ms,
            drain.reason.as_str()
        ));
        self.wake.notify_one();
    }

    /// Takes the outcome of one read of the ledger's store: good readings
    /// replace the published ones (and wake the publisher); a failure
    /// keeps the last good ones as they were, so no limit is lifted and
    /// every filter keeps counting its own spend on top.
    pub fn set_budgets(&self, got: Result<Vec<Budget>, String>, store: &str) {
        let c = &self.counters;
        match got {
            Ok(v) => {
                self.inputs().budgets = Some(v);
                c.ledger_reads_ok.fetch_add(1, Ordering::Relaxed);
                c.ledger_up.store(true, Ordering::Relaxed);
                self.note("ledger", store, Ok(()));
                self.wake.notify_one();
            }
            Err(e) => {
                c.ledger_reads_failed.fetch_add(1, Ordering::Relaxed);
                c.ledger_up.store(false, Ordering::Relaxed);
                let kept = match &self.inputs().budgets {
                    Some(_) => "the last good budget readings stay published",
                    None => "no budget readings are published until a read succeeds",
                };
                self.note("ledger", store, Err(&format!("{e}; {kept}")));
            }
        }
    }

    /// The `read_ms` of the last good budget readings (0: none yet).
    pub fn budgets_read_ms(&self) -> u64 {
        self.inputs()
            .budgets
            .as_ref()
            .and_then(|v| v.iter().map(|b| b.read_ms).max())
            .unwrap_or(0)
    }

    /// The reports the sources give at `now`.
    pub fn build(&self, now: u64) -> Vec<Report> {
        let s = &self.settings;
        let inputs = self.inputs();
        let step = s
            .plan_clock
            .and_then(|(start, len)| plan::current_step(now, start, len));
        let mut problems: Vec<(&'static str, String, Result<(), String>)> = Vec::new();
        let mut plan_gap: Option<String> = None;
        let mut out = Vec::new();
        for (dest, live) in self.dests.iter().zip(&inputs.live) {
            let load = live.load.map(|(l, at)| {
                let stale = live.load_failed || now.saturating_sub(at) > s.stale_after_ms;
                // Held figures carry their scrape time, for the filter's
                // bound; current ones none, so they do not change the
                // snapshot at every scrape.
                let scraped_ms = if stale { at.max(1) } else { 0 };
                Load {
                    stale,
                    scraped_ms,
                    ..l
                }
            });
            let capacity = match (dest.plan, &inputs.plan) {
                (Some((app, slots)), Some(p)) => match step.and_then(|k| p.gpus(k, app)) {
                    Some(g) => {
                        let c = u64::from(g) * u64::from(slots);
                        let key = format!("destination `{}` capacity", dest.name);
                        if c > u64::from(MAX_SLOTS) {
                            problems.push((
                                "plan",
                                key,
                                Err(format!("{g} GPUs x {slots} slots is above the snapshot's limit of {MAX_SLOTS}")),
                            ));
                            None
                        } else {
                            problems.push(("plan", key, Ok(())));
                            Some(c as u32)
                        }
                    }
                    None => {
                        plan_gap = Some(match step {
                            None => "now is before --plan-start: no capacity reported".to_string(),
                            Some(k) => format!("the plan has no step {k}: no capacity reported; roll the plan further"),
                        });
                        None
                    }
                },
                _ => None,
            };
            let usd_per_hour = match (&dest.gpu_price_key, &inputs.gpu_prices) {
                (Some(k), Some(f)) => f.at(k, now).and_then(|p| {
                    let h = p * f64::from(dest.gpus);
                    let key = format!("destination `{}` hourly price", dest.name);
                    if h <= MAX_USD_PER_HOUR {
                        problems.push(("gpu_prices", key, Ok(())));
                        Some(h)
                    } else {
                        problems.push((
                            "gpu_prices",
                            key,
                            Err(format!("{p} USD x {} GPUs is above the snapshot's limit of {MAX_USD_PER_HOUR} USD per hour", dest.gpus)),
                        ));
                        None
                    }
                }),
                _ => None,
            };
            let polled = live.notice.map(|at| Drain {
                until_ms: at.saturating_add(s.eviction_hold_ms),
                reason: DrainReason::Eviction,
            });
            let drain = [polled, live.pushed]
                .into_iter()
                .flatten()
                .filter(|d| d.until_ms > now)
                .max_by_key(|d| d.until_ms);
            let warm = live.models.as_ref().map(|m| {
                let mut w = m.clone();
                w.extend(live.adapters.iter().flatten().cloned());
                w.retain(|n| !n.is_empty() && n.len() <= ace_snapshot::MAX_NAME);
                w.sort();
                w.dedup();
                w.truncate(ace_snapshot::MAX_WARM);
                w
            });
            let r = Report {
                name: dest.name.clone(),
                load,
                capacity,
                price: live.price,
                usd_per_hour,
                drain,
                warm,
            };
            if r.load.is_some()
                || r.capacity.is_some()
                || r.price.is_some()
                || r.usd_per_hour.is_some()
                || r.drain.is_some()
                || r.warm.is_some()
            {
                out.push(r);
            }
        }
        if inputs.plan.is_some() && self.dests.iter().any(|d| d.plan.is_some()) {
            problems.push(("plan", "plan step".into(), plan_gap.map_or(Ok(()), Err)));
        }
        drop(inputs);
        for (source, key, r) in problems {
            self.note(source, &key, r.as_ref().map(|_| ()).map_err(String::as_str));
        }
        out
    }

    /// Publishes the reports at `now` as a new version if they changed.
    /// The snapshot is first fitted to its bounds ([`fit`]): warm lists
    /// give way so that load, staleness, prices, capacity and drains are
    /// always published. A snapshot that still cannot be encoded is not
    /// published (the last one stays): counted, logged, and returned as
    /// the error, so that a caller that needs it out (the webhook) can say so.
    pub fn publish(&self, now: u64) -> Result<(), String> {
        let _one = lock(&self.publishing);
        let mut reports = self.build(now);
        let budgets = self.inputs().budgets.clone().unwrap_or_default();
        let fitted = fit(&mut reports, &budgets);
        for (cut, r) in fitted.cut.iter().zip(&reports) {
            let key = format!("destination `{}` warm list", r.name);
            let r = match cut {
                Some((kept, of)) => Err(format!(
                    "{kept} of {of} warm models kept, to stay within {MAX_WARM_BYTES} bytes \
                     per destination"
                )),
                None => Ok(()),
            };
            self.note(
                "snapshot",
                &key,
                r.as_ref().map(|_| ()).map_err(String::as_str),
            );
        }
        let size = match fitted.dropped {
            0 => Ok(()),
            n => Err(format!(
                "{n} destinations' warm lists left out to keep the snapshot within {} bytes \
                 (their configured warm models apply); fewer loaded models or adapters per \
                 server bring them back",
                ace_snapshot::MAX_BYTES
            )),
        };
        self.note(
            "snapshot",
            "snapshot size",
            size.as_ref().map(|_| ()).map_err(String::as_str),
        );
        let current = self.current();
        if current.snapshot.version != 0
            && current.snapshot.reports == reports
            && current.snapshot.budgets == budgets
        {
            return Ok(());
        }
        let snapshot = Snapshot {
            version: (current.snapshot.version + 1).max(now),
            generated_ms: now,
            reports,
            budgets,
        };
        match ace_snapshot::encode(&snapshot) {
            Ok(bytes) => {
                let etag = ace_snapshot::etag(&bytes).unwrap_or_default();
                *self.published.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(Published {
                    snapshot,
                    bytes,
                    etag,
                });
                self.note("snapshot", "snapshot", Ok(()));
                Ok(())
            }
            Err(e) => {
                self.counters
                    .publish_failures
                    .fetch_add(1, Ordering::Relaxed);
                let msg = format!(
                    "not published, so drains and staleness do not reach Envoy; the last \
                     snapshot (version {}) stays: {e}",
                    current.snapshot.version
                );
                self.note("snapshot", "snapshot", Err(&msg));
                Err(msg)
            }
        }
    }
}

/// The most bytes one destination's warm list takes in a snapshot (its
/// names and their length prefixes): with [`ace_snapshot::MAX_WARM`] names
/// of [`ace_snapshot::MAX_NAME`] bytes one list alone could take 258 KiB,
/// and 32 of them the whole snapshot.
pub(crate) const MAX_WARM_BYTES: usize = 64 << 10;

/// What [`fit`] left out.
#[derive(Debug, Default)]
pub(crate) struct Fitted {
    /// Per report: (names kept, names given) where its list was cut.
    pub cut: Vec<Option<(usize, usize)>>,
    /// How many reports' warm lists were left out whole.
    pub dropped: usize,
}

/// The bytes a warm list takes on the wire.
fn warm_bytes(w: &[String]) -> usize {
    2 + w.iter().map(|n| 2 + n.len()).sum::<usize>()
}

/// Fits `reports` to the snapshot's bounds, least important data first:
/// each warm list is cut to [`MAX_WARM_BYTES`], then, while the whole
/// would pass [`ace_snapshot::MAX_BYTES`], the largest warm lists are left
/// out (a destination without one falls back to its configured warm
/// models). Load, staleness, prices, capacity and drains are never left
/// out: they are a few dozen bytes per destination. Budget readings
/// (`budgets`, bounded by the configuration's own limits) are never left
/// out either.
pub(crate) fn fit(reports: &mut [Report], budgets: &[Budget]) -> Fitted {
    let mut fitted = Fitted {
        cut: vec![None; reports.len()],
        dropped: 0,
    };
    for (r, cut) in reports.iter_mut().zip(&mut fitted.cut) {
        if let Some(w) = &mut r.warm {
            if warm_bytes(w) > MAX_WARM_BYTES {
                let of = w.len();
                let mut used = 2;
                let keep = w
                    .iter()
                    .take_while(|n| {
                        used += 2 + n.len();
                        used <= MAX_WARM_BYTES
                    })
                    .count();
                w.truncate(keep);
                *cut = Some((keep, of));
            }
        }
    }
    let mut size = ace_snapshot::encoded_len(reports, budgets);
    if size > ace_snapshot::MAX_BYTES {
        let mut by_size: Vec<(usize, usize)> = reports
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.warm.as_deref().map(|w| (warm_bytes(w), i)))
            .collect();
        by_size.sort_unstable_by(|a, b| b.cmp(a));
        for (bytes, i) in by_size {
            if size <= ace_snapshot::MAX_BYTES {
                break;
            }
            if let Some(r) = reports.get_mut(i) {
                r.warm = None;
            }
            size -= bytes;
            fitted.dropped += 1;
        }
    }
    fitted
}

/// A file re-read when its modification time or size changes.
#[derive(Debug)]
pub(crate) struct Watched {
    pub path: PathBuf,
    stamp: Option<(SystemTime, u64)>,
}

impl Watched {
    pub fn new(path: PathBuf) -> Watched {
        Watched { path, stamp: None }
    }

    /// The file's bytes if it changed since the last call.
    pub fn changed(&mut self) -> Result<Option<Vec<u8>>, Error> {
        let meta = std::fs::metadata(&self.path)
            .map_err(|e| Error::new(format!("cannot read {}: {e}", self.path.display())))?;
        let stamp = (
            meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            meta.len(),
        );
        if self.stamp == Some(stamp) {
            return Ok(None);
        }
        let bytes = std::fs::read(&self.path)
            .map_err(|e| Error::new(format!("cannot read {}: {e}", self.path.display())))?;
        self.stamp = Some(stamp);
        Ok(Some(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(i: usize, names: usize, len: usize) -> Report {
        Report {
            name: format!("d{i:03}"),
            drain: Some(Drain {
                until_ms: 1,
                reason: DrainReason::Eviction,
            }),
            load: Some(Load {
                stale: true,
                ..Load::default()
            }),
            warm: Some(
                (0..names)
                    .map(|k| format!("{k:04}{}", "m".repeat(len - 4)))
                    .collect(),
            ),
            ..Report::default()
        }
    }

    #[test]
    fn warm_lists_give_way_per_destination_and_in_total() {
        // 200 destinations of 1,024 names of 250 bytes: 52 MB of warm lists.
        let mut reports: Vec<Report> = (0..200).map(|i| report(i, 1024, 250)).collect();
        let fitted = fit(&mut reports, &[]);
        let encoded = ace_snapshot::encode(&Snapshot {
            version: 1,
            generated_ms: 1,
            reports: reports.clone(),
            budgets: Vec::new(),
        })
        .expect("fitted reports encode");
        assert!(encoded.len() <= ace_snapshot::MAX_BYTES);
        assert!(fitted
            .cut
            .iter()
            .all(|c| c.is_some_and(|(k, of)| k < of && of == 1024)));
        assert!(
            fitted.dropped > 0 && fitted.dropped < 200,
            "{}",
            fitted.dropped
        );
        for r in &reports {
            assert!(r.drain.is_some() && r.load.is_some_and(|l| l.stale));
            assert!(r
                .warm
                .as_deref()
                .is_none_or(|w| warm_bytes(w) <= MAX_WARM_BYTES));
        }
        // Small lists are left alone.
        let mut small = vec![report(0, 3, 10)];
        let fitted = fit(&mut small, &[]);
        assert_eq!((fitted.cut, fitted.dropped), (vec![None], 0));
        assert_eq!(small[0].warm.as_ref().unwrap().len(), 3);
    }
}
