//! The cases, each written once against [`Driver`], each run on every
//! host (`tests/conformance.rs`).
//!
//! The fleet of every case ([`fleet`]): `eu-owned` (cluster `eu_owned`),
//! owned GPUs in the EU, two slots, almost free, an SLO of one second; and
//! `us-api` (cluster `us_api`), a pay-as-you-go API in the US. The policy
//! attribute is the data class (`x-ace-data-class`): `personal_eu` may go
//! only to the EU, `public` anywhere; a missing class is refused
//! (`on_missing` reject), an unknown one matches no permit. Three failures
//! trip a destination for a second.

use crate::{Answer, Case, Driver, Req, Seen, Service, CONTROL, T0};
use ace_core::tables::{encode, AttributeSpec, DestinationSpec, FactorKind, FactorSpec, TableSpec};
use ace_snapshot::{Budget, BudgetState, Drain, DrainReason, Load, Report, Snapshot};
use base64::Engine;
use serde_json::Value;

/// The fleet's configuration, with `extra` fields (each starting with a
/// comma) added.
pub fn fleet(extra: &str) -> String {
    fleet_with(r#"{"read":true}"#, extra)
}

/// The fleet's tables, base64: the data class decides (`personal_eu`
/// only in the EU, an unknown class nowhere); with `tenants`, the tables
/// also read a `tenant` attribute of those values, which no rule uses.
fn tables(tenants: &[&str]) -> String {
    let mut attributes = vec![AttributeSpec::new("data_class", &["personal_eu", "public"])];
    if !tenants.is_empty() {
        attributes.push(AttributeSpec {
            name: "tenant".into(),
            values: tenants.iter().map(|t| t.to_string()).collect(),
        });
    }
    let spec = TableSpec {
        destinations: vec![
            DestinationSpec::new("eu-owned", "eu_owned"),
            DestinationSpec::new("us-api", "us_api"),
        ],
        attributes,
        factors: vec![
            FactorSpec {
                kind: FactorKind::Permit,
                attributes: vec![],
                rows: vec![0b11],
            },
            FactorSpec {
                kind: FactorKind::Forbid,
                attributes: vec![0],
                // Value 0 is the unknown one: forbidden everywhere;
                // personal_eu: not the US; public: nothing.
                rows: vec![0b11, 0b10, 0],
            },
        ],
    };
    base64::engine::general_purpose::STANDARD.encode(encode(&spec).unwrap())
}

/// [`fleet`] with body settings `body`.
pub fn fleet_with(body: &str, extra: &str) -> String {
    let tables = tables(&[]);
    format!(
        r#"{{"destinations":[
            {{"name":"eu-owned","cluster":"eu_owned","tier":"inhouse","capacity":2,
              "usd_per_input_token":1e-8,"usd_per_output_token":1e-8,"slo_ms":1000}},
            {{"name":"us-api","cluster":"us_api","tier":"payg",
              "usd_per_input_token":2e-6,"usd_per_output_token":8e-6}}],
          "tables_base64":"{tables}",
          "body":{body},
          "response_headers":true,
          "health":{{"trip_after":3,"base_cooldown_ms":1000}}{extra}}}"#
    )
}

fn plain() -> String {
    fleet("")
}

/// [`fleet`] whose tables also read the tenant (`x-ace-tenant`: `team-a`
/// or `team-b`, no rule on it), with two budgets: `team-a` may book USD
/// 0.01 a day, soft from half of it (then only the owned GPUs, the
/// default); `team-b` may use 2,500 tokens a minute. Polls the control
/// service.
pub fn budgeted() -> String {
    let mut config: Value = serde_json::from_str(&with_control()).unwrap();
    config["tables_base64"] = Value::String(tables(&["team-a", "team-b"]));
    config["budgets"] = serde_json::json!([
        {"name": "team-a", "tenants": ["team-a"], "usd": 0.01, "period": "day", "soft_at": 0.5},
        {"name": "team-b", "tenants": ["team-b"], "tokens_per_minute": 2500}
    ]);
    config.to_string()
}

/// [`fleet`] with the US API's prompt cache priced as Anthropic prices
/// its own: reads a tenth of an input token, writes 1.25.
fn cached_prices() -> String {
    fleet("").replacen(
        r#""usd_per_output_token":8e-6}"#,
        r#""usd_per_output_token":8e-6,"cached_input_factor":0.1,"cache_write_factor":1.25}"#,
        1,
    )
}

/// [`fleet`] whose EU GPUs serve a model with a 128,000-token context
/// and 16,384 tokens of output (gpt-4o's, in LiteLLM's price file).
fn windowed() -> String {
    fleet("").replacen(
        r#""slo_ms":1000}"#,
        r#""slo_ms":1000,"max_input_tokens":128000,"max_output_tokens":16384}"#,
        1,
    )
}

