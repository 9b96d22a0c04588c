//! Request attributes: from header values (and the body's `model`) to the
//! value indices that the policy tables are keyed by.
//!
//! A pure function, so it can be fuzzed and tested without a host. Values
//! are trimmed; a value the tables do not know maps to the unknown index,
//! which no permit row matches (fail closed). A missing value is refused or
//! replaced by the configured default, per `on_missing_attribute`. A header
//! sent twice with different values is refused: which one counts would be
//! a guess, and Envoy and the upstream may each pick another. An attribute
//! with a verified source (`attribute_sources`) takes its value from there
//! and never from a header.

use crate::headers::Pairs;
use ace_config::{AttributeSource, OnMissing, Policy, Trusted};
use ace_core::tables::Tables;

/// Why a request's attributes cannot be resolved.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AttributeError<'p> {
    /// The attribute is missing and the policy refuses to do without.
    Missing(&'p AttributeSource),
    /// The attribute's header was sent more than once, with different
    /// values.
    Conflicting(&'p AttributeSource),
}

/// Fill `values` (one slot per table attribute) for one request.
///
/// `headers` is the request's header map; each attribute's value is the
/// value of its header (`AttributeSource::header`), found in one pass over
/// the pairs however many attributes there are; the same header again with
/// another value is [`AttributeError::Conflicting`]. An attribute with a
/// verified source takes `trusted(source)` instead, and its header is not
/// read. `body_model` is the body's `model` field, used for an attribute
/// named `model` when its header is absent. ASCII whitespace around a value
/// is ignored; a value that is not UTF-8 is sent but matches nothing: the
/// unknown index. Returns the first attribute that is missing when the
/// policy refuses missing attributes.
pub fn resolve<'p, V: AsRef<[u8]>>(
    tables: &Tables<'_>,
    policy: &'p Policy,
    headers: &Pairs,
    body_model: Option<&str>,
    mut trusted: impl FnMut(&Trusted) -> Option<V>,
    values: &mut [u32],
) -> Result<(), AttributeError<'p>> {
    // Not yet seen: no value index is u32::MAX (tables refuse to load with
    // that many values).
    const UNSET: u32 = u32::MAX;
    let attributes = &policy.attributes;
    values.fill(UNSET);
    // What ACE computes itself (`substituted`, `cached`) starts at false
    // and is never read from a request.
    for (i, no) in &policy.computed {
        if let Some(slot) = values.get_mut(*i) {
            *slot = *no;
        }
    }
    // Each header attribute's first value, to compare a repeat against.
    let mut firsts: [Option<&[u8]>; 8] = [None; 8];
    let reads = &policy.from_headers;
    for (name, value) in headers.iter() {
        if !reads.may_carry(name.len()) {
            continue;
        }
        for &i in &reads.positions {
            let (Some(slot), Some(a)) = (values.get_mut(i), attributes.get(i)) else {
                continue;
            };
            let header = a.header.as_bytes();
            // Envoy hands names over in lower case, as the configuration
            // holds them: an exact comparison (vectorised) settles the
            // match, the byte-by-byte one only a name sent otherwise.
            if name.len() != header.len() || !(name == header || name.eq_ignore_ascii_case(header))
            {
                continue;
            }
            let value = value.trim_ascii();
            if *slot == UNSET {
                // Bytes that are not UTF-8 match no value: unknown.
                *slot = tables.value_index_bytes(i as u32, value);
                if let Some(f) = firsts.get_mut(i) {
                    *f = Some(value);
                }
            } else {
                let first = firsts.get(i).copied().flatten();
                // Past the eighth attribute the first value is not kept:
                // compare value indices (equal values, equal indices).
                let same = match first {
                    Some(f) => f == value,
                    None => *slot == tables.value_index_bytes(i as u32, value),
                };
                if !same {
                    return Err(AttributeError::Conflicting(a));
                }
            }
        }
    }
    for (i, (slot, a)) in values.iter_mut().zip(attributes).enumerate() {
        if *slot != UNSET {
            continue;
        }
        let value = match &a.trusted {
            Some(source) => trusted(source),
            None => None,
        };
        *slot = match (
            value,
            body_model.filter(|_| a.name == "model" && a.trusted.is_none()),
        ) {
            (Some(v), _) => tables.value_index_bytes(i as u32, v.as_ref().trim_ascii()),
            (None, Some(m)) => tables.value_index_bytes(i as u32, m.as_bytes().trim_ascii()),
            (None, None) if policy.on_missing == OnMissing::Reject => {
                return Err(AttributeError::Missing(a))
            }
            (None, None) => a.default_index,
        };
    }
    Ok(())
}

