//! Writing: the encoder `ace policy compile` runs to turn a compiled
//! policy ([`TableSpec`]) into the bytes the filter loads.
//!
//! It refuses any spec the loader would reject, so that a table it writes
//! always loads, and it writes the same bytes for the same spec, so that a
//! compiled table can be compared and checked in.

use super::format::{
    reseal, FactorKind, FORBID, HEADER_LEN, MAGIC, MAX_ATTRIBUTES, MAX_DESTINATIONS,
    MAX_FACTOR_ROWS, PERMIT, VERSION,
};
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

/// One destination as written into the tables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DestinationSpec {
    /// The manifest name.
    pub name: String,
    /// The Envoy cluster the filter routes to.
    pub cluster: String,
}

/// One request attribute and its known values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttributeSpec {
    /// Attribute name, unique.
    pub name: String,
    /// Known values, strictly increasing bytewise; value `values[i]` gets
    /// index `i + 1`.
    pub values: Vec<String>,
}

impl DestinationSpec {
    /// The destination `name` behind Envoy cluster `cluster`.
    pub fn new(name: &str, cluster: &str) -> Self {
        Self {
            name: name.into(),
            cluster: cluster.into(),
        }
    }
}

impl AttributeSpec {
    /// The attribute `name` with its known `values` (strictly increasing).
    pub fn new(name: &str, values: &[&str]) -> Self {
        Self {
            name: name.into(),
            values: values.iter().map(|v| String::from(*v)).collect(),
        }
    }
}

/// One factor to be written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FactorSpec {
    /// Permit or forbid.
    pub kind: FactorKind,
    /// Attribute indices the factor is keyed by, distinct, most significant
    /// first.
    pub attributes: Vec<u32>,
    /// Row words, row-major: `row_count * words()` words, where rows are
    /// numbered mixed-radix over the attributes' value counts plus one
    /// (unknown is digit 0), the last attribute varying fastest.
    pub rows: Vec<u64>,
}

/// Everything [`encode`] writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableSpec {
    /// Destinations, in bit order.
    pub destinations: Vec<DestinationSpec>,
    /// Request attributes, in index order.
    pub attributes: Vec<AttributeSpec>,
    /// Factors, any order.
    pub factors: Vec<FactorSpec>,
}

/// Why [`encode`] refused a spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncodeError {
    what: &'static str,
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot encode policy tables: {}", self.what)
    }
}

impl core::error::Error for EncodeError {}

fn too_big(what: &'static str) -> EncodeError {
    EncodeError { what }
}

fn to_u32(n: usize, what: &'static str) -> Result<u32, EncodeError> {
    u32::try_from(n).map_err(|_| too_big(what))
}

