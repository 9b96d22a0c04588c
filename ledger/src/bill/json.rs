//! Reading the providers' JSON answers: pages of time buckets, each with
//! its results, as OpenAI's and Anthropic's usage and cost APIs both
//! answer. A result that cannot be read is refused whole, named by its
//! place (`data[0].results[2]`) and the first field that is wrong.

use super::{BadRow, Keys, Parsed};
use serde_json::{Map, Value};

/// One result of an answer, with where it is and the day of its bucket.
pub(crate) struct Result<'a> {
    /// The file.
    pub source: &'a str,
    /// Its 1-based ordinal in the answer.
    pub ordinal: i64,
    /// `data[i].results[j]`.
    pub path: String,
    /// The UTC day its bucket starts.
    pub day: String,
    /// Its bucket's start as the answer writes it.
    pub start: String,
    /// The result object.
    pub fields: &'a Map<String, Value>,
}

/// How a bucket says when it starts.
#[derive(Clone, Copy)]
pub(crate) enum Start {
    /// `start_time`, Unix seconds (OpenAI).
    UnixSeconds,
    /// `starting_at`, RFC 3339 (Anthropic).
    Rfc3339,
}

impl Start {
    /// The bucket's field that says when it starts.
    fn field(self) -> &'static str {
        match self {
            Start::UnixSeconds => "start_time",
            Start::Rfc3339 => "starting_at",
        }
    }

    /// What that field holds, in words.
    fn what(self) -> &'static str {
        match self {
            Start::UnixSeconds => "Unix seconds",
            Start::Rfc3339 => "an RFC 3339 time in UTC",
        }
    }

    /// The UTC day the field's value `v` falls on.
    fn day(self, v: &Value) -> Option<String> {
        match self {
            Start::UnixSeconds => v.as_i64().map(super::day_of_secs),
            Start::Rfc3339 => v.as_str().and_then(super::utc_day),
        }
    }
}

/// Every result of the answer in `bytes`, bucket by bucket, calling
/// `read` on each; what it refuses (and every bucket or result that is
/// not an object with what the answer documents) goes to `bad`.
pub(crate) fn each(
    source: &str,
    bytes: &[u8],
    start: Start,
    mut read: impl FnMut(&Result<'_>, &mut Keys) -> std::result::Result<super::BillLine, BadRow>,
) -> anyhow::Result<Parsed> {
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| anyhow::anyhow!("{source}: not valid JSON: {e}"))?;
    let refuse = |line: i64, field: String, error: String| BadRow {
        source: source.to_string(),
        line,
        field,
        error,
    };
    let mut out = Parsed::default();
    let Some(data) = v.get("data").and_then(Value::as_array) else {
        out.bad.push(refuse(
            0,
            "data".into(),
            "missing or not an array; a usage or cost answer is a page whose `data` lists time \
             buckets"
                .into(),
        ));
        return Ok(out);
    };
    if v.get("has_more").and_then(Value::as_bool) == Some(true) {
        out.bad.push(refuse(
            0,
            "has_more".into(),
            "true: this page is not the whole answer; fetch the next pages (`next_page`) and \
             import each, or the bill is incomplete"
                .into(),
        ));
    }
    let mut keys = Keys::default();
    let mut ordinal = 0i64;
    for (i, bucket) in data.iter().enumerate() {
        let field = start.field();
        let at = bucket.get(field);
        let day = at.and_then(|v| start.day(v));
        let start_text = at.map(Value::to_string).unwrap_or_default();
        let results = bucket.get("results").and_then(Value::as_array);
        let (Some(day), Some(results)) = (day, results) else {
            ordinal += 1;
            out.bad.push(refuse(
                ordinal,
                format!("data[{i}]"),
                format!(
                    "a bucket needs `{field}` ({}) and `results` (an array); its results are not \
                     imported",
                    start.what()
                ),
            ));
            continue;
        };
        for (j, r) in results.iter().enumerate() {
            ordinal += 1;
            let path = format!("data[{i}].results[{j}]");
            let Some(fields) = r.as_object() else {
                out.bad
                    .push(refuse(ordinal, path, "a result is an object".into()));
                continue;
            };
            let res = Result {
                source,
                ordinal,
                path,
                day: day.clone(),
                start: start_text.clone(),
                fields,
            };
            match read(&res, &mut keys) {
                Ok(mut line) => {
                    line.line = ordinal;
                    line.day = res.day.clone();
                    out.lines.push(line);
                }
                Err(b) => out.bad.push(b),
            }
        }
    }
    Ok(out)
}

impl Result<'_> {
    /// A refusal of field `field` (a path under the result).
    pub fn bad(&self, field: &str, error: impl Into<String>) -> BadRow {
        BadRow {
            source: self.source.to_string(),
            line: self.ordinal,
            field: format!("{}.{field}", self.path),
            error: error.into(),
        }
    }

    /// The value at `path` (dot-separated), if present and not null.
    pub fn get(&self, path: &str) -> Option<&Value> {
        let mut parts = path.split('.');
        let mut v = self.fields.get(parts.next()?)?;
        for p in parts {
            v = v.get(p)?;
        }
        (!v.is_null()).then_some(v)
    }

    /// A token or request count at `path`: a whole number ≥ 0 (absent or
    /// null: `None`).
    pub fn count(&self, path: &str) -> std::result::Result<Option<i64>, BadRow> {
        match self.get(path) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| i64::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| {
                    self.bad(
                        path,
                        format!("{v} is not a count; a whole number >= 0 is accepted"),
                    )
                }),
        }
    }

    /// A count at `path` the format requires.
    pub fn need_count(&self, path: &str) -> std::result::Result<i64, BadRow> {
        self.count(path)?
            .ok_or_else(|| self.bad(path, "missing; the format requires a count here"))
    }

    /// Text at `path` (absent or null: `None`).
    pub fn text(&self, path: &str) -> std::result::Result<Option<String>, BadRow> {
        match self.get(path) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(self.bad(
                path,
                format!("{v} is not text; a string or null is accepted"),
            )),
        }
    }

    /// What identifies the result within its bucket: every field that is
    /// not a figure (text, booleans, nulls: its grouping fields), and its
    /// bucket's start, as canonical JSON.
    pub fn identity(&self, figures: &[&str]) -> String {
        let mut id: std::collections::BTreeMap<&str, &Value> = std::collections::BTreeMap::new();
        for (k, v) in self.fields {
            if !figures.contains(&k.as_str()) && !v.is_number() && !v.is_object() {
                id.insert(k, v);
            }
        }
        format!(
            "{}|{}",
            self.start,
            serde_json::to_string(&id).unwrap_or_default()
        )
    }
}
