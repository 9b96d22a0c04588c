//! Who sends the trace's requests: tenants, data classes, latency classes
//! and models, drawn per request from a mix file (`mix.toml` here is the
//! default, written for the example fleet).
//!
//! A request's attributes decide which destinations it may reach, so the
//! mix is checked against the fleet before anything runs: a name the
//! manifest does not know would make every such request fail closed and
//! quietly skew the comparison. Requests are interned into [`Profile`]s (one
//! per attribute combination, a few hundred at most), and everything a
//! policy needs per combination (the headers ACE reads, the Cedar feasible
//! set the violation count is checked against) is computed once per
//! profile.

use crate::rng::Rng;
use ace_core::tables::Tables;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// The default mix, for the example fleet.
pub const DEFAULT: &str = include_str!("../mix.toml");

/// A mix file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixFile {
    /// One entry per tenant.
    pub tenants: Vec<TenantMix>,
}

/// One tenant's requests.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantMix {
    /// Tenant id, as in the manifest.
    pub id: String,
    /// Its share of all requests (relative weight).
    pub share: f64,
    /// Data class → weight.
    pub data_class: BTreeMap<String, f64>,
    /// Latency class → weight.
    pub latency_class: BTreeMap<String, f64>,
    /// Model id → weight.
    pub model: BTreeMap<String, f64>,
}

/// A mix that does not fit the fleet, named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MixError(pub String);

impl fmt::Display for MixError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for MixError {}

/// The request attributes a mix sets, by table name.
pub const ATTRIBUTES: [&str; 5] = [
    "tenant",
    "data_class",
    "latency_class",
    "model",
    "tp_degree",
];

/// One combination of request attributes.
#[derive(Clone, Debug)]
pub struct Profile {
    /// Tenant id.
    pub tenant: String,
    /// Data class.
    pub data_class: String,
    /// Latency class.
    pub latency_class: String,
    /// Model id.
    pub model: String,
    /// The model's tensor-parallel degree, from the manifest's catalogue.
    pub tp_degree: u32,
    /// The headers a client sends for it (the configuration's header
    /// names).
    pub headers: Vec<(String, String)>,
    /// The destinations the compiled Cedar tables allow for it: the
    /// oracle every policy's choices are checked against.
    pub feasible: Vec<u64>,
    /// Per catalogue model, the destinations the tables allow when that
    /// model is served in place of the one asked for (`substituted`
    /// true): the oracle for model routing.
    pub substitutes: Vec<(String, Vec<u64>)>,
}

impl Profile {
    /// Whether the tables allow destination `d` for it.
    pub fn allows(&self, d: usize) -> bool {
        ace_core::dispatch::bit(&self.feasible, d)
    }

    /// Whether the tables allow destination `d` to serve it with model
    /// `served` (the model asked for, or one substituted for it).
    pub fn allows_serving(&self, d: usize, served: &str) -> bool {
        if served == self.model {
            return self.allows(d);
        }
        self.substitutes
            .iter()
            .find(|(m, _)| m == served)
            .is_some_and(|(_, mask)| ace_core::dispatch::bit(mask, d))
    }

    /// The value of attribute `name`; none for an attribute the request
    /// does not set (empty: a logged request without it).
    pub fn value(&self, name: &str) -> Option<String> {
        let v = match name {
            "tenant" => self.tenant.clone(),
            "data_class" => self.data_class.clone(),
            "latency_class" => self.latency_class.clone(),
            "model" => self.model.clone(),
            "tp_degree" => self.tp_degree.to_string(),
            _ => return None,
        };
        (!v.is_empty()).then_some(v)
    }
}

/// One tenant's share and weights, checked: (share, data classes,
/// latency classes, models, tenant id).
type Drawn = (f64, Weights, Weights, Weights, String);

/// Values and their weights.
type Weights = Vec<(String, f64)>;

/// A mix checked against a fleet, ready to draw from.
#[derive(Clone, Debug)]
pub struct Mix {
    tenants: Vec<Drawn>,
    /// Every profile drawn so far.
    pub profiles: Vec<Profile>,
    index: HashMap<(usize, usize, usize, usize), u32>,
    /// Profiles of given attributes ([`Mix::intern`]).
    given: HashMap<[String; 4], u32>,
    /// tp_degree per model id.
    tp: HashMap<String, u32>,
    /// Attribute name → header name, from the configuration.
    headers: Vec<(String, String)>,
    /// Per table attribute, the configured default value index.
    defaults: Vec<u32>,
    /// The tables, copied (profiles are resolved lazily).
    tables: Option<Vec<u8>>,
    destinations: usize,
}

