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
//! #     destinations: vec![DestinationSpec { name: "eu".into(), cluster: "eu_c".into() }],
//! #     attributes: vec![AttributeSpec { name: "data_class".into(), values: vec!["public".into()] }],
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
//! # Wire format (version 1, little-endian, no alignment required)
//!
//! Bespoke rather than serde: loading takes no heap and no decoding pass,
//! and every field is read with `from_le_bytes`, so the same bytes load on
//! any host and need no `unsafe`.
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 8 | magic `ACETBLS\0` |
//! | 8 | 4 | format version ([`VERSION`]) |
//! | 12 | 4 | header length (64) |
//! | 16 | 8 | total length in bytes |
//! | 24 | 8 | FNV-1a 64 checksum of every byte except these 8 |
//! | 32 | 4 | destination count `D` |
//! | 36 | 4 | words per row (`ceil(D / 64)`) |
//! | 40 | 4 | attribute count |
//! | 44 | 4 | value count (all attributes) |
//! | 48 | 4 | factor count |
//! | 52 | 4 | key count (all factors) |
//! | 56 | 4 | string bytes |
//! | 60 | 4 | word count |
//!
//! Then, in this order: attribute records (16 bytes: name offset, name
//! length, first value, value count), value records (8 bytes: offset,
//! length; each attribute's values strictly increasing bytewise), destination
//! records (16 bytes: cluster offset and length, name offset and length),
//! factor records (24 bytes: kind 0 = permit / 1 = forbid, first key, key
//! count, row count, first word, reserved 0; permit factors first), key
//! records (12 bytes: attribute, stride, value count + 1), zero padding to a multiple of 8, the row words (`u64`
//! each), and the UTF-8 string pool. A factor's row for a request is
//! `sum(value_index[key.attribute] * key.stride)`; the last key has stride 1
//! and each earlier stride is the next one times the next attribute's value
//! count plus one.

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

/// The eight bytes every table file starts with.
pub const MAGIC: [u8; 8] = *b"ACETBLS\0";
/// The format version this build reads and writes. Loading any other
/// version is an error: recompile the policies with the matching `ace`.
pub const VERSION: u32 = 1;
/// Value index of a value not known at compile time. Lookups fail closed on
/// it.
pub const UNKNOWN: u32 = 0;
/// Most destinations a table may hold.
pub const MAX_DESTINATIONS: u32 = 65_536;
/// Most request attributes a table may hold.
pub const MAX_ATTRIBUTES: u32 = 256;
/// Most rows one factor may hold (bounds compile output and load work).
pub const MAX_FACTOR_ROWS: u64 = 1 << 24;

const HEADER_LEN: usize = 64;
const CHECKSUM_AT: usize = 24;
const ATTR_REC: usize = 16;
const VALUE_REC: usize = 8;
const DEST_REC: usize = 16;
const FACTOR_REC: usize = 24;
const KEY_REC: usize = 12;

/// Why a table file was rejected. Each message names the problem and what
/// to do about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoadError {
    /// Fewer bytes than the header needs.
    TooShort {
        /// Bytes given.
        len: usize,
    },
    /// The file does not start with [`MAGIC`].
    BadMagic,
    /// The file was written by a different format version.
    UnsupportedVersion {
        /// Version found in the header.
        found: u32,
    },
    /// The header's total length disagrees with the bytes given.
    LengthMismatch {
        /// Length stated in the header.
        declared: u64,
        /// Bytes given.
        actual: usize,
    },
    /// The checksum does not match the contents.
    ChecksumMismatch {
        /// Checksum stored in the header.
        stored: u64,
        /// Checksum of the bytes given.
        computed: u64,
    },
    /// A count, offset, stride or string is inconsistent.
    Corrupt {
        /// What was wrong.
        what: &'static str,
    },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const FIX: &str = "recompile the policies with `ace policy compile`";
        match self {
            LoadError::TooShort { len } => write!(
                f,
                "policy tables are {len} bytes, fewer than the {HEADER_LEN}-byte header: \
                 the file is truncated or not an ACE table; {FIX}"
            ),
            LoadError::BadMagic => write!(
                f,
                "policy tables do not start with the ACE table magic: not an ACE table \
                 file; pass the `.acet` file written by `ace policy compile`"
            ),
            LoadError::UnsupportedVersion { found } => write!(
                f,
                "policy tables have format version {found} but this build reads \
                 version {VERSION}; {FIX} using the same ACE release as the filter"
            ),
            LoadError::LengthMismatch { declared, actual } => write!(
                f,
                "policy tables declare {declared} bytes but {actual} were given: \
                 the file is truncated or has trailing bytes; {FIX}"
            ),
            LoadError::ChecksumMismatch { stored, computed } => write!(
                f,
                "policy tables checksum mismatch (stored {stored:#018x}, computed \
                 {computed:#018x}): the file is corrupted; {FIX}"
            ),
            LoadError::Corrupt { what } => {
                write!(f, "policy tables are corrupt: {what}; {FIX}")
            }
        }
    }
}