/// [`fleet`] with upstream identities: the EU owned GPUs serve only
/// embeddings; the US API (an Azure-OpenAI-like v1 surface) only chat
/// completions, on its own path and authority.
fn addressed() -> String {
    fleet("")
        .replacen(
            r#""slo_ms":1000}"#,
            r#""slo_ms":1000,"upstream":{"paths":{"embeddings":"/v1/embeddings"}}}"#,
            1,
        )
        .replacen(
            r#""usd_per_output_token":8e-6}"#,
            r#""usd_per_output_token":8e-6,"upstream":{"authority":"res.openai.azure.com",
            "paths":{"chat_completions":"/openai/v1/chat/completions"}}}"#,
            1,
        )
}

/// [`fleet`] with prefix locality on, and both destinations priced as
/// providers with prompt caches that read at a tenth of the input price:
/// the EU at 2.6e-6 an input token, the US at 2e-6 (cheaper at list).
pub fn prefixed() -> String {
    fleet(r#","locality":{}"#)
        .replacen(
            r#""usd_per_input_token":1e-8,"usd_per_output_token":1e-8,"slo_ms":1000}"#,
            r#""usd_per_input_token":2.6e-6,"usd_per_output_token":8e-6,"slo_ms":1000,
            "cached_input_factor":0.1}"#,
            1,
        )
        .replacen(
            r#""usd_per_output_token":8e-6}"#,
            r#""usd_per_output_token":8e-6,"cached_input_factor":0.1}"#,
            1,
        )
}

