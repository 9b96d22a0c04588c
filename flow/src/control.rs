//! What the control service says of the fleet, checked against this
//! configuration and applied to the fleet's state; and the host-free
//! steps of polling it.
//!
//! Why here and not in a host: every host polls (or, in the simulator,
//! plays) the same service and must treat its answers the same way; only
//! how the bytes travel differs. The Wasm build fetches from whichever
//! worker holds a lease in shared data and relays the bytes to the other
//! workers; the dynamic module fetches once per Envoy from the main thread
//! and publishes the bytes to every fleet; the simulator hands its encoded
//! snapshots straight over. Each of them feeds what arrived, as a
//! [`Delivery`], to one [`Consumer`] per configuration, which alone
//! decides; the transport steps (when a poll may go, its headers, what an
//! answer's status and body mean) are one [`Poller`] over a small
//! [`Transport`] trait, so a host only moves bytes.
//!
//! The rules, in one place:
//!
//! - A snapshot moves prices, load, capacity, drains and warmth, through
//!   [`Signal`]s into [`Live`] (so a new kind of signal is one variant, as
//!   `ace_core::fleet` says). It can never add a destination or change
//!   feasibility: the policy tables alone decide that, and nothing here
//!   touches them.
//! - A snapshot that does not decode, names a destination this
//!   configuration does not know, or carries a figure a signal refuses, is
//!   rejected whole, with an error naming the destination and field; the
//!   last good one stays in force. A rejection is not hearing: staleness
//!   keeps counting from the last accepted answer, so a service that keeps
//!   sending bad snapshots goes stale after `stale_after_ms` exactly as a
//!   dead one does. Each distinct rejected snapshot (its ETag: version and
//!   checksum) is logged once and counted once ([`Verdict::Refused`]'s
//!   `first`), however often it is sent again.
//! - A "not modified" (304) is hearing only when what is unchanged is the
//!   snapshot in force: the consumer compares the ETag the poll sent with
//!   the one in force. A 304 for a rejected snapshot, or before any
//!   snapshot, is not hearing. The same bytes as the snapshot in force,
//!   sent again in full (a service that ignores `If-None-Match`), are
//!   hearing, and are not applied again.
//! - Versions are compared for equality, not order. A snapshot with a
//!   version lower than the one in force that this consumer has not had
//!   before is taken at once: the control service numbers versions
//!   `max(previous + 1, now in Unix ms)`, so a lower one is a service
//!   restarted with its clock stepped back, or another replica whose
//!   clock is behind (`control/README.md`, "Several replicas"), and either
//!   is the service's newest knowledge; refusing it would freeze the
//!   filter until the clock caught up. What is refused is a replay: a
//!   snapshot (its ETag) that was in force here and has since been
//!   replaced (one of the last 16), sent again, whatever its version. The
//!   service never sends one (any change makes a new version), so it is
//!   an old answer replayed (a cache, a stale replica flapping back): it
//!   is refused ([`Rejected::Replayed`]) and not heard while the snapshot
//!   in force is fresh, so it never undoes newer knowledge while the
//!   service is heard; once the one in force is stale, it is taken when
//!   it comes again (in full, or as a 304 for it), as the only answer
//!   there is. Snapshots a consumer of the same configuration already
//!   took ([`Delivery::Relayed`]: the Wasm workers that did not poll) skip
//!   this rule: it was the poller's to apply, and workers must not split.
//! - A snapshot's budget readings ([`crate::budget::Reading`]) are kept
//!   per budget and replaced only by a later reading (its `read_ms`): a
//!   snapshot that leaves one out, an old one replayed, or a service gone
//!   stale never lifts a limit. A reading naming a budget this
//!   configuration lacks is passed over (another manifest's budgets say
//!   nothing of these).
//! - Losing the service never stops traffic: the last snapshot stays in
//!   force, and once nothing has been heard for `stale_after_ms` it is
//!   stale: its load figures are dropped (the filter's own in-flight counts
//!   and passive health remain), its prices, capacities, drains and warmth
//!   kept (they are still the best knowledge there is). A later answer
//!   (a snapshot taken, or a 304 for the one in force) makes it fresh
//!   again, with no restart. Before the first answer, the age counts from
//!   when the consumer began.
//! - One destination's load can be stale while the snapshot is fresh: the
//!   service could not scrape that model server and holds its last good
//!   figures, marked stale with their scrape time. They are priced for
//!   `control.held_load_ms` from that time ([`held_load_ms`]), then
//!   dropped like a stale snapshot's: a server that stopped answering
//!   neither looks idle at once nor keeps phantom requests priced for ever.
//!   The end is an instant, so the fleet state reprices it with time alone
//!   (`ace_core::fleet::Live::depends_on_time`), on every host alike.
//! - Transport ([`Poller`]): one poll in flight at a time (one that never
//!   comes back is given up after `timeout_ms + interval_ms`); its headers
//!   are [`poll_headers`], with `If-None-Match` the ETag the host passes
//!   (the snapshot in force, for a single configuration). A 200's body is
//!   a snapshot to deliver; a 304 is "unchanged" for the ETag sent; a failed call or any other status delivers nothing, is counted
//!   (`ace.control.errors`) and logged once per distinct problem until an
//!   answer comes again. How often a poll may go is the host's (the Wasm
//!   lease, the dynamic module's main-thread timer).

use crate::budget::Reading;
use ace_config::{Config, Control, Warmth};
use ace_core::fleet::{FleetState, Live, Signal, SignalError};
use ace_snapshot::Snapshot;
use std::fmt;

