//! Addressing the upstream chosen: the request as that upstream expects
//! it ([`ace_config::Upstream`]).
//!
//! Two steps, one on each side of the merit order:
//!
//! - [`narrow`], with feasibility: a destination that does not serve the
//!   request's API, or that knows the model by another name when this
//!   request's body cannot be rewritten (read only in part, ended by
//!   trailers, a host that cannot replace it), leaves the feasible set.
//!   It only ever clears bits: nothing here adds a destination.
//! - [`address`], once a destination is chosen: the client's credential
//!   headers and credential query parameters go (unless the destination
//!   passes them), and the path and authority become the upstream's. The
//!   body's model is renamed by the flow with model routing's rewrite.
//!
//! A credential in the query string ([`CREDENTIAL_QUERY_PARAMS`]: Gemini's
//! `key`, Azure's `api-key`, OAuth's `access_token`, …) is removed as a
//! lenient server would read its name: percent-decoded, in any case, every
//! copy, with or without a value, between `&` or `;` separators (older
//! servers split on both). The rest of the query stays byte for byte, in
//! its order and encoding. A destination with `paths` gets its own path
//! and query instead of the client's, so nothing of the client's query
//! reaches it.

use crate::config::{Api, Config, Destination, CREDENTIAL_HEADERS, CREDENTIAL_QUERY_PARAMS};
use crate::headers::Pairs;
use crate::host::Host;

/// Clear from `mask` the destinations this request cannot be sent to as
/// they expect it: those not serving `api`, and, when the body cannot be
/// rewritten, those that know `model` by another name.
#[inline]
pub fn narrow(
    cfg: &Config,
    api: Option<Api>,
    model: Option<&str>,
    rewritable: bool,
    mask: &mut [u64],
) {
    cfg.serving.narrow(api, mask);
    let Some(model) = model.filter(|_| !rewritable) else {
        return;
    };
    for (d, dest) in cfg.destinations.iter().enumerate() {
        if cfg.serving.renames(d) && dest.upstream.model_name(model) != model {
            if let Some(w) = mask.get_mut(d / 64) {
                *w &= !(1u64 << (d % 64));
            }
        }
    }
}

/// Whether some credential header is in `headers`.
#[inline]
fn carries_credentials(headers: &Pairs) -> bool {
    headers.iter().any(|(k, _)| {
        CREDENTIAL_HEADERS
            .iter()
            .any(|c| k.eq_ignore_ascii_case(c.as_bytes()))
    })
}

