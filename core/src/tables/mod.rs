//! Feasibility tables: which destinations may serve a request, answered
//! with a few lookups and a bitwise AND instead of a Cedar evaluation.
//!
//! # Why tables
//!
//! Feasibility (residency, certifications, capability) is written in Cedar
//! and compiled ahead of time by `ace-policy`. Evaluating Cedar per request
//! per destination inside Envoy would cost microseconds each; these tables
//! answer the same question in tens of nanoseconds, and `ace policy verify`
//! proves they say exactly what Cedar says.
//!
//! # The model
//!
//! A request is a tuple of *attribute values* (tenant, data class, model,
//! ...). Each attribute has a finite domain of known values, numbered
//! `1..=n`; value index [`UNKNOWN`] (`0`) stands for any value that was not
//! known at compile time. The policy set is split into *factors*: the permit
//! policies that read the same set of attributes form one permit factor,
//! likewise for forbid policies. A factor stores one row of destination bits
//! per combination of its own attributes' values (unknown included). The
//! feasible set is
//!
//! ```text
//! (OR of permit-factor rows) AND NOT (OR of forbid-factor rows)
//! ```
//!
//! The compiler writes rows for unknown values so that they fail closed: a
//! permit row keyed by an unknown value is empty and a forbid row keyed by
//! one holds every destination. A zeroed index vector therefore permits
//! nothing that any policy reads an attribute for.
//!
//! # Using it (the filter's API)
//!
//! ```
//! # use ace_core::tables::{encode, TableSpec, AttributeSpec, DestinationSpec, FactorSpec, FactorKind};
//! # let spec = TableSpec {
//! #     destinations: vec![DestinationSpec::new("eu", "eu_c")],
//! #     attributes: vec![AttributeSpec::new("data_class", &["public"])],
//! #     factors: vec![FactorSpec { kind: FactorKind::Permit, attributes: vec![0], rows: vec![0, 1] }],
//! # };
//! # let bytes = encode(&spec).unwrap();
//! use ace_core::tables::Tables;
//! // Once, at configuration time: validate everything.
//! let tables = Tables::load(&bytes)?;
//! let attr = tables.attribute_index("data_class").unwrap();
//! // Per request: no allocation. Index vectors and the output buffer are
//! // owned by the caller and reused.
//! let mut request = [0u32; 1]; // all UNKNOWN
//! request[attr as usize] = tables.value_index(attr, "public");
//! let mut out = [0u64; 1];
//! tables.feasible(&request, &mut out)?;
//! assert_eq!(out[0], 0b1);
//! assert_eq!(tables.destination_cluster(0), Some("eu_c"));
//! # Ok::<(), Box<dyn core::error::Error>>(())
//! ```
//!
//! - [`Tables::load`] checks the header, the checksum and every offset,
//!   count and stride, so that the lookups afterwards cannot go out of
//!   bounds. It never panics and never allocates; it borrows the input.
//! - [`Tables::attribute_index`], [`Tables::value_index`] map names to
//!   indices (resolve attribute indices once at configuration time;
//!   `value_index` is a binary search and returns [`UNKNOWN`] for unseen
//!   values).
//! - [`Tables::feasible`] writes the destination bitmask: bit `d % 64` of
//!   word `d / 64` is destination `d`.
//! - [`Tables::destination_cluster`] and [`Tables::destination_name`] give
//!   the Envoy cluster and the manifest name of destination `d`.
//!
//! - [`encode`] writes a [`TableSpec`] (what `ace policy compile` builds
//!   from the Cedar policies) as the bytes [`Tables::load`] reads.
//!
//! # Where things are
//!
//! The reader runs inside Envoy on every request and the writer runs once
//! in the compiler, but both must agree on every byte, and the checks that
//! make hostile bytes safe must run before any lookup trusts them. Hence
//! four rooms:
//!
//! - `format`: the wire format (the layout table, constants, record sizes,
//!   the checksum), the one place both sides read it from;
//! - `validation`: [`Tables::load`] and [`LoadError`];
//! - `lookup`: [`Tables`]' per-request reads ([`Tables::feasible`], the
//!   name and index maps) and [`Factor`];
//! - `encoding`: [`encode`] and the spec types.

mod encoding;
mod format;
mod lookup;
mod validation;

pub use encoding::{encode, AttributeSpec, DestinationSpec, EncodeError, FactorSpec, TableSpec};
pub use format::{
    reseal, FactorKind, MAGIC, MAX_ATTRIBUTES, MAX_DESTINATIONS, MAX_FACTOR_ROWS, UNKNOWN, VERSION,
};
pub use lookup::{Factor, LookupError, Tables};
pub use validation::LoadError;

/// Two attributes (data_class: 2 values, tenant: 1 value), three
/// destinations. Permit keyed by data_class; forbid keyed by tenant.
#[cfg(test)]
fn spec() -> TableSpec {
    use alloc::{format, vec};
    TableSpec {
        destinations: (0..3)
            .map(|i| DestinationSpec {
                name: format!("d{i}"),
                cluster: format!("c{i}"),
            })
            .collect(),
        attributes: vec![
            AttributeSpec::new("data_class", &["personal", "public"]),
            AttributeSpec::new("tenant", &["acme"]),
        ],
        factors: vec![
            // rows: unknown, personal, public
            FactorSpec {
                kind: FactorKind::Permit,
                attributes: vec![0],
                rows: vec![0b000, 0b001, 0b111],
            },
            // rows: unknown, acme
            FactorSpec {
                kind: FactorKind::Forbid,
                attributes: vec![1],
                rows: vec![0b111, 0b100],
            },
        ],
    }
}
