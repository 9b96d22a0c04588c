//! The Prometheus text exposition format (0.0.4, and the sample lines
//! OpenMetrics shares with it), read into samples.
//!
//! Why our own reader: the parser the issue suggested, `prometheus-parse`
//! 0.2.5 (the newest on crates.io), matches metric names with `\w+`, so it
//! silently drops every name with a colon, which is every vLLM metric
//! (`vllm:num_requests_running`) and SGLang's `sglang:` ones; it also
//! splits label values on commas, and `vllm:lora_requests_info` carries
//! comma-separated adapter lists. The maintained alternative,
//! `openmetrics-parser`, is LGPL-3.0, awkward in a statically linked
//! Apache-2.0 binary. The format is small: a line is a comment (`#`), or
//! `name{label="value",...} value [timestamp]` with `\\`, `\"` and `\n`
//! escapes in label values. Like Prometheus, one malformed line fails the
//! whole scrape, naming the line.
//!
//! OpenMetrics adds three things a reader must pass over rather than
//! fail on: an exemplar after a sample (`... 3 # {trace_id="a"} 0.5
//! 1.7e9`, on any histogram bucket or counter, which engines attach from
//! their tracing), `# UNIT` lines, and the closing `# EOF`.
//!
//! The `# TYPE` lines matter too: a family declared with no samples is a
//! labelled metric no series of which has been set yet. `prometheus_client`
//! (vLLM, SGLang, trtllm-serve) writes exactly that for a labelled gauge
//! before its first `labels(...).set()`, which is how a freshly started
//! `trtllm-serve` shows its load gauges. [`Page::declares`] tells a reader
//! so, and it can read the family as empty instead of missing.

/// One sample: a metric name, its labels and its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The metric name, e.g. `vllm:num_requests_running`.
    pub name: String,
    /// Its labels, in the order written.
    pub labels: Vec<(String, String)>,
    /// Its value (may be NaN or infinite: the format allows them).
    pub value: f64,
}

impl Sample {
    /// The value of label `name`, if the sample has it.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A scrape's page: its samples (those kept) and the families its
/// `# TYPE` lines declare.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Page {
    /// The samples kept, in the order written.
    pub samples: Vec<Sample>,
    /// The family names declared by `# TYPE` lines.
    pub declared: Vec<String>,
    /// Every sample name on the page, kept or not, once each.
    pub names: std::collections::BTreeSet<String>,
}

impl Page {
    /// Whether a `# TYPE` line declares family `name`.
    pub fn declares(&self, name: &str) -> bool {
        self.declared.iter().any(|d| d == name)
    }

    /// Whether any sample is named `name`.
    pub fn has(&self, name: &str) -> bool {
        self.names.contains(name)
    }
}

/// Every sample in `text`, or the first malformed line (1-based) and why.
pub fn parse(text: &str) -> Result<Page, String> {
    parse_keeping(text, |_| true)
}

/// [`parse`], keeping only the samples whose name `keep` accepts: every
/// line is still checked, but a page of many series costs memory for the
/// few a reader uses (an engine's page is mostly histogram buckets), not
/// a multiple of its size.
pub fn parse_keeping(text: &str, keep: impl Fn(&str) -> bool) -> Result<Page, String> {
    let mut page = Page::default();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut words = comment.split_whitespace();
            match words.next() {
                // OpenMetrics: nothing after `# EOF` is part of the page.
                Some("EOF") => break,
                Some("TYPE") => {
                    if let Some(name) = words.next() {
                        page.declared.push(name.to_string());
                    }
                }
                _ => {}
            }
            continue;
        }
        let s = sample(line).map_err(|e| format!("metrics line {}: {e}", i + 1))?;
        if !page.names.contains(&s.name) {
            page.names.insert(s.name.clone());
        }
        if keep(&s.name) {
            page.samples.push(s);
        }
    }
    Ok(page)
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

