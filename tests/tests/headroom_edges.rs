//! A provider's own word at its edges, in a real Envoy, both builds, with
//! fake providers that send what their documentation says
//! (`ace_harness::provider`): a reserved block priced past its commitment
//! still spills when its provider says nothing is left; a reset time in
//! the far future keeps a destination out no longer than the longest
//! cool-down; and a client's credential in the query string reaches no
//! provider that does not pass credentials.

use ace_harness::provider::{Errors, Limits, Spec};
use ace_tests::{permit_tables, upstream, Filter, ProviderFleet};
use serde_json::json;
use std::time::{Duration, Instant};

type Fleet = ProviderFleet;

fn spec(name: &str, host: &str, credential: (&str, &str), paths: &[&str], models: &[&str]) -> Spec {
    Spec {
        name: name.into(),
        host: Some(host.into()),
        credential: (credential.0.into(), credential.1.into()),
        paths: paths.iter().map(|p| p.to_string()).collect(),
        models: models.iter().map(|m| m.to_string()).collect(),
        errors: Errors::OpenAi,
        limits: Limits::None,
    }
}

const PTU_PATH: &str = "/openai/deployments/gpt4o-ptu/chat/completions?api-version=2024-10-21";

/// A reserved block with an overage price, as the example fleet's
/// `eu-reserved-a100` (policies/fleet.toml: capacity 32, knee 0.8,
/// `overage_usd_per_mtok = 0.9`), on a provider reporting its headroom as
/// `limits` (`errors`, `credential` and `path` its shape), before a
/// pay-as-you-go API that costs more even than the overage.
fn reserved_with_overage(filter: Filter, limits: Limits, azure: bool) -> Fleet {
    let (credential, path, errors) = if azure {
        (("api-key", "azure-key"), PTU_PATH, Errors::Azure)
    } else {
        (
            ("authorization", "Bearer sk-reserved"),
            "/v1/chat/completions",
            Errors::OpenAi,
        )
    };
    let config = json!({
        "allow_no_policy": true,
        "response_headers": true,
        "body": {"read": true},
        "destinations": [
            {"name": "reserved", "cluster": "reserved", "tier": "reserved", "capacity": 32,
             "knee": 0.8, "overage_usd_per_token": 0.9e-6,
             "upstream": {"authority": "reserved.provider.test",
                          "paths": {"chat_completions": path}}},
            {"name": "openai", "cluster": "openai", "tier": "payg",
             "usd_per_input_token": 2.5e-6, "usd_per_output_token": 1e-5,
             "upstream": {"authority": "api.openai.test",
                          "paths": {"chat_completions": "/v1/chat/completions"}}}
        ]
    });
    let specs = vec![
        Spec {
            errors,
            limits,
            ..spec(
                "reserved",
                "reserved.provider.test",
                credential,
                &[path],
                &["gpt-4o"],
            )
        },
        spec(
            "openai",
            "api.openai.test",
            ("authorization", "Bearer sk-openai"),
            &["/v1/chat/completions"],
            &["gpt-4o"],
        ),
    ];
    Fleet::start(filter, &config, specs, &[])
}

/// The first answer says nothing is left; the second request must go to
/// the next rung, and the block must never have answered 429.
fn spills_on_its_first_exhausted_answer(f: &Fleet) {
    let first = f.send("/v1/chat/completions", "gpt-4o");
    assert_eq!((first.status, first.served()), (200, "reserved".into()));
    let next = f.send("/v1/chat/completions", "gpt-4o");
    assert_eq!(
        (next.status, next.served(), next.header("x-ace-reason")),
        (200, "openai".into(), Some("spill")),
        "the provider said nothing is left: the next request spills before its 429 \
         (the block's 429s: {:?})",
        f.providers[0]
            .rejected()
            .iter()
            .map(|(s, _)| *s)
            .collect::<Vec<_>>()
    );
    assert!(
        f.providers[0].rejected().is_empty(),
        "the spill came before any 429: {:?}",
        f.providers[0].rejected()
    );
}

/// Row: A reserved destination with `overage_usd_per_mtok` whose provider
/// says nothing is left (`x-ratelimit-remaining-tokens: 0`,
/// `azure-openai-deployment-utilization: 100.5%`) keeps getting requests,
/// priced at overage, instead of spilling before the 429 as
/// `health.headroom_low` promises: the throttle's cap of 0 is read as
/// "past the commitment". (The Azure provisioned deployment's
/// utilisation.)
fn a_reserved_block_with_overage_spills_when_its_deployment_is_full(filter: Filter) {
    let f = reserved_with_overage(filter, Limits::Provisioned { step: 100.5 }, true);
    spills_on_its_first_exhausted_answer(&f);
}

