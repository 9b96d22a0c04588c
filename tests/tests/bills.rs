//! The books meet the bill (issue 55), in a real Envoy, both builds: fake
//! OpenAI and Anthropic providers (`ace_harness::provider`: TLS to their
//! own names, their keys injected by Envoy) serve chat completions, a
//! streamed chat completion, a streamed Responses API answer (its usage in
//! `response.completed`'s `response.usage`, as the API reference's
//! "Streaming" example shows it) and Anthropic Messages, plain and
//! streamed (input and cache counts in `message_start`, the cumulative
//! output in `message_delta`, as "Streaming Messages" shows it). Each
//! provider then writes its bill from what it served, per model and UTC
//! day, in its own documented records (`ace_tests::bill`: OpenAI's
//! completions usage and costs, Anthropic's usage and cost reports), at
//! the configuration's prices. ACE's events, ingested into a ledger,
//! reconcile with those bills to 0 differences; the same events booked as
//! a gateway that misreads the two streams books them (the Responses
//! answer at its estimate, the Anthropic one at 0 input tokens), or a bill
//! at a price the configuration lacks, each difference named with its
//! cause.

use ace_harness::client::{Request, Response};
use ace_harness::provider::{Errors, Limits, Spec, Usage};
use ace_ledger::bill::reconcile::{Cause, Reconciliation};
use ace_ledger::bill::{self, Format};
use ace_ledger::book::Ledger;
use ace_ledger::ingest::Options;
use ace_ledger::window::Rules;
use ace_tests::bill::{self as fake_bill, Format as Fake};
use ace_tests::{permit_tables, Filter, ProviderFleet};
use serde_json::{json, Value};
use std::time::Duration;

/// Destinations in table order, each named as its provider's cluster.
const DESTINATIONS: [&str; 2] = ["openai", "anthropic"];

/// gpt-4o goes to OpenAI, claude-sonnet-4-5 to Anthropic, each priced as
/// its provider lists it (cached input at half the input price at OpenAI,
/// a tenth at Anthropic, a cache write 1.25 times it). The authorities
/// are the providers' own: the ledger knows a provider by them.
fn config() -> Value {
    json!({
        "response_headers": true,
        // Value indices (sorted): 0 unknown, 1 claude-sonnet-4-5, 2 gpt-4o.
        "tables_base64": permit_tables(
            &DESTINATIONS, "model", &["claude-sonnet-4-5", "gpt-4o"], &[0, 0b10, 0b01]),
        "body": {"read": true},
        "destinations": [
            {"name": "openai", "cluster": "openai", "tier": "payg",
             "usd_per_input_token": 2.5e-6, "usd_per_output_token": 1e-5,
             "cached_input_factor": 0.5,
             "upstream": {"authority": "api.openai.com",
                          "paths": {"chat_completions": "/v1/chat/completions",
                                    "responses": "/v1/responses"}}},
            {"name": "anthropic", "cluster": "anthropic", "tier": "payg",
             "usd_per_input_token": 3e-6, "usd_per_output_token": 1.5e-5,
             "cached_input_factor": 0.1, "cache_write_factor": 1.25,
             "upstream": {"authority": "api.anthropic.com"}}
        ]
    })
}

fn fleet(filter: Filter) -> ProviderFleet {
    let spec = |name: &str, credential: (&str, &str), paths: &[&str], model: &str| Spec {
        name: name.into(),
        host: Some(format!("api.{name}.com")),
        credential: (credential.0.into(), credential.1.into()),
        paths: paths.iter().map(|p| p.to_string()).collect(),
        models: vec![model.into()],
        errors: Errors::OpenAi,
        limits: Limits::None,
    };
    let specs = vec![
        spec(
            "openai",
            ("authorization", "Bearer sk-openai"),
            &["/v1/chat/completions", "/v1/responses"],
            "gpt-4o",
        ),
        Spec {
            errors: Errors::Anthropic,
            ..spec(
                "anthropic",
                ("x-api-key", "sk-ant"),
                &["/v1/messages"],
                "claude-sonnet-4-5",
            )
        },
    ];
    ProviderFleet::start(filter, &config(), specs, &[])
}

/// `POST path` with `body`, as a client of either provider sends it.
fn post(f: &ProviderFleet, path: &str, body: &Value) -> Response {
    let r = Request::post_json(path, body)
        .header("anthropic-version", "2023-06-01")
        .send(f.envoy.port())
        .unwrap_or_else(|e| panic!("request failed: {e}"));
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    r
}

