//! The same, but with a valid magic, version, length and checksum written
//! over the input first, so that the fuzzer spends its time on the
//! structural checks behind the checksum (counts, offsets, strides,
//! strings) instead of on the checksum itself.
#![no_main]
#![forbid(unsafe_code)]

use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    let mut bytes = data.to_vec();
    if bytes.len() >= 64 {
        bytes[..8].copy_from_slice(&ace_core::tables::MAGIC);
        bytes[8..12].copy_from_slice(&ace_core::tables::VERSION.to_le_bytes());
        bytes[12..16].copy_from_slice(&64u32.to_le_bytes());
        ace_core::tables::reseal(&mut bytes);
    }
    common::exercise(&bytes);
});
