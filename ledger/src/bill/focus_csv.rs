//! A cloud's cost and usage export in FOCUS form (CSV): Azure Cost
//! Management's FOCUS export (Microsoft Learn, "FOCUS cost and usage
//! details file schema", versions 1.0 to 1.2-preview) and AWS Data
//! Exports' CUR 2.0 FOCUS view, by the columns the FOCUS specification
//! defines (focus.finops.org).
//!
//! Columns read (by name, in any order; others are ignored):
//!
//! | column | use |
//! | --- | --- |
//! | `ChargePeriodStart` | the UTC day |
//! | `BilledCost`, `BillingCurrency` | the cost, in USD (else `x_BilledCostInUsd`, Azure's) |
//! | `ProviderName` (1.0-1.2) or `ServiceProviderName` (1.3) | the provider: Microsoft is `azure`, Amazon Web Services `aws` |
//! | `ConsumedQuantity`, `ConsumedUnit` | tokens, when the unit counts tokens (`Tokens`, `1K Tokens`, `1M Tokens`) |
//! | `SkuMeter` (else `x_SkuMeterName`, `x_UsageType`) | the model and kind of token of a token row: the meter's words up to the one naming the kind (`input`/`inp`/`prompt`, `output`/`outp`/`completion`, `cached`, `cache write`), e.g. `gpt-4o-mini-0718-Inp-glbl` is model `gpt-4o-mini-0718`, input; a `batch` word makes its tier `batch` |
//! | `PricingCategory` | the tier (`Standard`, `Committed`, `Dynamic`, `Other`) |
//! | `SubAccountId` | the scope (an Azure subscription, an AWS account) |
//! | `ResourceId`, `ChargeDescription` | the resource charged (a GPU VM is a capacity line) and the record's words |
//!
//! A row's identity is its charge period, resource, SKU, meter,
//! sub-account, charge category and class, pricing category, commitment
//! and tags. A row whose cost, currency, period or token count cannot be
//! read is refused, naming its line and column.

use super::{BadRow, BillLine, Figures, Format, Keys, Parsed, TokenKind};

/// Columns that identify a row (not its figures).
const IDENTITY: [&str; 16] = [
    "ChargePeriodStart",
    "ChargePeriodEnd",
    "ResourceId",
    "SkuId",
    "SkuPriceId",
    "SkuMeter",
    "x_SkuMeterName",
    "x_UsageType",
    "SubAccountId",
    "ChargeCategory",
    "ChargeClass",
    "PricingCategory",
    "CommitmentDiscountId",
    "ConsumedUnit",
    "ChargeDescription",
    "Tags",
];

/// Read a FOCUS CSV.
pub fn parse(source: &str, bytes: &[u8]) -> anyhow::Result<Parsed> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| anyhow::anyhow!("{source}: a FOCUS CSV is UTF-8: {e}"))?;
    let text = text.trim_start_matches('\u{feff}');
    let records = records(text).map_err(|(line, e)| anyhow::anyhow!("{source}:{line}: {e}"))?;
    let mut records = records.into_iter();
    let Some((_, header)) = records.next() else {
        anyhow::bail!("{source}: empty; a FOCUS CSV starts with its header");
    };
    let col = |name: &str| header.iter().position(|h| h.trim() == name);
    for need in ["ChargePeriodStart", "BilledCost", "BillingCurrency"] {
        if col(need).is_none() {
            anyhow::bail!(
                "{source}:1: no `{need}` column; a FOCUS export has ChargePeriodStart, \
                 BilledCost and BillingCurrency"
            );
        }
    }
    let identity: Vec<usize> = IDENTITY.iter().filter_map(|c| col(c)).collect();
    let mut keys = Keys::default();
    let mut out = Parsed::default();
    for (line, cells) in records {
        if cells.iter().all(|c| c.trim().is_empty()) {
            continue;
        }
        let row = Row {
            source,
            line,
            header: &header,
            cells: &cells,
        };
        let id: Vec<&str> = identity
            .iter()
            .map(|i| cells.get(*i).map_or("", String::as_str))
            .collect();
        let id = serde_json::to_string(&id).unwrap_or_default();
        match read(&row) {
            Ok(mut l) => {
                l.key = keys.key(Format::FocusCsv, &id);
                l.line = line;
                out.lines.push(l);
            }
            Err(b) => out.bad.push(b),
        }
    }
    Ok(out)
}

