//! Shared helpers for ACE's real-Envoy integration tests (in `tests/tests/`).
//!
//! Every test here needs a real Envoy and fails, never skips, when it is
//! missing: the error names Envoy and `make setup`.
#![forbid(unsafe_code)]

pub mod bill;

use ace_harness::envoy::{Envoy, EnvoyBuilder};
use ace_harness::upstream::Upstream;
use std::path::PathBuf;

/// Build the ACE filter for wasm32-wasip1 (once per test binary) or fail
/// the test; `ACE_TEST_FILTER_WASM` names another build to run the suite
/// against instead (an earlier commit's, to show a test fails there).
pub fn ace_filter_wasm() -> PathBuf {
    if let Some(p) = std::env::var_os("ACE_TEST_FILTER_WASM") {
        return PathBuf::from(p);
    }
    match ace_harness::wasm::build("ace-filter") {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

/// The two ways ACE runs in Envoy; the e2e tests run against both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// The proxy-wasm module (`ace-filter`, V8), as Istio loads it.
    Wasm,
    /// The Envoy dynamic module (`ace-dynamic`, native).
    Dynamic,
}

impl Filter {
    /// `builder` with ACE added under plugin configuration `config`.
    pub fn add(self, builder: EnvoyBuilder, config: &str) -> EnvoyBuilder {
        builder.http_filter(self.filter_json(config))
    }

    /// ACE's HTTP filter entry (Envoy JSON) under plugin configuration
    /// `config`.
    pub fn filter_json(self, config: &str) -> serde_json::Value {
        match self {
            Filter::Wasm => ace_harness::envoy::wasm_filter_json("ace", &ace_filter_wasm(), config),
            Filter::Dynamic => {
                ace_harness::dylib::http_filter_json(&ace_dynamic_lib(), "ace", Some(config))
            }
        }
    }

    /// Like [`Filter::add`], allowing the filter to hold the request
    /// headers while it reads the body (the Wasm filter needs Envoy's
    /// `allow_on_headers_stop_iteration` for that; a dynamic module always
    /// may).
    pub fn add_reading_body(self, builder: EnvoyBuilder, config: &str) -> EnvoyBuilder {
        match self {
            Filter::Wasm => builder.wasm_filter_reading_body(&ace_filter_wasm(), config),
            Filter::Dynamic => self.add(builder, config),
        }
    }

    /// The access-log format that prints ACE's event line.
    pub fn event_log_line(self) -> &'static str {
        match self {
            Filter::Wasm => "%FILTER_STATE(wasm.ace_event:PLAIN)%",
            Filter::Dynamic => "%FILTER_STATE(ace_event:PLAIN)%",
        }
    }

    /// `builder` logging ACE's event, one JSON line per request the filter
    /// saw and nothing for requests Envoy refused before it (a codec
    /// reject): as `envoy/envoy.yaml` ships it.
    pub fn event_log(self, builder: EnvoyBuilder) -> EnvoyBuilder {
        let key = match self {
            Filter::Wasm => "wasm.ace_event",
            Filter::Dynamic => "ace_event",
        };
        builder
            .access_log_line(self.event_log_line())
            .access_log_only_if(&format!("'{key}' in filter_state"))
    }

    /// The name Envoy's Prometheus output gives ACE's counter `name`
    /// (`ace_requests`): Wasm filters' counters keep their own name there.
    pub fn prometheus(self, name: &str) -> String {
        match self {
            Filter::Wasm => name.to_string(),
            Filter::Dynamic => format!("envoy_dynamicmodulescustom_{name}"),
        }
    }

    /// The name Envoy's stats give ACE's counter `name` (`ace.requests`).
    pub fn stat(self, name: &str) -> String {
        match self {
            Filter::Wasm => format!("wasmcustom.{name}"),
            Filter::Dynamic => format!("dynamicmodulescustom.{name}"),
        }
    }
}

