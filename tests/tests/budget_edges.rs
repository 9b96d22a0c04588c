//! Budgets at their edges (red team round 3, issue 50): what a budget's
//! 429 says, a budget on a tenant the client names, hostile rows in the
//! ledger's store, readings reaching a live filter through the control
//! poll, and a soft budget that allows substitutes only. Real Envoys (both
//! builds), a real PostgreSQL store and a real `ace control serve
//! --ledger-store`, with the machinery of `budgets.rs`.

use crate::budgets::{answering, ask, error, fleet_toml, policy_dir, until, World, INTERVAL};
use ace_harness::envoy::EnvoyBuilder;
use ace_ledger::row::Row;
use ace_tests::{now_ms, require_envoy, start, upstream, Filter};
use serde_json::json;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(15);

/// `fleet_toml()`'s fleet with `budgets` instead of its own.
fn with_budgets(budgets: &str) -> String {
    let fleet = fleet_toml();
    let head = fleet.split("[[budgets]]").next().unwrap_or_default();
    format!("{head}{budgets}")
}

/// Write one row into the store at `url`, as another proxy's ingest (or a
/// hostile edit) would: `tenant` booked `nano` nano-USD at `time_ms`.
fn book(url: &str, tenant: &str, time_ms: u64, nano: i64) {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let mut store = ace_ledger::store::open(url).unwrap_or_else(|e| panic!("{e:#}"));
    let row = Row {
        event_id: format!("{:016x}{n:016x}", 0xbad_b00c_u64),
        tenant: Some(tenant.into()),
        time_ms: time_ms as i64,
        booked: nano,
        ..Row::default()
    };
    let new = store.insert(&[row]).unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(new, [true], "the row is stored");
}

/// What the store at `url` holds booked for `tenant`, USD.
fn books(url: &str, tenant: &str) -> f64 {
    let mut store = ace_ledger::store::open(url).unwrap_or_else(|e| panic!("{e:#}"));
    let spent = store
        .spend(0, u64::MAX, &[tenant])
        .unwrap_or_else(|e| panic!("{e:#}"));
    spent.first().map_or(0.0, |(_, n)| *n as f64 / 1e9)
}

/// The 429's message.
fn message(r: &ace_harness::client::Response) -> String {
    error(r)["message"].as_str().unwrap_or_default().to_string()
}

/// Rows: "The soft-budget 429 states the control service's reading only
/// ('USD 0.00 booked' after USD 0.90 booked here)." No control service:
/// a tenant spends past its soft threshold through this proxy alone, and
/// the soft 429 (and the exhausted one) must state what this proxy booked,
/// not only the books' reading (none here).
fn the_429_states_this_proxys_own_spend(filter: Filter) {
    require_envoy();
    let dir = policy_dir(&fleet_toml());
    let mut plugin =
        ace_cli::plugin::build(dir.path(), false, false).unwrap_or_else(|e| panic!("{e:#}"));
    plugin["response_headers"] = json!(true);
    let (owned, api) = (upstream("eu_owned"), upstream("us_api"));
    answering(&owned, 100, 50);
    answering(&api, 2_000, 1_000);
    let envoy = start(
        &filter
            .add_reading_body(EnvoyBuilder::new(), &plugin.to_string())
            .cluster("eu_owned", owned.port())
            .cluster("us_api", api.port()),
    );
    // globex: USD 0.05 a day, soft at half; gpt-4o only on the API at USD
    // 0.015 a request: soft after two, and then nothing can serve gpt-4o.
    for _ in 0..2 {
        assert_eq!(ask(&envoy, "globex", "gpt-4o").status, 200);
    }
    let r = ask(&envoy, "globex", "gpt-4o");
    assert_eq!(r.served(), "refused 429", "{}", r.text());
    assert_eq!(error(&r)["reason"], "budget_soft", "{}", r.text());
    let m = message(&r);
    println!("soft 429: {m}");
    assert!(
        m.contains("USD 0.03 booked by this proxy"),
        "the soft 429 states this proxy's USD 0.03: {m}"
    );
    assert!(m.contains("no reading of the books"), "{m}");
    // northbank: USD 0.05, no soft step: exhausted after four.
    for _ in 0..4 {
        assert_eq!(ask(&envoy, "northbank", "gpt-4o").status, 200);
    }
    let r = ask(&envoy, "northbank", "gpt-4o");
    assert_eq!(error(&r)["reason"], "budget_exhausted", "{}", r.text());
    let m = message(&r);
    println!("exhausted 429: {m}");
    assert!(
        m.contains("USD 0.06 booked by this proxy"),
        "the exhausted 429 states this proxy's USD 0.06: {m}"
    );
}

