//! Fake LLM providers that hold a request to what the real ones check:
//! their own paths, their own model names, their own credential header
//! (and only theirs), over TLS with a certificate for their own name, and
//! the rate-limit figures and 429s they send.
//!
//! What each shape follows (the provider's documentation, or where it is
//! not written down, what its responses are seen to carry):
//!
//! - **OpenAI** (`Errors::OpenAi`): `authorization: Bearer <key>`; errors
//!   as `{"error":{"message","type","param","code"}}`, a bad key a 401 with
//!   `"code":"invalid_api_key"`, an unknown model a 404 with
//!   `"code":"model_not_found"`, an unknown path a 404 "Invalid URL"
//!   (platform.openai.com, "Error codes"); rate-limit figures
//!   `x-ratelimit-{limit,remaining,reset}-tokens` (the "Rate limits" guide,
//!   "Rate limits in headers": reset a duration such as `6m0s`). Groq's
//!   OpenAI-compatible surface answers the same way
//!   (console.groq.com/docs/openai, /docs/rate-limits).
//! - **Azure OpenAI** (`Errors::Azure`): `api-key: <key>`; paths
//!   `/openai/deployments/{deployment}/chat/completions?api-version=…` and
//!   the v1 surface `/openai/v1/…` (Azure OpenAI "API version lifecycle");
//!   errors as `{"error":{"code":"<status>","message"}}`. A provisioned
//!   (PTU) deployment reports its utilisation on every answer,
//!   `azure-openai-deployment-utilization: 89.3%` (Microsoft's
//!   `Azure/azure-openai-benchmark`, `benchmark/oairequester.py`), and past
//!   100 % answers a fast 429 with `retry-after-ms` and `retry-after`
//!   ("Provisioned throughput", "Get started with provisioned
//!   deployments").
//! - **Anthropic** (`Errors::Anthropic`, `Limits::Anthropic`): `x-api-key:
//!   <key>` and a required `anthropic-version` header; errors as
//!   `{"type":"error","error":{"type","message"}}` with the type named by
//!   the status (`authentication_error` 401, `not_found_error` 404,
//!   `rate_limit_error` 429, `api_error` 500; docs.anthropic.com/en/api/errors);
//!   an answer in the Messages API's shape (`"type":"message"`, `content`
//!   blocks, `usage.input_tokens` and `output_tokens`;
//!   docs.anthropic.com/en/api/messages); rate-limit figures
//!   `anthropic-ratelimit-tokens-{limit,remaining,reset}`, the reset an
//!   RFC 3339 time such as `2025-08-21T12:40:59Z`, and a 429 with
//!   `retry-after` in seconds past the limit (docs.anthropic.com/en/api/rate-limits,
//!   "Response headers").
//! - **vLLM** (`Errors::OpenAi`, plain HTTP): `vllm serve --api-key` reads
//!   `authorization: Bearer`, and serves each model under its
//!   `--served-model-name`.
//!
//! Each answer reports the usage [`Provider::answer_usage`] sets (12 in,
//! 3 out unless set), in the shape of the provider and API asked:
//! OpenAI's chat completions (`usage.prompt_tokens`, its
//! `prompt_tokens_details.cached_tokens`; streamed with
//! `stream_options.include_usage`, a last chunk with no choices), OpenAI's
//! Responses API (`usage.input_tokens`, `input_tokens_details.cached_tokens`;
//! streamed, the API reference's "Streaming" example with the usage in
//! `response.completed`'s `response.usage`), Anthropic's Messages
//! (`usage.input_tokens` without the cache reads and writes, counted apart
//! in `cache_read_input_tokens` and `cache_creation_input_tokens`;
//! streamed, the "Streaming Messages" page's basic example: the input in
//! `message_start`'s `message.usage`, the output in `message_delta`). The
//! documented examples are the usage fixtures of `flow/tests/fixtures/usage/`,
//! each citing its page; a streamed one is sent an event a chunk. What it
//! answered is kept ([`Provider::served`]: time, model, usage), the record
//! a provider bills from.
//!
//! A request a provider would refuse is answered as it would and kept in
//! [`Provider::rejected`]; one it serves is kept in [`Provider::accepted`].
//! A test that expects every request to arrive as its upstream wants it
//! checks that `rejected` is empty.