/// A snapshot this configuration cannot take, and why.
#[derive(Debug, Clone, PartialEq)]
pub enum Rejected {
    /// The bytes are not a valid snapshot.
    Decode(ace_snapshot::Error),
    /// It names a destination the configuration does not have.
    Unknown {
        /// The name.
        name: String,
    },
    /// A figure the fleet state refuses.
    Signal {
        /// The destination.
        name: String,
        /// Which figure.
        field: &'static str,
        /// Why.
        error: SignalError,
    },
    /// It was in force here before and has since been replaced (a
    /// replayed answer), and the one in force is still fresh.
    Replayed {
        /// Its version.
        version: u64,
        /// The version in force.
        in_force: u64,
    },
}

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejected::Decode(e) => write!(f, "{e}"),
            Rejected::Unknown { name } => write!(
                f,
                "control snapshot names destination `{name}`, which this configuration does not \
                 have: a snapshot cannot add destinations (regenerate the plugin configuration \
                 from the manifest the control service reads)"
            ),
            Rejected::Signal { name, field, error } => write!(
                f,
                "control snapshot, destination `{name}`, field `{field}`: {error}"
            ),
            Rejected::Replayed { version, in_force } => write!(
                f,
                "control snapshot version {version} was in force before and has been replaced \
                 (now version {in_force}): a replayed answer; it is taken only if the one in \
                 force goes stale (control.stale_after_ms)"
            ),
        }
    }
}

/// A snapshot resolved against a configuration: per destination, in
/// configuration order, what it says.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// The snapshot's version.
    pub version: u64,
    /// The checksum of the bytes it was decoded from ([`decode`]; `None`
    /// when resolved from a [`Snapshot`] value).
    pub checksum: Option<u32>,
    /// Per destination: the signals, folded.
    pub lives: Vec<Live>,
    /// Which destinations have which models resident: the snapshot's list
    /// where it gives one, the configured one elsewhere.
    pub warmth: Warmth,
    /// Per configured budget, the snapshot's reading of it, if it gives
    /// one (a budget the configuration lacks is passed over: a service
    /// reading another manifest's budgets tells this one nothing).
    pub budgets: Vec<Option<Reading>>,
}

/// Decode `bytes` and resolve them against `cfg`.
pub fn decode(cfg: &Config, bytes: &[u8]) -> Result<Resolved, Rejected> {
    let snapshot = ace_snapshot::decode(bytes).map_err(Rejected::Decode)?;
    let mut resolved = resolve(cfg, &snapshot)?;
    resolved.checksum = ace_snapshot::checksum(bytes);
    Ok(resolved)
}

/// How long held (stale) load figures are priced from their scrape under
/// `cfg`: `control.held_load_ms`, or [`DEFAULT_HELD_LOAD_MS`] for a
/// configuration without a `control` object (a host fed snapshots some
/// other way, as the simulator is).
pub fn held_load_ms(cfg: &Config) -> u64 {
    cfg.control
        .as_ref()
        .map_or(DEFAULT_HELD_LOAD_MS, |c| c.held_load_ms)
}

/// [`held_load_ms`] without a `control` object: the default
/// `control.stale_after_ms` at the default interval.
pub const DEFAULT_HELD_LOAD_MS: u64 = 5_000;

/// Resolve `snapshot` against `cfg`: each report to its destination's
/// index, each figure through [`Live::apply`].
pub fn resolve(cfg: &Config, snapshot: &Snapshot) -> Result<Resolved, Rejected> {
    let n = cfg.destinations.len();
    let held_ms = held_load_ms(cfg);
    let mut lives = vec![Live::default(); n];
    let mut warm: Vec<Option<&[String]>> = cfg
        .destinations
        .iter()
        .map(|d| d.warm_models.as_deref())
        .collect();
    let index: std::collections::HashMap<&str, usize> = cfg
        .destinations
        .iter()
        .enumerate()
        .map(|(i, d)| (d.name.as_str(), i))
        .collect();
    for r in &snapshot.reports {
        let Some(&d) = index.get(r.name.as_str()) else {
            return Err(Rejected::Unknown {
                name: r.name.clone(),
            });
        };
        let signals = [
            r.load.map(|l| {
                let requests = l.requests();
                // Held figures (unknown scrape time: 0) end `held_ms` after
                // their scrape; current ones do not end.
                let until_ms = l.stale.then(|| l.scraped_ms.saturating_add(held_ms));
                ("load", Signal::Load { requests, until_ms })
            }),
            r.capacity
                .map(|slots| ("capacity", Signal::Capacity { slots })),
            r.price.map(|p| {
                let signal = Signal::Price {
                    usd_per_input_token: p.usd_per_input_token,
                    usd_per_output_token: p.usd_per_output_token,
                };
                ("price", signal)
            }),
            r.usd_per_hour
                .map(|usd_per_hour| ("usd_per_hour", Signal::HourlyPrice { usd_per_hour })),
            r.drain.map(|d| {
                let until_ms = d.until_ms;
                ("drain", Signal::Drain { until_ms })
            }),
        ];
        let (Some(live), Some(w)) = (lives.get_mut(d), warm.get_mut(d)) else {
            continue; // unreachable: `d` indexes the destinations
        };
        for (field, signal) in signals.into_iter().flatten() {
            live.apply(signal).map_err(|error| Rejected::Signal {
                name: r.name.clone(),
                field,
                error,
            })?;
        }
        if let Some(models) = &r.warm {
            *w = Some(models.as_slice());
        }
    }
    let warmth = Warmth::from_lists(n, |i| warm.get(i).copied().flatten());
    let mut budgets = vec![None; cfg.budgets.list.len()];
    for b in &snapshot.budgets {
        let slot = cfg
            .budgets
            .named(&b.name)
            .and_then(|(i, _)| budgets.get_mut(i));
        if let Some(slot) = slot {
            *slot = Some(Reading {
                state: b.state,
                spent_usd: b.spent_usd,
                read_ms: b.read_ms,
                resets_ms: b.resets_ms,
            });
        }
    }
    Ok(Resolved {
        version: snapshot.version,
        checksum: None,
        lives,
        warmth,
        budgets,
    })
}