impl core::error::Error for LoadError {}

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

/// Whether a factor's rows grant or deny.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FactorKind {
    /// OR-ed into the feasible set.
    Permit,
    /// Removed from the feasible set.
    Forbid,
}

/// FNV-1a 64 of `parts`, in order. Cheap, dependency-free and good enough
/// to catch corruption; the tables are not a security boundary against a
/// malicious author (who could recompute it), only against damage.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// The checksum stored at bytes 24..32, over everything else.
fn checksum(data: &[u8]) -> u64 {
    let head = data.get(..CHECKSUM_AT).unwrap_or(&[]);
    let tail = data.get(CHECKSUM_AT + 8..).unwrap_or(&[]);
    fnv1a(&[head, tail])
}

/// Rewrites the total length and checksum fields of `bytes` to match its
/// contents, as [`encode`] does. For tools and fuzzers that edit a table on
/// purpose (to test the structural checks behind the checksum); a table
/// damaged by accident must be recompiled, not resealed. Does nothing to
/// input shorter than the header.
pub fn reseal(bytes: &mut [u8]) {
    if bytes.len() < HEADER_LEN {
        return;
    }
    let total = (bytes.len() as u64).to_le_bytes();
    if let Some(slot) = bytes.get_mut(16..24) {
        slot.copy_from_slice(&total);
    }
    let sum = checksum(bytes).to_le_bytes();
    if let Some(slot) = bytes.get_mut(CHECKSUM_AT..CHECKSUM_AT + 8) {
        slot.copy_from_slice(&sum);
    }
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    let end = off.checked_add(4)?;
    let bytes: [u8; 4] = b.get(off..end)?.try_into().ok()?;
    Some(u32::from_le_bytes(bytes))
}

fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    let end = off.checked_add(8)?;
    let bytes: [u8; 8] = b.get(off..end)?.try_into().ok()?;
    Some(u64::from_le_bytes(bytes))
}

/// Field `i` (a `u32`) of record `rec` in a section of `size`-byte records.
fn field(section: &[u8], size: usize, rec: usize, i: usize) -> Option<u32> {
    u32_at(section, rec.checked_mul(size)?.checked_add(i * 4)?)
}

fn corrupt(what: &'static str) -> LoadError {
    LoadError::Corrupt { what }
}

/// Splits `n` bytes off the front of `rest`.
fn take<'a>(rest: &mut &'a [u8], n: usize, what: &'static str) -> Result<&'a [u8], LoadError> {
    if n > rest.len() {
        return Err(corrupt(what));
    }
    let (head, tail) = rest.split_at(n);
    *rest = tail;
    Ok(head)
}

fn sized(count: u32, rec: usize, what: &'static str) -> Result<usize, LoadError> {
    (count as usize).checked_mul(rec).ok_or(corrupt(what))
}

/// Compiled feasibility tables borrowed from their bytes. See the module
/// docs for the API and the format.
#[derive(Clone, Copy, Debug)]
pub struct Tables<'a> {
    destination_count: usize,
    words_per_row: usize,
    attribute_count: usize,
    factor_count: usize,
    attributes: &'a [u8],
    values: &'a [u8],
    destinations: &'a [u8],
    factors: &'a [u8],
    keys: &'a [u8],
    words: &'a [u8],
    strings: &'a [u8],
}

