//! The per-request reader: names to indices, and the feasible set for a
//! request's index vector.
//!
//! Everything here runs after [`Tables::load`] has validated every record,
//! so a lookup neither checks the structure again nor allocates; an access
//! that validation makes impossible still answers something fail-closed
//! (an empty set, [`UNKNOWN`]) rather than panic.

use super::format::{
    field, u32_at, u64_at, FactorKind, ATTR_REC, DEST_REC, FACTOR_REC, FORBID, KEY_REC, PERMIT,
    UNKNOWN, VALUE_REC,
};
use core::fmt;

/// Why a lookup could not be answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LookupError {
    /// The request's value-index slice is not one entry per attribute.
    WrongAttributeCount {
        /// [`Tables::attribute_count`].
        expected: usize,
        /// Length given.
        found: usize,
    },
    /// The output buffer is shorter than [`Tables::words`].
    OutputTooShort {
        /// Words needed.
        needed: usize,
        /// Words given.
        found: usize,
    },
}

impl fmt::Display for LookupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LookupError::WrongAttributeCount { expected, found } => write!(
                f,
                "request has {found} attribute values but the tables have {expected} \
                 attributes: size the index vector with `attribute_count()`"
            ),
            LookupError::OutputTooShort { needed, found } => write!(
                f,
                "output buffer has {found} words but {needed} are needed: size it \
                 with `words()`"
            ),
        }
    }
}

impl core::error::Error for LookupError {}

/// Compiled feasibility tables borrowed from their bytes. See the module
/// docs for the API and the format.
#[derive(Clone, Copy, Debug)]
pub struct Tables<'a> {
    pub(super) destination_count: usize,
    pub(super) words_per_row: usize,
    pub(super) attribute_count: usize,
    pub(super) factor_count: usize,
    pub(super) attributes: &'a [u8],
    pub(super) values: &'a [u8],
    pub(super) destinations: &'a [u8],
    pub(super) factors: &'a [u8],
    pub(super) keys: &'a [u8],
    pub(super) words: &'a [u8],
    pub(super) strings: &'a [u8],
}