/// Row: "With `[[budgets]]` and no `attribute_sources`, a budget binds
/// whatever `x-ace-tenant` the client sends; nothing warns at load."
/// `ace plugin-config` warns (naming the budgets, the attribute and how
/// to verify it), and so does the filter, once, when it loads such a
/// configuration; with a verified tenant, neither does.
fn a_budget_on_an_unverified_tenant_warns_at_load(filter: Filter) {
    require_envoy();
    let dir = policy_dir(&fleet_toml());
    let config =
        ace_cli::plugin::build_config(dir.path(), false, false).unwrap_or_else(|e| panic!("{e:#}"));
    let warnings = ace_policy::plugin::warnings(&config);
    println!("ace plugin-config: {warnings:?}");
    let [w] = warnings.as_slice() else {
        panic!("one warning from ace plugin-config: {warnings:?}")
    };
    for needle in [
        "`globex`",
        "`northbank`",
        "`tenant`",
        "x-ace-tenant",
        "attribute_sources",
    ] {
        assert!(w.contains(needle), "the warning names {needle}: {w}");
    }
    let plugin = serde_json::to_value(&config).unwrap_or_else(|e| panic!("{e}"));
    let (owned, api) = (upstream("eu_owned"), upstream("us_api"));
    let run = |plugin: &serde_json::Value| {
        start(
            &filter
                .add_reading_body(EnvoyBuilder::new(), &plugin.to_string())
                .cluster("eu_owned", owned.port())
                .cluster("us_api", api.port()),
        )
    };
    let envoy = run(&plugin);
    let needle = "spend by the `tenant` attribute";
    assert!(
        envoy.wait_log(needle, Duration::from_secs(5)),
        "the filter warns at load:\n{}",
        envoy.log()
    );
    let line = envoy
        .log()
        .lines()
        .find(|l| l.contains(needle))
        .map(str::to_string)
        .unwrap_or_default();
    println!("{} filter: {line}", filter_name(filter));
    assert!(line.contains("attribute_sources"), "{line}");
    drop(envoy);
    // Verified from what an authorization service said: no warning, from
    // either.
    let mut verified = plugin.clone();
    verified["attribute_sources"] = json!({"tenant": {"metadata": {
        "namespace": "envoy.filters.http.ext_authz", "path": ["tenant"]}}});
    let parsed: ace_config::PluginConfig =
        serde_json::from_value(verified.clone()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ace_policy::plugin::warnings(&parsed), Vec::<String>::new());
    let envoy = run(&verified);
    // It has loaded (it answers), and said nothing of the tenant.
    let r = ask(&envoy, "globex", "llama-3.1-8b");
    assert_ne!(r.status, 0);
    assert!(!envoy.log().contains(needle), "{}", envoy.log());
}

fn filter_name(filter: Filter) -> &'static str {
    match filter {
        Filter::Wasm => "wasm",
        Filter::Dynamic => "dynamic module",
    }
}

ace_tests::for_each_filter!(
    the_429_states_this_proxys_own_spend,
    a_budget_on_an_unverified_tenant_warns_at_load,
    a_reading_reaches_a_live_filter_through_the_control_poll,
    a_soft_budget_allowing_substitutes_only_serves_a_substitute,
);