impl Mix {
    /// Parse `text` (named `source`) and check it against the fleet: its
    /// tenants, data and latency classes and models must be values the
    /// tables know.
    pub fn new(
        source: &str,
        text: &str,
        cfg: &ace_config::Config,
        models_tp: &[(String, u32)],
    ) -> Result<Mix, MixError> {
        let file: MixFile =
            toml::from_str(text).map_err(|e| MixError(format!("{source}: not a mix file: {e}")))?;
        if file.tenants.is_empty() {
            return Err(MixError(format!("{source}: no [[tenants]]")));
        }
        let tables_bytes = cfg.policy.as_ref().map(|p| p.tables.to_vec());
        let tables = tables_bytes.as_deref().and_then(|b| Tables::load(b).ok());
        let known = |attr: &str, value: &str| -> bool {
            let Some(t) = &tables else { return true };
            match t.attribute_index(attr) {
                Some(a) => t.value_index(a, value) != 0,
                None => true, // the policy does not read it: any value
            }
        };
        let tp: HashMap<String, u32> = models_tp.iter().cloned().collect();
        let mut tenants = Vec::new();
        for t in &file.tenants {
            if !(t.share.is_finite() && t.share >= 0.0) {
                return Err(MixError(format!(
                    "{source}: tenant `{}`: share {} is not a weight (a finite number >= 0)",
                    t.id, t.share
                )));
            }
            if !known("tenant", &t.id) {
                return Err(MixError(format!(
                    "{source}: tenant `{}` is not in the fleet manifest's [[tenants]]",
                    t.id
                )));
            }
            let check = |what: &str, attr: &str, m: &BTreeMap<String, f64>| {
                if m.is_empty() {
                    return Err(MixError(format!(
                        "{source}: tenant `{}`: no {what} weights",
                        t.id
                    )));
                }
                for (v, w) in m {
                    if !(w.is_finite() && *w >= 0.0) {
                        return Err(MixError(format!(
                            "{source}: tenant `{}`: {what} `{v}` has weight {w} (a finite number >= 0)",
                            t.id
                        )));
                    }
                    if !known(attr, v) {
                        return Err(MixError(format!(
                            "{source}: tenant `{}`: {what} `{v}` is not in the fleet manifest's domain",
                            t.id
                        )));
                    }
                }
                let total: f64 = m.values().sum();
                if !(total.is_finite() && total > 0.0) {
                    return Err(MixError(format!(
                        "{source}: tenant `{}`: its {what} weights sum to {total}; give at least \
                         one a positive weight (and keep their sum finite)",
                        t.id
                    )));
                }
                Ok(m.iter().map(|(k, w)| (k.clone(), *w)).collect::<Vec<_>>())
            };
            let dc = check("data class", "data_class", &t.data_class)?;
            let lc = check("latency class", "latency_class", &t.latency_class)?;
            let model = check("model", "model", &t.model)?;
            for (m, _) in &model {
                if !tp.contains_key(m) {
                    return Err(MixError(format!(
                        "{source}: tenant `{}`: model `{m}` is not in the manifest's [[models]]",
                        t.id
                    )));
                }
            }
            tenants.push((t.share, dc, lc, model, t.id.clone()));
        }
        let total: f64 = tenants.iter().map(|t| t.0).sum();
        if !(total.is_finite() && total > 0.0) {
            return Err(MixError(format!(
                "{source}: the tenants' shares sum to {total}; give at least one tenant a \
                 positive share (and keep their sum finite)"
            )));
        }
        let mut mix = Mix::given(cfg, models_tp);
        mix.tenants = tenants;
        Ok(mix)
    }

    /// A mix that draws nothing: every request's attributes are given
    /// (a logged request replayed), and [`Mix::intern`] makes its profile.
    pub fn given(cfg: &ace_config::Config, models_tp: &[(String, u32)]) -> Mix {
        let tables_bytes = cfg.policy.as_ref().map(|p| p.tables.to_vec());
        let headers = cfg
            .policy
            .as_ref()
            .map(|p| {
                p.attributes
                    .iter()
                    .map(|a| (a.name.clone(), a.header.clone()))
                    .collect()
            })
            .unwrap_or_default();
        Mix {
            tenants: Vec::new(),
            profiles: Vec::new(),
            index: HashMap::new(),
            given: HashMap::new(),
            tp: models_tp.iter().cloned().collect(),
            headers,
            defaults: cfg
                .policy
                .as_ref()
                .map(|p| p.attributes.iter().map(|a| a.default_index).collect())
                .unwrap_or_default(),
            tables: tables_bytes,
            destinations: cfg.destinations.len(),
        }
    }