impl<'a> Tables<'a> {
    /// The string at fields `i`, `i + 1` (offset, length) of a record.
    pub(super) fn string(
        &self,
        section: &[u8],
        size: usize,
        rec: usize,
        i: usize,
    ) -> Option<&'a str> {
        core::str::from_utf8(self.bytes(section, size, rec, i)?).ok()
    }

    /// The bytes of a string field, without the UTF-8 check.
    pub(super) fn bytes(
        &self,
        section: &[u8],
        size: usize,
        rec: usize,
        i: usize,
    ) -> Option<&'a [u8]> {
        let off = field(section, size, rec, i)? as usize;
        let len = field(section, size, rec, i + 1)? as usize;
        self.strings.get(off..off.checked_add(len)?)
    }

    /// Number of destinations `D`.
    pub fn destination_count(&self) -> usize {
        self.destination_count
    }

    /// Words of 64 destination bits in an output buffer (`ceil(D / 64)`).
    pub fn words(&self) -> usize {
        self.words_per_row
    }

    /// Number of request attributes; the length of a request's index vector.
    pub fn attribute_count(&self) -> usize {
        self.attribute_count
    }

    /// Number of factors.
    pub fn factor_count(&self) -> usize {
        self.factor_count
    }

    /// The index of the attribute called `name`, if any.
    pub fn attribute_index(&self, name: &str) -> Option<u32> {
        (0..self.attribute_count)
            .find(|&a| self.string(self.attributes, ATTR_REC, a, 0) == Some(name))
            .map(|a| a as u32)
    }

    /// The name of attribute `attribute`.
    pub fn attribute_name(&self, attribute: u32) -> Option<&'a str> {
        if attribute as usize >= self.attribute_count {
            return None;
        }
        self.string(self.attributes, ATTR_REC, attribute as usize, 0)
    }

    /// Number of known values of `attribute` (0 for a missing attribute).
    /// Value indices run `1..=value_count`; [`UNKNOWN`] is 0.
    pub fn value_count(&self, attribute: u32) -> u32 {
        if attribute as usize >= self.attribute_count {
            return 0;
        }
        field(self.attributes, ATTR_REC, attribute as usize, 3).unwrap_or(0)
    }

    /// The value index of `value` for `attribute`: `1..=value_count` for a
    /// known value, [`UNKNOWN`] otherwise (including a missing attribute).
    /// A binary search; allocates nothing.
    pub fn value_index(&self, attribute: u32, value: &str) -> u32 {
        self.value_index_bytes(attribute, value.as_bytes())
    }

    /// [`Tables::value_index`] of raw bytes, e.g. a header value as it
    /// arrived: bytes that are not UTF-8 equal no value (every value was
    /// checked to be UTF-8 at load), so they are [`UNKNOWN`].
    pub fn value_index_bytes(&self, attribute: u32, value: &[u8]) -> u32 {
        let first = if (attribute as usize) < self.attribute_count {
            field(self.attributes, ATTR_REC, attribute as usize, 2).unwrap_or(0) as usize
        } else {
            return UNKNOWN;
        };
        let (mut lo, mut hi) = (0usize, self.value_count(attribute) as usize);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            // Validated as UTF-8 at load: compared as bytes, not re-checked.
            let Some(s) = self.bytes(self.values, VALUE_REC, first + mid, 0) else {
                return UNKNOWN;
            };
            match s.cmp(value) {
                core::cmp::Ordering::Less => lo = mid + 1,
                core::cmp::Ordering::Greater => hi = mid,
                core::cmp::Ordering::Equal => return (mid + 1) as u32,
            }
        }
        UNKNOWN
    }

    /// The value string with index `index` (`1..=value_count`) of
    /// `attribute`; `None` for [`UNKNOWN`] or out of range.
    pub fn value_name(&self, attribute: u32, index: u32) -> Option<&'a str> {
        if index == UNKNOWN || index > self.value_count(attribute) {
            return None;
        }
        let first = field(self.attributes, ATTR_REC, attribute as usize, 2)? as usize;
        self.string(self.values, VALUE_REC, first + index as usize - 1, 0)
    }

    /// The Envoy cluster of destination `d`.
    pub fn destination_cluster(&self, d: usize) -> Option<&'a str> {
        if d >= self.destination_count {
            return None;
        }
        self.string(self.destinations, DEST_REC, d, 0)
    }

    /// The manifest name of destination `d`.
    pub fn destination_name(&self, d: usize) -> Option<&'a str> {
        if d >= self.destination_count {
            return None;
        }
        self.string(self.destinations, DEST_REC, d, 2)
    }

    /// Factor `i`, for inspection (`ace policy dump`).
    pub fn factor(&self, i: usize) -> Option<Factor<'a>> {
        if i >= self.factor_count {
            return None;
        }
        let rec = |k| field(self.factors, FACTOR_REC, i, k);
        Some(Factor {
            kind: if rec(0)? == PERMIT {
                FactorKind::Permit
            } else {
                FactorKind::Forbid
            },
            keys: self
                .keys
                .get(rec(1)? as usize * KEY_REC..(rec(1)? as usize + rec(2)? as usize) * KEY_REC)?,
            rows: rec(3)? as usize,
            words: self.words.get(
                rec(4)? as usize * 8
                    ..(rec(4)? as usize + rec(3)? as usize * self.words_per_row) * 8,
            )?,
            words_per_row: self.words_per_row,
        })
    }

    /// Writes the feasible-destination bitmask for a request into `out`.
    ///
    /// `values` holds one value index per attribute (see
    /// [`Tables::value_index`]); an index above the attribute's value count
    /// is treated as [`UNKNOWN`]. `out` must hold at least
    /// [`Tables::words`] words; extra words are zeroed. Allocates nothing.
    pub fn feasible(&self, values: &[u32], out: &mut [u64]) -> Result<(), LookupError> {
        if values.len() != self.attribute_count {
            return Err(LookupError::WrongAttributeCount {
                expected: self.attribute_count,
                found: values.len(),
            });
        }
        if out.len() < self.words_per_row {
            return Err(LookupError::OutputTooShort {
                needed: self.words_per_row,
                found: out.len(),
            });
        }
        out.fill(0);
        let out = out.get_mut(..self.words_per_row).unwrap_or(&mut []);
        // One pass: the loader checked that permit factors come first.
        for f in 0..self.factor_count {
            if !self.apply(f, values, out) {
                // Unreachable after validation; fail closed all the same.
                out.fill(0);
                return Ok(());
            }
        }
        let tail = self.destination_count % 64;
        if tail != 0 {
            if let Some(last) = out.last_mut() {
                *last &= (1u64 << tail) - 1;
            }
        }
        Ok(())
    }

    /// ORs (permit) or clears (forbid) factor `f`'s row for `values`.
    /// Returns `false` if a record is out of bounds (impossible after
    /// validation).
    #[inline]
    fn apply(&self, f: usize, values: &[u32], out: &mut [u64]) -> bool {
        let Some(rec) = self.factors.get(f * FACTOR_REC..(f + 1) * FACTOR_REC) else {
            return false;
        };
        let r = |k: usize| u32_at(rec, k * 4).unwrap_or(0) as usize;
        let (forbid, first_key, nkeys, first_word) = (r(0) == FORBID as usize, r(1), r(2), r(4));
        let Some(keys) = self
            .keys
            .get(first_key * KEY_REC..(first_key + nkeys) * KEY_REC)
        else {
            return false;
        };
        let mut row = 0usize;
        for key in keys.chunks_exact(KEY_REC) {
            let attr = u32_at(key, 0).unwrap_or(0) as usize;
            let stride = u32_at(key, 4).unwrap_or(0) as usize;
            let radix = u32_at(key, 8).unwrap_or(0);
            let mut v = values.get(attr).copied().unwrap_or(UNKNOWN);
            if v >= radix {
                v = UNKNOWN;
            }
            row += v as usize * stride;
        }
        let start = (first_word + row * self.words_per_row) * 8;
        let Some(bytes) = self.words.get(start..start + self.words_per_row * 8) else {
            return false;
        };
        for (o, chunk) in out.iter_mut().zip(bytes.chunks_exact(8)) {
            let w = u64::from_le_bytes(chunk.try_into().unwrap_or([0xff; 8]));
            if forbid {
                *o &= !w;
            } else {
                *o |= w;
            }
        }
        true
    }
}