use crate::upstream::{Behavior, Intercept, Recorded, Reply, Upstream};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A certificate authority made for one run: each provider's certificate
/// is issued by it for the provider's name, and Envoy trusts only it.
pub struct Ca {
    dir: tempfile::TempDir,
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").field("dir", &self.dir.path()).finish()
    }
}

impl Ca {
    /// A new CA, its certificate written to [`Ca::file`].
    pub fn new() -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new())
            .unwrap_or_else(|e| panic!("CA parameters: {e}"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "ACE test CA");
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("CA key: {e}"));
        let cert = params
            .self_signed(&key)
            .unwrap_or_else(|e| panic!("CA certificate: {e}"));
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
        std::fs::write(dir.path().join("ca.pem"), cert.pem())
            .unwrap_or_else(|e| panic!("write ca.pem: {e}"));
        Ca { dir, cert, key }
    }

    /// The CA certificate, PEM (Envoy's `trusted_ca`).
    pub fn file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A TLS server configuration with a certificate for `host`.
    fn server(&self, host: &str) -> Arc<rustls::ServerConfig> {
        let params = CertificateParams::new(vec![host.to_string()])
            .unwrap_or_else(|e| panic!("certificate for {host}: {e}"));
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("key for {host}: {e}"));
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .unwrap_or_else(|e| panic!("sign {host}: {e}"));
        let chain: Vec<CertificateDer<'static>> = vec![cert.der().clone(), self.cert.der().clone()];
        let private = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        // ring, as the control service's rustls: loopback TLS to a test CA
        // needs no post-quantum key exchange (why rustls deprecates it).
        #[allow(deprecated)]
        let ring = rustls::crypto::ring::default_provider();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(ring))
            .with_safe_default_protocol_versions()
            .and_then(|b| b.with_no_client_auth().with_single_cert(chain, private))
            .unwrap_or_else(|e| panic!("TLS config for {host}: {e}"));
        Arc::new(config)
    }
}

impl Default for Ca {
    fn default() -> Ca {
        Ca::new()
    }
}

/// How a provider words its errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Errors {
    /// `{"error":{"message","type","param","code"}}` (OpenAI, Groq, vLLM).
    OpenAi,
    /// `{"error":{"code":"<status>","message"}}` (Azure OpenAI).
    Azure,
    /// `{"type":"error","error":{"type","message"}}` (Anthropic), which
    /// also wants `anthropic-version` and answers in the Messages shape.
    Anthropic,
}

/// What a provider says of its rate limit on each answer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Limits {
    /// Nothing.
    None,
    /// A provisioned deployment: each request served adds `step` percent
    /// of utilisation, reported in `azure-openai-deployment-utilization`;
    /// a request arriving at 100 % or more is answered 429 with
    /// `retry-after-ms: 1000`.
    Provisioned {
        /// Utilisation each request adds, percent.
        step: f64,
    },
    /// A token budget per window, as OpenAI reports it: each request
    /// served spends `per_request` of `limit`, every answer carries
    /// `x-ratelimit-{limit,remaining,reset}-tokens` (the reset `reset`,
    /// a Go duration), and a request arriving with less than
    /// `per_request` left is answered 429 `rate_limit_exceeded`.
    Tokens {
        /// Tokens per window.
        limit: u64,
        /// Tokens each request spends.
        per_request: u64,
        /// The `x-ratelimit-reset-tokens` value.
        reset: &'static str,
    },
    /// A token budget as Anthropic reports it: like [`Limits::Tokens`],
    /// with `anthropic-ratelimit-tokens-{limit,remaining,reset}` on every
    /// answer (the reset `reset`, an RFC 3339 time, said as given) and a
    /// 429 `rate_limit_error` with `retry-after` past it.
    Anthropic {
        /// Tokens per window.
        limit: u64,
        /// Tokens each request spends.
        per_request: u64,
        /// The `anthropic-ratelimit-tokens-reset` value.
        reset: &'static str,
    },
}

