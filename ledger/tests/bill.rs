//! Providers' bills (`tests/golden/bills`, each copied from its
//! documentation, cited in its README): imported, stored idempotently in
//! SQLite and a real PostgreSQL, and reconciled with a ledger that booked
//! the same requests: no difference; then the same records with a price
//! changed, a cached-token count halved and a tier downgraded, each
//! difference found and named with its cause.

use crate::common;
use ace_harness::pg::Pg;
use ace_ledger::bill::reconcile::{Cause, Reconciliation};
use ace_ledger::bill::{self, Format};
use ace_ledger::book::Ledger;
use ace_ledger::ingest::Options;
use ace_ledger::window::Rules;

/// A bill fixture's bytes.
fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/golden/bills/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The fixtures of each provider's records, and their format.
const BILLS: [(&str, Format); 5] = [
    ("openai-usage", Format::OpenaiUsage),
    ("openai-costs", Format::OpenaiCosts),
    ("anthropic-usage", Format::AnthropicUsage),
    ("anthropic-cost", Format::AnthropicCost),
    ("azure-focus", Format::FocusCsv),
];

fn file(name: &str, changed: bool) -> String {
    let ext = if name.ends_with("focus") {
        "csv"
    } else {
        "json"
    };
    if changed {
        format!("{name}.changed.{ext}")
    } else {
        format!("{name}.{ext}")
    }
}

/// One event line: five a day per provider, whose sums are each record's
/// figures (input 1000 with 400 cached, output 500 a day).
#[allow(clippy::too_many_arguments)]
fn event(
    n: u32,
    config: &str,
    day: u32,
    dest: &str,
    model: &str,
    upstream: Option<&str>,
    read: u32,
    write: u32,
    tin: u32,
) -> String {
    let time = 1_730_419_200_000u64 + u64::from(day) * 86_400_000 + u64::from(n) * 1000;
    let upstream = upstream.map_or("null".into(), |u| format!("\"{u}\""));
    format!(
        "{{\"schema\":\"ace.event/2\",\"event_id\":\"{n:032x}\",\"config\":\"{config}\",\
         \"request_id\":\"r-{n}\",\"time_ms\":{time},\"tenant\":\"acme\",\"data_class\":null,\
         \"latency_class\":null,\"model_requested\":\"{model}\",\"model_served\":\"{model}\",\
         \"upstream_model\":{upstream},\"destination\":\"{dest}\",\"tier\":\"payg\",\
         \"tokens_in\":{tin},\"tokens_out\":100,\"tokens_cache_read\":{read},\
         \"tokens_cache_write\":{write},\"tokens_estimated\":false,\"status\":200,\
         \"latency_ms\":100,\"slo_ms\":null,\"slo_met\":null,\"marginal_usd\":0,\
         \"counterfactual_usd\":null,\"reason\":\"cheapest\",\"warm\":true,\"overage\":false,\
         \"usage_capped\":false,\"cached\":false}}\n"
    )
}

/// A ledger at `url` that booked the requests the records charge for.
pub(crate) fn booked(url: &str) -> Ledger {
    let mut ledger = Ledger::open(url).expect("open");
    let config = fixture("config.json");
    let id = ledger.register(&config, "bills config").expect("register");
    let mut log = String::new();
    let mut n = 0;
    for day in 0..3 {
        for _ in 0..5 {
            n += 1;
            log += &event(n, &id, day, "openai", "gpt-4o", None, 80, 20, 200);
            n += 1;
            log += &event(
                n,
                &id,
                day,
                "anthropic",
                "claude-sonnet-4-20250514",
                None,
                80,
                20,
                300,
            );
            n += 1;
            log += &event(
                n,
                &id,
                day,
                "azure",
                "gpt-4o-mini",
                Some("gpt-4o-mini-0718"),
                80,
                0,
                200,
            );
        }
    }
    let s = ledger
        .ingest_bytes("bills.log", log.as_bytes(), &Options::default())
        .expect("ingest");
    assert_eq!((s.new, s.rejected.len()), (45, 0), "{:#?}", s.rejected);
    ledger
}

pub(crate) fn import(ledger: &mut Ledger, changed: bool) -> Vec<bill::Summary> {
    BILLS
        .iter()
        .map(|(name, format)| {
            let f = file(name, changed);
            let bytes = fixture(&f);
            assert_eq!(bill::detect(&f, &bytes).expect("detect"), *format, "{f}");
            bill::import::file(ledger.store.as_mut(), &f, &bytes, None).expect("import")
        })
        .collect()
}