/// Build the ACE dynamic module (once per test binary) or fail the test;
/// `ACE_TEST_DYNAMIC_LIB` names another build, as for
/// [`ace_filter_wasm`].
pub fn ace_dynamic_lib() -> PathBuf {
    if let Some(p) = std::env::var_os("ACE_TEST_DYNAMIC_LIB") {
        return PathBuf::from(p);
    }
    match ace_harness::dylib::build("ace-dynamic") {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

/// Run each named test function (taking a [`Filter`]) once per filter, as
/// tests `wasm::NAME` and `dynamic_module::NAME`.
#[macro_export]
macro_rules! for_each_filter {
    ($($name:ident),* $(,)?) => {
        mod wasm {
            $(#[test]
            fn $name() {
                super::$name($crate::Filter::Wasm)
            })*
        }
        mod dynamic_module {
            $(#[test]
            fn $name() {
                super::$name($crate::Filter::Dynamic)
            })*
        }
    };
}

/// Start Envoy from `builder` or fail the test with Envoy's log.
pub fn start(builder: &EnvoyBuilder) -> Envoy {
    match builder.start() {
        Ok(e) => e,
        Err(e) => panic!("{e}"),
    }
}

/// Start one upstream or fail the test.
pub fn upstream(name: &str) -> Upstream {
    match Upstream::start(name) {
        Ok(u) => u,
        Err(e) => panic!("cannot start upstream {name}: {e}"),
    }
}

/// Fake providers (`ace_harness::provider`) behind one Envoy, each
/// reached by its own cluster: TLS to its name, its own key injected.
#[derive(Debug)]
pub struct ProviderFleet {
    pub envoy: Envoy,
    /// In the order of the specs they were started from.
    pub providers: Vec<ace_harness::provider::Provider>,
    names: Vec<String>,
    /// The plugin configuration, for the prices the providers bill at.
    config: serde_json::Value,
    _ca: ace_harness::provider::Ca,
    _secrets: tempfile::TempDir,
}

impl ProviderFleet {
    /// Starts a provider per spec, a cluster per provider (named as its
    /// spec) and per `plain` upstream (cluster name, port), and Envoy with
    /// `filter` under plugin configuration `config`, logging its events.
    pub fn start(
        filter: Filter,
        config: &serde_json::Value,
        specs: Vec<ace_harness::provider::Spec>,
        plain: &[(&str, u16)],
    ) -> ProviderFleet {
        use ace_harness::provider::{Ca, Provider};
        require_envoy();
        let ca = Ca::new();
        let secrets = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
        let providers: Vec<Provider> = specs.into_iter().map(|s| Provider::start(s, &ca)).collect();
        let mut b = filter
            .add_reading_body(EnvoyBuilder::new(), &config.to_string())
            .node("ace-test", "ace-test")
            .access_log_line(filter.event_log_line());
        for (name, p) in names.iter().zip(&providers) {
            b = b.cluster_json(p.cluster(name, &ca, secrets.path()));
        }
        for (name, port) in plain {
            b = b.cluster(name, *port);
        }
        ProviderFleet {
            envoy: start(&b),
            providers,
            names,
            config: config.clone(),
            _ca: ca,
            _secrets: secrets,
        }
    }

    /// The provider started from the spec named `name`.
    pub fn provider(&self, name: &str) -> &ace_harness::provider::Provider {
        let i = self.names.iter().position(|n| n == name);
        match i.and_then(|i| self.providers.get(i)) {
            Some(p) => p,
            None => panic!("no provider {name} in this fleet"),
        }
    }

    /// The bill, in `format`, of the provider started from the spec named
    /// `name`: what it served ([`ace_harness::provider::Provider::served`])
    /// at the prices of the configuration's destination of the same name
    /// ([`bill`]).
    pub fn bill(&self, name: &str, format: bill::Format) -> String {
        let config = ace_config::Config::parse(self.config.to_string().as_bytes())
            .unwrap_or_else(|e| panic!("the fleet's configuration: {e}"));
        let dest = config
            .destinations
            .iter()
            .find(|d| d.name == name)
            .unwrap_or_else(|| panic!("no destination {name} prices provider {name}"));
        bill::write(format, &self.provider(name).served(), dest)
    }

    /// `POST path` for `model` with a client's own (forged) credentials of
    /// every kind, and the `anthropic-version` an Anthropic client sends.
    pub fn send(&self, path: &str, model: &str) -> ace_harness::client::Response {
        ace_harness::client::Request::post_json(
            path,
            &serde_json::json!({"model": model, "max_tokens": 16,
                                "messages": [{"role": "user", "content": "hi"}]}),
        )
        .header("authorization", "Bearer client-forged")
        .header("api-key", "client-forged")
        .header("x-api-key", "client-forged")
        .header("anthropic-version", "2023-06-01")
        .send(self.envoy.port())
        .unwrap_or_else(|e| panic!("request failed: {e}"))
    }
}

/// Now, in ms since the epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Snapshot `version`, made now, with these reports and no budgets,
/// encoded as the control service serves it.
pub fn snapshot(version: u64, reports: Vec<ace_snapshot::Report>) -> Vec<u8> {
    let s = ace_snapshot::Snapshot {
        version,
        generated_ms: now_ms(),
        reports,
        budgets: Vec::new(),
    };
    ace_snapshot::encode(&s).unwrap_or_else(|e| panic!("{e}"))
}

/// An upstream per destination of plugin configuration `config`, named as
/// the destination, each on the destination's cluster added to `builder`.
pub fn destination_upstreams(
    config: &serde_json::Value,
    mut builder: EnvoyBuilder,
) -> (EnvoyBuilder, Vec<Upstream>) {
    let mut ups = Vec::new();
    for d in config["destinations"].as_array().into_iter().flatten() {
        let (name, cluster) = (
            d["name"].as_str().unwrap_or(""),
            d["cluster"].as_str().unwrap_or(""),
        );
        let u = upstream(name);
        builder = builder.cluster(cluster, u.port());
        ups.push(u);
    }
    (builder, ups)
}

/// Fail the test early, with the setup hint, when Envoy is missing. Call it
/// before anything slow so the message comes first.
pub fn require_envoy() {
    if let Err(e) = ace_harness::envoy::find_envoy() {
        panic!("{e}");
    }
}

/// Run `envoy --mode validate` on the bootstrap at `path` (Envoy also
/// starts Wasm plugins in this mode) and return its output, or fail the
/// test with that output when Envoy refuses the configuration.
pub fn envoy_validate(path: &std::path::Path) -> String {
    let envoy = ace_harness::envoy::find_envoy().unwrap_or_else(|e| panic!("{e}"));
    let out = std::process::Command::new(envoy)
        .args(["--mode", "validate", "--disable-hot-restart", "-c"])
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("cannot run envoy: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("OK"),
        "envoy --mode validate refused {}:\n{text}",
        path.display()
    );
    text
}

/// Tables for the residency rule the hostile-input tests share: one
/// `data_class` attribute (values 1 `personal_eu`, 2 `public`; 0 unknown),
/// every destination permitted, personal EU data forbidden on the
/// destinations in `outside_eu` (a bit per destination), unknown values
/// forbidden everywhere. Each destination's cluster is its name with `-`
/// as `_`.
pub fn residency_spec(names: &[&str], outside_eu: u64) -> ace_core::tables::TableSpec {
    use ace_core::tables::{AttributeSpec, FactorKind, FactorSpec, TableSpec};
    let all = (1u64 << names.len()) - 1;
    TableSpec {
        destinations: destinations(names),
        attributes: vec![AttributeSpec::new("data_class", &["personal_eu", "public"])],
        factors: vec![
            FactorSpec {
                kind: FactorKind::Permit,
                attributes: vec![],
                rows: vec![all],
            },
            FactorSpec {
                kind: FactorKind::Forbid,
                attributes: vec![0],
                rows: vec![all, outside_eu, 0],
            },
        ],
    }
}

/// Destinations named `names`, each one's cluster its name with `-` as
/// `_`, for a table spec.
pub fn destinations(names: &[&str]) -> Vec<ace_core::tables::DestinationSpec> {
    names
        .iter()
        .map(|n| ace_core::tables::DestinationSpec {
            name: n.to_string(),
            cluster: n.replace('-', "_"),
        })
        .collect()
}

/// Tables over one attribute, encoded and in base64: destinations `names`
/// ([`destinations`]), the attribute `attribute` with `values` (value
/// index 0 is unknown, then `values` in order), and one permit factor over
/// it whose row for value index `i` is `rows[i]` (bit `d` permits
/// `names[d]`).
pub fn permit_tables(names: &[&str], attribute: &str, values: &[&str], rows: &[u64]) -> String {
    use ace_core::tables::{AttributeSpec, FactorKind, FactorSpec, TableSpec};
    tables_base64(&TableSpec {
        destinations: destinations(names),
        attributes: vec![AttributeSpec {
            name: attribute.into(),
            values: values.iter().map(|v| v.to_string()).collect(),
        }],
        factors: vec![FactorSpec {
            kind: FactorKind::Permit,
            attributes: vec![0],
            rows: rows.to_vec(),
        }],
    })
}

/// `spec` encoded and in base64, as `tables_base64` takes it.
pub fn tables_base64(spec: &ace_core::tables::TableSpec) -> String {
    use base64::Engine;
    let bytes = ace_core::tables::encode(spec).unwrap_or_else(|e| panic!("{e}"));
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// `models` priced at `now_ms` from their health and loads alone (nothing
/// signalled or learned, the default health policy): the slate a decision
/// reads.
pub fn priced(
    models: &[ace_core::cost::CostModel],
    health: &[ace_core::health::Health],
    in_flight: &[u32],
    now_ms: u64,
) -> ace_core::dispatch::Slate {
    use ace_core::dispatch::{Fleet, Slate};
    let policy = ace_core::health::HealthPolicy::default();
    let fleet = Fleet {
        models,
        health,
        in_flight,
        live: &[],
        learned: &[],
        policy: &policy,
    };
    let mut slate = Slate::new(models.len());
    slate.refresh(&fleet, now_ms);
    slate
}

/// The health of a destination after `events`, for property tests: 0 is a
/// failure, 1 a 429 with a retry-after, anything else an answer slower than
/// its SLO. Any sequence gives a state the filter can reach.
pub fn health_after(events: impl IntoIterator<Item = u8>) -> ace_core::health::Health {
    use ace_core::health::{Health, HealthPolicy, Outcome};
    let p = HealthPolicy::default();
    let mut h = Health::default();
    for e in events {
        let o = match e {
            0 => Outcome::Failure { tenant: 0 },
            1 => Outcome::Throttled {
                retry_after_ms: Some(500),
            },
            _ => Outcome::Success {
                latency_ms: 5_000,
                slo_ms: Some(100),
                headroom: None,
            },
        };
        h.observe(o, 0, &p);
    }
    h
}

/// POSTs `body` as JSON to `/v1/chat/completions` on `port` over HTTP/2
/// (Debian's `nghttp`), with `headers` and one trailer after the body
/// (`x-checksum: 1`); fails the test when nghttp is missing or fails.
pub fn post_h2_with_trailer(port: u16, headers: &[(&str, &str)], body: &serde_json::Value) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let file = dir.path().join("body.json");
    std::fs::write(&file, body.to_string()).unwrap_or_else(|e| panic!("{e}"));
    let mut cmd = std::process::Command::new("nghttp");
    cmd.args(["--no-verify-peer", "-H", "content-type: application/json"]);
    for (k, v) in headers {
        cmd.args(["-H", &format!("{k}: {v}")]);
    }
    let out = cmd
        .args(["--trailer", "x-checksum: 1"])
        .arg("-d")
        .arg(&file)
        .arg(format!("http://127.0.0.1:{port}/v1/chat/completions"))
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run nghttp (Debian's nghttp2-client; run `make setup`): {e}")
        });
    assert!(
        out.status.success(),
        "nghttp failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether the response cache would answer a request (its attribute values
/// in `lookup`, naming `asked`) with an entry that destination `producer`
/// made serving `model`, by the filter's own check (`cache::may_serve`);
/// and whether that answer is `substituted` for the model named, as Cedar
/// must then be asked about it.
pub fn cache_would_serve(
    setup: &ace_flow::Setup,
    lookup: &mut ace_flow::request::Lookup,
    asked: ace_flow::routing::Asked,
    producer: usize,
    model: &str,
) -> (bool, bool) {
    use ace_flow::cache;
    let cfg = &setup.config;
    let (Some(tables), Some(c), Some(routing)) = (cfg.tables(), &setup.cache, &setup.routing)
    else {
        panic!("the configuration has no tables, cache or model routing");
    };
    let entry = cache::Entry {
        key: [0; 32],
        created_ms: 0,
        producer,
        model,
        status: 200,
        content_type: "application/json",
        tokens_in: 1,
        tokens_out: 1,
        estimated: false,
        digest: [0; 32],
        body: b"{}",
    };
    let mut scratch = Vec::new();
    let hit = cache::may_serve(
        cfg,
        &tables,
        lookup,
        &mut scratch,
        c,
        Some(routing),
        Some(asked),
        &entry,
    );
    let substituted =
        asked.member.is_some() && routing.reference(asked).map(|x| x.name.as_str()) != Some(model);
    (hit, substituted)
}