/// The usage each answer reports: (provider, path, streamed, usage).
fn traffic() -> Vec<(&'static str, &'static str, bool, Usage)> {
    let usage = |input, cached, cache_write, output| Usage {
        input,
        cached,
        cache_write,
        output,
    };
    vec![
        (
            "openai",
            "/v1/chat/completions",
            false,
            usage(1200, 1024, 0, 80),
        ),
        ("openai", "/v1/chat/completions", true, usage(800, 0, 0, 40)),
        // The Responses API reference's streamed answer, 4,096 cached.
        ("openai", "/v1/responses", true, usage(5000, 4096, 0, 60)),
        ("anthropic", "/v1/messages", false, usage(1500, 1000, 0, 30)),
        // Streamed: 3,000 uncached, 2,000 read, 500 written, 50 out.
        (
            "anthropic",
            "/v1/messages",
            true,
            usage(5500, 2000, 500, 50),
        ),
    ]
}

/// Send [`traffic`] through Envoy; the event lines it wrote.
fn serve(f: &ProviderFleet) -> Vec<String> {
    let t = traffic();
    for (provider, path, stream, usage) in &t {
        f.provider(provider).answer_usage(*usage);
        let model = if *provider == "openai" {
            "gpt-4o"
        } else {
            "claude-sonnet-4-5"
        };
        let body = if *path == "/v1/responses" {
            json!({"model": model, "input": "Hello!", "stream": stream, "max_output_tokens": 256})
        } else {
            json!({"model": model, "stream": stream, "max_tokens": 256,
                   "messages": [{"role": "user", "content": "Hello"}]})
        };
        let r = post(f, path, &body);
        if *stream {
            assert!(
                r.text().contains("\n\n"),
                "{path}: a server-sent event stream: {}",
                r.text()
            );
        }
    }
    for p in &f.providers {
        assert!(p.rejected().is_empty(), "refused: {:?}", p.rejected());
    }
    let lines = f.envoy.wait_access_log(t.len(), Duration::from_secs(10));
    assert_eq!(lines.len(), t.len(), "{lines:?}");
    lines
}

/// A ledger in SQLite at `path` that booked the event `lines` under
/// plugin configuration `config` (every line new, none rejected).
pub(crate) fn ledger_of(path: &std::path::Path, config: &str, lines: &[String]) -> Ledger {
    let mut ledger = Ledger::open(&path.display().to_string()).unwrap_or_else(|e| panic!("{e:#}"));
    let id = ledger
        .register(config.as_bytes(), "config")
        .unwrap_or_else(|e| panic!("{e:#}"));
    let opts = Options {
        v1_config: Some(id),
        ..Options::default()
    };
    let log = lines.join("\n") + "\n";
    let s = ledger
        .ingest_bytes("access.log", log.as_bytes(), &opts)
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!((s.new, s.rejected.len()), (lines.len() as u64, 0), "{s:?}");
    ledger
}

/// A ledger that booked `lines` under the fleet's configuration.
fn booked(dir: &tempfile::TempDir, name: &str, lines: &[String]) -> Ledger {
    let path = dir.path().join(format!("{name}.sqlite"));
    ledger_of(&path, &config().to_string(), lines)
}

/// Each bill a provider writes: its file name, the record's format as
/// the ledger reads it, the provider, the format the fake writes.
const BILLS: [(&str, Format, &str, Fake); 4] = [
    (
        "openai-usage.json",
        Format::OpenaiUsage,
        "openai",
        Fake::OpenaiUsage,
    ),
    (
        "openai-costs.json",
        Format::OpenaiCosts,
        "openai",
        Fake::OpenaiCosts,
    ),
    (
        "anthropic-usage.json",
        Format::AnthropicUsage,
        "anthropic",
        Fake::AnthropicUsage,
    ),
    (
        "anthropic-cost.json",
        Format::AnthropicCost,
        "anthropic",
        Fake::AnthropicCost,
    ),
];

/// The providers' bills, each as its provider wrote it: (file name, the
/// record's format, its bytes).
fn bills(f: &ProviderFleet) -> Vec<(&'static str, Format, String)> {
    BILLS
        .iter()
        .map(|(name, format, provider, writes)| (*name, *format, f.bill(provider, *writes)))
        .collect()
}