/// What this host holds from the control service: the snapshot in force
/// and whether it is fresh.
#[derive(Debug, Clone, PartialEq)]
pub struct Outside {
    /// The version in force (`None`: none yet).
    pub version: Option<u64>,
    /// The checksum of the snapshot in force.
    pub checksum: Option<u32>,
    /// When the service last answered (a snapshot or "not modified"), ms.
    pub heard_ms: u64,
    /// Whether nothing has been heard for the configured age.
    pub stale: bool,
    /// Per destination, what the snapshot in force says.
    lives: Vec<Live>,
    /// Which destinations have which models resident.
    pub warmth: Warmth,
    /// Per configured budget, the latest reading heard: replaced only by a
    /// later one, kept when a snapshot leaves it out or goes stale (a
    /// limit is never lifted by silence).
    budgets: Vec<Reading>,
}

impl Outside {
    /// Nothing heard yet: configured warmth, no signals.
    pub fn new(cfg: &Config) -> Outside {
        Outside {
            version: None,
            checksum: None,
            heard_ms: 0,
            stale: false,
            lives: vec![Live::default(); cfg.destinations.len()],
            warmth: cfg.warmth.clone(),
            budgets: vec![Reading::default(); cfg.budgets.list.len()],
        }
    }

    /// The reading held of budget `b` (none yet: an empty one).
    pub fn budget(&self, b: u16) -> Reading {
        self.budgets
            .get(usize::from(b))
            .copied()
            .unwrap_or_default()
    }

    /// Take `resolved`, heard at `now_ms`.
    pub fn accept(&mut self, resolved: Resolved, now_ms: u64) {
        self.version = Some(resolved.version);
        self.checksum = resolved.checksum;
        self.lives = resolved.lives;
        self.warmth = resolved.warmth;
        for (held, new) in self.budgets.iter_mut().zip(resolved.budgets) {
            *held = held.or_newer(new);
        }
        self.heard(now_ms);
    }

    /// Whether the snapshot in force is the one with `version` and
    /// `checksum`. Both, not the version alone: a service may publish
    /// other bytes under a version already seen (a restart with a clock
    /// behind, a replica), and workers that compared versions alone
    /// split between the two snapshots.
    pub fn holds(&self, version: u64, checksum: u32) -> bool {
        self.version == Some(version) && self.checksum == Some(checksum)
    }

    /// The service answered at `now_ms` (perhaps "not modified").
    pub fn heard(&mut self, now_ms: u64) {
        self.heard_ms = self.heard_ms.max(now_ms);
        self.stale = false;
    }

    /// Whether the snapshot has gone stale by `now_ms` under `control`
    /// (first heard counts from `started_ms`, when polling began). Returns
    /// `true` when this call changed it.
    pub fn age(&mut self, control: &Control, started_ms: u64, now_ms: u64) -> bool {
        self.age_by(control.stale_after_ms, &control.cluster, started_ms, now_ms)
    }

    /// [`Outside::age`] with the age and the cluster's name given.
    /// Going stale is logged once, here, for every host.
    fn age_by(&mut self, stale_after_ms: u64, cluster: &str, started_ms: u64, now_ms: u64) -> bool {
        let stale = self.age_ms(started_ms, now_ms) > stale_after_ms;
        let changed = stale != self.stale;
        self.stale = stale;
        if changed && stale {
            log::warn!(
                "control snapshot is stale: nothing heard from cluster `{cluster}` for over \
                 {stale_after_ms} ms; dropping its load figures, keeping its prices"
            );
        }
        changed
    }

    /// How long since the service was last heard at `now_ms` (or since
    /// `started_ms`, before it ever was), ms.
    pub fn age_ms(&self, started_ms: u64, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.heard_ms.max(started_ms))
    }

    /// The ETag of the snapshot in force ([`etag`]), if any.
    pub fn etag(&self) -> Option<String> {
        Some(etag(self.version?, self.checksum?))
    }

    /// Put what the snapshot says into `state` and reprice it: loads only
    /// while fresh.
    pub fn apply_to(&self, state: &mut FleetState, cfg: &Config, now_ms: u64) {
        for (slot, live) in state.live.iter_mut().zip(&self.lives) {
            *slot = *live;
            if self.stale {
                slot.reported_load = 0;
            }
        }
        state.reprice_all(&cfg.models, &cfg.health, now_ms);
    }
}

/// The request headers of one poll; `etag` is the last snapshot's, for a
/// "not modified" answer when nothing changed.
pub fn poll_headers<'a>(control: &'a Control, etag: Option<&'a str>) -> Vec<(&'a str, &'a str)> {
    let mut h = vec![
        (":method", "GET"),
        (":path", control.path.as_str()),
        (":authority", control.authority.as_str()),
        ("accept", "application/octet-stream"),
    ];
    if let Some(a) = &control.authorization {
        h.push(("authorization", a.as_str()));
    }
    if let Some(e) = etag {
        h.push(("if-none-match", e));
    }
    h
}

/// A poll that brought nothing usable.
#[derive(Debug, Clone, PartialEq)]
pub enum PollError {
    /// The call did not complete (Envoy's reason, e.g. a timeout or no
    /// healthy host in the cluster).
    Failed(String),
    /// The service answered with this status.
    Status(u32),
    /// It sent a snapshot this configuration rejects.
    Rejected(Rejected),
}

impl fmt::Display for PollError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PollError::Failed(why) => write!(f, "control poll failed: {why}"),
            PollError::Status(401) | PollError::Status(403) => f.write_str(
                "control service refused the poll (401/403): set control.token to the service's \
                 token",
            ),
            PollError::Status(s) => write!(f, "control service answered {s}"),
            PollError::Rejected(r) => write!(f, "{r}; keeping the last good snapshot"),
        }
    }
}

