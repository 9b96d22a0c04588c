//! A vLLM-like test model server: an [`Upstream`] that also answers
//! `GET /metrics` and `GET /v1/models` the way vLLM does.
//!
//! Why it exists: ACE's control service scrapes every self-hosted
//! destination's Prometheus endpoint and `/v1/models` to learn its load and
//! which models and LoRA adapters it serves. End-to-end tests against a real
//! Envoy need upstreams that answer those the way vLLM does, whose figures
//! move with the load the test puts on them, and that can be told to report
//! a queue past its knee or to fail a scrape.
//!
//! A [`ModelServer`] is an [`Upstream`] (it derefs to one): inference
//! requests are served, recorded and counted exactly as there, and
//! [`Upstream::set_behavior`] still scripts them. On top of that:
//!
//! - `GET /metrics` answers in Prometheus' text exposition format
//!   (`content-type: text/plain; version=0.0.4; charset=utf-8`, as vLLM's
//!   `prometheus_client` writes it) with vLLM's families, `# HELP` and
//!   `# TYPE` lines, and labels `engine="0"` and `model_name` (the first base
//!   model): `vllm:num_requests_running`, `vllm:num_requests_waiting`,
//!   `vllm:kv_cache_usage_perc` (or `vllm:gpu_cache_usage_perc`, see
//!   [`Dialect`]) and, when LoRA is enabled, `vllm:lora_requests_info`.
//!   The figures follow the inference requests in flight on this server right
//!   now (see [`ModelServer::set_reported_load`] to override them).
//! - `GET /v1/models` lists the served models and adapters as vLLM's
//!   OpenAI-compatible server does; [`ModelServer::load`] and
//!   [`ModelServer::unload`] change them while it runs.
//! - Neither endpoint is an inference request: they are not in
//!   [`Upstream::count`] or [`Upstream::requests`], not in flight, and have
//!   their own counters ([`ModelServer::metrics_scrapes`],
//!   [`ModelServer::models_fetches`]).
//! - [`ModelServer::set_metrics_behavior`] and
//!   [`ModelServer::set_models_behavior`] make either endpoint fail (status,
//!   hang, garbage, closed connection).
//!
//! The load model is deliberately simple: every request in flight is either
//! running (the first `max_running` by arrival, as vLLM's scheduler admits
//! up to `--max-num-seqs`) or waiting (the rest). Only the figures model the
//! queue: requests past `max_running` are still served at once, each after
//! the delay its [`Behavior`] says.
//!
//! ```no_run
//! use ace_harness::client;
//! use ace_harness::model_server::{Config, ModelCard, ModelServer};
//!
//! let server = ModelServer::start_with(
//!     "owned-a100",
//!     Config {
//!         max_running: 4,
//!         ..Config::new("meta-llama/Llama-3.1-8B-Instruct")
//!     },
//! )?;
//! server.load(ModelCard::adapter("sql-lora", "meta-llama/Llama-3.1-8B-Instruct"));
//! let metrics = client::get(server.port(), "/metrics")?.text();
//! assert!(metrics.contains("vllm:num_requests_running{engine=\"0\","));
//! assert_eq!(server.count(), 0); // the scrape is not an inference request
//! # Ok::<(), std::io::Error>(())
//! ```

use std::fmt::Write as _;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::upstream::{Behavior, Intercept, Recorded, Reply, Upstream};

/// Which vLLM's metric names and labels `/metrics` imitates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Dialect {
    /// Today's vLLM (V1 engine): `vllm:kv_cache_usage_perc`; labels
    /// `engine` and `model_name`.
    #[default]
    V1,
    /// vLLM V1 while the old name was deprecated but still shown (from 0.9):
    /// `vllm:kv_cache_usage_perc` and also `vllm:gpu_cache_usage_perc`, whose
    /// help says `DEPRECATED`.
    V1WithGpuCache,
    /// The old V0 engine: only `vllm:gpu_cache_usage_perc`, and only the
    /// `model_name` label (no `engine`).
    V0,
}

/// One entry of `/v1/models`: a base model or a LoRA adapter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelCard {
    /// The served name (`id`), what a request's `model` names.
    pub id: String,
    /// `root`: the base model's path or Hugging Face id, or the adapter's
    /// local path.
    pub root: String,
    /// `parent`: the base model an adapter applies to; `None` for a base
    /// model.
    pub parent: Option<String>,
    /// `max_model_len`: the context window; vLLM gives none for adapters.
    pub max_model_len: Option<u64>,
}

impl ModelCard {
    /// A base model served as `id` (also its `root`) with this context window.
    pub fn base(id: &str, max_model_len: u64) -> ModelCard {
        ModelCard {
            id: id.to_string(),
            root: id.to_string(),
            parent: None,
            max_model_len: Some(max_model_len),
        }
    }