/// Rows: "One store row with a negative `booked_nano` lowers a budget
/// reading to 0 (the clamp is on the sum, not the rows)." and "A row dated
/// years ahead counts in every period until then (no upper time bound in
/// the budget query)." Two Envoys (one of each build) on one PostgreSQL
/// store and one control service: a tenant exhausted through one Envoy is
/// refused by the other through the books; a row of USD -1 in the store
/// (the control service's reading) lifts neither; a row dated ten years
/// ahead for another tenant refuses it on neither.
#[test]
fn two_envoys_on_one_store_hold_their_limits_under_hostile_rows() {
    let fleet = with_budgets(
        r#"[[budgets]]
name = "globex"
tenants = ["globex"]
usd = 0.05
soft_at = 1.0

[[budgets]]
name = "acme"
tenants = ["acme-health"]
usd = 0.05
soft_at = 1.0
"#,
    );
    let mut w = World::new("edges_hostile", &fleet);
    let a = w.envoy(Filter::Wasm);
    let b = w.envoy(Filter::Dynamic);
    // Four requests of USD 0.015 through A: past USD 0.05.
    for _ in 0..4 {
        assert_eq!(ask(&a, "globex", "gpt-4o").status, 200);
    }
    until(&a, "globex", "gpt-4o", "refused 429", WAIT);
    // Once the books hold A's spend and a poll has carried it, B, which
    // booked nothing for globex, refuses on the books' reading alone.
    let t0 = Instant::now();
    while books(&w.store, "globex") < 0.06 - 1e-9 {
        assert!(t0.elapsed() < WAIT, "the books never held A's spend");
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(4 * INTERVAL);
    let on_the_books = until(&b, "globex", "gpt-4o", "refused 429", WAIT);
    println!("B, on the books: {}", message(&on_the_books));
    // A hostile row: USD -1 for globex, now.
    book(&w.store, "globex", now_ms(), -1_000_000_000);
    // A row dated ten years ahead: USD 1 for acme-health.
    book(
        &w.store,
        "acme-health",
        now_ms() + 10 * 365 * 86_400_000,
        1_000_000_000,
    );
    // Past several reads and polls, and past A's own count (the books'
    // lag, 5 s): neither lifts globex's limit, neither refuses acme.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(7) {
        for (name, envoy) in [("A (wasm)", &a), ("B (dynamic module)", &b)] {
            let r = ask(envoy, "globex", "gpt-4o");
            assert_eq!(
                r.served(),
                "refused 429",
                "{name}: a negative row in the store lifted globex's limit after {:?}",
                t0.elapsed()
            );
            assert_eq!(error(&r)["reason"], "budget_exhausted");
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    // B's 429 said what the books held, and that it booked nothing.
    let m = message(&on_the_books);
    assert!(m.contains("USD 0.06 booked as of"), "{m}");
    assert!(m.contains("USD 0.00 by this proxy since"), "{m}");
    for (name, envoy) in [("A (wasm)", &a), ("B (dynamic module)", &b)] {
        let r = ask(envoy, "acme-health", "llama-3.1-8b");
        assert_eq!(
            r.served(),
            "eu-owned",
            "{name}: a row dated ten years ahead counts today: {}",
            r.text()
        );
    }
}

/// Issue 50, item 8: a reading reaches a live filter through the control
/// poll. Nothing is booked through this Envoy: a row another proxy booked
/// (USD 1 for northbank, whose rolling window is six seconds) reaches the
/// store, `ace control serve --ledger-store` reads it, the filter polls
/// it, and northbank is refused, the 429 stating the books' figure; the
/// window moves on, the next reading says so, and northbank is served.
fn a_reading_reaches_a_live_filter_through_the_control_poll(filter: Filter) {
    let name = match filter {
        Filter::Wasm => "edges_poll_wasm",
        Filter::Dynamic => "edges_poll_dynamic",
    };
    let mut w = World::new(name, &fleet_toml());
    let envoy = w.envoy(filter);
    assert_eq!(
        ask(&envoy, "northbank", "llama-3.1-8b").served(),
        "eu-owned"
    );
    book(&w.store, "northbank", now_ms(), 1_000_000_000);
    let r = until(&envoy, "northbank", "llama-3.1-8b", "refused 429", WAIT);
    let m = message(&r);
    println!("refused on the reading: {m}");
    assert_eq!(error(&r)["reason"], "budget_exhausted", "{}", r.text());
    assert!(m.contains("USD 1.00 booked as of"), "{m}");
    assert!(m.contains("by this proxy since"), "{m}");
    // Six seconds on, the window holds nothing of it.
    until(
        &envoy,
        "northbank",
        "llama-3.1-8b",
        "eu-owned",
        Duration::from_secs(6) + WAIT,
    );
    // Another tenant never noticed.
    assert_eq!(ask(&envoy, "acme-health", "gpt-4o").served(), "us-api");
}

/// Issue 50, item 8: a soft `substitution_only` budget end to end. The
/// model class `chat` is llama-3.1-8b (on the owned GPUs) and gpt-4o (on
/// the API); globex's budget (USD 1 a day, soft at half) allows only a
/// substitute when soft. Below the threshold globex's llama-3.1-8b is
/// served as named; a row of USD 0.60 in the store, read by the control
/// service and polled by the filter, makes it soft: llama-3.1-8b is then
/// served by gpt-4o on the API (the answer says `x-ace-budget: soft`), and
/// a model with no substitute is refused with the soft 429. Another tenant
/// is served as before.
fn a_soft_budget_allowing_substitutes_only_serves_a_substitute(filter: Filter) {
    let name = match filter {
        Filter::Wasm => "edges_subst_wasm",
        Filter::Dynamic => "edges_subst_dynamic",
    };
    let fleet = with_budgets(
        r#"[[budgets]]
name = "globex"
tenants = ["globex"]
usd = 1.0
soft_at = 0.5
soft = { substitution_only = true }

[[model_classes]]
name = "chat"
models = ["llama-3.1-8b", "gpt-4o"]
"#,
    )
    // The API serves gpt-4o only; the owned GPUs llama and mistral-small.
    .replace(
        "models = [\"llama-3.1-8b\", \"gpt-4o\"]\n[destinations.cost]",
        "models = [\"gpt-4o\"]\n[destinations.cost]",
    )
    .replace(
        "models = [\"llama-3.1-8b\"]\n[destinations.cost]",
        "models = [\"llama-3.1-8b\", \"mistral-small\"]\n[destinations.cost]",
    )
    .replace(
        "[[models]]\nid = \"gpt-4o\"",
        "[[models]]\nid = \"mistral-small\"\nvram_gb = 48\ntp_degree = 1\n\
         accelerators = [\"h100\"]\n\n[[models]]\nid = \"gpt-4o\"",
    );
    assert!(
        fleet.contains("models = [\"llama-3.1-8b\", \"mistral-small\"]")
            && fleet.contains("models = [\"gpt-4o\"]"),
        "{fleet}"
    );
    let mut w = World::new_with(name, &fleet, &["substitution_tenant.cedar"]);
    let envoy = w.envoy(filter);
    let sent_model = |u: &ace_harness::upstream::Upstream| {
        let last = u.requests().pop().map(|r| r.body).unwrap_or_default();
        serde_json::from_slice::<serde_json::Value>(&last)
            .map_or(String::new(), |v| v["model"].as_str().unwrap_or("").into())
    };
    let r = ask(&envoy, "globex", "llama-3.1-8b");
    assert_eq!(r.served(), "eu-owned", "{}", r.text());
    assert_eq!(r.header("x-ace-budget"), None);
    assert_eq!(sent_model(&w.owned), "llama-3.1-8b");
    book(&w.store, "globex", now_ms(), 600_000_000);
    let r = until(&envoy, "globex", "llama-3.1-8b", "us-api", WAIT);
    assert_eq!(r.header("x-ace-budget"), Some("soft; budget=globex"));
    assert_eq!(sent_model(&w.api), "gpt-4o", "served by a substitute");
    let r = ask(&envoy, "globex", "mistral-small");
    assert_eq!(r.served(), "refused 429", "{}", r.text());
    assert_eq!(error(&r)["reason"], "budget_soft", "{}", r.text());
    let m = message(&r);
    println!("soft, no substitute: {m}");
    assert!(m.contains("a substitute model"), "{m}");
    assert!(m.contains("USD 0.60 booked as of"), "{m}");
    // Another tenant: as named, on the owned GPUs.
    let r = ask(&envoy, "acme-health", "llama-3.1-8b");
    assert_eq!(r.served(), "eu-owned", "{}", r.text());
    assert_eq!(sent_model(&w.owned), "llama-3.1-8b");
}