/// Import `bills` into `ledger` (each file's format detected, as `ace
/// ledger import-bill` does) and reconcile.
fn reconcile(ledger: &mut Ledger, bills: &[(&str, Format, String)]) -> Reconciliation {
    for (name, format, bytes) in bills {
        assert_eq!(
            bill::detect(name, bytes.as_bytes()).unwrap_or_else(|e| panic!("{e:#}")),
            *format,
            "{name}: {bytes}"
        );
        let s = bill::import::file(ledger.store.as_mut(), name, bytes.as_bytes(), None)
            .unwrap_or_else(|e| panic!("{name}: {e:#}"));
        assert!(s.new > 0 && s.rejected.is_empty(), "{name}: {s:?}\n{bytes}");
    }
    ledger
        .report(&Rules::default())
        .unwrap_or_else(|e| panic!("{e:#}"))
        .bills
}

/// Every difference: (provider, model, measure, cause).
fn differences(r: &Reconciliation) -> Vec<(&str, &str, &str, Cause)> {
    r.differences()
        .map(|(k, d)| {
            (
                k.provider.as_str(),
                k.model.as_str(),
                d.measure.as_str(),
                d.cause,
            )
        })
        .collect()
}

/// What the books and the bill both say of `provider`'s `model`: (tokens
/// in, cached, out, requests), booked and billed.
fn figures(r: &Reconciliation, provider: &str, model: &str) -> [(i64, i64, i64, i64); 2] {
    let c = r
        .comparisons
        .iter()
        .find(|c| c.key.provider == provider && c.key.model == model)
        .unwrap_or_else(|| panic!("no comparison of {provider} {model}: {r:#?}"));
    let f = |x: &ace_ledger::bill::reconcile::Figures| {
        (
            x.tokens_in.unwrap_or(-1),
            x.tokens_cached.unwrap_or(-1),
            x.tokens_out.unwrap_or(-1),
            x.requests.unwrap_or(-1),
        )
    };
    [f(&c.booked), f(&c.billed)]
}

/// The events reconcile with the bills the providers wrote from what they
/// served: 0 differences, every provider and model compared, the
/// streamed answers' usage in both.
fn the_books_of_a_real_envoy_run_meet_the_providers_bills(filter: Filter) {
    let f = fleet(filter);
    let lines = serve(&f);
    let events: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(
        events.iter().all(|e| e["tokens_estimated"] == false),
        "every answer's usage read: {lines:?}"
    );
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut ledger = booked(&dir, "run", &lines);
    let bills = bills(&f);
    let r = reconcile(&mut ledger, &bills);
    assert_eq!(differences(&r), [], "{r:#?}\n{bills:#?}");
    assert_eq!(r.differing, 0);
    assert_eq!(r.unmatched_destinations, Vec::<String>::new());
    // OpenAI: 1,200 + 800 + 5,000 in (1,024 + 4,096 cached), 180 out, 3
    // requests; its costs compared per day. Anthropic: 1,500 + 5,500 in
    // (1,000 + 2,000 read), 80 out; its reports count no requests.
    let gpt = (7000, 5120, 180, 3);
    assert_eq!(figures(&r, "openai", "gpt-4o"), [gpt, gpt], "{r:#?}");
    let claude = (7000, 3000, 80, -1);
    assert_eq!(
        figures(&r, "anthropic", "claude-sonnet-4-5"),
        [claude, claude],
        "{r:#?}"
    );
    let day_total = r
        .comparisons
        .iter()
        .find(|c| c.key.provider == "openai" && c.key.model == "*")
        .unwrap_or_else(|| panic!("OpenAI's costs compared per day: {r:#?}"));
    assert!(
        day_total.billed.cost.is_some_and(|c| c > 0),
        "{day_total:#?}"
    );
    let table = ledger
        .report(&Rules::default())
        .unwrap_or_else(|e| panic!("{e:#}"))
        .table();
    assert!(
        table.contains("bill lines, 0 rows not imported") && table.contains("0 differing"),
        "{table}"
    );
}

