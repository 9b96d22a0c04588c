//! The token estimate: one rule for every place that counts tokens it has
//! not been told (a prompt's size before its body is read, the part of a
//! prompt a destination holds).

/// Estimate tokens from a byte count (about four bytes per token).
pub fn estimate_tokens(bytes: usize) -> u32 {
    ((bytes / 4).max(1)).min(u32::MAX as usize) as u32
}