/// One provider's shape.
#[derive(Clone, Debug)]
pub struct Spec {
    /// Its name (in answers and errors).
    pub name: String,
    /// Its TLS name; `None`: plain HTTP (a model server inside the mesh).
    pub host: Option<String>,
    /// The credential header it reads and the exact value it accepts.
    pub credential: (String, String),
    /// The request paths it serves, query included.
    pub paths: Vec<String>,
    /// The model names it serves.
    pub models: Vec<String>,
    /// How it words errors.
    pub errors: Errors,
    /// What it says of its rate limit.
    pub limits: Limits,
}

/// The usage an answer reports: what the provider says it served, and
/// what it bills.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Input tokens, prompt-cache reads and writes included (OpenAI's
    /// `prompt_tokens` or `input_tokens`; Anthropic's `input_tokens` plus
    /// its two cache counts).
    pub input: u64,
    /// Of the input, tokens read from the prompt cache.
    pub cached: u64,
    /// Of the input, tokens written to the prompt cache (Anthropic's
    /// `cache_creation_input_tokens`).
    pub cache_write: u64,
    /// Output tokens.
    pub output: u64,
}

impl Default for Usage {
    /// 12 in, 3 out: what every answer said before usage could be set.
    fn default() -> Usage {
        Usage {
            input: 12,
            cached: 0,
            cache_write: 0,
            output: 3,
        }
    }
}

impl Usage {
    /// The input neither read from nor written to the prompt cache
    /// (Anthropic's `input_tokens`).
    pub fn uncached(&self) -> u64 {
        self.input
            .saturating_sub(self.cached)
            .saturating_sub(self.cache_write)
    }
}

/// One answer a provider served (a 200), as its bill counts it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Served {
    /// When, ms since the epoch.
    pub at_ms: u64,
    /// The model, as the request named it to the provider.
    pub model: String,
    /// The usage the answer reported.
    pub usage: Usage,
}