fn sample(line: &str) -> Result<Sample, String> {
    let end = line
        .char_indices()
        .find(|&(_, c)| !is_name_char(c))
        .map_or(line.len(), |(i, _)| i);
    let name = &line[..end];
    if !name.starts_with(is_name_start) {
        return Err("expected a metric name".into());
    }
    let mut rest = &line[end..];
    let mut labels = Vec::new();
    if let Some(r) = rest.strip_prefix('{') {
        rest = read_labels(r, &mut labels)?;
    }
    // An OpenMetrics exemplar (`# {labels} value [timestamp]`) follows the
    // value and timestamp; no `#` can come earlier once the labels are read.
    if let Some(at) = rest.find('#') {
        if !rest[at + 1..].trim_start().starts_with('{') {
            return Err(format!("`{name}` has `#` after its value but no exemplar"));
        }
        rest = &rest[..at];
    }
    let mut parts = rest.split_whitespace();
    let value = parts
        .next()
        .ok_or_else(|| format!("`{name}` has no value"))?;
    let value =
        number(value).ok_or_else(|| format!("`{name}` has value `{value}`, not a number"))?;
    if let Some(ts) = parts.next() {
        if ts.parse::<i64>().is_err() && ts.parse::<f64>().is_err() {
            return Err(format!("`{name}` has timestamp `{ts}`, not a number"));
        }
    }
    if parts.next().is_some() {
        return Err(format!("`{name}` has text after its value and timestamp"));
    }
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Reads `label="value",...}` and returns what follows the `}`.
fn read_labels<'a>(mut s: &'a str, out: &mut Vec<(String, String)>) -> Result<&'a str, String> {
    loop {
        s = s.trim_start();
        if let Some(r) = s.strip_prefix('}') {
            return Ok(r);
        }
        let end = s
            .char_indices()
            .find(|&(_, c)| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(s.len(), |(i, _)| i);
        let key = &s[..end];
        if key.is_empty() {
            return Err("expected a label name or `}`".into());
        }
        s = s[end..].trim_start();
        s = s
            .strip_prefix('=')
            .ok_or_else(|| format!("label `{key}` has no `=`"))?
            .trim_start();
        s = s
            .strip_prefix('"')
            .ok_or_else(|| format!("label `{key}`'s value is not quoted"))?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let close = loop {
            match chars.next() {
                None => return Err(format!("label `{key}`'s value is not closed")),
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c @ ('\\' | '"'))) => value.push(c),
                    Some((_, c)) => {
                        value.push('\\');
                        value.push(c);
                    }
                    None => return Err(format!("label `{key}`'s value is not closed")),
                },
                Some((_, c)) => value.push(c),
            }
        };
        out.push((key.to_string(), value));
        s = s[close + 1..].trim_start();
        if let Some(r) = s.strip_prefix(',') {
            s = r;
        } else if !s.starts_with('}') {
            return Err(format!("expected `,` or `}}` after label `{key}`"));
        }
    }
}

/// A sample value: a float, or Go's `NaN`, `+Inf`, `-Inf`.
fn number(s: &str) -> Option<f64> {
    match s {
        "NaN" => Some(f64::NAN),
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ => s.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_colon_names_escapes_and_comma_values() {
        let text = "# HELP vllm:num_requests_running Running.\n\
            # TYPE vllm:num_requests_running gauge\n\
            vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\n\
            vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"a,b\",waiting_lora_adapters=\"\"} 1.7e+09\n\
            weird{v=\"q\\\"uote\\\\back\\nline\",} +Inf 1700000000000\n\
            bare 4\n";
        let s = parse(text).unwrap().samples;
        assert_eq!(s.len(), 4);
        assert_eq!(s[0].name, "vllm:num_requests_running");
        assert_eq!(s[0].label("model_name"), Some("m"));
        assert_eq!(s[0].value, 3.0);
        assert_eq!(s[1].label("running_lora_adapters"), Some("a,b"));
        assert_eq!(s[1].label("waiting_lora_adapters"), Some(""));
        assert_eq!(s[2].label("v"), Some("q\"uote\\back\nline"));
        assert!(s[2].value.is_infinite());
        assert_eq!(s[3].labels, vec![]);
    }

    #[test]
    fn openmetrics_exemplars_units_and_eof_are_passed_over() {
        let text = "# TYPE vllm:e2e_request_latency_seconds histogram\n\
            # UNIT vllm:e2e_request_latency_seconds seconds\n\
            vllm:e2e_request_latency_seconds_bucket{le=\"0.5\"} 3.0 # {trace_id=\"abc\"} 0.4 1.7e9\n\
            vllm:e2e_request_latency_seconds_count 3.0\n\
            # TYPE trtllm_num_requests_running gauge\n\
            # EOF\n\
            after 1\n";
        let p = parse(text).unwrap();
        assert_eq!(p.samples.len(), 2);
        assert_eq!(p.samples[0].value, 3.0);
        assert_eq!(p.samples[0].label("le"), Some("0.5"));
        assert!(p.declares("trtllm_num_requests_running"));
        assert!(!p.has("trtllm_num_requests_running"));
        assert!(!p.has("after"), "nothing after # EOF");
    }

    #[test]
    fn a_malformed_line_fails_the_scrape_naming_it() {
        for (text, want) in [
            ("ok 1\n9bad 1\n", "line 2"),
            ("x{a=\"1\" 2\n", "line 1"),
            ("x{a=1} 2\n", "not quoted"),
            ("x abc\n", "not a number"),
            ("x\n", "no value"),
            ("x 1 2 3\n", "after its value"),
            ("x 1 # 2\n", "no exemplar"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }
}