    /// A LoRA adapter `id` on base model `parent`, rooted at `/adapters/<id>`.
    pub fn adapter(id: &str, parent: &str) -> ModelCard {
        ModelCard {
            id: id.to_string(),
            root: format!("/adapters/{id}"),
            parent: Some(parent.to_string()),
            max_model_len: None,
        }
    }

    /// Whether this is a LoRA adapter (it has a parent).
    pub fn is_adapter(&self) -> bool {
        self.parent.is_some()
    }
}

/// How a [`ModelServer`] starts.
#[derive(Clone, Debug)]
pub struct Config {
    /// What `/v1/models` lists. The first base model names the metrics'
    /// `model_name` label.
    pub models: Vec<ModelCard>,
    /// Requests that run at once (vLLM's `--max-num-seqs`); the rest of those
    /// in flight are reported waiting. Default 8.
    pub max_running: usize,
    /// vLLM's `--max-loras`, the `max_lora` label of
    /// `vllm:lora_requests_info`; 0 means LoRA is not enabled and the family
    /// is not written. Default 1 (vLLM's default).
    pub max_lora: usize,
    /// Which vLLM's metric names to write. Default [`Dialect::V1`].
    pub dialect: Dialect,
}

impl Config {
    /// One base model `model` (context window 4096), defaults otherwise.
    pub fn new(model: &str) -> Config {
        Config {
            models: vec![ModelCard::base(model, 4096)],
            max_running: 8,
            max_lora: 1,
            dialect: Dialect::V1,
        }
    }
}

/// What `/metrics` or `/v1/models` does with the next requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndpointBehavior {
    /// Answer as vLLM does.
    Serve,
    /// Answer with this status and a JSON body naming the upstream.
    Status(u16),
    /// Never answer: hold the connection open until the client gives up (or
    /// the server stops), so a scrape times out.
    Hang,
    /// 200 with this body verbatim, under the endpoint's usual content-type.
    Body(Vec<u8>),
    /// Read the request, then close the connection without answering.
    Close,
}

impl EndpointBehavior {
    /// 200 with a body that is neither Prometheus text nor JSON: a truncated
    /// sample line, a sample without a value, a bad value, binary noise.
    pub fn garbage() -> EndpointBehavior {
        EndpointBehavior::Body(
            b"vllm:num_requests_running{engine=\"0\",model_name=\"\nvllm:num_requests_waiting\n\
              vllm:kv_cache_usage_perc{engine=\"0\"} zero point five\n\x00\xff{{<html>\n"
                .to_vec(),
        )
    }
}

/// A running vLLM-like server. Derefs to its [`Upstream`]; stops when dropped.
#[derive(Debug)]
pub struct ModelServer {
    upstream: Upstream,
    state: Arc<State>,
}

impl Deref for ModelServer {
    type Target = Upstream;

    fn deref(&self) -> &Upstream {
        &self.upstream
    }
}

impl ModelServer {
    /// Start a server named `name` serving base model `model`, with
    /// [`Config::new`]'s defaults.
    pub fn start(name: &str, model: &str) -> std::io::Result<ModelServer> {
        ModelServer::start_with(name, Config::new(model))
    }

    /// Start a server named `name` as `config` says.
    pub fn start_with(name: &str, config: Config) -> std::io::Result<ModelServer> {
        let state = Arc::new(State {
            max_running: config.max_running,
            max_lora: config.max_lora,
            dialect: config.dialect,
            models: Mutex::new(config.models),
            in_flight: Mutex::new(InFlight::default()),
            reported: Mutex::new(None),
            metrics_behavior: Mutex::new(EndpointBehavior::Serve),
            models_behavior: Mutex::new(EndpointBehavior::Serve),
            metrics_scrapes: AtomicUsize::new(0),
            models_fetches: AtomicUsize::new(0),
            lora_series: Mutex::new(Vec::new()),
            permission_ids: AtomicU64::new(0),
        });
        let upstream = Upstream::start_with(name, Some(state.clone() as Arc<dyn Intercept>))?;
        Ok(ModelServer { upstream, state })
    }

    /// The underlying upstream (also reachable through deref).
    pub fn upstream(&self) -> &Upstream {
        &self.upstream
    }

    /// Replace what `/v1/models` lists.
    pub fn set_models(&self, models: Vec<ModelCard>) {
        *lock(&self.state.models) = models;
    }

    /// Load a model or adapter: replace the card with the same id, or add it
    /// at the end.
    pub fn load(&self, card: ModelCard) {
        let mut models = lock(&self.state.models);
        match models.iter_mut().find(|m| m.id == card.id) {
            Some(m) => *m = card,
            None => models.push(card),
        }
    }

