//! What the control service says of the fleet, checked against this
//! configuration and applied to the fleet's state; and the host-free
//! steps of polling it.
//!
//! Why here and not in a host: both builds poll the same service and must
//! treat its answers the same way; only how the bytes travel differs (the
//! Wasm build fetches from a worker that holds a lease in shared data; the
//! dynamic module from Envoy's main thread).
//!
//! The rules, in one place:
//!
//! - A snapshot moves prices, load, capacity, drains and warmth, through
//!   [`Signal`]s into [`Live`] (so a new kind of signal is one variant, as
//!   `ace_core::fleet` says). It can never add a destination or change
//!   feasibility: the policy tables alone decide that, and nothing here
//!   touches them.
//! - A snapshot that names a destination this configuration does not
//!   know, or carries a figure a signal refuses, is rejected whole, with
//!   an error naming the destination and field; the last good one stays.
//! - Losing the service never stops traffic: the last snapshot stays in
//!   force, and once nothing has been heard for `stale_after_ms` it is
//!   stale: its load figures are dropped (the filter's own in-flight counts
//!   and passive health remain), its prices, capacities, drains and warmth
//!   kept (they are still the best knowledge there is). A later answer
//!   makes it fresh again, with no restart.
//! - One destination's load can be stale while the snapshot is fresh: the
//!   service could not scrape that model server and holds its last good
//!   figures, marked stale with their scrape time. They are priced for
//!   `control.held_load_ms` from that time ([`held_load_ms`]), then
//!   dropped like a stale snapshot's: a server that stopped answering
//!   neither looks idle at once nor keeps phantom requests priced for ever.
//!   The end is an instant, so the fleet state reprices it with time alone
//!   (`ace_core::fleet::Live::depends_on_time`), on every host alike.

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
    Ok(Resolved {
        version: snapshot.version,
        checksum: None,
        lives,
        warmth,
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
        }
    }

    /// Take `resolved`, heard at `now_ms`.
    pub fn accept(&mut self, resolved: Resolved, now_ms: u64) {
        self.version = Some(resolved.version);
        self.checksum = resolved.checksum;
        self.lives = resolved.lives;
        self.warmth = resolved.warmth;
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
    /// Going stale is logged once, here, for both hosts.
    pub fn age(&mut self, control: &Control, started_ms: u64, now_ms: u64) -> bool {
        let since = self.heard_ms.max(started_ms);
        let stale = now_ms.saturating_sub(since) > control.stale_after_ms;
        let changed = stale != self.stale;
        self.stale = stale;
        if changed && stale {
            log::warn!(
                "control snapshot is stale: nothing heard from cluster `{}` for over {} ms; \
                 dropping its load figures, keeping its prices",
                control.cluster,
                control.stale_after_ms
            );
        }
        changed
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

/// What one poll brought.
#[derive(Debug)]
pub enum Answer {
    /// A snapshot, valid for this configuration, with its bytes and ETag.
    Snapshot {
        /// The encoded snapshot (as stored for other workers).
        bytes: Vec<u8>,
        /// It, resolved.
        resolved: Box<Resolved>,
        /// Its entity tag.
        etag: String,
    },
    /// Nothing changed since `etag`.
    NotModified,
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

/// Read one poll's answer: `status` and `body` as the host received them.
pub fn answer(cfg: &Config, status: u32, body: Vec<u8>) -> Result<Answer, PollError> {
    match status {
        304 => Ok(Answer::NotModified),
        200 => {
            let resolved = decode(cfg, &body).map_err(PollError::Rejected)?;
            let etag = ace_snapshot::etag(&body).unwrap_or_default();
            Ok(Answer::Snapshot {
                bytes: body,
                resolved: Box::new(resolved),
                etag,
            })
        }
        s => Err(PollError::Status(s)),
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
        };
        let r = resolve(&cfg, &s).unwrap();
        assert_eq!(r.lives[0].reported_load_at(1_764_000_000_000), 0);
    }

    #[test]
    fn answers_and_poll_errors_name_the_fix() {
        let cfg = config();
        assert!(matches!(answer(&cfg, 304, vec![]), Ok(Answer::NotModified)));
        let e = answer(&cfg, 401, vec![]).unwrap_err();
        assert!(e.to_string().contains("control.token"));
        let e = answer(&cfg, 200, b"garbage".to_vec()).unwrap_err();
        assert!(
            e.to_string().contains("keeping the last good snapshot"),
            "{e}"
        );
        let headers = poll_headers(cfg.control.as_ref().unwrap(), Some("\"1-0\""));
        assert!(headers.contains(&("authorization", "Bearer t")));
        assert!(headers.contains(&("if-none-match", "\"1-0\"")));
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