/// A read-only view of one factor.
#[derive(Clone, Copy, Debug)]
pub struct Factor<'a> {
    kind: FactorKind,
    keys: &'a [u8],
    rows: usize,
    words: &'a [u8],
    words_per_row: usize,
}

impl<'a> Factor<'a> {
    /// Permit or forbid.
    pub fn kind(&self) -> FactorKind {
        self.kind
    }

    /// The attribute indices this factor is keyed by, most significant
    /// first.
    pub fn attributes(&self) -> impl Iterator<Item = u32> + 'a {
        self.keys
            .chunks_exact(KEY_REC)
            .map(|k| u32_at(k, 0).unwrap_or(0))
    }

    /// Number of rows (the product of value counts plus one).
    pub fn row_count(&self) -> usize {
        self.rows
    }

    /// Word `w` of row `r`.
    pub fn word(&self, r: usize, w: usize) -> Option<u64> {
        if r >= self.rows || w >= self.words_per_row {
            return None;
        }
        u64_at(self.words, (r * self.words_per_row + w) * 8)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]
mod tests {
    use super::*;
    use crate::tables::{encode, spec, DestinationSpec, TableSpec};
    use alloc::vec::Vec;
    use alloc::{format, vec};

    fn lookup(t: &Tables<'_>, v: &[u32]) -> u64 {
        let mut out = [0u64; 1];
        t.feasible(v, &mut out).unwrap();
        out[0]
    }