impl<'a> Tables<'a> {
    /// Validates `data` and borrows it. Rejects truncated, corrupted and
    /// wrong-version input with an error; never panics, never allocates.
    pub fn load(data: &'a [u8]) -> Result<Tables<'a>, LoadError> {
        if data.len() < HEADER_LEN {
            return Err(LoadError::TooShort { len: data.len() });
        }
        if data.get(..8) != Some(&MAGIC[..]) {
            return Err(LoadError::BadMagic);
        }
        let h = |off| u32_at(data, off).ok_or(LoadError::TooShort { len: data.len() });
        let version = h(8)?;
        if version != VERSION {
            return Err(LoadError::UnsupportedVersion { found: version });
        }
        if h(12)? as usize != HEADER_LEN {
            return Err(corrupt("header length is not 64"));
        }
        let declared = u64_at(data, 16).ok_or(LoadError::TooShort { len: data.len() })?;
        if declared != data.len() as u64 {
            return Err(LoadError::LengthMismatch {
                declared,
                actual: data.len(),
            });
        }
        let stored = u64_at(data, CHECKSUM_AT).ok_or(LoadError::TooShort { len: data.len() })?;
        let computed = checksum(data);
        if stored != computed {
            return Err(LoadError::ChecksumMismatch { stored, computed });
        }
        let destination_count = h(32)?;
        let words_per_row = h(36)?;
        let attribute_count = h(40)?;
        let value_count = h(44)?;
        let factor_count = h(48)?;
        let key_count = h(52)?;
        let string_bytes = h(56)?;
        let word_count = h(60)?;
        if destination_count == 0 || destination_count > MAX_DESTINATIONS {
            return Err(corrupt("destination count is 0 or above 65,536"));
        }
        if words_per_row != destination_count.div_ceil(64) {
            return Err(corrupt(
                "words per row disagrees with the destination count",
            ));
        }
        if attribute_count > MAX_ATTRIBUTES {
            return Err(corrupt("more than 256 attributes"));
        }
        let mut rest = data.get(HEADER_LEN..).unwrap_or(&[]);
        let attributes = take(
            &mut rest,
            sized(attribute_count, ATTR_REC, "attribute count")?,
            "attribute records run past the end",
        )?;
        let values = take(
            &mut rest,
            sized(value_count, VALUE_REC, "value count")?,
            "value records run past the end",
        )?;
        let destinations = take(
            &mut rest,
            sized(destination_count, DEST_REC, "destination count")?,
            "destination records run past the end",
        )?;
        let factors = take(
            &mut rest,
            sized(factor_count, FACTOR_REC, "factor count")?,
            "factor records run past the end",
        )?;
        let keys = take(
            &mut rest,
            sized(key_count, KEY_REC, "key count")?,
            "key records run past the end",
        )?;
        let used = data.len() - rest.len();
        let pad = (8 - used % 8) % 8;
        let padding = take(&mut rest, pad, "padding runs past the end")?;
        if padding.iter().any(|&b| b != 0) {
            return Err(corrupt("nonzero padding before the row words"));
        }
        let words = take(
            &mut rest,
            sized(word_count, 8, "word count")?,
            "row words run past the end",
        )?;
        let strings = take(
            &mut rest,
            string_bytes as usize,
            "string pool runs past the end",
        )?;
        if !rest.is_empty() {
            return Err(corrupt("bytes after the string pool"));
        }
        let t = Tables {
            destination_count: destination_count as usize,
            words_per_row: words_per_row as usize,
            attribute_count: attribute_count as usize,
            factor_count: factor_count as usize,
            attributes,
            values,
            destinations,
            factors,
            keys,
            words,
            strings,
        };
        t.validate(
            value_count as usize,
            key_count as usize,
            word_count as usize,
        )?;
        Ok(t)
    }

    /// Checks every record so that lookups afterwards stay in bounds.
    fn validate(
        &self,
        value_count: usize,
        key_count: usize,
        word_count: usize,
    ) -> Result<(), LoadError> {
        // Attributes: names are unique UTF-8; value ranges tile the value
        // records in order; values are UTF-8 and strictly increasing.
        let mut next_value = 0usize;
        for a in 0..self.attribute_count {
            let name = self
                .string(self.attributes, ATTR_REC, a, 0)
                .ok_or(corrupt("attribute name out of bounds or not UTF-8"))?;
            for b in 0..a {
                if self.string(self.attributes, ATTR_REC, b, 0) == Some(name) {
                    return Err(corrupt("duplicate attribute name"));
                }
            }
            let first =
                field(self.attributes, ATTR_REC, a, 2).ok_or(corrupt("attribute record"))? as usize;
            let count =
                field(self.attributes, ATTR_REC, a, 3).ok_or(corrupt("attribute record"))? as usize;
            if first != next_value || count >= u32::MAX as usize {
                return Err(corrupt(
                    "attribute value ranges do not tile the value records",
                ));
            }
            next_value = first
                .checked_add(count)
                .ok_or(corrupt("value range overflows"))?;
            if next_value > value_count {
                return Err(corrupt("attribute value range runs past the value records"));
            }
            let mut prev: Option<&str> = None;
            for v in first..next_value {
                let s = self
                    .string(self.values, VALUE_REC, v, 0)
                    .ok_or(corrupt("value string out of bounds or not UTF-8"))?;
                if prev.is_some_and(|p| p.as_bytes() >= s.as_bytes()) {
                    return Err(corrupt("attribute values are not strictly increasing"));
                }
                prev = Some(s);
            }
        }
        if next_value != value_count {
            return Err(corrupt("value records not owned by any attribute"));
        }
        for d in 0..self.destination_count {
            if self.string(self.destinations, DEST_REC, d, 0).is_none()
                || self.string(self.destinations, DEST_REC, d, 2).is_none()
            {
                return Err(corrupt("destination name out of bounds or not UTF-8"));
            }
        }
        // Factors: keys tile the key records; each key names a distinct
        // attribute; strides are the mixed-radix strides of the value
        // counts; rows tile the words.
        let mut next_key = 0usize;
        let mut next_word = 0usize;
        let mut seen_forbid = false;
        for f in 0..self.factor_count {
            let rec = |i| field(self.factors, FACTOR_REC, f, i).ok_or(corrupt("factor record"));
            let kind = rec(0)?;
            let first_key = rec(1)? as usize;
            let nkeys = rec(2)? as usize;
            let rows = rec(3)? as u64;
            let first_word = rec(4)? as usize;
            if kind > 1 || rec(5)? != 0 {
                return Err(corrupt("factor kind is neither permit nor forbid"));
            }
            if kind == 0 && seen_forbid {
                return Err(corrupt("a permit factor follows a forbid factor"));
            }
            seen_forbid |= kind == 1;
            if first_key != next_key {
                return Err(corrupt("factor key ranges do not tile the key records"));
            }
            next_key = first_key
                .checked_add(nkeys)
                .ok_or(corrupt("key range overflows"))?;
            if next_key > key_count {
                return Err(corrupt("factor key range runs past the key records"));
            }
            let mut expected_stride: u64 = 1;
            for k in (first_key..next_key).rev() {
                let attr = field(self.keys, KEY_REC, k, 0).ok_or(corrupt("key record"))? as usize;
                let stride = field(self.keys, KEY_REC, k, 1).ok_or(corrupt("key record"))? as u64;
                if attr >= self.attribute_count {
                    return Err(corrupt("factor key names a missing attribute"));
                }
                for j in first_key..k {
                    if field(self.keys, KEY_REC, j, 0) == Some(attr as u32) {
                        return Err(corrupt("factor keys repeat an attribute"));
                    }
                }
                if stride != expected_stride {
                    return Err(corrupt("factor key stride is inconsistent"));
                }
                let n = self.value_count(attr as u32) as u64 + 1;
                if field(self.keys, KEY_REC, k, 2).map(u64::from) != Some(n) {
                    return Err(corrupt("factor key radix disagrees with the value count"));
                }
                expected_stride = expected_stride
                    .checked_mul(n)
                    .filter(|&r| r <= MAX_FACTOR_ROWS)
                    .ok_or(corrupt("factor has too many rows"))?;
            }
            if rows != expected_stride {
                return Err(corrupt("factor row count disagrees with its keys"));
            }
            if first_word != next_word {
                return Err(corrupt("factor rows do not tile the row words"));
            }
            let nwords = (rows as usize)
                .checked_mul(self.words_per_row)
                .ok_or(corrupt("factor rows overflow"))?;
            next_word = first_word
                .checked_add(nwords)
                .ok_or(corrupt("factor rows overflow"))?;
            if next_word > word_count {
                return Err(corrupt("factor rows run past the row words"));
            }
        }
        if next_key != key_count {
            return Err(corrupt("key records not owned by any factor"));
        }
        if next_word != word_count {
            return Err(corrupt("row words not owned by any factor"));
        }
        Ok(())
    }

    /// The string at fields `i`, `i + 1` (offset, length) of a record.
    fn string(&self, section: &[u8], size: usize, rec: usize, i: usize) -> Option<&'a str> {
        core::str::from_utf8(self.bytes(section, size, rec, i)?).ok()
    }