/// Turn `n` of a chat about `topic` (a system prompt of about 7,400
/// bytes, then alternating questions and answers), with `extra` more
/// bytes in its last question.
pub fn conversation(topic: &str, n: usize, extra: usize) -> String {
    let system = format!("{topic}: answer as a careful assistant would. ").repeat(150);
    let mut m = format!(r#"{{"role":"system","content":"{system}"}}"#);
    for i in 1..=n {
        if i > 1 {
            m.push_str(&format!(
                r#",{{"role":"assistant","content":"answer {}"}}"#,
                i - 1
            ));
        }
        let more = if i == n {
            "x".repeat(extra)
        } else {
            String::new()
        };
        m.push_str(&format!(
            r#",{{"role":"user","content":"question {i}{more}"}}"#
        ));
    }
    format!(r#"{{"model":"m","messages":[{m}],"max_tokens":10}}"#)
}

fn with_control() -> String {
    fleet(&format!(",{CONTROL}"))
}

fn ok() -> Answer {
    Answer::ok(r#"{"choices":[]}"#)
}

/// Where `seen` went, by cluster, or `refused <status>`.
fn went(seen: &Seen) -> String {
    match &seen.upstream {
        Some(c) => c.clone(),
        None => format!("refused {}", seen.status),
    }
}

/// Where a `class` request goes now (answered 200 at once).
fn route(h: &mut dyn Driver, class: &str) -> String {
    went(&h.send(&Req::class(class), &ok()))
}

/// Counter `name` is `n`, on a host that keeps counters.
fn counter(h: &mut dyn Driver, name: &str, n: u64) {
    if let Some(v) = h.counter(name) {
        assert_eq!(v, n, "counter {name} on {:?}", h.kind());
    }
}

/// Response header `name` is `value`, on a host that shows them.
fn header(seen: &Seen, name: &str, value: Option<&str>) {
    if let Some(v) = seen.header(name) {
        assert_eq!(v, value, "response header {name}: {:?}", seen.headers);
    }
}

/// The local reply's error type is `kind`, on a host that shows the
/// reply's body.
fn reply(seen: &Seen, kind: &str) {
    if let Some(r) = &seen.reply {
        assert_eq!(r["error"]["type"], kind, "{r}");
    }
}

fn f64_of(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// Every case, in the order the tests list them.
pub const ALL: &[Case] = &[
    Case {
        name: "a_budget_steps_down_then_refuses",
        config: budgeted,
        skip: &[],
        run: a_budget_steps_down_then_refuses,
    },
    Case {
        name: "refusals_name_their_reason",
        config: plain,
        skip: &[],
        run: refusals_name_their_reason,
    },
    Case {
        name: "the_cheapest_feasible_destination_is_chosen",
        config: plain,
        skip: &[],
        run: the_cheapest_feasible_destination_is_chosen,
    },
    Case {
        name: "failures_trip_then_spill_then_a_probe_closes",
        config: plain,
        skip: &[],
        run: failures_trip_then_spill_then_a_probe_closes,
    },
    Case {
        name: "a_429_moves_the_cap_left",
        config: plain,
        skip: &[],
        run: a_429_moves_the_cap_left,
    },
    Case {
        name: "a_providers_own_figures_spill_before_its_429",
        config: plain,
        skip: &[],
        run: a_providers_own_figures_spill_before_its_429,
    },
    Case {
        name: "a_slow_answer_derates",
        config: plain,
        skip: &[],
        run: a_slow_answer_derates,
    },
    Case {
        name: "a_usage_claim_is_booked_within_its_models_window",
        config: windowed,
        skip: &[],
        run: a_usage_claim_is_booked_within_its_models_window,
    },
    Case {
        name: "usage_from_json_and_sse_is_booked",
        config: plain,
        skip: &[],
        run: usage_from_json_and_sse_is_booked,
    },
    Case {
        name: "cached_input_is_booked_at_each_destinations_cached_price",
        config: cached_prices,
        skip: &[],
        run: cached_input_is_booked_at_each_destinations_cached_price,
    },
    Case {
        name: "a_conversation_stays_where_its_prefix_is_held",
        config: prefixed,
        skip: &[],
        run: a_conversation_stays_where_its_prefix_is_held,
    },
    Case {
        name: "a_held_body_decides_the_estimate",
        config: plain,
        skip: &[],
        run: a_held_body_decides_the_estimate,
    },
    Case {
        name: "each_upstream_is_addressed_as_it_expects",
        config: addressed,
        skip: &[],
        run: each_upstream_is_addressed_as_it_expects,
    },
    Case {
        name: "a_good_snapshot_moves_the_choice",
        config: with_control,
        skip: &[],
        run: a_good_snapshot_moves_the_choice,
    },
    Case {
        name: "a_rejected_snapshot_leaves_the_last_good_one",
        config: with_control,
        skip: &[],
        run: a_rejected_snapshot_leaves_the_last_good_one,
    },
    Case {
        name: "a_rejected_snapshot_is_not_hearing_the_service",
        config: with_control,
        skip: &[],
        run: a_rejected_snapshot_is_not_hearing_the_service,
    },
    Case {
        name: "a_silent_service_goes_stale_and_its_loads_are_dropped",
        config: with_control,
        skip: &[],
        run: a_silent_service_goes_stale_and_its_loads_are_dropped,
    },
    Case {
        name: "a_stale_destination_load_is_priced_then_dropped",
        config: with_control,
        skip: &[],
        run: a_stale_destination_load_is_priced_then_dropped,
    },
];

/// No feasible destination: 503 `no_feasible_destination` (an unknown
/// class matches no permit); no healthy one: 503 `no_healthy_destination`
/// (the EU full, for EU-only data); a missing attribute under `on_missing`
/// reject: 400 `missing_attribute`. Each with a JSON error and an event.
fn refusals_name_their_reason(h: &mut dyn Driver) {
    let e = h.send(&Req::default(), &ok());
    assert_eq!((e.upstream.as_deref(), e.status), (None, 400), "{e:?}");
    reply(&e, "missing_attribute");
    assert_eq!(
        e.event["reason"], "data_class",
        "the attribute missing: {}",
        e.event
    );
    let e = h.send(&Req::class("secret"), &ok());
    assert_eq!((e.upstream.as_deref(), e.status), (None, 503), "{e:?}");
    assert_eq!(e.event["reason"], "no_feasible_destination", "{}", e.event);
    // Fill the EU's two slots: EU-only data has nowhere healthy to go.
    let a = h.open(&Req::class("personal_eu"));
    let b = h.open(&Req::class("personal_eu"));
    assert_eq!(h.upstream(a).as_deref(), Some("eu_owned"));
    assert_eq!(h.upstream(b).as_deref(), Some("eu_owned"));
    let e = h.send(&Req::class("personal_eu"), &ok());
    assert_eq!(went(&e), "refused 503", "{e:?}");
    assert_eq!(e.event["reason"], "no_healthy_destination", "{}", e.event);
    reply(&e, "no_feasible_destination");
    // Public data spills to the API meanwhile.
    assert_eq!(route(h, "public"), "us_api");
    h.close(a, &ok());
    h.close(b, &ok());
    assert_eq!(route(h, "personal_eu"), "eu_owned", "slots released");
    counter(h, "ace.no_destination", 2);
}

/// The cheapest feasible destination, with the operator headers and the
/// event's fields.
fn the_cheapest_feasible_destination_is_chosen(h: &mut dyn Driver) {
    let e = h.send(&Req::class("public"), &ok());
    assert_eq!(went(&e), "eu_owned");
    assert_eq!(e.status, 200);
    header(&e, "x-ace-destination", Some("eu-owned"));
    header(&e, "x-ace-reason", Some("cheapest"));
    header(&e, "x-ace-tier", Some("inhouse"));
    let ev = &e.event;
    assert_eq!(ev["destination"], "eu-owned", "{ev}");
    assert_eq!(ev["reason"], "cheapest", "{ev}");
    assert_eq!(ev["status"], 200, "{ev}");
    assert_eq!(ev["tier"], "inhouse", "{ev}");
    assert_eq!(ev["slo_met"], true, "{ev}");
    assert!(
        ev["event_id"].as_str().is_some_and(|s| s.len() == 32),
        "{ev}"
    );
    let t = ev["time_ms"].as_u64().unwrap();
    assert!((T0..T0 + 1_000).contains(&t), "{ev}");
    counter(h, "ace.requests", 1);
}

/// Three 5xx trip the cheapest destination; the next request goes to the
/// next rung (EU-only data is refused meanwhile); after the cooldown one
/// probe goes back, and its success closes the breaker.
fn failures_trip_then_spill_then_a_probe_closes(h: &mut dyn Driver) {
    for _ in 0..3 {
        let e = h.send(&Req::class("public"), &Answer::status(503));
        assert_eq!((went(&e).as_str(), e.status), ("eu_owned", 503), "{e:?}");
        assert_eq!(e.event["status"], 503);
    }
    counter(h, "ace.trips", 1);
    assert_eq!(route(h, "public"), "us_api", "spilled past the trip");
    assert_eq!(route(h, "personal_eu"), "refused 503");
    h.advance(1_500);
    assert_eq!(route(h, "public"), "eu_owned", "half-open probe");
    assert_eq!(route(h, "public"), "eu_owned", "closed again");
}

/// A 429 cuts the EU's cap from two slots to one: with one request in
/// flight it is full.
fn a_429_moves_the_cap_left(h: &mut dyn Driver) {
    let throttled = Answer::status(429).header("retry-after", "2");
    let e = h.send(&Req::class("personal_eu"), &throttled);
    assert_eq!((went(&e).as_str(), e.status), ("eu_owned", 429), "{e:?}");
    counter(h, "ace.cap_cuts", 1);
    let held = h.open(&Req::class("personal_eu"));
    assert_eq!(h.upstream(held).as_deref(), Some("eu_owned"));
    assert_eq!(route(h, "public"), "us_api", "one slot left, taken");
    assert_eq!(route(h, "personal_eu"), "refused 503");
    h.close(held, &ok());
}

/// Usage with a provider's prompt-cache counts: booked on the destination
/// that served it at its own prices (the EU owned GPUs: no cache
/// discount), and the counterfactual at the US API's cached prices.
fn cached_input_is_booked_at_each_destinations_cached_price(h: &mut dyn Driver) {
    for (body, input, read, write) in [
        (
            r#"{"usage":{"prompt_tokens":2006,"completion_tokens":300,"prompt_tokens_details":{"cached_tokens":1920}}}"#,
            2006u64,
            1920u64,
            0u64,
        ),
        (
            r#"{"usage":{"input_tokens":21,"cache_creation_input_tokens":2000,"cache_read_input_tokens":10000,"output_tokens":300}}"#,
            12_021,
            10_000,
            2_000,
        ),
    ] {
        let e = h.send(&Req::class("public"), &Answer::ok(body));
        let ev = &e.event;
        assert_eq!(went(&e), "eu_owned");
        assert_eq!(
            (
                ev["tokens_in"].as_u64(),
                ev["tokens_cache_read"].as_u64(),
                ev["tokens_cache_write"].as_u64()
            ),
            (Some(input), Some(read), Some(write)),
            "{ev}"
        );
        let (i, r, w) = (input as f64, read as f64, write as f64);
        let usd = f64_of(&ev["marginal_usd"]);
        assert!((usd - (i + 300.0) * 1e-8).abs() < 1e-12, "{ev}");
        let billed = (i - r - w) + r * 0.1 + w * 1.25;
        let cf = f64_of(&ev["counterfactual_usd"]);
        assert!((cf - (billed * 2e-6 + 300.0 * 8e-6)).abs() < 1e-12, "{ev}");
    }
}

/// A destination whose answers say its rate limit is running out
/// (OpenAI's `x-ratelimit-*` headers) takes less before any 429: a
/// quarter of its limit left keeps both slots; 5 % (half the 10 % mark)
/// halves them until the reset; nothing left sends every request on until
/// the reset, when it is back.
fn a_providers_own_figures_spill_before_its_429(h: &mut dyn Driver) {
    let figures = |remaining: &str, reset: &str| {
        ok().header("x-ratelimit-limit-tokens", "1000")
            .header("x-ratelimit-remaining-tokens", remaining)
            .header("x-ratelimit-reset-tokens", reset)
    };
    let e = h.send(&Req::class("public"), &figures("250", "2s"));
    assert_eq!(went(&e), "eu_owned");
    let a = h.open(&Req::class("personal_eu"));
    assert_eq!(h.upstream(a).as_deref(), Some("eu_owned"), "two slots");
    h.close(a, &figures("50", "2s"));
    let a = h.open(&Req::class("personal_eu"));
    assert_eq!(h.upstream(a).as_deref(), Some("eu_owned"));
    assert_eq!(route(h, "public"), "us_api", "one slot while 5 % is left");
    h.close(a, &figures("0", "2s"));
    // Nothing left: no 429 seen, and nothing goes there until the reset.
    assert_eq!(route(h, "public"), "us_api");
    assert_eq!(route(h, "personal_eu"), "refused 503");
    h.advance(2_000);
    assert_eq!(route(h, "public"), "eu_owned", "the limit reset");
}

/// Prefix locality: a conversation stays on the destination that holds
/// its prompt while that is cheapest counting the cached price; another
/// tenant's identical conversation is priced as if nothing were held; the
/// conversation moves when its new part outweighs the discount, and when
/// the holder trips.
fn a_conversation_stays_where_its_prefix_is_held(h: &mut dyn Driver) {
    let turn = |topic: &str, n: usize, tenant: &str, class: &str, extra: usize| {
        Req::class(class)
            .header("x-ace-tenant", tenant)
            .body(&[&conversation(topic, n, extra)])
    };
    let held = |e: &Seen| e.event["tokens_prefix_held"].as_u64().unwrap_or(0);
    // Turn 1: only the EU may serve it; nothing is held anywhere yet.
    let e = h.send(&turn("tax", 1, "acme", "personal_eu", 0), &ok());
    assert_eq!(
        (went(&e).as_str(), held(&e)),
        ("eu_owned", 0),
        "{}",
        e.event
    );
    // Turn 2, which either may serve: the US is cheaper at list, but the
    // EU holds turn 1's prompt (about 1,600 tokens) at a tenth.
    let e = h.send(&turn("tax", 2, "acme", "public", 0), &ok());
    assert_eq!(went(&e), "eu_owned", "{}", e.event);
    assert!((1_550..1_650).contains(&held(&e)), "{}", e.event);
    // The same conversation from another tenant holds nothing.
    let e = h.send(&turn("tax", 2, "rival", "public", 0), &ok());
    assert_eq!((went(&e).as_str(), held(&e)), ("us_api", 0), "{}", e.event);
    // A turn whose new question is four times the held prompt: the EU's
    // discount no longer covers its higher list price.
    let e = h.send(&turn("tax", 3, "acme", "public", 30_000), &ok());
    assert_eq!(went(&e), "us_api", "{}", e.event);
    // Another conversation on the EU, which then trips: its next turn
    // goes where nothing is held.
    let e = h.send(&turn("law", 1, "acme", "personal_eu", 0), &ok());
    assert_eq!(went(&e), "eu_owned");
    for _ in 0..3 {
        let e = h.send(&Req::class("personal_eu"), &Answer::status(503));
        assert_eq!(went(&e), "eu_owned");
    }
    let e = h.send(&turn("law", 2, "acme", "public", 0), &ok());
    assert_eq!((went(&e).as_str(), held(&e)), ("us_api", 0), "{}", e.event);
}

/// An answer past the SLO derates the destination and the event says the
/// SLO was missed.
fn a_slow_answer_derates(h: &mut dyn Driver) {
    let e = h.send(&Req::class("public"), &ok().took(5_000));
    assert_eq!(went(&e), "eu_owned");
    assert_eq!(e.event["slo_met"], false, "{}", e.event);
    assert!(
        e.event["latency_ms"].as_u64().unwrap() >= 5_000,
        "{}",
        e.event
    );
    counter(h, "ace.derates", 1);
    let e = h.send(&Req::class("public"), &ok());
    assert_eq!(e.event["slo_met"], true, "{}", e.event);
}

/// Token usage read from the response, JSON and SSE (split across
/// chunks), booked at the chosen destination's prices, with the
/// pay-as-you-go counterfactual.
fn usage_from_json_and_sse_is_booked(h: &mut dyn Driver) {
    let json = Answer::ok(r#"{"id":"x","usage":{"prompt_tokens":1200,"completion_tokens":345}}"#);
    let e = h.send(&Req::class("public"), &json);
    let ev = &e.event;
    assert_eq!(
        (ev["tokens_in"].as_u64(), ev["tokens_out"].as_u64()),
        (Some(1200), Some(345)),
        "{ev}"
    );
    assert_eq!(ev["tokens_estimated"], false, "{ev}");
    let usd = f64_of(&ev["marginal_usd"]);
    assert!((usd - 1545.0 * 1e-8).abs() < 1e-12, "{ev}");
    let sse = Answer::ok("")
        .header("content-type", "text/event-stream")
        .chunks(&[
            "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tok",
            "ens\":7,\"completion_tokens\":9}}\n\ndata: [DONE]\n\n",
        ]);
    let e = h.send(&Req::class("public"), &sse);
    let ev = &e.event;
    assert_eq!(
        (ev["tokens_in"].as_u64(), ev["tokens_out"].as_u64()),
        (Some(7), Some(9)),
        "{ev}"
    );
    let usd = f64_of(&ev["marginal_usd"]);
    assert!((usd - 16.0 * 1e-8).abs() < 1e-12, "{ev}");
    let cf = f64_of(&ev["counterfactual_usd"]);
    assert!((cf - (7.0 * 2e-6 + 9.0 * 8e-6)).abs() < 1e-12, "{ev}");
    counter(h, "ace.booked_nano_usd", 15_450 + 160);
}

/// An answer claiming more tokens than its model can take or give is
/// booked at the model's own window (as the ledger books it), not at the
/// configuration's global bound.
fn a_usage_claim_is_booked_within_its_models_window(h: &mut dyn Driver) {
    let huge = Answer::ok(r#"{"usage":{"prompt_tokens":1048576,"completion_tokens":1048576}}"#);
    let e = h.send(&Req::class("public"), &huge);
    let ev = &e.event;
    assert_eq!(ev["destination"], "eu-owned", "{ev}");
    assert_eq!(
        (ev["tokens_in"].as_u64(), ev["tokens_out"].as_u64()),
        (Some(128_000), Some(16_384)),
        "{ev}"
    );
    assert_eq!(ev["usage_capped"], true, "{ev}");
    let usd = f64_of(&ev["marginal_usd"]);
    assert!((usd - (128_000.0 + 16_384.0) * 1e-8).abs() < 1e-12, "{ev}");
}

/// A held body names the model and the output budget; a header naming
/// another model conflicts.
fn a_held_body_decides_the_estimate(h: &mut dyn Driver) {
    let r =
        Req::class("public").body(&[r#"{"model":"llama","max_tokens":"#, r#"77,"messages":[]}"#]);
    let e = h.send(&r, &ok());
    assert_eq!(went(&e), "eu_owned");
    assert_eq!(e.event["model_requested"], "llama", "{}", e.event);
    assert_eq!(e.event["tokens_out"], 77, "{}", e.event);
    let e = h.send(&r.clone().header("x-ace-model", "gpt"), &ok());
    assert_eq!(went(&e), "refused 400");
    assert_eq!(e.event["reason"], "model_conflict", "{}", e.event);
}

/// A snapshot as the control service encodes it.
/// A request goes only where its API is served, on that upstream's path
/// and authority, without the client's credentials (in its headers or its
/// query string); an API nobody serves is refused as infeasible, never
/// mis-sent.
fn each_upstream_is_addressed_as_it_expects(h: &mut dyn Driver) {
    let chat = Req::class("public")
        .header("authorization", "Bearer client-key")
        .header("api-key", "forged");
    let id = h.open(&chat);
    assert_eq!(
        h.upstream(id).as_deref(),
        Some("us_api"),
        "only the API serves chat"
    );
    if let Some(sent) = h.sent(id) {
        let get = |n: &str| sent.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
        assert_eq!(
            get(":path"),
            Some("/openai/v1/chat/completions"),
            "{sent:?}"
        );
        assert_eq!(get(":authority"), Some("res.openai.azure.com"), "{sent:?}");
        assert_eq!(get("authorization"), None, "{sent:?}");
        assert_eq!(get("api-key"), None, "{sent:?}");
    }
    let e = h.close(id, &ok());
    assert_eq!(e.event["api"], "chat_completions", "{}", e.event);
    // A destination's configured path replaces the client's, query and
    // all: a key in the client's query string (Gemini's `key`,
    // percent-encoded) goes with it.
    let embed = Req::class("public").header(":path", "/v1/embeddings?%6Bey=client-key&x=%2F");
    let id = h.open(&embed);
    assert_eq!(h.upstream(id).as_deref(), Some("eu_owned"));
    if let Some(sent) = h.sent(id) {
        let get = |n: &str| sent.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
        assert_eq!(get(":path"), Some("/v1/embeddings"), "{sent:?}");
        assert_eq!(get(":authority"), Some("ace.test"), "kept: {sent:?}");
    }
    let e = h.close(id, &ok());
    assert_eq!(e.event["api"], "embeddings", "{}", e.event);
    // EU-only data asking for chat: the one destination allowed does not
    // serve it.
    let e = h.send(&Req::class("personal_eu"), &ok());
    assert_eq!(went(&e), "refused 503", "{e:?}");
    assert_eq!(e.event["reason"], "no_feasible_destination", "{}", e.event);
    let models = Req::class("public").header(":path", "/v1/models");
    let e = h.send(&models, &ok());
    assert_eq!(went(&e), "refused 503", "no destination serves it: {e:?}");
    assert_eq!(e.event["api"], Value::Null, "{}", e.event);
}

/// A snapshot with nothing to say of the destinations and `budgets`.
fn readings(version: u64, budgets: Vec<Budget>) -> Vec<u8> {
    ace_snapshot::encode(&Snapshot {
        version,
        generated_ms: T0,
        reports: vec![],
        budgets,
    })
    .unwrap()
}

/// The books' reading of budget `team-a`: `spent_usd` in the day of
/// `read_ms`.
fn team_a(state: BudgetState, spent_usd: f64, read_ms: u64) -> Budget {
    let day = 86_400_000;
    Budget {
        name: "team-a".into(),
        state,
        spent_usd,
        read_ms,
        resets_ms: read_ms - read_ms % day + day,
    }
}

/// A tenant's budget: served only on the rungs it allows once soft (with
/// a header saying so), refused with the 429 naming it once exhausted (by
/// the books' reading or by what this proxy booked since), never lifted
/// by a silent service, lifted by a reading of the next period; another
/// tenant unaffected; a token limit refuses for the rest of its minute.
fn a_budget_steps_down_then_refuses(h: &mut dyn Driver) {
    let a = || Req::class("public").header("x-ace-tenant", "team-a");
    let b = || Req::class("public").header("x-ace-tenant", "team-b");
    let priced =
        Answer::ok(r#"{"choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":250}}"#);
    let state = |e: &Seen| (e.event["budget"].clone(), e.event["budget_state"].clone());
    h.service(Service::Serves(readings(
        1,
        vec![team_a(BudgetState::Ok, 0.0, T0)],
    )));
    h.advance(2_000);
    let e = h.send(&a(), &ok());
    assert_eq!(went(&e), "eu_owned");
    assert_eq!(state(&e), (Value::Null, Value::Null), "{}", e.event);
    // The owned GPUs full (another tenant's two): team-a spills to the
    // API and books USD 0.004 a request there, past its soft threshold
    // after two (counted here, before the books show it).
    let eu_only = || Req::class("personal_eu").header("x-ace-tenant", "team-b");
    let held = [h.open(&eu_only()), h.open(&eu_only())];
    for id in held {
        assert_eq!(h.upstream(id).as_deref(), Some("eu_owned"));
    }
    for _ in 0..2 {
        let e = h.send(&a(), &priced);
        assert_eq!(went(&e), "us_api", "{}", e.event);
        assert_eq!(state(&e), (Value::Null, Value::Null), "{}", e.event);
    }
    // Soft: only the owned GPUs, which are full: the budget's 429.
    let e = h.send(&a(), &ok());
    assert_eq!(went(&e), "refused 429", "{e:?}");
    assert_eq!(state(&e), ("team-a".into(), "soft".into()), "{}", e.event);
    assert_eq!(e.event["reason"], "budget_soft", "{}", e.event);
    if let Some(r) = &e.reply {
        assert_eq!(r["error"]["code"], "budget_exceeded", "{r}");
        assert_eq!(r["error"]["budget"], "team-a", "{r}");
    }
    // The other tenant is unaffected.
    assert_eq!(went(&h.send(&b(), &ok())), "us_api");
    for id in held {
        h.close(id, &ok());
    }
    // Room on the owned GPUs: served there, and told why.
    let e = h.send(&a(), &ok());
    assert_eq!(went(&e), "eu_owned", "{}", e.event);
    assert_eq!(state(&e), ("team-a".into(), "soft".into()), "{}", e.event);
    header(&e, "x-ace-budget", Some("soft; budget=team-a"));
    // The books say exhausted: refused, naming the budget and its reset.
    let later = T0 + 10_000;
    let exhausted = team_a(BudgetState::Exhausted, 0.012, later);
    h.service(Service::Serves(readings(2, vec![exhausted.clone()])));
    h.advance(2_000);
    let e = h.send(&a(), &ok());
    assert_eq!(went(&e), "refused 429", "{e:?}");
    assert_eq!(
        state(&e),
        ("team-a".into(), "exhausted".into()),
        "{}",
        e.event
    );
    assert_eq!(e.event["reason"], "budget_exhausted", "{}", e.event);
    if let Some(r) = &e.reply {
        assert_eq!(r["error"]["type"], "budget_exceeded", "{r}");
        assert_eq!(r["error"]["period"], "day", "{r}");
        let resets = ace_config::budget::rfc3339(exhausted.resets_ms);
        assert_eq!(r["error"]["resets_at"], resets.as_str(), "{r}");
        let m = r["error"]["message"].as_str().unwrap_or("");
        assert!(m.contains("team-a") && m.contains("exhausted"), "{m}");
    }
    // A silent service, long stale: the limit stays.
    h.service(Service::Down);
    h.advance(10_000);
    assert_eq!(went(&h.send(&a(), &ok())), "refused 429");
    // A reading of the next day lifts it.
    let next_day = exhausted.resets_ms + 1_000;
    h.service(Service::Serves(readings(
        3,
        vec![team_a(BudgetState::Ok, 0.0, next_day)],
    )));
    h.advance(2_000);
    let e = h.send(&a(), &priced);
    assert_eq!(went(&e), "eu_owned", "{}", e.event);
    assert_eq!(state(&e), (Value::Null, Value::Null), "{}", e.event);
    counter(h, "ace.budget.refused", 3);
    // team-b's tokens: refused within the minute once 2,500 are used
    // (each request here reserves its default 256 output tokens and its
    // input), served again the next minute.
    let mut served = 0;
    let refused = loop {
        let e = h.send(&b(), &ok());
        if e.status == 429 {
            break e;
        }
        served += 1;
        assert!(served < 20, "never refused: {}", e.event);
    };
    assert!(served >= 5, "{served} served");
    assert_eq!(
        state(&refused),
        ("team-b".into(), "tokens_per_minute".into()),
        "{}",
        refused.event
    );
    if let Some(r) = &refused.reply {
        assert_eq!(r["error"]["code"], "rate_limit_exceeded", "{r}");
    }
    if let Some(v) = refused.header("retry-after") {
        let secs: u64 = v.unwrap_or("").parse().unwrap_or(0);
        assert!((1..=60).contains(&secs), "retry-after {v:?}");
    }
    h.advance(60_000);
    assert_eq!(went(&h.send(&b(), &ok())), "eu_owned", "a new minute");
}

fn snapshot(version: u64, reports: Vec<Report>) -> Vec<u8> {
    ace_snapshot::encode(&Snapshot {
        version,
        generated_ms: T0,
        reports,
        budgets: Vec::new(),
    })
    .unwrap()
}

fn report(name: &str) -> Report {
    Report {
        name: name.to_string(),
        ..Report::default()
    }
}

/// `eu-owned` draining until far ahead.
fn drained(version: u64) -> Vec<u8> {
    let mut eu = report("eu-owned");
    eu.drain = Some(Drain {
        until_ms: T0 + 3_600_000,
        reason: DrainReason::Operator,
    });
    snapshot(version, vec![eu, report("us-api")])
}

/// `eu-owned` reporting itself full (two running of two slots).
fn full(version: u64, stale_since: Option<u64>) -> Vec<u8> {
    let mut eu = report("eu-owned");
    eu.load = Some(Load {
        running: 2,
        waiting: 4,
        kv_permille: 0,
        stale: stale_since.is_some(),
        scraped_ms: stale_since.unwrap_or(0),
    });
    snapshot(version, vec![eu, report("us-api")])
}

/// A snapshot naming a destination this configuration does not know.
fn unknown(version: u64) -> Vec<u8> {
    snapshot(version, vec![report("eu-owned"), report("mars-gpu")])
}

/// A drain moves public data to the API and leaves EU-only data nowhere;
/// the next snapshot, without it, brings both back.
fn a_good_snapshot_moves_the_choice(h: &mut dyn Driver) {
    assert_eq!(route(h, "public"), "eu_owned");
    h.service(Service::Serves(drained(1)));
    h.advance(2_000);
    assert_eq!(route(h, "public"), "us_api", "eu-owned drains");
    assert_eq!(route(h, "personal_eu"), "refused 503");
    h.service(Service::Serves(snapshot(2, vec![report("eu-owned")])));
    h.advance(2_000);
    assert_eq!(route(h, "public"), "eu_owned", "drain over");
}

/// A snapshot naming an unknown destination is rejected whole: the drain
/// of the last good one stays in force.
fn a_rejected_snapshot_leaves_the_last_good_one(h: &mut dyn Driver) {
    h.service(Service::Serves(drained(1)));
    h.advance(2_000);
    assert_eq!(route(h, "public"), "us_api");
    h.service(Service::Serves(unknown(2)));
    h.advance(2_000);
    assert_eq!(route(h, "public"), "us_api", "the last good snapshot stays");
    // Bytes that do not decode are rejected the same way.
    h.service(Service::Serves(b"not a snapshot".to_vec()));
    h.advance(1_000);
    assert_eq!(route(h, "public"), "us_api", "the last good snapshot stays");
}

/// A rejected snapshot is not hearing the service: staleness counts from
/// the last accepted answer, so the load figures of the last good one are
/// dropped once `stale_after_ms` passes with only rejections.
fn a_rejected_snapshot_is_not_hearing_the_service(h: &mut dyn Driver) {
    h.service(Service::Serves(full(1, None)));
    h.advance(2_000);
    assert_eq!(route(h, "public"), "us_api", "eu-owned reports itself full");
    h.service(Service::Serves(unknown(2)));
    h.advance(1_000);
    assert_eq!(route(h, "public"), "us_api", "fresh yet: load still priced");
    h.advance(4_000);
    assert_eq!(
        route(h, "public"),
        "eu_owned",
        "only rejections for over stale_after_ms: stale, load dropped"
    );
}

/// A service that stops answering: past `stale_after_ms` the snapshot is
/// stale and its load figures dropped (its drains kept); an answer makes it
/// fresh again. A 304 keeps the snapshot in force fresh.
fn a_silent_service_goes_stale_and_its_loads_are_dropped(h: &mut dyn Driver) {
    h.service(Service::Serves(full(1, None)));
    h.advance(2_000);
    assert_eq!(route(h, "public"), "us_api", "eu-owned reports itself full");
    h.service(Service::NotModified);
    h.advance(5_000);
    assert_eq!(route(h, "public"), "us_api", "304s keep it fresh");
    h.service(Service::Down);
    h.advance(1_000);
    assert_eq!(route(h, "public"), "us_api", "not stale yet");
    h.advance(4_000);
    assert_eq!(route(h, "public"), "eu_owned", "stale: load dropped");
    h.service(Service::Serves(full(1, None)));
    h.advance(2_000);
    assert_eq!(route(h, "public"), "us_api", "heard again: fresh");
}

/// One destination's load the service holds (its scrapes failing) is
/// priced for `held_load_ms` (here `stale_after_ms`, 3 s) from its last
/// good scrape, then dropped, while the snapshot stays fresh.
fn a_stale_destination_load_is_priced_then_dropped(h: &mut dyn Driver) {
    let scraped = h.now();
    h.service(Service::Serves(full(1, Some(scraped))));
    h.advance(1_000);
    assert_eq!(route(h, "public"), "us_api", "held load still priced");
    h.advance(3_000);
    assert_eq!(
        route(h, "public"),
        "eu_owned",
        "held past held_load_ms: dropped"
    );
}
