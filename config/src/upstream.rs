//! What each destination's upstream expects of a request: the name it
//! knows each model by, the path of each API it serves, its authority,
//! and whether a client's own credentials may reach it.
//!
//! Why it is configuration and not Envoy's routes: the model name depends
//! on the (destination, model) pair ACE chose, which only the filter
//! knows, and a destination that does not serve a request's API must drop
//! out of the feasible set before the merit order runs, never be sent a
//! request it cannot answer. Credentials themselves are never here: each
//! Envoy cluster attaches its provider's key with Envoy's own credential
//! injection from a secret file (`envoy/providers.yaml`), and the filter
//! removes every credential header a client sent unless the destination
//! says it passes them through, so a key meant for one provider never
//! reaches another; the same holds for a credential in the query string.
//!
//! The API of a request is read from the path the client used: its last
//! segments, whatever the prefix (`/v1/chat/completions`,
//! `/openai/deployments/x/chat/completions?api-version=…`).

use crate::ConfigError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// An API a destination may serve, as the OpenAI-compatible surface names
/// it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    /// `…/chat/completions`.
    ChatCompletions,
    /// `…/completions` (the legacy text completions).
    Completions,
    /// `…/embeddings`.
    Embeddings,
    /// `…/responses` (OpenAI's Responses API).
    Responses,
}

impl Api {
    /// Every API, in index order.
    pub const ALL: [Api; 4] = [
        Api::ChatCompletions,
        Api::Completions,
        Api::Embeddings,
        Api::Responses,
    ];

    /// Its configuration name.
    pub const fn name(self) -> &'static str {
        match self {
            Api::ChatCompletions => "chat_completions",
            Api::Completions => "completions",
            Api::Embeddings => "embeddings",
            Api::Responses => "responses",
        }
    }

    /// Its index in [`Api::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The API a request path asks for, from its last segments (the query
    /// ignored); `None` for any other path (a model list, a file upload).
    pub fn of_path(path: &[u8]) -> Option<Api> {
        let end = path.iter().position(|&b| b == b'?').unwrap_or(path.len());
        let p = path.get(..end)?;
        let p = p.strip_suffix(b"/").unwrap_or(p);
        if p.ends_with(b"/chat/completions") {
            Some(Api::ChatCompletions)
        } else if p.ends_with(b"/completions") {
            Some(Api::Completions)
        } else if p.ends_with(b"/embeddings") {
            Some(Api::Embeddings)
        } else if p.ends_with(b"/responses") {
            Some(Api::Responses)
        } else {
            None
        }
    }
}

/// The headers a client may carry a provider credential in. Each is
/// removed before the request leaves unless the destination chosen passes
/// credentials through ([`Upstream::pass_credentials`]): OpenAI and most
/// OpenAI-compatible providers read `authorization: Bearer`, Azure OpenAI
/// `api-key`, Anthropic `x-api-key`, Gemini `x-goog-api-key`, Azure API
/// Management (in front of Azure OpenAI as an AI gateway)
/// `ocp-apim-subscription-key` ("Subscriptions in Azure API Management").
pub const CREDENTIAL_HEADERS: [&str; 6] = [
    "authorization",
    "api-key",
    "x-api-key",
    "x-goog-api-key",
    "ocp-apim-subscription-key",
    "proxy-authorization",
];

/// The query parameters a client may carry a provider credential in,
/// removed from the client's query string on the same terms as
/// [`CREDENTIAL_HEADERS`] (a destination's configured `paths` replace the
/// whole query anyway). Names as the providers document them, matched as
/// a lenient server reads them (percent-decoded, in any case):
///
/// - `key` and `$key`: a Google API key, the Gemini API's `?key=` (Gemini
///   API, "Get a Gemini API key"; Google Cloud "System parameters", which
///   maps both to `X-Goog-Api-Key`).
/// - `api-key`: Azure OpenAI's key on the request URI (Azure OpenAI,
///   "Use the GPT Realtime API via WebSockets", authentication: "an
///   `api-key` query string parameter on the request URI").
/// - `access_token`: an OAuth 2.0 bearer token in the URI (RFC 6750
///   §2.3, "URI Query Parameter"; Google's "Using OAuth 2.0 to Access
///   Google APIs" takes it on every API).
/// - `subscription-key`: Azure API Management's key in the query
///   ("Subscriptions in Azure API Management").
pub const CREDENTIAL_QUERY_PARAMS: [&str; 5] =
    ["key", "$key", "api-key", "access_token", "subscription-key"];

