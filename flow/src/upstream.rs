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
//!   headers go (unless the destination passes them), and the path and
//!   authority become the upstream's. The body's model is renamed by the
//!   flow with model routing's rewrite.

use crate::config::{Api, Config, Destination, CREDENTIAL_HEADERS};
use crate::flow::Host;
use crate::headers::Pairs;

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

/// Make the request what `dest`'s upstream expects: without the client's
/// credentials (unless it passes them), on its path for `api` and its
/// authority. `false` when the host could not make a change: the request
/// must not leave.
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
    fn a_renaming_destination_needs_the_body_read() {
        let json = r#"{"destinations":[{"name":"d","cluster":"c","upstream":{"models":{"m":"n"}}}],"allow_no_policy":true}"#;
        let e = Config::parse(json.as_bytes()).unwrap_err();
        assert_eq!(e.field, "destinations[0].upstream.models");
        assert!(e.message.contains("body.read"), "{e}");
    }
}