    /// Unload model or adapter `id`; whether it was listed.
    pub fn unload(&self, id: &str) -> bool {
        let mut models = lock(&self.state.models);
        let before = models.len();
        models.retain(|m| m.id != id);
        models.len() != before
    }

    /// What `/v1/models` lists now.
    pub fn models(&self) -> Vec<ModelCard> {
        lock(&self.state.models).clone()
    }

    /// Report `running` and `waiting` requests (and the KV-cache usage they
    /// imply) whatever the real load, e.g. a queue past its knee.
    pub fn set_reported_load(&self, running: usize, waiting: usize) {
        *lock(&self.state.reported) = Some((running, waiting));
    }

    /// Report the real load again.
    pub fn clear_reported_load(&self) {
        *lock(&self.state.reported) = None;
    }

    /// Change what `GET /metrics` does with the next scrapes.
    pub fn set_metrics_behavior(&self, b: EndpointBehavior) {
        *lock(&self.state.metrics_behavior) = b;
    }

    /// Change what `GET /v1/models` does with the next fetches.
    pub fn set_models_behavior(&self, b: EndpointBehavior) {
        *lock(&self.state.models_behavior) = b;
    }

    /// How many `GET /metrics` it has received (answered or not) since start
    /// or the last [`Upstream::clear`].
    pub fn metrics_scrapes(&self) -> usize {
        self.state.metrics_scrapes.load(Ordering::SeqCst)
    }

    /// How many `GET /v1/models` it has received (answered or not) since
    /// start or the last [`Upstream::clear`].
    pub fn models_fetches(&self) -> usize {
        self.state.models_fetches.load(Ordering::SeqCst)
    }

    /// The body `GET /metrics` would answer now when serving (it updates
    /// the `vllm:lora_requests_info` series as a scrape would, but is not
    /// counted as one).
    pub fn metrics_text(&self) -> String {
        self.state.metrics_text()
    }
}

/// Distinct label pairs of `vllm:lora_requests_info` the gauge keeps.
const LORA_SERIES_CAP: usize = 32;

#[derive(Default)]
struct InFlight {
    next: u64,
    /// In arrival order: token, and the adapter the request names (if any).
    reqs: Vec<(u64, Option<String>)>,
}

struct LoraSeries {
    running: String,
    waiting: String,
    at: f64,
}

struct State {
    max_running: usize,
    max_lora: usize,
    dialect: Dialect,
    models: Mutex<Vec<ModelCard>>,
    in_flight: Mutex<InFlight>,
    reported: Mutex<Option<(usize, usize)>>,
    metrics_behavior: Mutex<EndpointBehavior>,
    models_behavior: Mutex<EndpointBehavior>,
    metrics_scrapes: AtomicUsize,
    models_fetches: AtomicUsize,
    /// Every label pair `vllm:lora_requests_info` has had, with when it last
    /// held: vLLM's gauge keeps old label sets, so a scrape sees stale series
    /// next to the current one (the newest value is current).
    lora_series: Mutex<Vec<LoraSeries>>,
    permission_ids: AtomicU64,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("max_running", &self.max_running)
            .field("max_lora", &self.max_lora)
            .field("dialect", &self.dialect)
            .finish_non_exhaustive()
    }
}

impl Intercept for State {
    fn intercept(&self, req: &Recorded) -> Option<Reply> {
        if req.method != "GET" {
            return None;
        }
        let path = req.path.split('?').next().unwrap_or("");
        let (behavior, content_type) = match path {
            "/metrics" => {
                self.metrics_scrapes.fetch_add(1, Ordering::SeqCst);
                (
                    lock(&self.metrics_behavior).clone(),
                    "text/plain; version=0.0.4; charset=utf-8",
                )
            }
            "/v1/models" => {
                self.models_fetches.fetch_add(1, Ordering::SeqCst);
                (lock(&self.models_behavior).clone(), "application/json")
            }
            _ => return None,
        };
        let body = match behavior {
            EndpointBehavior::Serve if path == "/metrics" => self.metrics_text().into_bytes(),
            EndpointBehavior::Serve => self.models_json().into_bytes(),
            EndpointBehavior::Body(b) => b,
            EndpointBehavior::Status(code) => return Some(Reply::Respond(Behavior::Status(code))),
            EndpointBehavior::Hang => return Some(Reply::Hang),
            EndpointBehavior::Close => return Some(Reply::Respond(Behavior::Close)),
        };
        Some(Reply::Respond(Behavior::Respond {
            status: 200,
            headers: vec![("content-type".into(), content_type.into())],
            body,
        }))
    }