struct State {
    spec: Spec,
    accepted: Mutex<Vec<Recorded>>,
    rejected: Mutex<Vec<(u16, Recorded)>>,
    served: AtomicU64,
    /// Requests still to answer 500 (an engine error).
    fail: AtomicU64,
    /// The usage each answer reports.
    usage: Mutex<Usage>,
    /// The answers served.
    answered: Mutex<Vec<Served>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl State {
    fn error(&self, status: u16, kind: &str, code: &str, message: String) -> Behavior {
        let body = match self.spec.errors {
            Errors::OpenAi => {
                json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
            }
            Errors::Azure => json!({"error": {"code": status.to_string(), "message": message}}),
            Errors::Anthropic => {
                let kind = match status {
                    400 => "invalid_request_error",
                    401 => "authentication_error",
                    404 => "not_found_error",
                    429 => "rate_limit_error",
                    _ => "api_error",
                };
                json!({"type": "error", "error": {"type": kind, "message": message}})
            }
        };
        Behavior::Respond {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.to_string().into_bytes(),
        }
    }

    /// A token budget of `limit` a window, `per_request` spent by each
    /// request served: the figures to answer with (`names`: the limit,
    /// remaining and reset headers), or, with too little left, the 429
    /// `refuse(spent)` words, with the figures and its extra header.
    fn spend_tokens(
        &self,
        limit: u64,
        per_request: u64,
        names: [&str; 3],
        reset: &str,
        refuse: impl FnOnce(u64) -> (Behavior, Option<(String, String)>),
    ) -> Result<Vec<(String, String)>, Behavior> {
        let spent = self
            .served
            .load(Ordering::SeqCst)
            .saturating_mul(per_request);
        let left = limit.saturating_sub(spent);
        let figures = |left: u64| {
            let [l, r, t] = names.map(str::to_string);
            vec![
                (l, limit.to_string()),
                (r, left.to_string()),
                (t, reset.to_string()),
            ]
        };
        if left < per_request {
            let (mut b, extra) = refuse(spent);
            if let Behavior::Respond { headers, .. } = &mut b {
                headers.extend(figures(left));
                headers.extend(extra);
            }
            return Err(b);
        }
        Ok(figures(left - per_request))
    }

    fn judge(&self, req: &Recorded) -> Result<Behavior, Behavior> {
        let (header, key) = &self.spec.credential;
        if req.header(header) != Some(key.as_str()) {
            return Err(match self.spec.errors {
                Errors::OpenAi => self.error(
                    401,
                    "invalid_request_error",
                    "invalid_api_key",
                    "Incorrect API key provided.".into(),
                ),
                Errors::Azure => self.error(
                    401,
                    "",
                    "",
                    "Access denied due to invalid subscription key or wrong API endpoint.".into(),
                ),
                Errors::Anthropic => self.error(401, "", "", "invalid x-api-key".into()),
            });
        }
        if self.spec.errors == Errors::Anthropic && req.header("anthropic-version").is_none() {
            return Err(self.error(400, "", "", "anthropic-version: header is required".into()));
        }
        if !self.spec.paths.contains(&req.path) {
            return Err(match self.spec.errors {
                Errors::OpenAi => self.error(
                    404,
                    "invalid_request_error",
                    "",
                    format!("Invalid URL ({} {})", req.method, req.path),
                ),
                Errors::Azure => self.error(404, "", "", "Resource not found".into()),
                Errors::Anthropic => self.error(404, "", "", "Not found".into()),
            });
        }
        let model = serde_json::from_slice::<Value>(&req.body)
            .ok()
            .and_then(|v| v["model"].as_str().map(str::to_string))
            .unwrap_or_default();
        if !self.spec.models.contains(&model) {
            return Err(self.error(
                404,
                "invalid_request_error",
                "model_not_found",
                format!("The model `{model}` does not exist or you do not have access to it."),
            ));
        }
        let failing = self
            .fail
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            let mut b = self.error(500, "server_error", "", "The server had an error.".into());
            if let Behavior::Respond { headers, .. } = &mut b {
                headers.push(("x-upstream".into(), self.spec.name.clone()));
            }
            return Ok(b);
        }
        let mut headers = vec![("content-type".to_string(), "application/json".to_string())];
        if let Limits::Tokens {
            limit,
            per_request,
            reset,
        } = self.spec.limits
        {
            let names = [
                "x-ratelimit-limit-tokens",
                "x-ratelimit-remaining-tokens",
                "x-ratelimit-reset-tokens",
            ];
            headers.extend(
                self.spend_tokens(limit, per_request, names, reset, |spent| {
                    let b = self.error(
                        429,
                        "tokens",
                        "rate_limit_exceeded",
                        format!(
                        "Rate limit reached on tokens per min (TPM): Limit {limit}, Used {spent}, \
                         Requested {per_request}."
                    ),
                    );
                    (b, None)
                })?,
            );
        }
        if let Limits::Anthropic {
            limit,
            per_request,
            reset,
        } = self.spec.limits
        {
            let names = [
                "anthropic-ratelimit-tokens-limit",
                "anthropic-ratelimit-tokens-remaining",
                "anthropic-ratelimit-tokens-reset",
            ];
            headers.extend(self.spend_tokens(limit, per_request, names, reset, |_| {
                let b = self.error(
                    429,
                    "",
                    "",
                    "This request would exceed your organization's rate limit of tokens per \
                     minute."
                        .into(),
                );
                (b, Some(("retry-after".to_string(), "1".to_string())))
            })?);
        }
        if let Limits::Provisioned { step } = self.spec.limits {
            let before = self.served.load(Ordering::SeqCst) as f64 * step;
            if before >= 100.0 {
                let mut b = self.error(
                    429,
                    "",
                    "",
                    "Requests to the ChatCompletions_Create Operation have exceeded the \
                     provisioned throughput of this deployment. Please retry after 1 second."
                        .into(),
                );
                if let Behavior::Respond { headers, .. } = &mut b {
                    headers.push(("retry-after-ms".into(), "1000".into()));
                    headers.push(("retry-after".into(), "1".into()));
                    headers.push((
                        "azure-openai-deployment-utilization".into(),
                        format!("{before:.1}%"),
                    ));
                }
                return Err(b);
            }
            headers.push((
                "azure-openai-deployment-utilization".into(),
                format!("{:.1}%", before + step),
            ));
        }
        self.served.fetch_add(1, Ordering::SeqCst);
        let usage = *lock(&self.usage);
        lock(&self.answered).push(Served {
            at_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            model: model.clone(),
            usage,
        });
        let request: Value = serde_json::from_slice(&req.body).unwrap_or_default();
        let stream = request["stream"] == true;
        let responses = req
            .path
            .split('?')
            .next()
            .is_some_and(|p| p.ends_with("/responses"));
        if stream && self.spec.errors == Errors::Anthropic {
            return Ok(self.events(headers, &anthropic_stream(&model, usage)));
        }
        if stream && responses {
            return Ok(self.events(headers, &responses_stream(&model, usage)));
        }
        if stream {
            let include = request["stream_options"]["include_usage"] == true;
            return Ok(Behavior::RespondWithTrailers {
                status: 200,
                headers: vec![("content-type".into(), "text/event-stream".into())],
                body: chat_stream(&model, include, usage).into_bytes(),
                trailers: Vec::new(),
            });
        }
        let body = if self.spec.errors == Errors::Anthropic {
            let mut u = json!({"input_tokens": usage.uncached(), "output_tokens": usage.output});
            if usage.cached > 0 || usage.cache_write > 0 {
                u["cache_creation_input_tokens"] = usage.cache_write.into();
                u["cache_read_input_tokens"] = usage.cached.into();
            }
            json!({
                "id": "msg_01", "type": "message", "role": "assistant", "model": model,
                "content": [{"type": "text", "text": self.spec.name}],
                "stop_reason": "end_turn", "stop_sequence": null,
                "usage": u
            })
        } else if responses {
            responses_answer(&model, usage)
        } else {
            let mut u = json!({"prompt_tokens": usage.input, "completion_tokens": usage.output,
                               "total_tokens": usage.input + usage.output});
            if usage.cached > 0 {
                u["prompt_tokens_details"] = json!({"cached_tokens": usage.cached});
            }
            json!({
                "id": "chatcmpl-1", "object": "chat.completion", "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": self.spec.name},
                             "finish_reason": "stop"}],
                "usage": u
            })
        };
        headers.push(("x-upstream".into(), self.spec.name.clone()));
        Ok(Behavior::Respond {
            status: 200,
            headers,
            body: body.to_string().into_bytes(),
        })
    }

    /// 200 with `stream` as server-sent events, one event (up to its blank
    /// line) a chunk, with `headers` (the rate-limit figures) as a
    /// streaming answer carries them.
    fn events(&self, mut headers: Vec<(String, String)>, stream: &str) -> Behavior {
        headers.retain(|(k, _)| k != "content-type");
        headers.push(("content-type".into(), "text/event-stream".into()));
        headers.push(("x-upstream".into(), self.spec.name.clone()));
        let mut chunks: Vec<Vec<u8>> = stream
            .split_inclusive("\n\n")
            .map(|e| e.as_bytes().to_vec())
            .collect();
        chunks.retain(|c| !c.is_empty());
        Behavior::Chunks {
            status: 200,
            headers,
            chunks,
            gap: std::time::Duration::from_millis(1),
        }
    }
}