/// [`booked`] in a new SQLite file (removed with the directory).
fn booked_sqlite() -> (tempfile::TempDir, Ledger) {
    let (dir, url) = common::sqlite_url();
    (dir, booked(&url))
}

/// Fixture `name` with its first `from` replaced by `to`.
fn edited(name: &str, from: &str, to: &str) -> String {
    String::from_utf8(fixture(name))
        .expect("utf8")
        .replacen(from, to, 1)
}

/// OpenAI's usage answer with its first result's output tokens `n`.
fn usage_with_output(n: &str) -> String {
    let to = format!("\"output_tokens\": {n}");
    edited("openai-usage.json", "\"output_tokens\": 500", &to)
}

fn reconciliation(ledger: &mut Ledger) -> Reconciliation {
    ledger.report(&Rules::default()).expect("report").bills
}

#[test]
fn documented_records_reconcile_with_the_same_requests_booked() {
    let (_dir, mut ledger) = booked_sqlite();
    let s = import(&mut ledger, false);
    let lines: Vec<(u64, usize)> = s.iter().map(|s| (s.new, s.rejected.len())).collect();
    assert_eq!(lines, [(3, 0), (3, 0), (3, 0), (12, 0), (12, 0)]);
    let r = reconciliation(&mut ledger);
    assert_eq!(r.differences().count(), 0, "{r:#?}");
    assert_eq!(r.unmatched_destinations, Vec::<String>::new());
    // Every provider's days are compared, each figure the record states.
    let compared: Vec<(&str, &str)> = r
        .comparisons
        .iter()
        .map(|c| (c.key.provider.as_str(), c.key.model.as_str()))
        .collect();
    for want in [
        ("openai", "gpt-4o"),
        ("openai", "*"),
        ("anthropic", "claude-sonnet-4"),
        ("azure", "gpt-4o-mini-0718"),
    ] {
        assert_eq!(
            compared.iter().filter(|c| **c == want).count(),
            3,
            "{want:?}: {compared:?}"
        );
    }
    // The GPU VM is standing capacity, listed apart: 3 days.
    assert_eq!(r.capacity.len(), 3);
    assert_eq!(r.capacity[0].figures.cost, Some(88_128_000_000));
    let table = ledger.report(&Rules::default()).expect("report").table();
    assert!(
        table.contains("books against the bill: 33 bill lines, 0 rows not imported"),
        "{table}"
    );
    assert!(table.contains("0 differing"), "{table}");
}

#[test]
fn a_changed_price_halved_cached_tokens_and_a_downgraded_tier_are_each_named() {
    let (_dir, mut ledger) = booked_sqlite();
    import(&mut ledger, true);
    let r = reconciliation(&mut ledger);
    let has = |provider: &str, day: &str, measure: &str, cause: Cause| {
        r.differences().any(|(k, d)| {
            k.provider == provider && k.day == day && d.measure == measure && d.cause == cause
        })
    };
    // Each change on its day, as the figure it changes.
    let changed = [
        (Cause::Price, "2024-11-01", "cost"),
        (Cause::CachedTokens, "2024-11-02", "tokens_cached"),
        (Cause::Tier, "2024-11-03", "tier"),
    ];
    for provider in ["openai", "anthropic", "azure"] {
        for (cause, day, measure) in changed {
            assert!(
                has(provider, day, measure, cause),
                "{provider} {cause:?}: {r:#?}"
            );
        }
    }
    // Nothing else: every difference is one of the three, on its day.
    for (k, d) in r.differences() {
        let day = changed.iter().find(|c| c.0 == d.cause).map(|c| c.1);
        assert_eq!(Some(k.day.as_str()), day, "unexpected: {k:?} {d:?}");
    }
    // The price drift is a proposal, never applied: +10 % on OpenAI (its
    // costs are not split by kind, so both prices scale), Anthropic's and
    // Azure's output price from the bill's output line.
    let proposals: Vec<(String, String, f64)> = r
        .comparisons
        .iter()
        .flat_map(|c| {
            c.proposals
                .iter()
                .map(|p| (p.destination.clone(), p.field.clone(), p.proposed))
        })
        .collect();
    let near = |dest: &str, field: &str, want: f64| {
        proposals
            .iter()
            .any(|p| p.0 == dest && p.1 == field && (p.2 - want).abs() < want * 1e-6)
    };
    for (dest, field, want) in [
        ("openai", "usd_per_input_token", 2.75e-6),
        ("openai", "usd_per_output_token", 1.1e-5),
        ("anthropic", "usd_per_output_token", 1.65e-5),
        ("azure", "usd_per_output_token", 7.26e-7),
    ] {
        assert!(near(dest, field, want), "{dest} {field}: {proposals:?}");
    }
    let config = ledger.registry.ids();
    assert_eq!(config.len(), 1, "no configuration was changed or added");
    let html =
        ace_ledger::html::page(&ledger.report(&Rules::default()).expect("report")).expect("html");
    assert!(html.contains("<table id=\"bills\">") && html.contains("proposed (not applied)"));
}