/// The same run booked as a gateway that misreads the two streams books
/// it: the Responses answer at its estimate (`tokens_estimated`, the
/// request's 256 out), the Anthropic answer at 0 input and cache tokens.
/// The bills, the same, now differ from the books, each difference named;
/// and a bill at an output price the configuration lacks is a price
/// difference with a proposed (never applied) change.
fn misread_streams_and_a_changed_price_are_each_named(filter: Filter) {
    let f = fleet(filter);
    let lines = serve(&f);
    let misread: Vec<String> = lines
        .iter()
        .map(|l| {
            let mut e: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            match (e["destination"].as_str(), e["tokens_in"].as_u64()) {
                (Some("openai"), Some(5000)) => {
                    e["tokens_in"] = 21.into();
                    e["tokens_cache_read"] = 0.into();
                    e["tokens_out"] = 256.into();
                    e["tokens_estimated"] = true.into();
                }
                (Some("anthropic"), Some(5500)) => {
                    e["tokens_in"] = 0.into();
                    e["tokens_cache_read"] = 0.into();
                    e["tokens_cache_write"] = 0.into();
                }
                _ => {}
            }
            e.to_string()
        })
        .collect();
    assert_eq!(
        misread.iter().filter(|l| !lines.contains(l)).count(),
        2,
        "both streamed answers' events found: {lines:?}"
    );
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut ledger = booked(&dir, "misread", &misread);
    let r = reconcile(&mut ledger, &bills(&f));
    let found = differences(&r);
    let has = |provider: &str, model: &str, measure: &str, cause: Cause| {
        found
            .iter()
            .any(|d| d.0 == provider && d.1 == model && d.2 == measure && d.3 == cause)
    };
    for (provider, model) in [("openai", "gpt-4o"), ("anthropic", "claude-sonnet-4-5")] {
        assert!(
            has(provider, model, "tokens_in", Cause::MissingInLog),
            "{provider}: {found:#?}"
        );
        assert!(
            has(provider, model, "tokens_cached", Cause::MissingInLog),
            "{provider}: {found:#?}"
        );
    }
    assert!(
        has("openai", "gpt-4o", "tokens_out", Cause::MissingInBill),
        "the estimate's 256 out against the 60 served: {found:#?}"
    );
    assert!(
        has(
            "anthropic",
            "claude-sonnet-4-5",
            "cost",
            Cause::MissingInLog
        ),
        "{found:#?}"
    );
    // OpenAI's costs name no model: the day's cost follows the tokens its
    // usage record counts, and no price change is proposed for a misread.
    assert!(
        has("openai", "*", "cost", Cause::MissingInLog),
        "{found:#?}"
    );
    assert!(
        found.iter().all(|d| d.3 != Cause::Price)
            && r.comparisons.iter().all(|c| c.proposals.is_empty()),
        "a misread is no price drift: {r:#?}"
    );
    let why = r
        .comparisons
        .iter()
        .filter(|c| c.key.provider == "anthropic")
        .flat_map(|c| &c.differences)
        .find(|d| d.measure == "tokens_in")
        .map(|d| d.why.clone());
    assert_eq!(
        why.as_deref(),
        Some("the bill has 7000 tokens_in, the log 1500: the bill has what the log does not"),
        "{r:#?}"
    );

    // The run booked right, and Anthropic's cost report at USD 1.65e-5 an
    // output token where the configuration says 1.5e-5.
    let mut ledger = booked(&dir, "price", &lines);
    let mut raised = config();
    raised["destinations"][1]["usd_per_output_token"] = json!(1.65e-5);
    let raised =
        ace_config::Config::parse(raised.to_string().as_bytes()).unwrap_or_else(|e| panic!("{e}"));
    let mut bills = bills(&f);
    bills[3].2 = fake_bill::write(
        Fake::AnthropicCost,
        &f.provider("anthropic").served(),
        &raised.destinations[1],
    );
    let r = reconcile(&mut ledger, &bills);
    assert_eq!(
        differences(&r),
        [("anthropic", "claude-sonnet-4-5", "cost", Cause::Price)],
        "{r:#?}"
    );
    let proposed: Vec<(String, String, f64)> = r
        .comparisons
        .iter()
        .flat_map(|c| &c.proposals)
        .map(|p| (p.destination.clone(), p.field.clone(), p.proposed))
        .collect();
    assert_eq!(
        proposed,
        [(
            "anthropic".to_string(),
            "usd_per_output_token".to_string(),
            1.65e-5
        )],
        "{r:#?}"
    );
}

ace_tests::for_each_filter!(
    the_books_of_a_real_envoy_run_meet_the_providers_bills,
    misread_streams_and_a_changed_price_are_each_named,
);