impl Intercept for State {
    fn intercept(&self, req: &Recorded) -> Option<Reply> {
        Some(Reply::Respond(match self.judge(req) {
            Ok(b) => {
                lock(&self.accepted).push(req.clone());
                b
            }
            Err(b) => {
                let status = match &b {
                    Behavior::Respond { status, .. } => *status,
                    _ => 0,
                };
                lock(&self.rejected).push((status, req.clone()));
                b
            }
        }))
    }

    fn started(&self, _req: &Recorded) -> u64 {
        0
    }

    fn finished(&self, _token: u64) {}

    fn clear(&self) {
        lock(&self.accepted).clear();
        lock(&self.rejected).clear();
    }
}

/// A running fake provider. Stops when dropped.
pub struct Provider {
    state: Arc<State>,
    upstream: Upstream,
    /// The TLS front's port and runtime, for a provider with a TLS name.
    tls: Option<(u16, tokio::runtime::Runtime)>,
}

impl std::fmt::Debug for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provider")
            .field("name", &self.state.spec.name)
            .field("port", &self.port())
            .finish()
    }
}

impl Provider {
    /// Start `spec`, with TLS from `ca` when it has a TLS name.
    pub fn start(spec: Spec, ca: &Ca) -> Provider {
        let state = Arc::new(State {
            spec,
            accepted: Mutex::new(Vec::new()),
            rejected: Mutex::new(Vec::new()),
            served: AtomicU64::new(0),
            fail: AtomicU64::new(0),
            usage: Mutex::new(Usage::default()),
            answered: Mutex::new(Vec::new()),
        });
        let name = state.spec.name.clone();
        let upstream = Upstream::start_with(&name, Some(state.clone()))
            .unwrap_or_else(|e| panic!("start provider {name}: {e}"));
        let tls = state
            .spec
            .host
            .as_deref()
            .map(|host| tls_front(ca.server(host), upstream.port()));
        Provider {
            state,
            upstream,
            tls,
        }
    }