/// Writes `spec` in the current format. The output loads with
/// [`Tables::load`](super::Tables::load); the same spec always gives the
/// same bytes.
pub fn encode(spec: &TableSpec) -> Result<Vec<u8>, EncodeError> {
    let d = spec.destinations.len();
    if d == 0 || d > MAX_DESTINATIONS as usize {
        return Err(too_big("destination count must be 1 to 65,536"));
    }
    if spec.attributes.len() > MAX_ATTRIBUTES as usize {
        return Err(too_big("more than 256 attributes"));
    }
    let wpr = d.div_ceil(64);
    let mut strings: Vec<u8> = Vec::new();
    let mut put = |s: &str| -> Result<[u32; 2], EncodeError> {
        let off = to_u32(strings.len(), "string pool over 4 GiB")?;
        strings.extend_from_slice(s.as_bytes());
        Ok([off, to_u32(s.len(), "string over 4 GiB")?])
    };
    let mut attrs = Vec::new();
    let mut values = Vec::new();
    let mut nvalues = 0usize;
    for (i, a) in spec.attributes.iter().enumerate() {
        if spec.attributes.iter().take(i).any(|b| b.name == a.name) {
            return Err(too_big("duplicate attribute name"));
        }
        if a.values
            .windows(2)
            .any(|w| matches!(w, [x, y] if x.as_bytes() >= y.as_bytes()))
        {
            return Err(too_big("attribute values must be strictly increasing"));
        }
        let [o, l] = put(&a.name)?;
        attrs.extend([
            o,
            l,
            to_u32(nvalues, "too many values")?,
            to_u32(a.values.len(), "too many values")?,
        ]);
        for v in &a.values {
            values.extend(put(v)?);
        }
        nvalues += a.values.len();
    }
    let mut dests = Vec::new();
    for dst in &spec.destinations {
        dests.extend(put(&dst.cluster)?);
        dests.extend(put(&dst.name)?);
    }
    let mut factors = Vec::new();
    let mut keys = Vec::new();
    let mut words: Vec<u64> = Vec::new();
    // Permits first: `feasible` makes one pass and relies on it.
    let ordered = spec
        .factors
        .iter()
        .filter(|f| f.kind == FactorKind::Permit)
        .chain(spec.factors.iter().filter(|f| f.kind == FactorKind::Forbid));
    for f in ordered {
        let first_key = to_u32(keys.len() / 3, "too many keys")?;
        let mut strides = alloc::vec![[0u32; 2]; f.attributes.len()];
        let mut stride: u64 = 1;
        for (k, &a) in f.attributes.iter().enumerate().rev() {
            let attr = spec
                .attributes
                .get(a as usize)
                .ok_or(too_big("factor names a missing attribute"))?;
            if f.attributes.iter().take(k).any(|&b| b == a) {
                return Err(too_big("factor repeats an attribute"));
            }
            if let Some(s) = strides.get_mut(k) {
                *s = [
                    to_u32(stride as usize, "factor too large")?,
                    to_u32(attr.values.len() + 1, "too many values")?,
                ];
            }
            stride = stride
                .checked_mul(attr.values.len() as u64 + 1)
                .filter(|&r| r <= MAX_FACTOR_ROWS)
                .ok_or(too_big("factor has more than 2^24 rows"))?;
        }
        if f.rows.len() as u64 != stride * wpr as u64 {
            return Err(too_big("factor row words disagree with its attributes"));
        }
        for (&a, &[stride, radix]) in f.attributes.iter().zip(&strides) {
            keys.extend([a, stride, radix]);
        }
        factors.extend([
            match f.kind {
                FactorKind::Permit => PERMIT,
                FactorKind::Forbid => FORBID,
            },
            first_key,
            to_u32(f.attributes.len(), "too many keys")?,
            to_u32(stride as usize, "factor too large")?,
            to_u32(words.len(), "too many words")?,
            0,
        ]);
        words.extend_from_slice(&f.rows);
    }
    let header = [
        to_u32(d, "destinations")?,
        to_u32(wpr, "words")?,
        to_u32(spec.attributes.len(), "attributes")?,
        to_u32(nvalues, "values")?,
        to_u32(spec.factors.len(), "factors")?,
        to_u32(keys.len() / 3, "keys")?,
        to_u32(strings.len(), "strings")?,
        to_u32(words.len(), "words")?,
    ];
    let mut out = Vec::new();
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(HEADER_LEN as u32).to_le_bytes());
    out.extend_from_slice(&[0; 16]); // total length and checksum, below
    for x in header
        .iter()
        .chain(&attrs)
        .chain(&values)
        .chain(&dests)
        .chain(&factors)
        .chain(&keys)
    {
        out.extend_from_slice(&x.to_le_bytes());
    }
    while out.len() % 8 != 0 {
        out.push(0);
    }
    for w in &words {
        out.extend_from_slice(&w.to_le_bytes());
    }
    out.extend_from_slice(&strings);
    reseal(&mut out);
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]
mod tests {
    use super::*;
    use crate::tables::spec;
    use alloc::vec;

    #[test]
    fn encoder_rejects_bad_specs() {
        let mut s = spec();
        s.attributes[0].values.reverse();
        assert!(encode(&s).is_err());
        let mut s = spec();
        s.factors[0].rows.pop();
        assert!(encode(&s).is_err());
        let mut s = spec();
        s.destinations.clear();
        assert!(encode(&s).is_err());
        let mut s = spec();
        s.factors[0].attributes = vec![0, 0];
        assert!(encode(&s).is_err());
    }
}