/// The value of one hex digit.
#[inline]
fn hex(b: Option<&u8>) -> Option<u8> {
    let b = *b?;
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Whether query parameter name `raw`, as sent, reads as `name`:
/// percent-decoded (once, as a server decodes it), in any case.
fn reads_as(raw: &[u8], name: &[u8]) -> bool {
    let (mut i, mut j) = (0usize, 0usize);
    while let Some(&b) = raw.get(i) {
        let (byte, step) = match (b, hex(raw.get(i + 1)), hex(raw.get(i + 2))) {
            (b'%', Some(hi), Some(lo)) => (hi << 4 | lo, 3),
            _ => (b, 1),
        };
        if !name.get(j).is_some_and(|n| n.eq_ignore_ascii_case(&byte)) {
            return false;
        }
        i += step;
        j += 1;
    }
    j == name.len()
}

/// Whether query parameter `param` (`name=value`, `name` or `name=`)
/// carries a credential.
#[inline]
fn is_credential_param(param: &[u8]) -> bool {
    let name = param
        .iter()
        .position(|&b| b == b'=')
        .and_then(|i| param.get(..i))
        .unwrap_or(param);
    // The shortest name is 3 bytes; the longest, encoded, three times its
    // 16: a cheap first test before decoding.
    (3..=48).contains(&name.len())
        && CREDENTIAL_QUERY_PARAMS
            .iter()
            .any(|c| reads_as(name, c.as_bytes()))
}

/// The query parameters of `path`, split at `&` and `;`, each with the
/// separator before it (`?` for the first).
fn params(path: &[u8]) -> impl Iterator<Item = (u8, &[u8])> {
    let query = path
        .iter()
        .position(|&b| b == b'?')
        .and_then(|q| path.get(q + 1..));
    let mut at = 0usize;
    let mut sep = b'?';
    let mut done = query.is_none();
    std::iter::from_fn(move || {
        if done {
            return None;
        }
        let q = query?;
        let rest = q.get(at..)?;
        let (param, next) = match rest.iter().position(|&b| b == b'&' || b == b';') {
            Some(i) => (rest.get(..i)?, rest.get(i).copied()),
            None => (rest, None),
        };
        let item = (sep, param);
        match next {
            Some(s) => {
                sep = s;
                at += param.len() + 1;
            }
            None => done = true,
        }
        Some(item)
    })
}

/// Whether `path`'s query string carries a credential parameter
/// ([`CREDENTIAL_QUERY_PARAMS`]).
#[inline]
pub fn query_carries_credentials(path: &[u8]) -> bool {
    path.contains(&b'?') && params(path).any(|(_, p)| is_credential_param(p))
}

/// `path` without its credential query parameters, the rest byte for
/// byte (`None` when the path is not UTF-8: it cannot be set again).
pub fn without_query_credentials(path: &[u8]) -> Option<String> {
    let end = path.iter().position(|&b| b == b'?').unwrap_or(path.len());
    let mut out = Vec::with_capacity(path.len());
    out.extend_from_slice(path.get(..end)?);
    let mut first = true;
    for (sep, param) in params(path) {
        if is_credential_param(param) {
            continue;
        }
        out.push(if first { b'?' } else { sep });
        out.extend_from_slice(param);
        first = false;
    }
    String::from_utf8(out).ok()
}

/// Make the request what `dest`'s upstream expects: without the client's
/// credentials, in headers or in the query string (unless it passes
/// them), on its path for `api` and its authority. `false` when the host
/// could not make a change: the request must not leave.
pub fn address<H: Host>(
    dest: &Destination,
    api: Option<Api>,
    headers: &Pairs,
    host: &mut H,
) -> bool {
    let u = &dest.upstream;
    if !u.pass_credentials && carries_credentials(headers) {
        for name in CREDENTIAL_HEADERS {
            if headers.get(name).is_some() && !host.remove_request_header(name) {
                return false;
            }
        }
    }
    // The client's path is kept (no `paths` for this API): its query
    // loses what carries a credential. Rare, so the one allocation.
    if !u.pass_credentials && u.path(api).is_none() {
        if let Some(path) = headers
            .get(":path")
            .filter(|p| query_carries_credentials(p))
        {
            let kept = without_query_credentials(path);
            if !kept.is_some_and(|p| host.set_request_header(":path", &p)) {
                return false;
            }
        }
    }
    if let Some(path) = u.path(api) {
        if headers.get(":path") != Some(path.as_bytes()) && !host.set_request_header(":path", path)
        {
            return false;
        }
    }
    if let Some(authority) = &u.authority {
        if headers.get(":authority") != Some(authority.as_bytes())
            && !host.set_request_header(":authority", authority)
        {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(upstreams: &[&str], read: bool) -> Config {
        let destinations: Vec<String> = upstreams
            .iter()
            .enumerate()
            .map(|(i, u)| format!(r#"{{"name":"d{i}","cluster":"c{i}","upstream":{u}}}"#))
            .collect();
        let json = format!(
            r#"{{"destinations":[{}],"allow_no_policy":true,"body":{{"read":{read}}}}}"#,
            destinations.join(",")
        );
        Config::parse(json.as_bytes()).unwrap()
    }

    #[test]
    fn narrowing_only_clears() {
        let cfg = config(
            &[
                "{}",
                r#"{"paths":{"chat_completions":"/openai/v1/chat/completions"}}"#,
                r#"{"models":{"m":"org/M-Instruct"}}"#,
            ],
            true,
        );
        let mut mask = [0b111];
        narrow(&cfg, Some(Api::ChatCompletions), Some("m"), true, &mut mask);
        assert_eq!(mask, [0b111]);
        narrow(
            &cfg,
            Some(Api::ChatCompletions),
            Some("m"),
            false,
            &mut mask,
        );
        assert_eq!(
            mask,
            [0b011],
            "a body that cannot be rewritten keeps the name"
        );
        narrow(&cfg, Some(Api::Embeddings), Some("x"), false, &mut mask);
        assert_eq!(mask, [0b001]);
        let mut mask = [0b100];
        narrow(&cfg, Some(Api::Responses), Some("other"), false, &mut mask);
        assert_eq!(mask, [0b100], "a model it does not rename goes as it is");
        let mut none = [0];
        narrow(&cfg, None, None, false, &mut none);
        assert_eq!(none, [0]);
    }

    #[test]
    fn a_credential_in_the_query_goes_and_the_rest_stays_byte_for_byte() {
        for (sent, kept) in [
            // Gemini's `?key=`, its `$key` system parameter, Azure's
            // `api-key`, OAuth's `access_token`, APIM's `subscription-key`.
            (
                "/v1beta/models/g:generateContent?key=AIza",
                "/v1beta/models/g:generateContent",
            ),
            ("/v1/x?$key=k&alt=sse", "/v1/x?alt=sse"),
            ("/v1/x?api-key=k", "/v1/x"),
            ("/v1/x?access_token=t&a=1", "/v1/x?a=1"),
            ("/v1/x?a=1&Subscription-Key=k", "/v1/x?a=1"),
            // Any case, percent-encoded names (and hex digits in any case).
            ("/v1/x?KEY=k&a=1", "/v1/x?a=1"),
            ("/v1/x?%6Bey=k&a=1", "/v1/x?a=1"),
            ("/v1/x?%6bEY=k&a=1", "/v1/x?a=1"),
            ("/v1/x?%24key=k&a=1", "/v1/x?a=1"),
            ("/v1/x?api%2Dkey=k&a=1", "/v1/x?a=1"),
            ("/v1/x?%61%70%69%2d%6b%65%79=k", "/v1/x"),
            // Empty, valueless, repeated, between `;`.
            ("/v1/x?key=&a=1", "/v1/x?a=1"),
            ("/v1/x?a=1&key", "/v1/x?a=1"),
            ("/v1/x?key=1&a=1&key=2&b=2&KEY=3", "/v1/x?a=1&b=2"),
            ("/v1/x?a=1;key=k;b=2", "/v1/x?a=1;b=2"),
            ("/v1/x?a=1;key=k&b=2", "/v1/x?a=1&b=2"),
            // The rest as it was: order, encoding, odd separators.
            (
                "/v1/x?z=%2F%2f+a&key=k&y=%E2%82%AC&&x",
                "/v1/x?z=%2F%2f+a&y=%E2%82%AC&&x",
            ),
            ("/v1/x?key=k&", "/v1/x?"),
            ("/v1/x?key=a=b&c=key", "/v1/x?c=key"),
        ] {
            assert!(query_carries_credentials(sent.as_bytes()), "{sent}");
            assert_eq!(
                without_query_credentials(sent.as_bytes()).as_deref(),
                Some(kept),
                "{sent}"
            );
        }
        for clean in [
            &b"/v1/x"[..],
            b"/v1/x?",
            b"/v1/x?a=key",
            b"/v1/x?keys=1&monkey=2&key_=3&ke=4&k%65=5x&%6B%65%79%31=1",
            b"/v1/x?api_key=1&apikey=2&key%=3&%key=4&%2",
            b"/v1/key?x=1",
            b"/openai/deployments/d/chat/completions?api-version=2024-10-21",
            b"/v1/x?ke%79",
        ] {
            let readable = String::from_utf8_lossy(clean);
            let carries = query_carries_credentials(clean);
            // `ke%79` is `key`: the one dirty path in the list.
            assert_eq!(carries, clean.ends_with(b"ke%79"), "{readable}");
        }
        assert_eq!(
            without_query_credentials(b"/v1/x?ke%79&a"),
            Some("/v1/x?a".into())
        );
        assert_eq!(without_query_credentials(b"/v1/x?key=1&a=\xff"), None);
    }

    use proptest::prelude::*;

    proptest! {
        /// Any query: what goes is exactly the credential parameters, what
        /// stays is every other parameter with its separator, in order,
        /// byte for byte; a query without one is left alone.
        #[test]
        fn only_credentials_leave_the_query(
            params in proptest::collection::vec(
                (
                    prop_oneof![Just(b'&'), Just(b';')],
                    prop_oneof![
                        "(key|KEY|Key|%6[bB]ey|%24key|\\$key|api-key|API-KEY|api%2[dD]key|access_token|subscription-key)(=[a-zA-Z0-9%]{0,8})?",
                        "[a-zA-Z0-9_.~%+$-]{0,10}(=[a-zA-Z0-9_.~%+=$-]{0,10})?",
                    ],
                ),
                0..8,
            ),
        ) {
            let mut path = b"/v1/x".to_vec();
            let mut expected = path.clone();
            let mut kept = 0;
            for (i, (sep, p)) in params.iter().enumerate() {
                path.push(if i == 0 { b'?' } else { *sep });
                path.extend_from_slice(p.as_bytes());
                if !is_credential_param(p.as_bytes()) {
                    expected.push(if kept == 0 { b'?' } else { *sep });
                    expected.extend_from_slice(p.as_bytes());
                    kept += 1;
                }
            }
            let carries = query_carries_credentials(&path);
            prop_assert_eq!(carries, kept < params.len());
            let out = without_query_credentials(&path).unwrap_or_default();
            prop_assert_eq!(out.as_bytes(), &expected[..]);
            prop_assert!(!query_carries_credentials(out.as_bytes()));
        }
    }

    #[test]
    fn a_renaming_destination_needs_the_body_read() {
        let json = r#"{"destinations":[{"name":"d","cluster":"c","upstream":{"models":{"m":"n"}}}],"allow_no_policy":true}"#;
        let e = Config::parse(json.as_bytes()).unwrap_err();
        assert_eq!(e.field, "destinations[0].upstream.models");
        assert!(e.message.contains("body.read"), "{e}");
    }
}