    /// The bytes of a string field, without the UTF-8 check.
    fn bytes(&self, section: &[u8], size: usize, rec: usize, i: usize) -> Option<&'a [u8]> {
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
            kind: if rec(0)? == 0 {
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
        let (forbid, first_key, nkeys, first_word) = (r(0) == 1, r(1), r(2), r(4));
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

/// One factor to be written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FactorSpec {
    /// Permit or forbid.
    pub kind: FactorKind,
    /// Attribute indices the factor is keyed by, distinct, most significant
    /// first.
    pub attributes: Vec<u32>,
    /// Row words, row-major: `row_count * words()` words, where rows are
    /// numbered by the mixed-radix strides described in the module docs.
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
/// [`Tables::load`]; the same spec always gives the same bytes.
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
                FactorKind::Permit => 0,
                FactorKind::Forbid => 1,
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
    use alloc::format;
    use alloc::string::ToString;
    use alloc::vec;

    /// Two attributes (data_class: 2 values, tenant: 1 value), three
    /// destinations. Permit keyed by data_class; forbid keyed by tenant.
    fn spec() -> TableSpec {
        TableSpec {
            destinations: (0..3)
                .map(|i| DestinationSpec {
                    name: format!("d{i}"),
                    cluster: format!("c{i}"),
                })
                .collect(),
            attributes: vec![
                AttributeSpec {
                    name: "data_class".into(),
                    values: vec!["personal".into(), "public".into()],
                },
                AttributeSpec {
                    name: "tenant".into(),
                    values: vec!["acme".into()],
                },
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
    fn every_truncation_is_rejected() {
        let bytes = encode(&spec()).unwrap();
        for n in 0..bytes.len() {
            assert!(
                Tables::load(&bytes[..n]).is_err(),
                "prefix of {n} bytes loaded"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(
            Tables::load(&longer),
            Err(LoadError::LengthMismatch { .. })
        ));
    }

    #[test]
    fn every_bit_flip_is_rejected() {
        let bytes = encode(&spec()).unwrap();
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[i] ^= 1 << bit;
                assert!(
                    Tables::load(&b).is_err(),
                    "flip of bit {bit} of byte {i} loaded"
                );
            }
        }
    }

    #[test]
    fn structural_corruption_is_rejected_even_with_a_valid_checksum() {
        let bytes = encode(&spec()).unwrap();
        // Header fields 32..64, then the first records: bump each u32 in
        // turn and reseal; every edit must be caught or stay harmless.
        for off in (32..bytes.len() - 8).step_by(4) {
            for delta in [1u32, 0x100, 0x8000_0000] {
                let mut b = bytes.clone();
                let v = u32::from_le_bytes(b[off..off + 4].try_into().unwrap());
                b[off..off + 4].copy_from_slice(&v.wrapping_add(delta).to_le_bytes());
                reseal(&mut b);
                if let Ok(t) = Tables::load(&b) {
                    // Loaded (e.g. a row word changed): lookups stay total.
                    let mut out = vec![0u64; t.words()];
                    let idx = vec![1u32; t.attribute_count()];
                    t.feasible(&idx, &mut out).unwrap();
                }
            }
        }
    }

    #[test]
    fn a_permit_after_a_forbid_is_rejected() {
        let mut b = encode(&spec()).unwrap();
        // Factor records follow the header, 2 attribute records, 3 value
        // records and 3 destination records; swap the two kinds.
        let factors = 64 + 2 * ATTR_REC + 3 * VALUE_REC + 3 * DEST_REC;
        b[factors] = 1;
        b[factors + FACTOR_REC] = 0;
        reseal(&mut b);
        assert_eq!(
            Tables::load(&b).unwrap_err(),
            LoadError::Corrupt {
                what: "a permit factor follows a forbid factor"
            }
        );
    }

    #[test]
    fn wrong_version_and_magic_are_named() {
        let mut b = encode(&spec()).unwrap();
        b[8] = 2;
        reseal(&mut b);
        let e = Tables::load(&b).unwrap_err();
        assert_eq!(e, LoadError::UnsupportedVersion { found: 2 });
        assert!(e.to_string().contains("version 2"));
        b[0] = b'X';
        assert_eq!(Tables::load(&b).unwrap_err(), LoadError::BadMagic);
        assert!(matches!(
            Tables::load(&[]),
            Err(LoadError::TooShort { len: 0 })
        ));
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

    #[test]
    fn no_attributes_no_factors() {
        let s = TableSpec {
            destinations: vec![DestinationSpec {
                name: "a".into(),
                cluster: "b".into(),
            }],
            attributes: vec![],
            factors: vec![],
        };
        let bytes = encode(&s).unwrap();
        let t = Tables::load(&bytes).unwrap();
        assert_eq!(lookup(&t, &[]), 0);
    }
}
