//! The wire format: constants, record layout and the checksum, shared by
//! the writer ([`encode`](super::encode)) and the reader
//! ([`Tables::load`](super::Tables::load)) so that the two cannot disagree
//! on a size or an offset.
//!
//! # Version 1 (little-endian, no alignment required)
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
//! length; each attribute's values strictly increasing bytewise),
//! destination records (16 bytes: cluster offset and length, name offset
//! and length), factor records (24 bytes: kind 0 = permit / 1 = forbid,
//! first key, key count, row count, first word, reserved 0; permit factors
//! first), key records (12 bytes: attribute, stride, value count + 1), zero
//! padding to a multiple of 8, the row words (`u64` each), and the UTF-8
//! string pool. A factor's row for a request is
//! `sum(value_index[key.attribute] * key.stride)`; the last key has stride 1
//! and each earlier stride is the next one times the next attribute's value
//! count plus one.

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

pub(super) const HEADER_LEN: usize = 64;
/// Where the total length is stored (8 bytes).
pub(super) const LENGTH_AT: usize = 16;
/// Where the checksum is stored (8 bytes).
pub(super) const CHECKSUM_AT: usize = 24;
pub(super) const ATTR_REC: usize = 16;
pub(super) const VALUE_REC: usize = 8;
pub(super) const DEST_REC: usize = 16;
pub(super) const FACTOR_REC: usize = 24;
pub(super) const KEY_REC: usize = 12;

/// Whether a factor's rows grant or deny.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FactorKind {
    /// OR-ed into the feasible set.
    Permit,
    /// Removed from the feasible set.
    Forbid,
}

/// The factor record's kind field for a permit factor.
pub(super) const PERMIT: u32 = 0;
/// The factor record's kind field for a forbid factor.
pub(super) const FORBID: u32 = 1;

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
pub(super) fn checksum(data: &[u8]) -> u64 {
    let head = data.get(..CHECKSUM_AT).unwrap_or(&[]);
    let tail = data.get(CHECKSUM_AT + 8..).unwrap_or(&[]);
    fnv1a(&[head, tail])
}

/// Rewrites the total length and checksum fields of `bytes` to match its
/// contents, as [`encode`](super::encode) does. For tools and fuzzers that
/// edit a table on purpose (to test the structural checks behind the
/// checksum); a table damaged by accident must be recompiled, not
/// resealed. Does nothing to input shorter than the header.
pub fn reseal(bytes: &mut [u8]) {
    if bytes.len() < HEADER_LEN {
        return;
    }
    let total = (bytes.len() as u64).to_le_bytes();
    if let Some(slot) = bytes.get_mut(LENGTH_AT..LENGTH_AT + 8) {
        slot.copy_from_slice(&total);
    }
    let sum = checksum(bytes).to_le_bytes();
    if let Some(slot) = bytes.get_mut(CHECKSUM_AT..CHECKSUM_AT + 8) {
        slot.copy_from_slice(&sum);
    }
}

/// The little-endian `u32` at `off`, if in bounds.
pub(super) fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    let end = off.checked_add(4)?;
    let bytes: [u8; 4] = b.get(off..end)?.try_into().ok()?;
    Some(u32::from_le_bytes(bytes))
}

/// The little-endian `u64` at `off`, if in bounds.
pub(super) fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    let end = off.checked_add(8)?;
    let bytes: [u8; 8] = b.get(off..end)?.try_into().ok()?;
    Some(u64::from_le_bytes(bytes))
}

/// Field `i` (a `u32`) of record `rec` in a section of `size`-byte records.
pub(super) fn field(section: &[u8], size: usize, rec: usize, i: usize) -> Option<u32> {
    u32_at(section, rec.checked_mul(size)?.checked_add(i * 4)?)
}