/// Row: A reserved destination with `overage_usd_per_mtok` whose provider
/// says nothing is left (`x-ratelimit-remaining-tokens: 0`,
/// `azure-openai-deployment-utilization: 100.5%`) keeps getting requests,
/// priced at overage, instead of spilling before the 429 as
/// `health.headroom_low` promises: the throttle's cap of 0 is read as
/// "past the commitment". (OpenAI's remaining tokens.)
fn a_reserved_block_with_overage_spills_when_no_tokens_are_left(filter: Filter) {
    let limits = Limits::Tokens {
        limit: 1000,
        per_request: 1000,
        reset: "1s",
    };
    let f = reserved_with_overage(filter, limits, false);
    spills_on_its_first_exhausted_answer(&f);
}

/// Two Anthropic destinations for Claude; the cheaper one's provider says
/// its tokens reset at the end of time.
fn claude_fleet(filter: Filter, reset: &'static str) -> Fleet {
    let dest = |name: &str, host: &str, usd: f64| {
        json!({"name": name, "cluster": name, "tier": "payg",
               "usd_per_input_token": usd, "usd_per_output_token": usd * 5.0,
               "upstream": {"authority": host}})
    };
    let config = json!({
        "allow_no_policy": true,
        "response_headers": true,
        "body": {"read": true},
        // The longest any one signal keeps a destination out.
        "health": {"base_cooldown_ms": 500, "max_cooldown_ms": 1000},
        "destinations": [
            dest("anthropic", "api.anthropic.test", 3e-6),
            dest("anthropic_eu", "eu.anthropic.test", 4e-6)
        ]
    });
    let claude = |name: &str, host: &str, key: &str, limits: Limits| Spec {
        errors: Errors::Anthropic,
        limits,
        ..spec(
            name,
            host,
            ("x-api-key", key),
            &["/v1/messages"],
            &["claude-sonnet-4-5"],
        )
    };
    let specs = vec![
        claude(
            "anthropic",
            "api.anthropic.test",
            "sk-ant-a",
            Limits::Anthropic {
                limit: 1000,
                per_request: 1000,
                reset,
            },
        ),
        claude(
            "anthropic_eu",
            "eu.anthropic.test",
            "sk-ant-eu",
            Limits::None,
        ),
    ];
    Fleet::start(filter, &config, specs, &[])
}

