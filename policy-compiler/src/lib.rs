//! ace-policy: Cedar feasibility policies compiled into exact bitmask
//! tables, and the proof that the tables say what Cedar says.
//!
//! Why compile at all: feasibility (EU personal data only to EU
//! destinations, PHI only where there is a BAA, ...) must hold on every
//! request inside Envoy, where evaluating Cedar per request per destination
//! would cost microseconds each. The tables answer with a few lookups and a
//! bitwise AND (`ace_core::tables`), and [`verify::verify`] checks them
//! against Cedar's authorizer over the request space.
//!
//! Pipeline, one module each:
//! - [`project`]: read a policy directory (schema, `*.cedar`, `fleet.toml`),
//!   parse and validate with Cedar's own validator, and find which request
//!   attributes each policy reads; [`manifest`] reads and checks
//!   `fleet.toml`, [`limits`] refuses Cedar text nested or chained deeper
//!   than Cedar's parser can take, [`schema`] finds the documented types
//!   by name, [`entities`] builds the manifest's Cedar entities (with
//!   [`custom`] destination attributes), [`domain`]
//!   the request attributes' finite domains, [`warnings`] decides which
//!   validator warnings stop the compile.
//! - [`mod@compile`]: group policies into permit and forbid factors by the
//!   attributes they read, evaluate each factor's rows with Cedar, encode.
//! - [`oracle`]: Cedar's answer built from the sources by a second path that
//!   shares nothing with the compiler's entity and schema code.
//! - [`verify`]: tables == oracle, exhaustively or with stated coverage;
//!   [`explain`]: one request, destination by destination.
//! - [`dump`]: the tables as text; [`tables_sha256`]: the checksum
//!   `ace policy compile` prints and the playground shows.
//! - [`plugin`]: the filter's configuration for the compiled tables and the
//!   manifest (`ace plugin-config`, the playground's download).
//! - [`error`]: every error names its file, line and column and says what
//!   to change.
//!
//! Layout of a policy directory and where the output goes: see
//! [`OUT_DIR`] and `policies/README.md`.
#![forbid(unsafe_code)]
// The no-panic lints of product code (tests/tests/lints.rs checks them;
// tests may still unwrap and index: clippy.toml).
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![deny(clippy::panic, clippy::indexing_slicing)]

pub mod compile;
pub mod custom;
pub mod domain;
pub mod dump;
pub mod entities;
pub mod error;
pub mod explain;
pub mod limits;
pub mod manifest;
pub mod oracle;
pub mod plugin;
pub mod project;
pub mod schema;
pub mod verify;
pub mod warnings;

pub use compile::{compile, Compiled, FactorInfo};
pub use error::{Diagnostic, Error};
pub use project::{Project, Sources};

use std::path::{Path, PathBuf};

/// Compiled output goes to this directory inside the policy directory.
pub const OUT_DIR: &str = "out";
/// The tables file name in [`OUT_DIR`].
pub const TABLES_FILE: &str = "tables.acet";
/// The human-readable dump written beside it.
pub const DUMP_FILE: &str = "tables.txt";
/// Destinations with resolved cost parameters, in table order, for the
/// filter's configuration.
pub const FLEET_FILE: &str = "fleet.json";

/// The SHA-256 of a tables file in lowercase hex: what `ace policy compile`
/// prints and the playground shows, so that tables compiled in either can
/// be compared (and checked with `sha256sum out/tables.acet`).
pub fn tables_sha256(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    use std::fmt::Write as _;
    let mut hex = String::with_capacity(64);
    for b in sha2::Sha256::digest(bytes) {
        let _ = write!(hex, "{b:02x}");
    }
    hex
}

/// Where `ace policy compile DIR` writes the tables.
pub fn tables_path(dir: &Path) -> PathBuf {
    dir.join(OUT_DIR).join(TABLES_FILE)
}

/// Loads and checks the policy directory `dir`.
pub fn load_dir(dir: &Path) -> Result<Project, Error> {
    Project::load(Sources::read_dir(dir)?)
}