/// One destination's upstream identity (`destinations[i].upstream`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Upstream {
    /// The `:authority` the upstream expects (e.g. `api.openai.com`);
    /// absent: the client's is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority: Option<String>,
    /// The request path for each API the destination serves, query
    /// included (Azure OpenAI:
    /// `/openai/deployments/gpt-4o-prod/chat/completions?api-version=2024-10-21`).
    /// Absent: it serves every API, each on the path the client used; set:
    /// a request for an API not listed never reaches it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paths: Option<BTreeMap<Api, String>>,
    /// Catalogue model id to the name the upstream knows it by (vLLM's
    /// `--served-model-name`, an Azure deployment, a provider's model
    /// id). A model not listed is sent under its catalogue id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub models: BTreeMap<String, String>,
    /// Whether the client's own credential headers
    /// ([`CREDENTIAL_HEADERS`]) and query parameters
    /// ([`CREDENTIAL_QUERY_PARAMS`]) reach this upstream (default false:
    /// they are removed, and Envoy's cluster attaches the provider's own).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pass_credentials: bool,
}

impl Upstream {
    /// Whether nothing is configured (every request passes unchanged but
    /// for the credential headers).
    pub fn is_default(&self) -> bool {
        *self == Upstream::default()
    }

    /// The name the upstream knows catalogue model `model` by.
    #[inline]
    pub fn model_name<'a>(&'a self, model: &'a str) -> &'a str {
        if self.models.is_empty() {
            return model;
        }
        self.models.get(model).map_or(model, String::as_str)
    }

    /// The path to send a request for `api` on; `None` when the client's
    /// path is kept (no `paths`, or an API ACE does not recognise on a
    /// destination that serves every API).
    #[inline]
    pub fn path(&self, api: Option<Api>) -> Option<&str> {
        self.paths
            .as_ref()
            .zip(api)
            .and_then(|(p, a)| p.get(&a))
            .map(String::as_str)
    }

    /// Whether the destination serves `api` (`None`: a path ACE does not
    /// recognise, which only a destination without `paths` serves).
    #[inline]
    pub fn serves(&self, api: Option<Api>) -> bool {
        match (&self.paths, api) {
            (None, _) => true,
            (Some(p), Some(a)) => p.contains_key(&a),
            (Some(_), None) => false,
        }
    }

    /// Check every field; errors name `destinations[i].upstream.…`.
    pub fn validate(&self, i: usize) -> Result<(), ConfigError> {
        let field = |f: &str| format!("destinations[{i}].upstream.{f}");
        if let Some(a) = &self.authority {
            let ok = !a.is_empty()
                && a.len() <= 255
                && a.bytes().all(|b| {
                    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b':' | b'[' | b']')
                });
            if !ok {
                return Err(ConfigError {
                    field: field("authority"),
                    message: format!(
                        "{a:?} is not a host[:port] (letters, digits, '-', '.', ':', '[', ']')"
                    ),
                });
            }
        }
        if let Some(paths) = &self.paths {
            if paths.is_empty() {
                return Err(ConfigError {
                    field: field("paths"),
                    message: "lists no API: leave `paths` out for a destination that serves \
                              every API on the client's path, or list the ones it serves"
                        .into(),
                });
            }
            for (api, p) in paths {
                let ok = p.starts_with('/')
                    && p.len() <= 2048
                    && p.bytes().all(|b| b.is_ascii_graphic())
                    && !p.contains('#');
                if !ok {
                    return Err(ConfigError {
                        field: field(&format!("paths.{}", api.name())),
                        message: format!(
                            "{p:?} is not a request path: it must start with '/' and hold \
                             visible ASCII only (no spaces, no '#'), at most 2,048 bytes"
                        ),
                    });
                }
            }
        }
        for (model, name) in &self.models {
            let ok = |s: &str| {
                !s.is_empty() && s.len() <= 256 && s.chars().all(|c| !c.is_control() && c != '"')
            };
            if !ok(model) || !ok(name) {
                return Err(ConfigError {
                    field: field(&format!("models.{model}")),
                    message: format!(
                        "{model:?} -> {name:?}: both the catalogue id and the upstream's name \
                         must be 1 to 256 characters, without control characters or quotes"
                    ),
                });
            }
        }
        Ok(())
    }
}

/// The destinations serving each API, as bitmasks in table order, built
/// once from the configuration.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Serving {
    /// `by_api[api.index()]`; the last entry is for a path ACE does not
    /// recognise.
    by_api: [Vec<u64>; 5],
    /// Destinations that send some model under another name.
    renaming: Vec<u64>,
    /// Whether any destination restricts its APIs.
    restricted: bool,
}