    fn started(&self, req: &Recorded) -> u64 {
        let adapter = self.adapter_named_by(&req.body);
        let mut f = lock(&self.in_flight);
        f.next += 1;
        let token = f.next;
        f.reqs.push((token, adapter));
        token
    }

    fn finished(&self, token: u64) {
        lock(&self.in_flight).reqs.retain(|(t, _)| *t != token);
    }

    fn clear(&self) {
        self.metrics_scrapes.store(0, Ordering::SeqCst);
        self.models_fetches.store(0, Ordering::SeqCst);
    }
}

impl State {
    /// The adapter a request body's `model` names, if it names one. Bodies
    /// are parsed only while adapters are listed.
    fn adapter_named_by(&self, body: &[u8]) -> Option<String> {
        let models = lock(&self.models);
        if !models.iter().any(ModelCard::is_adapter) {
            return None;
        }
        let v: serde_json::Value = serde_json::from_slice(body).ok()?;
        let model = v.get("model")?.as_str()?;
        models
            .iter()
            .find(|m| m.is_adapter() && m.id == model)
            .map(|m| m.id.clone())
    }

    fn metrics_text(&self) -> String {
        let model = lock(&self.models)
            .iter()
            .find(|m| !m.is_adapter())
            .map(|m| escape_label(&m.id))
            .unwrap_or_default();
        let labels = match self.dialect {
            Dialect::V0 => format!("model_name=\"{model}\""),
            Dialect::V1 | Dialect::V1WithGpuCache => {
                format!("engine=\"0\",model_name=\"{model}\"")
            }
        };
        let (running, waiting, running_adapters, waiting_adapters) = {
            let f = lock(&self.in_flight);
            let mut running_adapters = String::new();
            let mut waiting_adapters = String::new();
            for (i, (_, adapter)) in f.reqs.iter().enumerate() {
                let Some(a) = adapter else { continue };
                let list = if i < self.max_running {
                    &mut running_adapters
                } else {
                    &mut waiting_adapters
                };
                if !list.split(',').any(|x| x == a) {
                    if !list.is_empty() {
                        list.push(',');
                    }
                    list.push_str(a);
                }
            }
            let n = f.reqs.len();
            let (running, waiting) = lock(&self.reported)
                .unwrap_or((n.min(self.max_running), n.saturating_sub(self.max_running)));
            (running, waiting, running_adapters, waiting_adapters)
        };
        let kv = if self.max_running == 0 {
            0.0
        } else {
            running.min(self.max_running) as f64 / self.max_running as f64
        };

        let mut out = String::with_capacity(2048);
        // prometheus_client's default collectors come first; one stands for them.
        out.push_str(
            "# HELP python_info Python platform information\n\
             # TYPE python_info gauge\n\
             python_info{implementation=\"CPython\",major=\"3\",minor=\"12\",\
             patchlevel=\"11\",version=\"3.12.11\"} 1.0\n",
        );
        let (running_help, gpu_help) = match self.dialect {
            Dialect::V0 => (
                "Number of requests currently running on GPU.",
                "GPU KV-cache usage. 1 means 100 percent usage.",
            ),
            Dialect::V1 | Dialect::V1WithGpuCache => (
                "Number of requests in model execution batches.",
                // vLLM's text, missing space included.
                "GPU KV-cache usage. 1 means 100 percent usage.\
                 DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
            ),
        };
        gauge(
            &mut out,
            "vllm:num_requests_running",
            running_help,
            &labels,
            running as f64,
        );
        gauge(
            &mut out,
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            &labels,
            waiting as f64,
        );
        if self.dialect != Dialect::V1 {
            gauge(&mut out, "vllm:gpu_cache_usage_perc", gpu_help, &labels, kv);
        }
        if self.dialect != Dialect::V0 {
            gauge(
                &mut out,
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
                &labels,
                kv,
            );
        }
        if self.max_lora > 0 {
            self.lora_info(&mut out, running_adapters, waiting_adapters);
        }
        out
    }