/// Row: `anthropic-ratelimit-tokens-remaining: 0` with
/// `-reset: 9999-12-31T23:59:59Z` takes a destination out for the life of
/// the proxy; the other reset headers are capped at a day.
fn a_reset_at_the_end_of_time_keeps_a_destination_out_no_longer_than_the_longest_cool_down(
    filter: Filter,
) {
    let f = claude_fleet(filter, "9999-12-31T23:59:59Z");
    let first = f.send("/v1/messages", "claude-sonnet-4-5");
    assert_eq!((first.status, first.served()), (200, "anthropic".into()));
    // Its window turns, whatever the header said.
    f.providers[0].replenish();
    let next = f.send("/v1/messages", "claude-sonnet-4-5");
    assert_eq!(
        (next.status, next.served()),
        (200, "anthropic_eu".into()),
        "nothing left: the next request spills"
    );
    // health.max_cooldown_ms is 1 s: the destination is back within it,
    // not in the year 9999. (Waiting ten times as long tells the two
    // apart without timing anything.)
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut went = Vec::new();
    loop {
        let r = f.send("/v1/messages", "claude-sonnet-4-5");
        went.push(r.served());
        if r.served() == "anthropic" {
            assert_eq!(r.status, 200, "{r:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a reset in the year 9999 kept the destination out past health.max_cooldown_ms \
             (1 s) for 10 s: {} requests since, none to it ({:?})",
            went.len(),
            went.last()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        f.providers[0].rejected().is_empty(),
        "{:?}",
        f.providers[0].rejected()
    );
}

/// Claude on an Anthropic destination without `paths`, and the model
/// `gateway-model` on a gateway that passes the client's credentials.
/// Value indices (sorted): 0 unknown, 1 claude, 2 gateway-model.
fn query_tables() -> String {
    permit_tables(
        &["anthropic", "gateway"],
        "model",
        &["claude-sonnet-4-5", "gateway-model"],
        &[0, 0b01, 0b10],
    )
}

/// Row: A client credential in the query string (`?key=`, `?api-key=`)
/// reaches a provider that does not pass credentials when its destination
/// has no `paths`.
fn a_credential_in_the_query_string_reaches_no_provider_that_does_not_pass_credentials(
    filter: Filter,
) {
    let gateway = upstream("gateway");
    let config = json!({
        "tables_base64": query_tables(),
        "response_headers": true,
        "body": {"read": true},
        "destinations": [
            {"name": "anthropic", "cluster": "anthropic", "tier": "payg",
             "usd_per_input_token": 3e-6, "usd_per_output_token": 1.5e-5,
             "upstream": {"authority": "api.anthropic.test"}},
            {"name": "gateway", "cluster": "gateway", "tier": "payg",
             "usd_per_input_token": 3e-6, "usd_per_output_token": 1.5e-5,
             "upstream": {"pass_credentials": true}}
        ]
    });
    let anthropic = Spec {
        errors: Errors::Anthropic,
        ..spec(
            "anthropic",
            "api.anthropic.test",
            ("x-api-key", "sk-ant-a"),
            // The Messages API, and its beta surface as Anthropic's SDKs
            // call it.
            &["/v1/messages", "/v1/messages?beta=true"],
            &["claude-sonnet-4-5"],
        )
    };
    let f = Fleet::start(
        filter,
        &config,
        vec![anthropic],
        &[("gateway", gateway.port())],
    );
    // Each way a client may put a key in the query (Gemini's `key`, its
    // `$key` system parameter, Azure's `api-key`, OAuth's `access_token`),
    // in any case, percent-encoded, empty, repeated or after a `;`: what
    // reaches Anthropic is the rest of the query, as sent.
    for (sent, arrives) in [
        ("/v1/messages?key=client-key", "/v1/messages"),
        (
            "/v1/messages?beta=true&key=client-key",
            "/v1/messages?beta=true",
        ),
        (
            "/v1/messages?KEY=client-key&beta=true",
            "/v1/messages?beta=true",
        ),
        (
            "/v1/messages?%6Bey=client-key&beta=true",
            "/v1/messages?beta=true",
        ),
        (
            "/v1/messages?%24key=client-key&beta=true",
            "/v1/messages?beta=true",
        ),
        (
            "/v1/messages?api-key=client-key&beta=true&Api%2DKey=k2",
            "/v1/messages?beta=true",
        ),
        (
            "/v1/messages?key=&beta=true&key=again",
            "/v1/messages?beta=true",
        ),
        (
            "/v1/messages?access_token=client-token&beta=true",
            "/v1/messages?beta=true",
        ),
        (
            "/v1/messages?beta=true;key=client-key",
            "/v1/messages?beta=true",
        ),
    ] {
        let before = f.providers[0].accepted().len();
        let r = f.send(sent, "claude-sonnet-4-5");
        assert_eq!(
            (r.status, r.served()),
            (200, "anthropic".into()),
            "{sent}: Anthropic refused {:?}",
            f.providers[0]
                .rejected()
                .last()
                .map(|(s, req)| (*s, req.path.clone()))
        );
        let got = f.providers[0].accepted();
        let got = got.get(before).map(|r| r.path.as_str());
        assert_eq!(got, Some(arrives), "{sent}");
    }
    // A destination that passes credentials gets the query as sent.
    let sent = "/v1/messages?beta=true&key=client-key";
    let r = f.send(sent, "gateway-model");
    assert_eq!(r.served(), "gateway", "{r:?}");
    let got = gateway.requests();
    assert_eq!(got.last().map(|r| r.path.as_str()), Some(sent));
    assert_eq!(
        got.last().and_then(|r| r.header("x-api-key")),
        Some("client-forged")
    );
}

ace_tests::for_each_filter!(
    a_reserved_block_with_overage_spills_when_its_deployment_is_full,
    a_reserved_block_with_overage_spills_when_no_tokens_are_left,
    a_reset_at_the_end_of_time_keeps_a_destination_out_no_longer_than_the_longest_cool_down,
    a_credential_in_the_query_string_reaches_no_provider_that_does_not_pass_credentials,
);