    /// The port Envoy connects to (TLS when the provider has a TLS name).
    pub fn port(&self) -> u16 {
        self.tls.as_ref().map_or(self.upstream.port(), |(p, _)| *p)
    }

    /// Answer the next `n` requests it would serve with a 500 (an engine
    /// error), as they arrive.
    pub fn fail_next(&self, n: u64) {
        self.state.fail.store(n, Ordering::SeqCst);
    }

    /// Give back its whole rate limit now, whatever reset it said (its
    /// window turned).
    pub fn replenish(&self) {
        self.state.served.store(0, Ordering::SeqCst);
    }

    /// Report `usage` in every answer from now on.
    pub fn answer_usage(&self, usage: Usage) {
        *lock(&self.state.usage) = usage;
    }

    /// The answers it served (200s), in order: when, the model, the usage
    /// each reported; what its bill charges (`ace_tests::bill` writes it).
    pub fn served(&self) -> Vec<Served> {
        lock(&self.state.answered).clone()
    }

    /// The requests it served, as they arrived.
    pub fn accepted(&self) -> Vec<Recorded> {
        lock(&self.state.accepted).clone()
    }

    /// The requests it refused, with the status it answered.
    pub fn rejected(&self) -> Vec<(u16, Recorded)> {
        lock(&self.state.rejected).clone()
    }