/// The ETag of the snapshot with `version` and `checksum`, as the control
/// service sends it and [`ace_snapshot::etag`] computes it from the bytes.
pub fn etag(version: u64, checksum: u32) -> String {
    format!("\"{version:x}-{checksum:08x}\"")
}

/// `stale_after_ms` for a configuration without a `control` object (a
/// host fed snapshots some other way, as the simulator is): the default
/// at the default interval.
pub const DEFAULT_STALE_AFTER_MS: u64 = 5_000;

/// How many distinct rejected snapshots a consumer remembers (so that
/// each is logged and counted once), and how many replaced ones (to know a
/// replay).
const REMEMBERED: usize = 16;

/// What a transport delivered to a [`Consumer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery<'a> {
    /// A snapshot's bytes (a 200), received at `at_ms`.
    Snapshot {
        /// The body.
        bytes: &'a [u8],
        /// When it was received, ms.
        at_ms: u64,
    },
    /// A snapshot's bytes that a consumer of this same configuration took
    /// at `at_ms` (the Wasm poller's, read back from shared data by the
    /// other workers): checked like any other, except for the rollback
    /// rule, which was that consumer's to apply.
    Relayed {
        /// The bytes.
        bytes: &'a [u8],
        /// When the poller received them, ms.
        at_ms: u64,
    },
    /// "Not modified" (a 304) at `at_ms`, for the snapshot whose ETag the
    /// poll sent (empty: none was sent).
    Unchanged {
        /// The ETag sent in `If-None-Match`.
        etag: &'a str,
        /// When it was received, ms.
        at_ms: u64,
    },
}

/// What a [`Consumer`] made of a [`Delivery`].
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// A new snapshot is in force (and the service heard).
    Accepted,
    /// The snapshot in force, again: the service is heard.
    Heard,
    /// Nothing for this configuration: a 304 for a snapshot not in force.
    NotHeard,
    /// A snapshot rejected whole; the last good one stays, and the service
    /// is not heard.
    Refused {
        /// Why.
        why: Rejected,
        /// Whether this snapshot (its ETag) was refused for the first
        /// time: logged and to be counted (`ace.control.errors`) only then.
        first: bool,
    },
}

/// One configuration's consumer of the control service's answers: the
/// rules of this module (accept, reject, heard, stale) over an
/// [`Outside`]. Every host feeds it; none decides itself.
#[derive(Debug, Clone)]
pub struct Consumer {
    outside: Outside,
    stale_after_ms: u64,
    /// The control cluster, for log lines.
    cluster: String,
    /// When it began (the age counts from here until first heard), ms.
    started_ms: u64,
    /// The ETags of the last rejected snapshots, oldest first.
    refused: Vec<String>,
    /// The ETags of the last snapshots in force here and since replaced,
    /// oldest first.
    superseded: Vec<String>,
    /// The last snapshot refused only as a replay, and its ETag: taken if
    /// heard again once the one in force is stale.
    replayed: Option<(String, Resolved)>,
}

impl Consumer {
    /// A consumer for `cfg`, beginning at `now_ms`, holding nothing.
    pub fn new(cfg: &Config, now_ms: u64) -> Consumer {
        let (stale_after_ms, cluster) = cfg.control.as_ref().map_or_else(
            || (DEFAULT_STALE_AFTER_MS, String::new()),
            |c| (c.stale_after_ms, c.cluster.clone()),
        );
        Consumer {
            outside: Outside::new(cfg),
            stale_after_ms,
            cluster,
            started_ms: now_ms,
            refused: Vec::new(),
            superseded: Vec::new(),
            replayed: None,
        }
    }

    /// What is in force.
    pub fn outside(&self) -> &Outside {
        &self.outside
    }

    /// The ETag of the snapshot in force: what a poll for this
    /// configuration sends in `If-None-Match`.
    pub fn etag(&self) -> Option<String> {
        self.outside.etag()
    }

    /// `stale_after_ms` as configured (or [`DEFAULT_STALE_AFTER_MS`]).
    pub fn stale_after_ms(&self) -> u64 {
        self.stale_after_ms
    }

    /// Whether the snapshot in force is stale (as of the last call).
    pub fn stale(&self) -> bool {
        self.outside.stale
    }

    /// How long since the service was last heard (or since the consumer
    /// began), ms: the `ace.control.age_ms` gauge.
    pub fn age_ms(&self, now_ms: u64) -> u64 {
        self.outside.age_ms(self.started_ms, now_ms)
    }

    /// Take `delivery` under `cfg`, then age the snapshot to `now_ms`.
    /// Returns the verdict and whether what is in force changed (a new
    /// snapshot, or fresh/stale flipped): then [`Consumer::apply_to`].
    pub fn deliver(
        &mut self,
        cfg: &Config,
        delivery: Delivery<'_>,
        now_ms: u64,
    ) -> (Verdict, bool) {
        let was_stale = self.outside.stale;
        let verdict = match delivery {
            Delivery::Snapshot { bytes, at_ms } => self.snapshot(cfg, bytes, at_ms, true),
            Delivery::Relayed { bytes, at_ms } => self.snapshot(cfg, bytes, at_ms, false),
            Delivery::Unchanged { etag, at_ms } => self.unchanged(etag, at_ms),
        };
        // A late delivery cannot make the snapshot fresher than `now` says.
        self.age(now_ms);
        let changed = verdict == Verdict::Accepted || was_stale != self.outside.stale;
        (verdict, changed)
    }

    /// Age the snapshot to `now_ms` with nothing delivered. Returns whether
    /// fresh/stale flipped (then [`Consumer::apply_to`]).
    pub fn age(&mut self, now_ms: u64) -> bool {
        let (after, started) = (self.stale_after_ms, self.started_ms);
        self.outside.age_by(after, &self.cluster, started, now_ms)
    }