    /// The profile of a request with these attributes (as a client sent
    /// them: a value the fleet does not know is kept, and the tables
    /// decide what it may reach, as the filter's would).
    pub fn intern(
        &mut self,
        tenant: &str,
        data_class: &str,
        latency_class: &str,
        model: &str,
    ) -> u32 {
        let key = [tenant, data_class, latency_class, model].map(str::to_string);
        if let Some(p) = self.given.get(&key) {
            return *p;
        }
        let p = self.resolve(tenant, data_class, latency_class, model);
        let id = self.profiles.len() as u32;
        self.profiles.push(p);
        self.given.insert(key, id);
        id
    }

    /// Whether it draws profiles (a mix file), rather than taking them
    /// given ([`Mix::given`]).
    pub fn draws(&self) -> bool {
        !self.tenants.is_empty()
    }

    /// Draw one request's profile.
    pub fn draw(&mut self, rng: &mut Rng) -> u32 {
        let shares: Vec<f64> = self.tenants.iter().map(|t| t.0).collect();
        let t = rng.weighted(&shares);
        let Some((_, dc, lc, model, _)) = self.tenants.get(t) else {
            return 0;
        };
        let pick = |rng: &mut Rng, v: &[(String, f64)]| {
            let w: Vec<f64> = v.iter().map(|x| x.1).collect();
            rng.weighted(&w)
        };
        let key = (t, pick(rng, dc), pick(rng, lc), pick(rng, model));
        if let Some(p) = self.index.get(&key) {
            return *p;
        }
        let p = self.profile(key);
        let id = self.profiles.len() as u32;
        self.profiles.push(p);
        self.index.insert(key, id);
        id
    }

    fn profile(&self, (t, d, l, m): (usize, usize, usize, usize)) -> Profile {
        fn name(v: Option<&(String, f64)>) -> &str {
            v.map_or("", |x| x.0.as_str())
        }
        let tm = self.tenants.get(t);
        self.resolve(
            tm.map_or("", |x| x.4.as_str()),
            name(tm.and_then(|x| x.1.get(d))),
            name(tm.and_then(|x| x.2.get(l))),
            name(tm.and_then(|x| x.3.get(m))),
        )
    }

    fn resolve(&self, tenant: &str, data_class: &str, latency_class: &str, model: &str) -> Profile {
        let mut p = Profile {
            tenant: tenant.to_string(),
            data_class: data_class.to_string(),
            latency_class: latency_class.to_string(),
            tp_degree: self.tp.get(model).copied().unwrap_or(1),
            model: model.to_string(),
            headers: Vec::new(),
            feasible: vec![!0u64; self.destinations.div_ceil(64)],
            substitutes: Vec::new(),
        };
        p.headers = self
            .headers
            .iter()
            .filter_map(|(attr, header)| Some((header.clone(), p.value(attr)?)))
            .collect();
        // The oracle: exactly what the compiled tables allow.
        if let Some(t) = self.tables.as_deref().and_then(|b| Tables::load(b).ok()) {
            // What the mix does not set: a flag the filter sets itself (a
            // cache hit, a substituted model) is false for the request as
            // sent; anything else takes the configured default.
            let lookup = |model: Option<&str>| {
                let values: Vec<u32> = (0..t.attribute_count() as u32)
                    .map(|a| {
                        let name = t.attribute_name(a);
                        let value = match (name, model) {
                            (Some("model"), Some(m)) => Some(m.to_string()),
                            (Some("substituted"), Some(_)) => Some("true".to_string()),
                            (Some(n), _) => p.value(n),
                            (None, _) => None,
                        };
                        match value {
                            Some(v) => t.value_index(a, &v),
                            None => match t.value_index(a, "false") {
                                0 => self.defaults.get(a as usize).copied().unwrap_or(0),
                                f => f,
                            },
                        }
                    })
                    .collect();
                let mut mask = vec![0u64; t.words()];
                if t.feasible(&values, &mut mask).is_err() {
                    mask.fill(0);
                }
                mask
            };
            let feasible = lookup(None);
            let mut models: Vec<&String> = self.tp.keys().collect();
            models.sort();
            let substitutes = models
                .into_iter()
                .filter(|m| **m != p.model)
                .map(|m| (m.clone(), lookup(Some(m))))
                .collect();
            p.feasible = feasible;
            p.substitutes = substitutes;
        } else {
            // No tables: every destination is allowed, but only those that
            // exist.
            for (i, w) in p.feasible.iter_mut().enumerate() {
                let live = self.destinations.saturating_sub(i * 64).min(64);
                *w = if live == 64 { !0 } else { (1u64 << live) - 1 };
            }
        }
        p
    }
}