    /// The Envoy cluster `name` that reaches it: TLS to its name (SNI, only
    /// `ca` trusted, the name checked) when it has one, and its credential
    /// injected from an SDS secret file written under `secrets` by Envoy's
    /// credential injector as an upstream filter, overwriting whatever the
    /// request carried (`envoy/providers.yaml` ships the same).
    pub fn cluster(&self, name: &str, ca: &Ca, secrets: &Path) -> Value {
        let spec = &self.state.spec;
        let (header, value) = &spec.credential;
        let (prefix, key) = match value.strip_prefix("Bearer ") {
            Some(k) => ("Bearer ", k),
            None => ("", value.as_str()),
        };
        let key_file = secrets.join(format!("{name}.key"));
        let secret_file = secrets.join(format!("{name}.yaml"));
        std::fs::write(&key_file, format!("{key}\n")).unwrap_or_else(|e| panic!("{e}"));
        let secret = json!({"resources": [{
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret",
            "name": format!("{name}_key"),
            "generic_secret": {"secret": {"filename": key_file}}
        }]});
        std::fs::write(&secret_file, secret.to_string()).unwrap_or_else(|e| panic!("{e}"));
        let mut cluster = crate::envoy::static_cluster(name, self.port());
        let options = json!({
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http_protocol_options": {}},
                    "http_filters": [
                        {"name": "envoy.filters.http.credential_injector",
                         "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.credential_injector.v3.CredentialInjector",
                            "overwrite": true,
                            "credential": {
                                "name": "envoy.http.injected_credentials.generic",
                                "typed_config": {
                                    "@type": "type.googleapis.com/envoy.extensions.http.injected_credentials.generic.v3.Generic",
                                    "header": header,
                                    "header_value_prefix": prefix,
                                    "credential": {
                                        "name": format!("{name}_key"),
                                        "sds_config": {
                                            "path_config_source": {"path": secret_file},
                                            "resource_api_version": "V3"
                                        }
                                    }
                                }
                            }
                         }},
                        {"name": "envoy.filters.http.upstream_codec",
                         "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.upstream_codec.v3.UpstreamCodec"}}
                    ]
                }
        });
        if let Some(c) = cluster.as_object_mut() {
            c.insert("typed_extension_protocol_options".into(), options);
        }
        if let (Some(host), Some(c)) = (&spec.host, cluster.as_object_mut()) {
            c.insert(
                "transport_socket".into(),
                json!({
                    "name": "envoy.transport_sockets.tls",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                        "sni": host,
                        "common_tls_context": {"validation_context": {
                            "trusted_ca": {"filename": ca.file()},
                            "match_typed_subject_alt_names": [
                                {"san_type": "DNS", "matcher": {"exact": host}}
                            ]
                        }}
                    }
                }),
            );
        }
        cluster
    }
}

/// A streamed chat completion as OpenAI sends it ("Create chat
/// completion", streaming): two events and `[DONE]`; with
/// `stream_options.include_usage`, `"usage":null` last in every event and
/// an event with no choices and the usage (12 in, 3 out) before `[DONE]`.
pub fn stream_events(model: &str, include_usage: bool) -> String {
    chat_stream(model, include_usage, Usage::default())
}

/// [`stream_events`] reporting `usage`.
fn chat_stream(model: &str, include_usage: bool, usage: Usage) -> String {
    let null = if include_usage {
        r#","usage":null"#
    } else {
        ""
    };
    let head = format!(
        r#""id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"{model}""#
    );
    let mut s = format!(
        "data: {{{head},\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"hi\"}}}}]{null}}}\n\n\
         data: {{{head},\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\"}}]{null}}}\n\n"
    );
    if include_usage {
        let cached = if usage.cached > 0 {
            format!(
                r#","prompt_tokens_details":{{"cached_tokens":{}}}"#,
                usage.cached
            )
        } else {
            String::new()
        };
        s.push_str(&format!(
            "data: {{{head},\"choices\":[],\"usage\":{{\"prompt_tokens\":{},\"completion_tokens\":{},\"total_tokens\":{}{cached}}}}}\n\n",
            usage.input,
            usage.output,
            usage.input + usage.output
        ));
    }
    s.push_str("data: [DONE]\n\n");
    s
}