    /// Put what is in force into `state` ([`Outside::apply_to`]).
    pub fn apply_to(&self, state: &mut FleetState, cfg: &Config, now_ms: u64) {
        self.outside.apply_to(state, cfg, now_ms);
    }

    /// Whether the snapshot in force is stale at `at_ms`.
    fn stale_at(&self, at_ms: u64) -> bool {
        self.outside.stale || self.outside.age_ms(self.started_ms, at_ms) > self.stale_after_ms
    }

    fn snapshot(&mut self, cfg: &Config, bytes: &[u8], at_ms: u64, ordered: bool) -> Verdict {
        let tag = ace_snapshot::etag(bytes).unwrap_or_else(|| format!("({} bytes)", bytes.len()));
        let resolved = match decode(cfg, bytes) {
            Ok(r) => r,
            Err(why) => return self.refuse(tag, why),
        };
        let checksum = resolved.checksum.unwrap_or_default();
        if self.outside.holds(resolved.version, checksum) {
            self.outside.heard(at_ms);
            return Verdict::Heard;
        }
        if let Some(in_force) = self.outside.version {
            if ordered && self.superseded.contains(&tag) && !self.stale_at(at_ms) {
                let version = resolved.version;
                self.replayed = Some((tag.clone(), resolved));
                return self.refuse(tag, Rejected::Replayed { version, in_force });
            }
        }
        self.take(resolved, at_ms)
    }

    fn unchanged(&mut self, etag: &str, at_ms: u64) -> Verdict {
        if !etag.is_empty() && self.outside.etag().as_deref() == Some(etag) {
            self.outside.heard(at_ms);
            return Verdict::Heard;
        }
        // The replayed snapshot heard again: taken once the one in force is
        // stale.
        let again = matches!(&self.replayed, Some((tag, _)) if tag == etag);
        if again && self.stale_at(at_ms) {
            if let Some((_, resolved)) = self.replayed.take() {
                return self.take(resolved, at_ms);
            }
        }
        Verdict::NotHeard
    }

    fn take(&mut self, resolved: Resolved, at_ms: u64) -> Verdict {
        let version = resolved.version;
        if let Some(old) = self.outside.etag() {
            remember(&mut self.superseded, old);
        }
        self.outside.accept(resolved, at_ms);
        if let Some(new) = self.outside.etag() {
            self.superseded.retain(|t| *t != new);
            self.refused.retain(|t| *t != new);
        }
        self.replayed = None;
        log::info!("control snapshot version {version} in force");
        Verdict::Accepted
    }

    fn refuse(&mut self, tag: String, why: Rejected) -> Verdict {
        let first = !self.refused.contains(&tag);
        if first {
            log::warn!("{why}; keeping the last good snapshot");
            remember(&mut self.refused, tag);
        }
        Verdict::Refused { why, first }
    }
}

/// Add `tag` to `list`, forgetting the oldest beyond [`REMEMBERED`].
fn remember(list: &mut Vec<String>, tag: String) {
    if list.len() >= REMEMBERED {
        list.remove(0);
    }
    list.push(tag);
}

/// A consumer reads as what it holds in force (the request path reads
/// warmth through it).
impl std::ops::Deref for Consumer {
    type Target = Outside;

    fn deref(&self) -> &Outside {
        &self.outside
    }
}

/// The control poller's metrics, the same names in every build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// Counter: polls sent.
    Polls,
    /// Counter: new snapshots taken (Wasm) or published (dynamic module).
    Snapshots,
    /// Counter: polls that brought nothing usable, and each distinct
    /// rejected snapshot once.
    Errors,
    /// Gauge: ms since the service was last heard (or polling began).
    AgeMs,
    /// Gauge: 1 while the snapshot in force is stale.
    Stale,
}

impl Metric {
    /// Every metric, in id order.
    pub const ALL: [Metric; 5] = [
        Metric::Polls,
        Metric::Snapshots,
        Metric::Errors,
        Metric::AgeMs,
        Metric::Stale,
    ];

    /// Its name in Envoy's stats.
    pub fn name(self) -> &'static str {
        match self {
            Metric::Polls => "ace.control.polls",
            Metric::Snapshots => "ace.control.snapshots",
            Metric::Errors => "ace.control.errors",
            Metric::AgeMs => "ace.control.age_ms",
            Metric::Stale => "ace.control.stale",
        }
    }

    /// Whether it is a counter (else a gauge).
    pub fn is_counter(self) -> bool {
        matches!(self, Metric::Polls | Metric::Snapshots | Metric::Errors)
    }
}

/// What the [`Poller`] needs of a host to send a poll and count.
pub trait Transport {
    /// Send a poll through `cluster`; its id, or why it could not be sent.
    fn send(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        timeout_ms: u64,
    ) -> Result<u64, String>;
    /// Add `n` to a counter.
    fn count(&mut self, metric: Metric, n: u64);
}

/// How a poll ended, as the host received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// No response (the host's reason, e.g. a timeout or no healthy host).
    Failed(String),
    /// A response: its `:status` (if it had a readable one) and its body
    /// (only a 200's is read).
    Answer {
        /// `:status`.
        status: Option<u32>,
        /// The body.
        body: Vec<u8>,
    },
}

/// What a poll brought, to deliver ([`Answered::delivery`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answered {
    /// New bytes.
    Snapshot(Vec<u8>),
    /// Nothing changed since the snapshot with this ETag (a 304 for the
    /// one sent).
    Unchanged(String),
}

impl Answered {
    /// As a delivery received at `at_ms`.
    pub fn delivery(&self, at_ms: u64) -> Delivery<'_> {
        match self {
            Answered::Snapshot(bytes) => Delivery::Snapshot { bytes, at_ms },
            Answered::Unchanged(etag) => Delivery::Unchanged { etag, at_ms },
        }
    }
}