    /// Write `vllm:lora_requests_info`: the current adapters stamped now,
    /// after the label pairs seen before with when they last held.
    fn lora_info(&self, out: &mut String, running: String, waiting: String) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let mut series = lock(&self.lora_series);
        match series
            .iter_mut()
            .find(|s| s.running == running && s.waiting == waiting)
        {
            Some(s) => s.at = now,
            None => {
                if series.len() == LORA_SERIES_CAP {
                    series.remove(0);
                }
                series.push(LoraSeries {
                    running,
                    waiting,
                    at: now,
                });
            }
        }
        out.push_str(
            "# HELP vllm:lora_requests_info Running stats on lora requests.\n\
             # TYPE vllm:lora_requests_info gauge\n",
        );
        for s in series.iter() {
            let _ = write!(
                out,
                "vllm:lora_requests_info{{max_lora=\"{}\",running_lora_adapters=\"{}\",\
                 waiting_lora_adapters=\"{}\"}} ",
                self.max_lora,
                escape_label(&s.running),
                escape_label(&s.waiting),
            );
            push_value(out, s.at);
            out.push('\n');
        }
    }

    fn models_json(&self) -> String {
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let models = lock(&self.models);
        let data: Vec<serde_json::Value> = models
            .iter()
            .map(|m| {
                let perm = self.permission_ids.fetch_add(1, Ordering::Relaxed);
                serde_json::json!({
                    "id": m.id,
                    "object": "model",
                    "created": created,
                    "owned_by": "vllm",
                    "root": m.root,
                    "parent": m.parent,
                    "max_model_len": m.max_model_len,
                    "permission": [{
                        "id": format!("modelperm-{perm:032x}"),
                        "object": "model_permission",
                        "created": created,
                        "allow_create_engine": false,
                        "allow_sampling": true,
                        "allow_logprobs": true,
                        "allow_search_indices": false,
                        "allow_view": true,
                        "allow_fine_tuning": false,
                        "organization": "*",
                        "group": null,
                        "is_blocking": false,
                    }],
                })
            })
            .collect();
        serde_json::json!({"object": "list", "data": data}).to_string()
    }
}

/// One gauge family with one sample.
fn gauge(out: &mut String, name: &str, help: &str, labels: &str, value: f64) {
    let _ = write!(
        out,
        "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{labels}}} "
    );
    push_value(out, value);
    out.push('\n');
}

/// A sample value as Python's `prometheus_client` writes it: `repr` of the
/// float (`3.0`, `0.375`), and from a million up Go's exponent form
/// (`1.7886264577368872e+09`).
fn push_value(out: &mut String, v: f64) {
    let mut s = format!("{v}");
    if v.is_finite() && !s.contains(['.', 'e']) {
        s.push_str(".0");
    }
    match s.find('.') {
        Some(dot) if v > 0.0 && dot > 6 => {
            let digits: String = s.chars().filter(|c| *c != '.').collect();
            let mantissa = format!("{}.{}", &digits[..1], &digits[1..]);
            let mantissa = mantissa.trim_end_matches(['0', '.']);
            let _ = write!(out, "{mantissa}e+0{}", dot - 1);
        }
        _ => out.push_str(&s),
    }
}