/// The same bills in SQLite and in a real PostgreSQL: the same stored
/// lines and reconciliation; importing again adds nothing.
#[test]
fn bills_are_stored_idempotently_in_sqlite_and_postgres() {
    let pg = Pg::start();
    let (_dir, sqlite) = common::sqlite_url();
    let mut a = booked(&sqlite);
    let mut b = booked(&pg.database("bills"));
    for ledger in [&mut a, &mut b] {
        import(ledger, false);
        let again: Vec<(u64, u64, u64)> = import(ledger, false)
            .iter()
            .map(|s| (s.new, s.already, s.restated))
            .collect();
        assert_eq!(
            again,
            [(0, 3, 0), (0, 3, 0), (0, 3, 0), (0, 12, 0), (0, 12, 0)]
        );
    }
    let la = a.store.bill_lines().expect("lines");
    assert_eq!(la.len(), 33);
    assert_eq!(la, b.store.bill_lines().expect("lines"), "line for line");
    assert_eq!(reconciliation(&mut a), reconciliation(&mut b));
    // A restated bill replaces the lines whose figures changed.
    let f = file("openai-costs", true);
    let s = bill::import::file(b.store.as_mut(), &f, &fixture(&f), None).expect("restated");
    assert_eq!((s.new, s.already, s.restated), (0, 2, 1));
}

/// Bad rows are named (file, row, field, what is accepted), kept, and
/// never stop the rest.
#[test]
fn bad_rows_are_named_and_the_rest_imported() {
    let (_dir, mut ledger) = booked_sqlite();
    let usage = usage_with_output("-5");
    let s = bill::import::file(ledger.store.as_mut(), "bad.json", usage.as_bytes(), None)
        .expect("import");
    assert_eq!((s.new, s.rejected.len()), (2, 1));
    assert_eq!(
        s.rejected[0].to_string(),
        "bad.json:1: `data[0].results[0].output_tokens`: -5 is not a count; a whole number >= 0 is accepted"
    );
    let csv = edited("azure-focus.csv", "0.000099,USD", "0.000099,EUR").replacen(
        "0.00033,USD,Usage,2024-11-02",
        "abc,USD,Usage,2024-11-02",
        1,
    );
    let s =
        bill::import::file(ledger.store.as_mut(), "bad.csv", csv.as_bytes(), None).expect("import");
    let named: Vec<String> = s.rejected.iter().map(ToString::to_string).collect();
    assert_eq!(
        named,
        [
            "bad.csv:2: `BillingCurrency`: \"EUR\": the ledger books USD only; USD is accepted (or an x_BilledCostInUsd column)",
            "bad.csv:4: `BilledCost`: \"abc\" is not an amount; a decimal is accepted",
        ]
    );
    assert_eq!(s.new, 10);
    assert_eq!(ledger.store.bill_rejects().expect("rejects").len(), 3);
    assert_eq!(reconciliation(&mut ledger).rows_not_imported, 3);
}

/// A day's cost from a record naming no model (OpenAI's costs) that
/// differs where the same day's usage record counts more tokens than the
/// books is put down to the tokens, not to a price: no change proposed.
#[test]
fn a_day_total_follows_the_usage_record_not_a_price() {
    let (_dir, mut ledger) = booked_sqlite();
    let usage = usage_with_output("570");
    let costs = fixture("openai-costs.changed.json");
    for (name, bytes) in [("usage.json", usage.as_bytes()), ("costs.json", &costs)] {
        bill::import::file(ledger.store.as_mut(), name, bytes, None).expect("import");
    }
    let r = reconciliation(&mut ledger);
    let day1 = |model: &str, measure: &str, cause: Cause| {
        r.differences().any(|(k, d)| {
            (k.provider.as_str(), k.day.as_str(), k.model.as_str())
                == ("openai", "2024-11-01", model)
                && d.measure == measure
                && d.cause == cause
        })
    };
    assert!(day1("gpt-4o", "tokens_out", Cause::MissingInLog), "{r:#?}");
    assert!(day1("*", "cost", Cause::MissingInLog), "{r:#?}");
    assert!(
        r.comparisons.iter().all(|c| c.proposals.is_empty()),
        "{r:#?}"
    );
}