    #[test]
    fn round_trip_and_lookup() {
        let bytes = encode(&spec()).unwrap();
        let t = Tables::load(&bytes).unwrap();
        assert_eq!(t.destination_count(), 3);
        assert_eq!(t.attribute_count(), 2);
        assert_eq!(t.attribute_index("tenant"), Some(1));
        assert_eq!(t.attribute_index("nope"), None);
        assert_eq!(t.value_index(0, "public"), 2);
        assert_eq!(t.value_index(0, "personal"), 1);
        assert_eq!(t.value_index(0, "secret"), UNKNOWN);
        assert_eq!(t.value_index(9, "public"), UNKNOWN);
        assert_eq!(t.value_index_bytes(0, b"public"), 2);
        assert_eq!(t.value_index_bytes(0, b"publ\xffc"), UNKNOWN, "not UTF-8");
        assert_eq!(t.value_name(0, 2), Some("public"));
        assert_eq!(t.value_name(0, 0), None);
        assert_eq!(t.destination_cluster(2), Some("c2"));
        assert_eq!(t.destination_name(0), Some("d0"));
        assert_eq!(t.destination_cluster(3), None);
        assert_eq!(lookup(&t, &[2, 1]), 0b011);
        assert_eq!(lookup(&t, &[1, 1]), 0b001);
        // Unknown tenant: the forbid row is all destinations.
        assert_eq!(lookup(&t, &[2, 0]), 0);
        // Unknown data class: the permit row is empty.
        assert_eq!(lookup(&t, &[0, 1]), 0);
        // Out-of-range indices count as unknown.
        assert_eq!(lookup(&t, &[7, 1]), 0);
        let f = t.factor(1).unwrap();
        assert_eq!(f.kind(), FactorKind::Forbid);
        assert_eq!(f.attributes().collect::<Vec<_>>(), vec![1]);
        assert_eq!(f.word(1, 0), Some(0b100));
        assert_eq!(f.word(2, 0), None);
    }

    #[test]
    fn lookup_rejects_bad_buffers() {
        let bytes = encode(&spec()).unwrap();
        let t = Tables::load(&bytes).unwrap();
        let mut out = [0u64; 0];
        assert!(matches!(
            t.feasible(&[1, 1], &mut out),
            Err(LookupError::OutputTooShort { .. })
        ));
        let mut out = [u64::MAX; 2];
        assert!(matches!(
            t.feasible(&[1], &mut out),
            Err(LookupError::WrongAttributeCount { .. })
        ));
        t.feasible(&[2, 1], &mut out).unwrap();
        assert_eq!(out, [0b011, 0]);
    }

    #[test]
    fn a_thousand_and_twenty_four_destinations() {
        let n = 1024;
        let mut s = spec();
        s.destinations = (0..n)
            .map(|i| DestinationSpec {
                name: format!("d{i}"),
                cluster: format!("c{i}"),
            })
            .collect();
        let w = n / 64;
        // Permit: "public" allows the odd destinations; forbid: "acme" the
        // last one.
        let mut permit = vec![0u64; 3 * w];
        for x in &mut permit[2 * w..] {
            *x = 0xaaaa_aaaa_aaaa_aaaa;
        }
        let mut forbid = vec![u64::MAX; 2 * w];
        for x in &mut forbid[w..] {
            *x = 0;
        }
        forbid[2 * w - 1] = 1 << 63;
        s.factors[0].rows = permit;
        s.factors[1].rows = forbid;
        let bytes = encode(&s).unwrap();
        let t = Tables::load(&bytes).unwrap();
        let mut out = vec![0u64; w];
        t.feasible(&[2, 1], &mut out).unwrap();
        let allowed: usize = out.iter().map(|x| x.count_ones() as usize).sum();
        assert_eq!(allowed, 511);
        assert_eq!(out[w - 1] >> 63, 0);
        assert_eq!(t.destination_cluster(1023), Some("c1023"));
    }

    #[test]
    fn padding_bits_never_reach_the_output() {
        let mut s = spec();
        s.factors[0].rows = vec![0, u64::MAX, u64::MAX];
        let bytes = encode(&s).unwrap();
        let t = Tables::load(&bytes).unwrap();
        assert_eq!(lookup(&t, &[2, 1]), 0b011);
    }

    #[test]
    fn no_attributes_no_factors() {
        let s = TableSpec {
            destinations: vec![DestinationSpec::new("a", "b")],
            attributes: vec![],
            factors: vec![],
        };
        let bytes = encode(&s).unwrap();
        let t = Tables::load(&bytes).unwrap();
        assert_eq!(lookup(&t, &[]), 0);
    }
}