/// A label value escaped for the text format (backslash, quote, newline).
fn escape_label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{self, Request, Response};
    use std::time::{Duration, Instant};

    const BASE: &str = "meta-llama/Llama-3.1-8B-Instruct";

    /// Check `text` is well-formed exposition text (every sample's family has
    /// `# HELP` and `# TYPE` before it, every value is a float) and return its
    /// samples as (name, labels, value).
    fn parse(text: &str) -> Vec<(String, String, f64)> {
        assert!(text.ends_with('\n'), "no final newline: {text:?}");
        let mut helped = Vec::new();
        let mut typed = Vec::new();
        let mut samples = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                helped.push(rest.split(' ').next().unwrap().to_string());
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert_eq!(kind, "gauge", "{line}");
                typed.push(name.to_string());
            } else {
                let (series, value) = line.rsplit_once(' ').expect(line);
                let (name, labels) = match series.split_once('{') {
                    Some((n, l)) => (n, l.strip_suffix('}').expect(line)),
                    None => (series, ""),
                };
                assert!(helped.iter().any(|h| h == name), "no HELP for {line}");
                assert!(typed.iter().any(|t| t == name), "no TYPE for {line}");
                let value: f64 = value.parse().unwrap_or_else(|e| panic!("{line}: {e}"));
                samples.push((name.to_string(), labels.to_string(), value));
            }
        }
        samples
    }

    /// The value of the one sample of `name`.
    fn value(samples: &[(String, String, f64)], name: &str) -> f64 {
        let mut found = samples.iter().filter(|s| s.0 == name);
        let s = found.next().unwrap_or_else(|| panic!("no {name}"));
        assert!(found.next().is_none(), "two samples of {name}");
        s.2
    }

    /// The labels of the newest `vllm:lora_requests_info` sample.
    fn current_lora(samples: &[(String, String, f64)]) -> String {
        samples
            .iter()
            .filter(|s| s.0 == "vllm:lora_requests_info")
            .max_by(|a, b| a.2.total_cmp(&b.2))
            .expect("no vllm:lora_requests_info")
            .1
            .clone()
    }

    fn scrape(server: &ModelServer) -> (Response, Vec<(String, String, f64)>) {
        let r = client::get(server.port(), "/metrics").expect("scrape");
        assert_eq!(r.status, 200, "{}", r.text());
        let samples = parse(&r.text());
        (r, samples)
    }

    fn wait_for_in_flight(server: &ModelServer, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.in_flight() != n {
            assert!(
                Instant::now() < deadline,
                "in flight {} != {n}",
                server.in_flight()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn chat(port: u16, model: &str) -> std::thread::JoinHandle<u16> {
        let req = Request::post_json(
            "/v1/chat/completions",
            &serde_json::json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}),
        );
        std::thread::spawn(move || req.send(port).expect("inference request").status)
    }

    fn with_adapters(max_running: usize) -> Config {
        Config {
            models: vec![
                ModelCard::base(BASE, 8192),
                ModelCard::adapter("sql-lora", BASE),
                ModelCard::adapter("chat-lora", BASE),
            ],
            max_running,
            ..Config::new(BASE)
        }
    }

    #[test]
    fn metrics_follow_the_requests_in_flight() {
        let server = ModelServer::start_with("vllm-a", with_adapters(2)).unwrap();
        let (r, samples) = scrape(&server);
        assert_eq!(
            r.header("content-type"),
            Some("text/plain; version=0.0.4; charset=utf-8")
        );
        assert_eq!(value(&samples, "vllm:num_requests_running"), 0.0);
        assert_eq!(value(&samples, "vllm:num_requests_waiting"), 0.0);
        assert_eq!(value(&samples, "vllm:kv_cache_usage_perc"), 0.0);
        let running = samples
            .iter()
            .find(|s| s.0 == "vllm:num_requests_running")
            .unwrap();
        assert_eq!(running.1, format!("engine=\"0\",model_name=\"{BASE}\""));
        assert_eq!(
            current_lora(&samples),
            "max_lora=\"1\",running_lora_adapters=\"\",waiting_lora_adapters=\"\""
        );

        // Three slow requests, started one after another so their order is
        // known: the base model, then each adapter. Two run, one waits.
        server.set_behavior(Behavior::Slow(Duration::from_secs(3)));
        let first = chat(server.port(), BASE);
        wait_for_in_flight(&server, 1);
        let (_, samples) = scrape(&server);
        assert_eq!(value(&samples, "vllm:num_requests_running"), 1.0);
        assert_eq!(value(&samples, "vllm:num_requests_waiting"), 0.0);
        assert_eq!(value(&samples, "vllm:kv_cache_usage_perc"), 0.5);
        let second = chat(server.port(), "sql-lora");
        wait_for_in_flight(&server, 2);
        let third = chat(server.port(), "chat-lora");
        wait_for_in_flight(&server, 3);
        let (_, samples) = scrape(&server);
        assert_eq!(value(&samples, "vllm:num_requests_running"), 2.0);
        assert_eq!(value(&samples, "vllm:num_requests_waiting"), 1.0);
        assert_eq!(value(&samples, "vllm:kv_cache_usage_perc"), 1.0);
        assert_eq!(
            current_lora(&samples),
            "max_lora=\"1\",running_lora_adapters=\"sql-lora\",\
             waiting_lora_adapters=\"chat-lora\""
        );

        for h in [first, second, third] {
            assert_eq!(h.join().unwrap(), 200);
        }
        // The client may read its response before the server counts it done.
        wait_for_in_flight(&server, 0);
        let (_, samples) = scrape(&server);
        assert_eq!(value(&samples, "vllm:num_requests_running"), 0.0);
        assert_eq!(value(&samples, "vllm:num_requests_waiting"), 0.0);
        assert_eq!(value(&samples, "vllm:kv_cache_usage_perc"), 0.0);
        // As in vLLM, the busy label pair stays, stamped earlier.
        let lora: Vec<_> = samples
            .iter()
            .filter(|s| s.0 == "vllm:lora_requests_info")
            .collect();
        assert_eq!(lora.len(), 2, "{lora:?}");
        let busy = lora.iter().find(|s| s.1.contains("sql-lora")).unwrap();
        let idle = lora.iter().find(|s| !s.1.contains("sql-lora")).unwrap();
        assert!(busy.2 > 1.5e9 && busy.2 < idle.2, "{lora:?}");
        assert_eq!(
            current_lora(&samples),
            "max_lora=\"1\",running_lora_adapters=\"\",waiting_lora_adapters=\"\""
        );

        assert_eq!(server.count(), 3);
        assert!(server.requests().iter().all(|r| r.method == "POST"));
        assert_eq!(server.max_in_flight(), 3);
        assert_eq!(server.metrics_scrapes(), 4);
        assert_eq!(server.models_fetches(), 0);
    }

    #[test]
    fn a_reported_load_overrides_the_real_one() {
        let server = ModelServer::start("vllm-b", BASE).unwrap();
        server.set_reported_load(40, 12);
        let (_, samples) = scrape(&server);
        assert_eq!(value(&samples, "vllm:num_requests_running"), 40.0);
        assert_eq!(value(&samples, "vllm:num_requests_waiting"), 12.0);
        assert_eq!(value(&samples, "vllm:kv_cache_usage_perc"), 1.0);
        server.set_reported_load(2, 0);
        let (_, samples) = scrape(&server);
        assert_eq!(value(&samples, "vllm:kv_cache_usage_perc"), 0.25);
        server.clear_reported_load();
        let (_, samples) = scrape(&server);
        assert_eq!(value(&samples, "vllm:num_requests_running"), 0.0);
        assert_eq!(value(&samples, "vllm:num_requests_waiting"), 0.0);
        assert_eq!(server.count(), 0);
        assert_eq!(server.metrics_scrapes(), 3);
    }

    #[test]
    fn metrics_can_fail_every_way_a_scrape_can() {
        let server = ModelServer::start("vllm-c", BASE).unwrap();

        server.set_metrics_behavior(EndpointBehavior::Status(500));
        let r = client::get(server.port(), "/metrics").unwrap();
        assert_eq!(r.status, 500);

        server.set_metrics_behavior(EndpointBehavior::garbage());
        let r = client::get(server.port(), "/metrics").unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(
            r.header("content-type"),
            Some("text/plain; version=0.0.4; charset=utf-8")
        );
        let unparsable = std::panic::catch_unwind(|| parse(&r.text()));
        assert!(unparsable.is_err(), "garbage parsed: {:?}", r.text());

        server.set_metrics_behavior(EndpointBehavior::Hang);
        let timeout = Duration::from_millis(300);
        let started = Instant::now();
        let err = Request {
            timeout,
            ..Request::get("/metrics")
        }
        .send(server.port())
        .expect_err("a hanging /metrics answered");
        assert!(
            matches!(
                err.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "{err}"
        );
        assert!(started.elapsed() >= timeout);

        server.set_metrics_behavior(EndpointBehavior::Close);
        assert!(client::get(server.port(), "/metrics").is_err());

        server.set_metrics_behavior(EndpointBehavior::Serve);
        scrape(&server);
        assert_eq!(server.metrics_scrapes(), 5);
        assert_eq!(server.count(), 0);
        assert_eq!(server.in_flight(), 0);

        // A scrape left hanging does not hold up the server's drop.
        server.set_metrics_behavior(EndpointBehavior::Hang);
        let port = server.port();
        let hung = std::thread::spawn(move || client::get(port, "/metrics"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.metrics_scrapes() < 6 {
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(5));
        }
        let dropping = Instant::now();
        drop(server);
        assert!(dropping.elapsed() < Duration::from_secs(2));
        // Its connection closes within the server's 200 ms poll.
        assert!(hung.join().unwrap().is_err());
    }

    #[test]
    fn models_list_adapters_with_their_parents_and_follow_loads() {
        let server = ModelServer::start_with("vllm-d", with_adapters(8)).unwrap();
        let r = client::get(server.port(), "/v1/models").unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-type"), Some("application/json"));
        let v = r.json().unwrap();
        assert_eq!(v["object"], "list");
        let data = v["data"].as_array().unwrap();
        let ids: Vec<&str> = data.iter().map(|m| m["id"].as_str().unwrap()).collect();
        assert_eq!(ids, [BASE, "sql-lora", "chat-lora"]);
        for m in data {
            assert_eq!(m["object"], "model");
            assert_eq!(m["owned_by"], "vllm");
            assert!(m["created"].as_u64().unwrap() > 1_500_000_000);
            assert_eq!(m["permission"][0]["object"], "model_permission");
        }
        assert_eq!(data[0]["root"], BASE);
        assert!(data[0]["parent"].is_null());
        assert_eq!(data[0]["max_model_len"], 8192);
        assert_eq!(data[1]["root"], "/adapters/sql-lora");
        assert_eq!(data[1]["parent"], BASE);
        assert!(data[1]["max_model_len"].is_null());

        // Unload one adapter, load another, then swap the base model.
        assert!(server.unload("sql-lora"));
        assert!(!server.unload("sql-lora"));
        server.load(ModelCard::adapter("summarise-lora", BASE));
        let v = client::get(server.port(), "/v1/models")
            .unwrap()
            .json()
            .unwrap();
        let ids: Vec<&str> = v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, [BASE, "chat-lora", "summarise-lora"]);
        server.set_models(vec![ModelCard::base("Qwen/Qwen2.5-7B-Instruct", 32768)]);
        let v = client::get(server.port(), "/v1/models")
            .unwrap()
            .json()
            .unwrap();
        assert_eq!(v["data"].as_array().unwrap().len(), 1);
        assert_eq!(v["data"][0]["id"], "Qwen/Qwen2.5-7B-Instruct");
        assert_eq!(
            server.models(),
            [ModelCard::base("Qwen/Qwen2.5-7B-Instruct", 32768)]
        );
        // The metrics follow the base model.
        assert!(server
            .metrics_text()
            .contains("model_name=\"Qwen/Qwen2.5-7B-Instruct\""));

        server.set_models_behavior(EndpointBehavior::Status(503));
        assert_eq!(
            client::get(server.port(), "/v1/models").unwrap().status,
            503
        );
        server.set_models_behavior(EndpointBehavior::garbage());
        assert!(client::get(server.port(), "/v1/models")
            .unwrap()
            .json()
            .is_err());

        assert_eq!(server.models_fetches(), 5);
        assert_eq!(server.metrics_scrapes(), 0);
        assert_eq!(server.count(), 0);
    }

    #[test]
    fn inference_requests_are_served_and_counted_as_on_an_upstream() {
        let server = ModelServer::start("vllm-e", BASE).unwrap();
        server.set_behavior(Behavior::Status(503));
        let r = Request::post_json("/v1/chat/completions", &serde_json::json!({"model": BASE}))
            .send(server.port())
            .unwrap();
        assert_eq!(r.status, 503);
        assert_eq!(r.header("x-upstream"), Some("vllm-e"));
        // Only GET is taken over: anything else is an inference request.
        assert_eq!(
            Request {
                method: "POST".into(),
                ..Request::get("/metrics")
            }
            .send(server.port())
            .unwrap()
            .status,
            503
        );
        client::get(server.port(), "/metrics?name[]=vllm").unwrap();
        client::get(server.port(), "/v1/models").unwrap();
        assert_eq!(server.count(), 2);
        let paths: Vec<String> = server.requests().into_iter().map(|r| r.path).collect();
        assert_eq!(paths, ["/v1/chat/completions", "/metrics"]);
        assert_eq!(server.metrics_scrapes(), 1);
        assert_eq!(server.models_fetches(), 1);
        server.clear();
        assert_eq!(server.count(), 0);
        assert_eq!(server.metrics_scrapes(), 0);
        assert_eq!(server.models_fetches(), 0);
        assert_eq!(server.upstream().name(), "vllm-e");
    }

    #[test]
    fn dialects_name_the_cache_gauge_as_their_vllm_did() {
        let text = |dialect, max_lora| {
            let server = ModelServer::start_with(
                "vllm-f",
                Config {
                    dialect,
                    max_lora,
                    ..Config::new(BASE)
                },
            )
            .unwrap();
            server.set_reported_load(2, 0);
            let text = server.metrics_text();
            parse(&text);
            text
        };
        let v1 = text(Dialect::V1, 1);
        assert!(v1.contains("\nvllm:kv_cache_usage_perc{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 0.25\n"));
        assert!(!v1.contains("gpu_cache_usage_perc"));
        assert!(v1.contains(
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        ));
        assert!(v1.contains("# TYPE vllm:lora_requests_info gauge\n"));

        let both = text(Dialect::V1WithGpuCache, 1);
        assert!(both.contains("\nvllm:kv_cache_usage_perc{engine=\"0\","));
        assert!(both.contains("\nvllm:gpu_cache_usage_perc{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 0.25\n"));
        assert!(both.contains("DEPRECATED: Use vllm:kv_cache_usage_perc instead."));

        let v0 = text(Dialect::V0, 0);
        assert!(!v0.contains("kv_cache_usage_perc"));
        assert!(!v0.contains("engine="));
        assert!(v0.contains(
            "\nvllm:gpu_cache_usage_perc{model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 0.25\n"
        ));
        assert!(v0.contains(
            "\nvllm:num_requests_running{model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 2.0\n"
        ));
        assert!(!v0.contains("lora_requests_info"), "max_lora 0 is LoRA off");
    }

    #[test]
    fn values_are_written_as_prometheus_client_writes_them() {
        let w = |v| {
            let mut s = String::new();
            push_value(&mut s, v);
            s
        };
        assert_eq!(w(0.0), "0.0");
        assert_eq!(w(3.0), "3.0");
        assert_eq!(w(0.375), "0.375");
        assert_eq!(w(123456.0), "123456.0");
        assert_eq!(w(1234567.0), "1.234567e+06");
        assert_eq!(w(12345678.5), "1.23456785e+07");
        assert_eq!(w(1788626457.7368872), "1.7886264577368872e+09");
        assert_eq!(w(1e9), "1e+09");
        assert_eq!(
            "1.7886264577368872e+09".parse::<f64>(),
            Ok(1788626457.7368872)
        );
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