/// The poll in flight.
#[derive(Debug, Clone)]
struct Pending {
    id: u64,
    sent_ms: u64,
    /// The ETag it sent in `If-None-Match` ("": none).
    etag: String,
}

/// The transport's state, host-free: one poll in flight, its headers, and
/// what its answer means. How often a poll may go is the host's.
#[derive(Debug, Clone)]
pub struct Poller {
    control: Control,
    pending: Option<Pending>,
    /// The ETag of the last 200's bytes.
    last: Option<String>,
    /// The last problem logged, so that a lasting one is logged once.
    problem: Option<String>,
}

impl Poller {
    /// A poller for `control`.
    pub fn new(control: Control) -> Poller {
        Poller {
            control,
            pending: None,
            last: None,
            problem: None,
        }
    }

    /// The settings.
    pub fn control(&self) -> &Control {
        &self.control
    }

    /// The id of the poll in flight, if any.
    pub fn pending(&self) -> Option<u64> {
        self.pending.as_ref().map(|p| p.id)
    }

    /// The ETag of the last snapshot a 200 brought (what a poller serving
    /// several configurations sends in `If-None-Match`).
    pub fn last_etag(&self) -> Option<&str> {
        self.last.as_deref()
    }

    /// The last problem logged (cleared when an answer comes).
    pub fn problem(&self) -> Option<&str> {
        self.problem.as_deref()
    }

    /// Send a poll at `now_ms` with `If-None-Match: etag`, unless one is in
    /// flight (one that never came back within `timeout_ms + interval_ms`
    /// is given up, as a problem). Returns whether one was sent.
    pub fn poll(&mut self, t: &mut impl Transport, etag: Option<&str>, now_ms: u64) -> bool {
        if let Some(p) = &self.pending {
            let patience = self
                .control
                .timeout_ms
                .saturating_add(self.control.interval_ms);
            if now_ms.saturating_sub(p.sent_ms) <= patience {
                return false;
            }
            self.pending = None;
            let problem = format!(
                "control poll through cluster `{}` never completed; polling again",
                self.control.cluster
            );
            self.trouble(t, problem);
        }
        let etag = etag.filter(|e| !e.is_empty());
        let headers = poll_headers(&self.control, etag);
        match t.send(&self.control.cluster, &headers, self.control.timeout_ms) {
            Ok(id) => {
                self.pending = Some(Pending {
                    id,
                    sent_ms: now_ms,
                    etag: etag.unwrap_or_default().to_string(),
                });
                t.count(Metric::Polls, 1);
                true
            }
            Err(why) => {
                let problem = format!(
                    "cannot poll the control service through cluster `{}`: {why}; keeping the \
                     last snapshot",
                    self.control.cluster
                );
                self.trouble(t, problem);
                false
            }
        }
    }

    /// Poll `id` ended with `reply`: what to deliver, if anything (a reply
    /// to anything but the poll in flight is ignored).
    pub fn answer(&mut self, t: &mut impl Transport, id: u64, reply: Reply) -> Option<Answered> {
        if self.pending() != Some(id) {
            return None;
        }
        let sent = self.pending.take().map(|p| p.etag).unwrap_or_default();
        let cluster = &self.control.cluster;
        let problem = match reply {
            Reply::Failed(why) => PollError::Failed(format!(
                "through cluster `{cluster}`: {why}; keeping the last snapshot"
            ))
            .to_string(),
            Reply::Answer {
                status: Some(304), ..
            } => {
                self.fine();
                return Some(Answered::Unchanged(sent));
            }
            Reply::Answer {
                status: Some(200),
                body,
            } => {
                self.fine();
                self.last = ace_snapshot::etag(&body);
                return Some(Answered::Snapshot(body));
            }
            Reply::Answer {
                status: Some(s), ..
            } => {
                let hint = if matches!(s, 502..=504) {
                    " (also Envoy's own answer when it cannot reach the service in time: is \
                     `ace control serve` running at the cluster's address?)"
                } else {
                    ""
                };
                format!(
                    "control poll through cluster `{cluster}`: {}{hint}; keeping the last snapshot",
                    PollError::Status(s)
                )
            }
            Reply::Answer { status: None, .. } => format!(
                "control poll through cluster `{cluster}`: an answer without a status; keeping \
                 the last snapshot"
            ),
        };
        self.trouble(t, problem);
        None
    }

    /// Count a problem; log it unless it is the one logged last.
    pub fn trouble(&mut self, t: &mut impl Transport, problem: String) {
        t.count(Metric::Errors, 1);
        if self.problem.as_deref() != Some(problem.as_str()) {
            log::warn!("{problem}");
            self.problem = Some(problem);
        }
    }

    /// An answer came: the next problem is news again.
    fn fine(&mut self) {
        if self.problem.take().is_some() {
            log::info!(
                "control service answers again through cluster `{}`",
                self.control.cluster
            );
        }
    }
}

/// The lease that lets one worker of an Envoy poll per interval: the time
/// (ms) until which the last poller holds it, as stored in shared data.
pub mod lease {
    /// Whether the lease stored as `stored` is free at `now_ms`.
    pub fn is_free(stored: Option<&[u8]>, now_ms: u64) -> bool {
        until(stored).is_none_or(|until| now_ms >= until)
    }

    /// The bytes of a lease taken at `now_ms` for `interval_ms`.
    pub fn taken(now_ms: u64, interval_ms: u64) -> [u8; 8] {
        now_ms.saturating_add(interval_ms).to_le_bytes()
    }

    /// Until when the lease stored as `stored` is held, ms (`None`: absent
    /// or damaged, so free).
    pub fn until(stored: Option<&[u8]>) -> Option<u64> {
        let b: [u8; 8] = stored?.try_into().ok()?;
        Some(u64::from_le_bytes(b))
    }
}