/// The answer after a usage fixture's `# ----` header line.
fn payload(fixture: &'static str) -> &'static str {
    match fixture.split_once("# ----\n") {
        Some((_, answer)) => answer,
        None => panic!("a usage fixture's header ends in a `# ----` line"),
    }
}

/// `text` with `from`, which it holds, replaced by `to` everywhere.
fn put(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "`{from}` in the documented example");
    text.replace(from, to)
}

/// The Responses API's usage object for `usage`.
fn responses_usage(usage: Usage) -> Value {
    json!({
        "input_tokens": usage.input,
        "input_tokens_details": {"cached_tokens": usage.cached},
        "output_tokens": usage.output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.input + usage.output
    })
}

/// A streamed Responses API answer: the API reference's "Streaming"
/// example (`flow/tests/fixtures/usage/openai-responses-stream.sse`, which
/// cites it), its model `model` and its `response.completed` event's
/// `response.usage` `usage`.
fn responses_stream(model: &str, usage: Usage) -> String {
    let documented = payload(include_str!(
        "../../flow/tests/fixtures/usage/openai-responses-stream.sse"
    ));
    let s = put(
        documented,
        r#""usage":{"input_tokens":37,"output_tokens":11,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":48}"#,
        &format!(r#""usage":{}"#, responses_usage(usage)),
    );
    put(
        &s,
        r#""model":"gpt-5.4""#,
        &format!(r#""model":{}"#, json!(model)),
    )
}

/// A Responses API answer: the API reference's "Text input" example
/// (`flow/tests/fixtures/usage/openai-responses.json`), its model `model`
/// and its usage `usage`.
fn responses_answer(model: &str, usage: Usage) -> Value {
    let mut v: Value = serde_json::from_str(payload(include_str!(
        "../../flow/tests/fixtures/usage/openai-responses.json"
    )))
    .unwrap_or_else(|e| panic!("openai-responses.json: {e}"));
    v["model"] = model.into();
    v["usage"] = responses_usage(usage);
    v
}

/// A streamed Anthropic Messages answer: the "Streaming Messages" page's
/// basic example (`flow/tests/fixtures/usage/anthropic-stream-basic.sse`,
/// which cites it), its model `model`, `message_start`'s `message.usage`
/// the input (uncached, cache writes and reads apart, as Anthropic counts
/// them) and `message_delta`'s cumulative `output_tokens` `usage.output`.
fn anthropic_stream(model: &str, usage: Usage) -> String {
    let documented = payload(include_str!(
        "../../flow/tests/fixtures/usage/anthropic-stream-basic.sse"
    ));
    let s = put(
        documented,
        r#""usage": {"input_tokens": 25, "output_tokens": 1}"#,
        &format!(
            r#""usage": {{"input_tokens": {}, "cache_creation_input_tokens": {}, "cache_read_input_tokens": {}, "output_tokens": 1}}"#,
            usage.uncached(),
            usage.cache_write,
            usage.cached
        ),
    );
    let s = put(
        &s,
        r#""usage": {"output_tokens": 15}"#,
        &format!(r#""usage": {{"output_tokens": {}}}"#, usage.output),
    );
    put(
        &s,
        r#""model": "claude-sonnet-4-5-20250929""#,
        &format!(r#""model": {}"#, json!(model)),
    )
}

/// A TLS listener on a free loopback port whose connections are carried,
/// decrypted, to `plain` (the provider's HTTP server).
fn tls_front(config: Arc<rustls::ServerConfig>, plain: u16) -> (u16, tokio::runtime::Runtime) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("TLS front runtime: {e}"));
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(("127.0.0.1", 0)))
        .unwrap_or_else(|e| panic!("TLS front bind: {e}"));
    let port = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("TLS front address: {e}"))
        .port();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    rt.spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                // A client that fails the handshake (no TLS, another name)
                // gets nothing.
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(mut inner) = tokio::net::TcpStream::connect(("127.0.0.1", plain)).await
                else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut inner).await;
            });
        }
    });
    (port, rt)
}
