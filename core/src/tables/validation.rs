//! Loading: every check a table must pass before a lookup may trust it.
//!
//! [`Tables::load`] checks the header, the checksum and every offset,
//! count and stride once, at configuration time, so that the per-request
//! reader ([`lookup`](super::lookup)) can index without re-checking. It
//! never panics and never allocates; it borrows the input. The checksum
//! only catches damage: the structural checks behind it are what make
//! hostile bytes safe (the fuzz targets in `fuzz/` reseal their input to
//! reach them).

use super::format::{
    checksum, field, u32_at, u64_at, ATTR_REC, CHECKSUM_AT, DEST_REC, FACTOR_REC, FORBID,
    HEADER_LEN, KEY_REC, LENGTH_AT, MAGIC, MAX_ATTRIBUTES, MAX_DESTINATIONS, MAX_FACTOR_ROWS,
    PERMIT, VALUE_REC, VERSION,
};
use super::lookup::Tables;
use core::fmt;

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
        let declared = u64_at(data, LENGTH_AT).ok_or(LoadError::TooShort { len: data.len() })?;
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
            if !(kind == PERMIT || kind == FORBID) || rec(5)? != 0 {
                return Err(corrupt("factor kind is neither permit nor forbid"));
            }
            if kind == PERMIT && seen_forbid {
                return Err(corrupt("a permit factor follows a forbid factor"));
            }
            seen_forbid |= kind == FORBID;
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
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]
mod tests {
    use super::*;
    use crate::tables::{encode, reseal, spec};
    use alloc::string::ToString;
    use alloc::vec;

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
}