/// Where the poller tells the other workers what it heard: the version
/// and checksum in force, when the service last answered and the ETag to
/// send, as stored in shared data (20 bytes and the ETag).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Heard {
    /// The version of the stored snapshot.
    pub version: u64,
    /// The checksum of the stored snapshot ([`ace_snapshot::checksum`]).
    pub checksum: u32,
    /// When the service last answered, ms.
    pub at_ms: u64,
    /// The stored snapshot's ETag.
    pub etag: String,
}

impl Heard {
    /// As stored.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(20 + self.etag.len());
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.at_ms.to_le_bytes());
        out.extend_from_slice(&self.checksum.to_le_bytes());
        out.extend_from_slice(self.etag.as_bytes());
        out
    }

    /// From storage (`None`: absent or damaged).
    pub fn decode(b: &[u8]) -> Option<Heard> {
        let version = u64::from_le_bytes(b.get(..8)?.try_into().ok()?);
        let at_ms = u64::from_le_bytes(b.get(8..16)?.try_into().ok()?);
        let checksum = u32::from_le_bytes(b.get(16..20)?.try_into().ok()?);
        let etag = std::str::from_utf8(b.get(20..)?).ok()?.to_string();
        Some(Heard {
            version,
            checksum,
            at_ms,
            etag,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ace_snapshot::{Drain, DrainReason, Load, Price, Report};

    fn config() -> Config {
        Config::parse(
            br#"{"allow_no_policy":true,"control":{"cluster":"ace_control","token":"t"},
                "destinations":[
                {"name":"owned","cluster":"c0","tier":"inhouse","capacity":8,
                 "usd_per_input_token":1e-9,"usd_per_output_token":1e-9,"warm_models":["m1"]},
                {"name":"api","cluster":"c1","tier":"payg",
                 "usd_per_input_token":1e-6,"usd_per_output_token":1e-6}]}"#,
        )
        .unwrap()
    }

    fn report(name: &str) -> Report {
        Report {
            name: name.to_string(),
            ..Report::default()
        }
    }

    #[test]
    fn a_snapshot_resolves_to_signals_and_warmth() {
        let cfg = config();
        let mut owned = report("owned");
        owned.load = Some(Load {
            running: 5,
            waiting: 2,
            kv_permille: 900,
            stale: true,
            scraped_ms: 40,
        });
        owned.capacity = Some(4);
        owned.warm = Some(vec!["m2".to_string()]);
        let mut api = report("api");
        api.price = Some(Price {
            usd_per_input_token: 2e-6,
            usd_per_output_token: 3e-6,
        });
        api.drain = Some(Drain {
            until_ms: 99,
            reason: DrainReason::Eviction,
        });
        let s = Snapshot {
            version: 3,
            generated_ms: 0,
            reports: vec![owned, api],
            budgets: Vec::new(),
        };
        let r = decode(&cfg, &ace_snapshot::encode(&s).unwrap()).unwrap();
        assert_eq!(r.version, 3);
        assert_eq!(r.lives[0].reported_load, 7);
        // Held figures end `control.held_load_ms` after their scrape.
        let held = cfg.control.as_ref().unwrap().held_load_ms;
        assert_eq!(r.lives[0].load_until_ms, Some(40 + held));
        assert_eq!(r.lives[1].load_until_ms, None);
        assert_eq!(r.lives[0].capacity, Some(4));
        assert_eq!(r.lives[1].usd_per_token, Some((2e-6, 3e-6)));
        assert_eq!(r.lives[1].drained_until_ms, 99);
        // The snapshot's list replaces the configured one; `api` has none
        // configured, so it stays warm for everything.
        assert_eq!(r.warmth.mask(Some("m2")), &[0b11]);
        assert_eq!(r.warmth.mask(Some("m1")), &[0b10]);
    }

    #[test]
    fn an_unknown_destination_rejects_the_whole_snapshot() {
        let cfg = config();
        let mut priced = report("api");
        priced.price = Some(Price::default());
        let s = Snapshot {
            version: 1,
            generated_ms: 0,
            reports: vec![priced, report("eu-secret")],
            budgets: Vec::new(),
        };
        let e = resolve(&cfg, &s).unwrap_err();
        assert_eq!(
            e,
            Rejected::Unknown {
                name: "eu-secret".to_string()
            }
        );
        assert!(e.to_string().contains("cannot add destinations"));
    }

    #[test]
    fn stale_drops_loads_and_keeps_the_rest() {
        let cfg = config();
        let control = cfg.control.clone().unwrap();
        let mut o = Outside::new(&cfg);
        let mut owned = report("owned");
        owned.load = Some(Load {
            running: 8,
            ..Load::default()
        });
        owned.capacity = Some(6);
        let s = Snapshot {
            version: 1,
            generated_ms: 0,
            reports: vec![owned],
            budgets: Vec::new(),
        };
        o.accept(resolve(&cfg, &s).unwrap(), 1_000);
        let mut state = FleetState::new(2);
        o.apply_to(&mut state, &cfg, 1_000);
        assert_eq!(state.live[0].reported_load, 8);
        assert!(!o.age(&control, 0, 1_000 + control.stale_after_ms));
        assert!(o.age(&control, 0, 1_001 + control.stale_after_ms));
        o.apply_to(&mut state, &cfg, 2_000);
        assert_eq!(state.live[0].reported_load, 0);
        assert_eq!(state.live[0].capacity, Some(6));
        o.heard(9_000);
        assert!(!o.stale);
    }

    #[test]
    fn one_destinations_held_load_ends_while_the_snapshot_stays_fresh() {
        let cfg = config();
        let held = cfg.control.as_ref().unwrap().held_load_ms;
        let mut o = Outside::new(&cfg);
        let mut owned = report("owned");
        owned.load = Some(Load {
            running: 7,
            waiting: 12,
            stale: true,
            scraped_ms: 10_000,
            ..Load::default()
        });
        let s = Snapshot {
            version: 1,
            generated_ms: 10_000,
            reports: vec![owned],
            budgets: Vec::new(),
        };
        o.accept(resolve(&cfg, &s).unwrap(), 11_000);
        let models = &cfg.models;
        let mut state = FleetState::new(2);
        o.apply_to(&mut state, &cfg, 11_000);
        let priced = |state: &FleetState, now| state.live[0].reported_load_at(now);
        assert_eq!(priced(&state, 10_000 + held - 1), 19);
        assert_eq!(priced(&state, 10_000 + held), 0);
        // The slate follows with time alone, as before any decision.
        state.advance(models, &cfg.health, 10_000 + held);
        assert!(!state.live[0].depends_on_time(10_000 + held));
        // A held load with no scrape time is not priced at all.
        let mut unknown = report("owned");
        unknown.load = Some(Load {
            running: 7,
            stale: true,
            ..Load::default()
        });
        let s = Snapshot {
            version: 2,
            generated_ms: 0,
            reports: vec![unknown],
            budgets: Vec::new(),
        };
        let r = resolve(&cfg, &s).unwrap();
        assert_eq!(r.lives[0].reported_load_at(1_764_000_000_000), 0);
    }

    #[test]
    fn answers_and_poll_errors_name_the_fix() {
        #[derive(Default)]
        struct T(Vec<Vec<(String, String)>>, u64);
        impl Transport for T {
            fn send(&mut self, _: &str, h: &[(&str, &str)], _: u64) -> Result<u64, String> {
                self.0.push(
                    h.iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                );
                Ok(self.0.len() as u64)
            }
            fn count(&mut self, m: Metric, n: u64) {
                if m == Metric::Errors {
                    self.1 += n;
                }
            }
        }
        let cfg = config();
        let mut p = Poller::new(cfg.control.clone().unwrap());
        let mut t = T::default();
        assert!(p.poll(&mut t, Some("\"1-0\""), 0));
        assert!(!p.poll(&mut t, None, 1), "one poll in flight");
        assert!(t.0[0].contains(&("authorization".into(), "Bearer t".into())));
        assert!(t.0[0].contains(&("if-none-match".into(), "\"1-0\"".into())));
        let not_modified = Reply::Answer {
            status: Some(304),
            body: vec![],
        };
        assert_eq!(
            p.answer(&mut t, 1, not_modified),
            Some(Answered::Unchanged("\"1-0\"".into())),
            "a 304 is for the ETag sent"
        );
        p.poll(&mut t, None, 2);
        let refused = Reply::Answer {
            status: Some(401),
            body: vec![],
        };
        assert_eq!(p.answer(&mut t, 2, refused), None);
        assert!(p.problem().unwrap().contains("control.token"));
        assert_eq!(t.1, 1);
    }

    #[test]
    fn one_lease_per_interval() {
        assert!(lease::is_free(None, 0));
        let held = lease::taken(1_000, 500);
        assert!(!lease::is_free(Some(&held), 1_499));
        assert!(lease::is_free(Some(&held), 1_500));
        assert!(lease::is_free(Some(b"junk"), 0));
    }

    #[test]
    fn heard_round_trips() {
        let h = Heard {
            version: 9,
            checksum: 0xdead_beef,
            at_ms: 12,
            etag: "\"9-abc\"".to_string(),
        };
        assert_eq!(Heard::decode(&h.encode()), Some(h));
        assert_eq!(Heard::decode(b"short"), None);
    }

    /// Two snapshots with one version and other contents split the Wasm
    /// workers (27 and 25 of 40 requests followed the new one): a worker
    /// that held the version did not read the stored bytes again. Workers
    /// now key on version and checksum, so each takes the stored bytes.
    #[test]
    fn a_reused_version_with_other_bytes_reaches_every_worker() {
        let cfg = config();
        let bytes = |slots: u32| {
            let mut owned = report("owned");
            owned.capacity = Some(slots);
            ace_snapshot::encode(&Snapshot {
                version: 5,
                generated_ms: 1,
                reports: vec![owned],
                budgets: Vec::new(),
            })
            .unwrap()
        };
        let (old, new) = (bytes(4), bytes(2));
        // Both workers hold the old snapshot.
        let mut workers = [Outside::new(&cfg), Outside::new(&cfg)];
        for w in &mut workers {
            w.accept(decode(&cfg, &old).unwrap(), 1);
        }
        // The poller (worker 0) takes the new one and stores what it heard.
        let taken = decode(&cfg, &new).unwrap();
        let heard = Heard {
            version: taken.version,
            checksum: taken.checksum.unwrap(),
            at_ms: 2,
            etag: ace_snapshot::etag(&new).unwrap(),
        };
        workers[0].accept(taken, 2);
        let heard = Heard::decode(&heard.encode()).unwrap();
        // Worker 1 holds the same version, but not the same snapshot.
        assert_eq!(workers[1].version, Some(heard.version));
        assert!(!workers[1].holds(heard.version, heard.checksum));
        assert!(workers[0].holds(heard.version, heard.checksum));
        // So it reads the stored bytes, as the poller stored them.
        workers[1].accept(decode(&cfg, &new).unwrap(), heard.at_ms);
        assert!(workers[1].holds(heard.version, heard.checksum));
        assert_eq!(workers[0], workers[1]);
        let [a, b] = workers.each_ref().map(|w| {
            let mut state = FleetState::new(cfg.destinations.len());
            w.apply_to(&mut state, &cfg, 3);
            state
        });
        assert_eq!(a, b);
    }
}