impl Serving {
    /// Build the masks for `upstreams`, in table order.
    pub fn new<'a>(upstreams: impl ExactSizeIterator<Item = &'a Upstream>) -> Serving {
        let words = upstreams.len().div_ceil(64);
        let mut s = Serving {
            by_api: std::array::from_fn(|_| vec![0; words]),
            renaming: vec![0; words],
            restricted: false,
        };
        for (d, u) in upstreams.enumerate() {
            let (w, bit) = (d / 64, 1u64 << (d % 64));
            for (k, api) in Api::ALL.iter().map(|a| Some(*a)).chain([None]).enumerate() {
                if u.serves(api) {
                    if let Some(x) = s.by_api.get_mut(k).and_then(|m| m.get_mut(w)) {
                        *x |= bit;
                    }
                }
            }
            if u.models.iter().any(|(m, n)| m != n) {
                if let Some(x) = s.renaming.get_mut(w) {
                    *x |= bit;
                }
            }
            s.restricted |= u.paths.is_some();
        }
        s
    }

    /// Clear from `mask` every destination that does not serve `api`.
    #[inline]
    pub fn narrow(&self, api: Option<Api>, mask: &mut [u64]) {
        if !self.restricted {
            return;
        }
        let k = api.map_or(Api::ALL.len(), Api::index);
        if let Some(serving) = self.by_api.get(k) {
            for (m, s) in mask.iter_mut().zip(serving) {
                *m &= s;
            }
        }
    }

    /// Whether destination `d` sends some model under another name.
    #[inline]
    pub fn renames(&self, d: usize) -> bool {
        self.renaming
            .get(d / 64)
            .is_some_and(|w| w & (1u64 << (d % 64)) != 0)
    }

    /// Whether any destination sends some model under another name (the
    /// filter then reads request bodies, to rewrite them).
    pub fn any_renames(&self) -> bool {
        self.renaming.iter().any(|w| *w != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_is_the_paths_last_segments_whatever_the_prefix() {
        for (path, api) in [
            (&b"/v1/chat/completions"[..], Some(Api::ChatCompletions)),
            (b"/chat/completions/", Some(Api::ChatCompletions)),
            (
                b"/openai/deployments/x/chat/completions?api-version=2024-10-21",
                Some(Api::ChatCompletions),
            ),
            (b"/v1/completions", Some(Api::Completions)),
            (b"/v1/embeddings?x=/chat/completions", Some(Api::Embeddings)),
            (b"/v1/responses", Some(Api::Responses)),
            (b"/v1/models", None),
            (b"/v1/chat/completionsx", None),
            (b"", None),
        ] {
            assert_eq!(Api::of_path(path), api, "{}", String::from_utf8_lossy(path));
        }
    }

    fn upstream(json: &str) -> Upstream {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn a_destination_with_paths_serves_only_those() {
        let all = Upstream::default();
        let azure = upstream(
            r#"{"paths":{"chat_completions":"/openai/deployments/d/chat/completions?api-version=2024-10-21"}}"#,
        );
        assert!(all.serves(Some(Api::Embeddings)) && all.serves(None));
        assert!(azure.serves(Some(Api::ChatCompletions)));
        assert!(!azure.serves(Some(Api::Embeddings)) && !azure.serves(None));
        assert_eq!(all.path(Some(Api::ChatCompletions)), None);
        assert_eq!(
            azure.path(Some(Api::ChatCompletions)),
            Some("/openai/deployments/d/chat/completions?api-version=2024-10-21")
        );
        let s = Serving::new([&all, &azure].into_iter());
        let mut mask = [0b11];
        s.narrow(Some(Api::Embeddings), &mut mask);
        assert_eq!(mask, [0b01]);
        let mut mask = [0b11];
        s.narrow(Some(Api::ChatCompletions), &mut mask);
        assert_eq!(mask, [0b11]);
        let mut mask = [0b11];
        s.narrow(None, &mut mask);
        assert_eq!(mask, [0b01]);
    }

    #[test]
    fn models_not_listed_keep_their_catalogue_id() {
        let u = upstream(r#"{"models":{"llama-3.1-8b":"meta-llama/Llama-3.1-8B-Instruct"}}"#);
        assert_eq!(
            u.model_name("llama-3.1-8b"),
            "meta-llama/Llama-3.1-8B-Instruct"
        );
        assert_eq!(u.model_name("gpt-4o"), "gpt-4o");
        let s = Serving::new([&Upstream::default(), &u].into_iter());
        assert!(!s.renames(0) && s.renames(1) && !s.renames(64) && s.any_renames());
    }

    #[test]
    fn bad_fields_are_named() {
        for (json, field) in [
            (
                r#"{"authority":"a b"}"#,
                "destinations[3].upstream.authority",
            ),
            (r#"{"authority":""}"#, "destinations[3].upstream.authority"),
            (r#"{"paths":{}}"#, "destinations[3].upstream.paths"),
            (
                r#"{"paths":{"embeddings":"v1/embeddings"}}"#,
                "destinations[3].upstream.paths.embeddings",
            ),
            (
                r#"{"paths":{"responses":"/v1/a b"}}"#,
                "destinations[3].upstream.paths.responses",
            ),
            (
                r#"{"models":{"m":""}}"#,
                "destinations[3].upstream.models.m",
            ),
            (
                r#"{"models":{"m":"a\"b"}}"#,
                "destinations[3].upstream.models.m",
            ),
        ] {
            let e = upstream(json).validate(3).unwrap_err();
            assert_eq!(e.field, field, "{json}");
        }
        assert!(serde_json::from_str::<Upstream>(r#"{"paths":{"chat":"/x"}}"#).is_err());
        assert!(serde_json::from_str::<Upstream>(r#"{"model":{}}"#).is_err());
    }
}
