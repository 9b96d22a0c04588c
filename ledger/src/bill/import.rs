//! A bill file into the ledger's store ([`file()`]): parsed whole, its
//! lines kept by their keys (again: nothing new), its bad rows kept and
//! named. Apart from the parsers, which know no store.

use super::{detect, parse, Format, Parsed, Stored, Summary};
use crate::store::Store;

/// Import `bytes` (the file `source`) into `store`: `format`, or the one
/// [`detect`] finds.
pub fn file(
    store: &mut dyn Store,
    source: &str,
    bytes: &[u8],
    format: Option<Format>,
) -> anyhow::Result<Summary> {
    let format = match format {
        Some(f) => f,
        None => detect(source, bytes)?,
    };
    let Parsed { lines, bad } = parse(format, source, bytes)?;
    let mut s = Summary {
        source: source.to_string(),
        format: format.as_str().to_string(),
        lines: (lines.len() + bad.len()) as u64,
        ..Summary::default()
    };
    for outcome in store.put_bill_lines(&lines)? {
        match outcome {
            Stored::New => s.new += 1,
            Stored::Same => s.already += 1,
            Stored::Restated => s.restated += 1,
        }
    }
    store.put_bill_rejects(&bad)?;
    s.rejected = bad;
    Ok(s)
}