/// One CSV record with its header.
struct Row<'a> {
    source: &'a str,
    line: i64,
    header: &'a [String],
    cells: &'a [String],
}

impl Row<'_> {
    /// The cell of column `name`, trimmed; `None` when the column is
    /// absent or the cell empty.
    fn get(&self, name: &str) -> Option<&str> {
        let i = self.header.iter().position(|h| h.trim() == name)?;
        let c = self.cells.get(i)?.trim();
        (!c.is_empty()).then_some(c)
    }

    fn bad(&self, column: &str, error: impl Into<String>) -> BadRow {
        BadRow {
            source: self.source.to_string(),
            line: self.line,
            field: column.to_string(),
            error: error.into(),
        }
    }
}

fn read(r: &Row<'_>) -> Result<BillLine, BadRow> {
    if r.cells.len() != r.header.len() {
        return Err(r.bad(
            "(row)",
            format!(
                "{} cells under a header of {} columns; every row has one cell per column",
                r.cells.len(),
                r.header.len()
            ),
        ));
    }
    let start = r.get("ChargePeriodStart").unwrap_or("");
    let day = super::utc_day(start).ok_or_else(|| {
        r.bad(
            "ChargePeriodStart",
            format!("{start:?}: an ISO 8601 date-time in UTC (2024-01-01T00:00:00Z) is accepted"),
        )
    })?;
    let currency = r.get("BillingCurrency").unwrap_or("");
    let (column, amount) = if currency == "USD" {
        ("BilledCost", r.get("BilledCost"))
    } else if r.get("x_BilledCostInUsd").is_some() {
        ("x_BilledCostInUsd", r.get("x_BilledCostInUsd"))
    } else {
        return Err(r.bad(
            "BillingCurrency",
            format!(
                "{currency:?}: the ledger books USD only; USD is accepted (or an \
                 x_BilledCostInUsd column)"
            ),
        ));
    };
    let amount = amount.unwrap_or("");
    let cost = super::nano(amount).ok_or_else(|| {
        r.bad(
            column,
            format!("{amount:?} is not an amount; a decimal is accepted"),
        )
    })?;
    let provider = r
        .get("ServiceProviderName")
        .or(r.get("ProviderName"))
        .map(provider)
        .ok_or_else(|| {
            r.bad(
                "ProviderName",
                "empty; ProviderName (FOCUS 1.0-1.2) or ServiceProviderName (1.3) names who charged",
            )
        })?;
    let meter = r
        .get("SkuMeter")
        .or(r.get("x_SkuMeterName"))
        .or(r.get("x_UsageType"));
    let unit = r.get("ConsumedUnit").unwrap_or("");
    let mut line = BillLine {
        provider,
        day,
        scope: r.get("SubAccountId").map(str::to_string),
        tier: r.get("PricingCategory").map(str::to_string),
        resource: r.get("ResourceId").map(str::to_string),
        description: meter.or(r.get("ChargeDescription")).map(str::to_string),
        figures: Figures::of_cost(cost),
        ..BillLine::default()
    };
    if unit.to_ascii_lowercase().contains("token") {
        let shift = token_shift(unit);
        let q = r.get("ConsumedQuantity").unwrap_or("");
        let tokens = super::scaled(q, shift).filter(|n| *n >= 0).ok_or_else(|| {
            r.bad(
                "ConsumedQuantity",
                format!("{q:?} is not a quantity of {unit} >= 0; a decimal is accepted"),
            )
        })?;
        let m = meter.unwrap_or("");
        let (model, kind, batch) = meter_parts(m).ok_or_else(|| {
            r.bad(
                "SkuMeter",
                format!(
                    "{m:?} names no kind of token; a token meter names its model then input, \
                     output, cached or cache write"
                ),
            )
        })?;
        line.model = Some(model);
        line.kind = Some(kind);
        line.quantity = Some(tokens);
        if batch {
            line.tier = Some("batch".into());
        }
    }
    Ok(line)
}

/// The provider's name in the ledger, from a FOCUS provider name.
fn provider(name: &str) -> String {
    let l = name.to_ascii_lowercase();
    if l.contains("microsoft") || l.contains("azure") {
        "azure".into()
    } else if l.contains("amazon") || l == "aws" {
        "aws".into()
    } else if l.contains("google") {
        "gcp".into()
    } else {
        l
    }
}

