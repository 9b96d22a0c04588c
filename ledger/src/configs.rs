//! Plugin configurations, by the id each event names.
//!
//! An event's costs are re-derived from the configuration the filter had
//! loaded when it decided, so configurations are registered with the ledger
//! (stored by id) and looked up per event. The id is the first 16 hex
//! digits of the SHA-256 of the exact configuration bytes, which is what
//! the filter computes; parsing uses the filter's own types, so the ledger
//! can never read a price differently from the filter.
//!
//! A configuration is loaded for pricing only
//! (`Config::parse_for_pricing`): the rules a new release applies to how
//! a configuration makes the filter read requests are not the ledger's
//! rules for events an earlier release already decided, so a
//! configuration an upgrade now refuses (e.g. `body.read` false under
//! tables that decide on `model`) still books its logs.

use ace_flow::Setup;
use anyhow::{anyhow, Context};
use sha2::{Digest, Sha256};
use std::collections::HashMap;

/// The id of configuration `bytes`.
pub fn config_id(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Parsed configurations, by id.
#[derive(Debug, Default)]
pub struct Registry {
    by_id: HashMap<String, Setup>,
}

impl Registry {
    /// Parse and add `bytes`, named `origin` in errors; returns its id.
    pub fn add(&mut self, bytes: &[u8], origin: &str) -> anyhow::Result<String> {
        let id = config_id(bytes);
        if !self.by_id.contains_key(&id) {
            let cfg = Setup::parse_for_pricing(bytes).map_err(|e| anyhow!("{origin}: {e}"))?;
            self.by_id.insert(id.clone(), cfg);
        }
        Ok(id)
    }

    /// Add each stored `(id, bytes)`; the id must match the bytes.
    pub fn load(&mut self, stored: &[(String, Vec<u8>)]) -> anyhow::Result<()> {
        for (id, bytes) in stored {
            let got = self
                .add(bytes, &format!("stored configuration {id}"))
                .with_context(|| format!("the ledger's configuration {id} no longer parses"))?;
            if &got != id {
                return Err(anyhow!(
                    "the ledger's configuration {id} hashes to {got}: the store was edited by hand"
                ));
            }
        }
        Ok(())
    }

    /// The configuration `id`.
    pub fn get(&self, id: &str) -> Option<&Setup> {
        self.by_id.get(id)
    }

    /// Every id, sorted.
    pub fn ids(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.by_id.keys().map(String::as_str).collect();
        v.sort_unstable();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_is_the_sha256_prefix() {
        // sha256("") = e3b0c44298fc1c14...
        assert_eq!(config_id(b""), "e3b0c44298fc1c14");
    }
}