/// No verified sources: for callers whose policy has none.
pub fn no_trusted(_: &Trusted) -> Option<&'static [u8]> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use ace_config::Config;
    use ace_core::tables::{
        encode, AttributeSpec, DestinationSpec, FactorKind, FactorSpec, TableSpec, UNKNOWN,
    };
    use base64::Engine;

    fn config(on_missing: &str, defaults: &str) -> Config {
        try_config(on_missing, defaults).unwrap_or_else(|e| panic!("{e}"))
    }

    fn try_config(on_missing: &str, defaults: &str) -> Result<Config, ace_config::ConfigError> {
        try_config_sourced(on_missing, defaults, "{}")
    }

    /// With `attribute_sources` as given (JSON).
    fn try_config_sourced(
        on_missing: &str,
        defaults: &str,
        sources: &str,
    ) -> Result<Config, ace_config::ConfigError> {
        let spec = TableSpec {
            destinations: vec![DestinationSpec::new("a", "a")],
            attributes: vec![
                AttributeSpec::new("data_class", &["personal_eu", "public"]),
                AttributeSpec::new("model", &["m1"]),
            ],
            factors: vec![FactorSpec {
                kind: FactorKind::Permit,
                attributes: vec![],
                rows: vec![1],
            }],
        };
        let b64 = base64::engine::general_purpose::STANDARD.encode(encode(&spec).unwrap());
        let json = format!(
            r#"{{"destinations":[{{"name":"a","cluster":"a"}}],"tables_base64":"{b64}",
                "on_missing_attribute":"{on_missing}","attribute_defaults":{defaults},
                "attribute_sources":{sources},"body":{{"read":true}}}}"#
        );
        Config::parse(json.as_bytes())
    }

    /// A request's headers: each attribute's header (by position in the
    /// policy) with the value given, if any, among unrelated headers.
    fn sent(p: &Policy, values: &[Option<&[u8]>]) -> Pairs {
        let mut list: Vec<(&[u8], &[u8])> = vec![(b":method", b"POST")];
        for (a, v) in p.attributes.iter().zip(values) {
            if let Some(v) = v {
                list.push((a.header.as_bytes(), v));
            }
        }
        list.push((b"content-type", b"application/json"));
        Pairs::encode(list)
    }

    #[test]
    fn maps_headers_and_the_body_model() {
        let c = config("reject", "{}");
        let p = c.policy.as_ref().unwrap();
        let t = Tables::load(p.tables).unwrap();
        let mut v = [9u32; 2];
        let r = resolve(
            &t,
            p,
            &sent(p, &[Some(b" public "), None]),
            Some("m1"),
            no_trusted,
            &mut v,
        );
        assert!(r.is_ok());
        assert_eq!(v, [2, 1]);
        let r = resolve(
            &t,
            p,
            &sent(p, &[Some(b"secret"), Some(b"m1")]),
            None,
            no_trusted,
            &mut v,
        );
        assert!(r.is_ok());
        assert_eq!(v, [UNKNOWN, 1], "unknown values fail closed");
        let r = resolve(
            &t,
            p,
            &sent(p, &[None, Some(b"m1")]),
            None,
            no_trusted,
            &mut v,
        );
        assert!(matches!(r, Err(AttributeError::Missing(a)) if a.header == "x-ace-data-class"));
    }

    #[test]
    fn a_header_repeated_with_another_value_is_refused_and_names_ignore_case() {
        let c = config("reject", "{}");
        let p = c.policy.as_ref().unwrap();
        let t = Tables::load(p.tables).unwrap();
        let mut v = [9u32; 2];
        for (first, second) in [("public", "personal_eu"), ("personal_eu", "public")] {
            let headers = Pairs::encode([
                (&b"X-ACE-Data-Class"[..], first.as_bytes()),
                (b"x-ace-model", b"m1"),
                (b"x-ace-data-class", second.as_bytes()),
            ]);
            let r = resolve(&t, p, &headers, None, no_trusted, &mut v);
            assert!(
                matches!(r, Err(AttributeError::Conflicting(a)) if a.name == "data_class"),
                "{first} then {second}: {r:?}"
            );
        }
        // The same value twice (whitespace aside) is one value.
        let headers = Pairs::encode([
            (&b"x-ace-data-class"[..], &b"public"[..]),
            (b"x-ace-data-class", b" public"),
            (b"x-ace-model", b"m1"),
        ]);
        assert!(resolve(&t, p, &headers, None, no_trusted, &mut v).is_ok());
        assert_eq!(v, [2, 1]);
    }

    #[test]
    fn a_verified_source_replaces_the_header() {
        let c = try_config_sourced(
            "reject",
            "{}",
            r#"{"data_class": {"metadata": {"namespace": "jwt", "path": ["data_class"]}}}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let source = Trusted::Metadata {
            namespace: "jwt".into(),
            path: vec!["data_class".into()],
        };
        let p = c.policy.as_ref().unwrap();
        let t = Tables::load(p.tables).unwrap();
        let mut v = [9u32; 2];
        // The client claims public, twice even; the token says personal_eu.
        let headers = Pairs::encode([
            (&b"x-ace-data-class"[..], &b"public"[..]),
            (b"x-ace-data-class", b"other"),
            (b"x-ace-model", b"m1"),
        ]);
        let from_token = |s: &Trusted| (s == &source).then_some(&b"personal_eu"[..]);
        assert!(resolve(&t, p, &headers, None, from_token, &mut v).is_ok());
        assert_eq!(v, [1, 1]);
        // No verified value: missing, whatever the header says.
        let r = resolve(&t, p, &headers, None, no_trusted, &mut v);
        assert!(matches!(r, Err(AttributeError::Missing(a)) if a.name == "data_class"));
    }

    #[test]
    fn a_value_that_is_not_utf8_is_sent_but_unknown() {
        let c = config("reject", "{}");
        let p = c.policy.as_ref().unwrap();
        let t = Tables::load(p.tables).unwrap();
        let mut v = [9u32; 2];
        let headers = sent(p, &[Some(b"publ\xffic"), Some(b"m1")]);
        let r = resolve(&t, p, &headers, None, no_trusted, &mut v);
        assert!(r.is_ok(), "sent, so not missing");
        assert_eq!(v, [UNKNOWN, 1]);
    }

    #[test]
    fn restrict_uses_the_default_or_unknown() {
        let c = config("restrict", r#"{"data_class":"personal_eu"}"#);
        let p = c.policy.as_ref().unwrap();
        let t = Tables::load(p.tables).unwrap();
        let mut v = [9u32; 2];
        assert!(resolve(&t, p, &sent(p, &[None, None]), None, no_trusted, &mut v).is_ok());
        assert_eq!(v, [1, UNKNOWN]);
    }

    #[test]
    fn defaults_outside_the_domain_are_config_errors() {
        let e = try_config("restrict", r#"{"data_class":"nope"}"#).map(|_| ());
        assert_eq!(
            e.map_err(|e| e.field),
            Err("attribute_defaults.data_class".to_string())
        );
        let e = try_config("restrict", r#"{"colour":"red"}"#).map(|_| ());
        assert_eq!(
            e.map_err(|e| e.field),
            Err("attribute_defaults.colour".to_string())
        );
    }
}