/// The power of ten a token unit counts in (`1K Tokens` 3, `1M Tokens` 6).
fn token_shift(unit: &str) -> i32 {
    let u = unit.to_ascii_lowercase();
    if u.contains("1m") || u.contains("million") {
        6
    } else if u.contains("1k") || u.contains("1000") || u.contains("thousand") {
        3
    } else {
        0
    }
}

/// A token meter's model, kind of token, and whether it is a batch meter.
fn meter_parts(meter: &str) -> Option<(String, TokenKind, bool)> {
    let words: Vec<&str> = meter
        .split([' ', '-', '_', ','])
        .filter(|w| !w.is_empty())
        .collect();
    let kind_at = |i: usize| -> Option<TokenKind> {
        let w = words.get(i)?.to_ascii_lowercase();
        let next = words.get(i + 1).map(|n| n.to_ascii_lowercase());
        match w.as_str() {
            "cached" | "cache" if next.as_deref() == Some("write") => Some(TokenKind::CacheWrite),
            "cached" | "cache" | "cachedinp" => Some(TokenKind::Cached),
            "input" | "inp" | "prompt" => Some(TokenKind::Input),
            "output" | "outp" | "out" | "completion" => Some(TokenKind::Output),
            _ => None,
        }
    };
    let i = (0..words.len()).find(|i| kind_at(*i).is_some())?;
    let kind = kind_at(i)?;
    let model = words.get(..i)?.join("-");
    if model.is_empty() {
        return None;
    }
    let batch = words.iter().any(|w| w.eq_ignore_ascii_case("batch"));
    Some((model, kind, batch))
}

/// The records of `text` (RFC 4180: quoted cells, `""` inside quotes,
/// line breaks inside quotes), each with the line it starts on; or the
/// line where a quote is left open.
/// A CSV record: the line it starts on, and its cells.
type Record = (i64, Vec<String>);

fn records(text: &str) -> Result<Vec<Record>, (i64, String)> {
    let mut out = Vec::new();
    let mut cells = Vec::new();
    let mut cell = String::new();
    let mut quoted = false;
    let mut line = 1i64;
    let mut start = 1i64;
    let mut chars = text.chars().peekable();
    let mut any = false;
    while let Some(c) = chars.next() {
        any = true;
        if quoted {
            match c {
                '"' if chars.peek() == Some(&'"') => {
                    chars.next();
                    cell.push('"');
                }
                '"' => quoted = false,
                '\n' => {
                    line += 1;
                    cell.push(c);
                }
                _ => cell.push(c),
            }
            continue;
        }
        match c {
            '"' if cell.is_empty() => quoted = true,
            ',' => cells.push(std::mem::take(&mut cell)),
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' => {
                cells.push(std::mem::take(&mut cell));
                out.push((start, std::mem::take(&mut cells)));
                line += 1;
                start = line;
                any = false;
            }
            _ => cell.push(c),
        }
    }
    if quoted {
        return Err((start, "a quoted cell is never closed".into()));
    }
    if any {
        cells.push(cell);
        out.push((start, cells));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meters_name_model_and_kind() {
        let p = meter_parts;
        assert_eq!(
            p("gpt-4o-mini-0718-Inp-glbl"),
            Some(("gpt-4o-mini-0718".into(), TokenKind::Input, false))
        );
        assert_eq!(
            p("gpt-4o Output Tokens Batch"),
            Some(("gpt-4o".into(), TokenKind::Output, true))
        );
        assert_eq!(
            p("gpt-4o cached Input Tokens"),
            Some(("gpt-4o".into(), TokenKind::Cached, false))
        );
        assert_eq!(p("NC24ads A100 v4"), None);
        assert_eq!(p("Input tokens"), None, "no model before the kind");
    }

    #[test]
    fn csv_cells_quote_as_rfc4180() {
        let r = records("a,b\r\n\"x,\"\"y\"\"\",\"two\nlines\"\n3,4").expect("csv");
        assert_eq!(r[1], (2, vec!["x,\"y\"".to_string(), "two\nlines".into()]));
        assert_eq!(r[2], (4, vec!["3".to_string(), "4".into()]));
        assert!(records("a\n\"open").is_err());
    }
}
