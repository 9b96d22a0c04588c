//! A ledger: a store plus the configurations registered in it, which is
//! what every command needs before it can book or report anything.

use crate::configs::Registry;
use crate::ingest::{self, Options, Summary};
use crate::report::{self, Report};
use crate::store::{self, Store};
use crate::window::Rules;
use anyhow::Context;
use std::io::BufReader;
use std::path::Path;

/// An open ledger.
pub struct Ledger {
    /// Where the rows live.
    pub store: Box<dyn Store>,
    /// The configurations the rows are priced with.
    pub registry: Registry,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("configs", &self.registry.ids())
            .finish()
    }
}

impl Ledger {
    /// Open the store at `url` (see [`store::open`]) and load its
    /// configurations.
    pub fn open(url: &str) -> anyhow::Result<Ledger> {
        let mut store = store::open(url)?;
        let mut registry = Registry::default();
        registry.load(&store.configs()?)?;
        Ok(Ledger { store, registry })
    }

    /// Register the configuration in file `path`; returns its id.
    pub fn register_file(&mut self, path: &Path) -> anyhow::Result<String> {
        let bytes = std::fs::read(path).with_context(|| {
            format!("cannot read the plugin configuration `{}`", path.display())
        })?;
        self.register(&bytes, &path.display().to_string())
    }

    /// Register configuration `bytes` (named `origin` in errors).
    pub fn register(&mut self, bytes: &[u8], origin: &str) -> anyhow::Result<String> {
        let text = std::str::from_utf8(bytes)
            .with_context(|| format!("{origin}: a plugin configuration is JSON, so UTF-8"))?;
        let id = self.registry.add(bytes, origin)?;
        self.store.put_config(&id, text)?;
        Ok(id)
    }

    /// Ingest the file at `path`, or standard input for `-`.
    pub fn ingest_path(&mut self, path: &str, opts: &Options) -> anyhow::Result<Summary> {
        if path == "-" {
            let stdin = std::io::stdin().lock();
            return ingest::ingest(self.store.as_mut(), &self.registry, "-", stdin, None, opts);
        }
        let file = std::fs::File::open(path)
            .with_context(|| format!("cannot open the access log `{path}`"))?;
        let len = file.metadata().ok().map(|m| m.len());
        let reader = BufReader::with_capacity(1 << 20, file);
        ingest::ingest(self.store.as_mut(), &self.registry, path, reader, len, opts)
    }

    /// Ingest `bytes` as if read from a file named `source`.
    pub fn ingest_bytes(
        &mut self,
        source: &str,
        bytes: &[u8],
        opts: &Options,
    ) -> anyhow::Result<Summary> {
        ingest::ingest(
            self.store.as_mut(),
            &self.registry,
            source,
            bytes,
            Some(bytes.len() as u64),
            opts,
        )
    }

    /// The report under `rules`.
    pub fn report(&mut self, rules: &Rules) -> anyhow::Result<Report> {
        report::build(self.store.as_mut(), &self.registry, rules)
    }
}
