//! What a configuration builds once ([`Setup`]) and what a worker reuses
//! for every request ([`Worker`]).

use crate::budget;
use crate::cache;
use crate::prefix;
use crate::request::{self, EventIds, Lookup, Refused};
use crate::routing;
use crate::store;
use ace_config::{Config, ConfigError};
use ace_core::tables::Tables;
use std::cell::RefCell;
use std::sync::Arc;

/// Everything a request needs of one configuration, built once.
#[derive(Debug)]
pub struct Setup {
    /// The validated configuration.
    pub config: Config,
    /// The compiled policy tables, borrowed zero-copy.
    pub tables: Option<Tables<'static>>,
    /// Destination names, shared with each request's event.
    pub names: Vec<Arc<str>>,
    /// Model routing, built against the tables; none when not configured.
    pub routing: Option<routing::Routing>,
    /// The response cache's parameters, built against the tables; none
    /// when not configured.
    pub cache: Option<cache::Cache>,
    /// Prefix locality, built against the destinations; none when not
    /// configured.
    pub locality: Option<prefix::Locality>,
    /// Tenant budgets, built against the tables; none when not configured.
    pub budgets: Option<budget::Budgeting>,
}

impl Setup {
    /// The setup of `config`: its routing and cache built against its
    /// tables, or the configuration error that names what is wrong.
    pub fn new(config: Config) -> Result<Setup, ConfigError> {
        let tables = config.tables();
        let names = config.names();
        let ids: Vec<&str> = config
            .destinations
            .iter()
            .map(|d| d.name.as_str())
            .collect();
        let routing = config
            .model_routing
            .as_ref()
            .map(|r| routing::Routing::build(r, tables.as_ref(), &ids))
            .transpose()?;
        let cache = config
            .cache
            .as_ref()
            .map(|c| cache::Cache::build(c, tables.as_ref()))
            .transpose()?;
        let locality = prefix::Locality::build(&config)?;
        let budgets = budget::Budgeting::build(&config, tables.as_ref());
        Ok(Setup {
            budgets,
            tables,
            names,
            routing,
            cache,
            locality,
            config,
        })
    }

    /// Parse, validate and build the plugin configuration `bytes`: what a
    /// host does when a configuration arrives.
    pub fn parse(bytes: &[u8]) -> Result<Setup, ConfigError> {
        Setup::new(Config::parse(bytes)?)
    }

    /// The same for a configuration a filter ran with, to price its events
    /// ([`Config::parse_for_pricing`]).
    pub fn parse_for_pricing(bytes: &[u8]) -> Result<Setup, ConfigError> {
        Setup::new(Config::parse_for_pricing(bytes)?)
    }

    /// Log what the configuration does, and what this host will not do of
    /// it (`can_rerun`: it keeps a [`crate::host::Host::parking`]).
    pub fn announce(&self, can_rerun: bool) {
        log::info!("{}", self.config.summary());
        if self.config.no_policy {
            log::warn!(
                "allow_no_policy: routing without policy tables, every destination is feasible for every request (counted in ace.requests_without_policy)"
            );
        }
        if let Some(w) = ace_config::budget::unverified_tenant_in(&self.config) {
            log::warn!("{w}");
        }
        if self.config.retry_next && !can_rerun {
            log::warn!(
                "retry_next is ignored: only the dynamic module can run a request again; failures spill from the next request"
            );
        }
    }
}

/// Buffers one worker reuses for every request, so that a warm worker
/// allocates little per request.
#[derive(Debug, Default)]
pub struct Worker {
    /// The feasibility lookup's buffers.
    pub lookup: Lookup,
    /// The event's JSON line, rewritten in place for every write.
    pub event_line: Vec<u8>,
    /// A request's (destination, model) pairs under model routing.
    pub pairs: routing::Pairs,
    /// A cache entry as read.
    pub entry: Vec<u8>,
    /// Cache hits on this worker (every `cache.check_every`-th is checked).
    pub hits: u64,
    /// Scratch mask.
    pub scratch: Vec<u64>,
    /// What each destination holds of a request's prompt.
    pub held: prefix::HeldBuf,
    /// The shared store's key and value buffers.
    pub store: store::Scratch,
    /// This worker's event ids (drawn when first needed).
    ids: Option<EventIds>,
}

impl Worker {
    /// A worker whose event ids run under `prefix` (a simulation or a
    /// test that wants the same ids every run); [`Worker::default`] draws
    /// a random one.
    pub fn with_event_ids(prefix: u64) -> Worker {
        Worker {
            ids: Some(EventIds::new(prefix)),
            ..Worker::default()
        }
    }

    /// A new event id, unique across every worker: this worker's random
    /// prefix and its count.
    pub fn next_event_id(&mut self) -> [u8; 32] {
        self.ids
            .get_or_insert_with(|| EventIds::new(request::random_u64()))
            .next_id()
    }
}

/// `f` on `worker`'s buffers, or on fresh ones if they are in use (a
/// re-entrant call from the host: never expected, never a panic).
pub fn with_worker<R>(worker: &RefCell<Worker>, f: impl FnOnce(&mut Worker) -> R) -> R {
    match worker.try_borrow_mut() {
        Ok(mut w) => f(&mut w),
        Err(_) => f(&mut Worker::default()),
    }
}

/// The answer to a request that arrived before any valid configuration.
pub fn not_configured() -> Refused {
    Refused {
        status: 503,
        kind: "not_configured",
        reason: "not_configured",
        message: "the ACE filter has no valid configuration".to_string(),
    }
}
