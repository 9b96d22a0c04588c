//! Hostile input: whoever can send a request writes part of an access-log
//! line, and whoever can write the log writes all of it. Each test here is
//! one way such a line once broke the ledger (issue 33): a NUL the store
//! cannot hold, times and latencies that overflow every later report, a
//! stray time that billed owned pools for decades, token counts past the
//! configuration's bound, forged or client-chosen ids that hid events,
//! spreadsheet formulas and terminal escapes passed through, one bad line
//! that stopped or lost the rest, and an earlier configuration refused.

use crate::common;
use ace_ledger::book::Ledger;
use ace_ledger::ingest::{Options, Summary};
use ace_ledger::row::Row;
use ace_ledger::store::{Reject, Store};
use ace_ledger::window::Rules;
use serde_json::{json, Value};

/// Golden line 1 (owned, tenant acme, 1000 + 500 tokens) under `cfg`, as
/// event `n`, with `patch`'s fields replaced.
fn event(cfg: &str, n: u32, patch: Value) -> String {
    let first = include_str!("golden/events.ndjson")
        .lines()
        .next()
        .unwrap_or_default();
    let mut e: Value = serde_json::from_str(first).expect("golden line");
    e["config"] = cfg.into();
    e["event_id"] = format!("{n:032x}").into();
    e["request_id"] = format!("t-{n}").into();
    if let (Some(o), Value::Object(p)) = (e.as_object_mut(), patch) {
        o.extend(p);
    }
    e.to_string()
}

fn lines(ls: &[String]) -> Vec<u8> {
    let mut out = ls.join("\n").into_bytes();
    out.push(b'\n');
    out
}

/// A SQLite ledger with `config` registered, and its id.
fn ledger_with(config: &[u8]) -> (tempfile::TempDir, Ledger, String) {
    let (dir, url) = common::sqlite_url();
    let mut ledger = Ledger::open(&url).expect("open");
    let id = ledger.register(config, "config").expect("register");
    (dir, ledger, id)
}

fn ledger() -> (tempfile::TempDir, Ledger, String) {
    ledger_with(&common::golden_config())
}

fn ingest(ledger: &mut Ledger, source: &str, bytes: &[u8]) -> Summary {
    ledger
        .ingest_bytes(source, bytes, &Options::default())
        .expect("ingest")
}

fn rows(store: &mut dyn Store) -> Vec<Row> {
    let mut out = Vec::new();
    store
        .scan(&mut |r| {
            out.push(r);
            Ok(())
        })
        .expect("scan");
    out
}

fn rejected_lines(s: &Summary) -> Vec<i64> {
    s.rejected.iter().map(|r| r.line).collect()
}

/// Finding 1: a NUL is stored as `\u0000`, a byte that is not UTF-8 as
/// `\xNN`, the same text whichever the store (PostgreSQL refuses a NUL).
#[test]
fn text_with_a_nul_or_bytes_not_utf8_is_stored_escaped() {
    let (_dir, mut ledger, id) = ledger();
    let mut bytes = lines(&[event(
        &id,
        1,
        json!({"tenant": "a\u{0}b", "request_id": "\u{0}"}),
    )]);
    let bad = event(&id, 2, json!({"tenant": "xBADy"}));
    let (head, tail) = bad.split_once("BAD").expect("marker");
    bytes.extend_from_slice(head.as_bytes());
    bytes.push(0xff);
    bytes.extend_from_slice(tail.as_bytes());
    bytes.push(b'\n');
    let s = ingest(&mut ledger, "nul.log", &bytes);
    assert_eq!((s.new, s.rejected.len()), (2, 0), "{:?}", s.rejected);
    let got = rows(ledger.store.as_mut());
    let tenants: Vec<&str> = got.iter().filter_map(|r| r.tenant.as_deref()).collect();
    assert_eq!(tenants, ["a\\u0000b", "x\\xffy"]);
    assert_eq!(got[0].request_id.as_deref(), Some("\\u0000"));
}

/// A store that refuses any batch holding tenant `poison`, as PostgreSQL
/// refuses a row it cannot hold.
struct Picky(Box<dyn Store>);

impl Store for Picky {
    fn put_config(&mut self, id: &str, json: &str) -> anyhow::Result<()> {
        self.0.put_config(id, json)
    }
    fn configs(&mut self) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
        self.0.configs()
    }
    fn insert(&mut self, rows: &[Row]) -> anyhow::Result<Vec<bool>> {
        if rows.iter().any(|r| r.tenant.as_deref() == Some("poison")) {
            anyhow::bail!("invalid byte sequence for encoding \"UTF8\": 0x00");
        }
        self.0.insert(rows)
    }
    fn get(&mut self, event_id: &str) -> anyhow::Result<Option<Row>> {
        self.0.get(event_id)
    }
    fn put_rejects(&mut self, rejects: &[Reject]) -> anyhow::Result<()> {
        self.0.put_rejects(rejects)
    }
    fn rejects(&mut self) -> anyhow::Result<Vec<Reject>> {
        self.0.rejects()
    }
    fn scan(&mut self, f: &mut dyn FnMut(Row) -> anyhow::Result<()>) -> anyhow::Result<()> {
        self.0.scan(f)
    }
    fn spend(
        &mut self,
        since_ms: u64,
        until_ms: u64,
        tenants: &[&str],
    ) -> anyhow::Result<Vec<(String, i64)>> {
        self.0.spend(since_ms, until_ms, tenants)
    }
}

/// Finding 1: a row the store refuses is rejected with its line and the
/// store's reason; the rest of its batch is booked.
#[test]
fn a_row_the_store_refuses_is_rejected_by_its_line_and_its_batch_is_booked() {
    let (_dir, ledger, id) = ledger();
    let mut ledger = Ledger {
        store: Box::new(Picky(ledger.store)),
        registry: ledger.registry,
    };
    let bytes = lines(&[
        event(&id, 1, json!({})),
        event(&id, 2, json!({"tenant": "poison"})),
        event(&id, 3, json!({})),
    ]);
    let s = ingest(&mut ledger, "batch.log", &bytes);
    assert_eq!(s.new, 2);
    assert_eq!(rejected_lines(&s), [2]);
    assert!(
        s.rejected[0].error.contains("the store refused event")
            && s.rejected[0].error.contains("UTF8"),
        "{}",
        s.rejected[0].error
    );
}

/// Finding 2: times outside 2000..2100 and latencies over a day are
/// refused, each named by its line and field.
#[test]
fn out_of_range_times_and_latencies_are_refused_by_line_and_field() {
    let (_dir, mut ledger, id) = ledger();
    let bytes = lines(&[
        event(&id, 1, json!({"time_ms": u64::MAX})),
        event(&id, 2, json!({"time_ms": 0})),
        event(&id, 3, json!({"latency_ms": i64::MAX})),
        event(&id, 4, json!({"time_ms": 4_102_444_800_000u64})),
        event(&id, 5, json!({"slo_ms": u64::MAX})),
        event(&id, 6, json!({})),
    ]);
    let s = ingest(&mut ledger, "times.log", &bytes);
    assert_eq!(s.new, 1);
    assert_eq!(rejected_lines(&s), [1, 2, 3, 4, 5]);
    for (r, field) in
        s.rejected
            .iter()
            .zip(["time_ms", "time_ms", "latency_ms", "time_ms", "slo_ms"])
    {
        assert!(r.error.contains(&format!("`{field}`")), "{}", r.error);
    }
}

/// Finding 2: whatever a store holds (it may have been written by an
/// older ledger or edited), report, table, trace, export and page never
/// panic.
#[test]
fn no_stored_value_makes_a_report_trace_or_export_panic() {
    let (_dir, url) = common::sqlite_url();
    let (mut golden, _) = common::golden_ledger(&url);
    let good = rows(golden.store.as_mut());
    let (_dir2, mut ledger, _) = ledger();
    let edits: [fn(&mut Row); 8] = [
        |r| r.time_ms = i64::MAX,
        |r| r.time_ms = i64::MIN,
        |r| r.latency_ms = i64::MAX,
        |r| r.latency_ms = i64::MAX,
        |r| {
            r.booked = i64::MAX;
            r.counterfactual = Some(i64::MIN);
        },
        |r| {
            r.booked = i64::MAX;
            r.tokens_in = i64::MAX;
            r.tokens_out = i64::MAX;
        },
        |r| {
            r.booked = i64::MIN;
            r.tokens_in = -5;
            r.latency_ms = i64::MIN;
        },
        |r| r.time_ms = 0,
    ];
    let mut hostile = Vec::new();
    for (k, edit) in edits.iter().enumerate() {
        let mut r = good[k % good.len()].clone();
        r.event_id = format!("edited-{k}");
        edit(&mut r);
        hostile.push(r);
    }
    hostile.extend(good);
    ledger.store.insert(&hostile).expect("insert");
    for window_ms in [1, 60_000, i64::MAX] {
        let rules = Rules {
            window_ms,
            ..Rules::default()
        };
        let r = ledger.report(&rules).expect("report");
        assert_eq!(r.events, 18);
        let _ = r.table();
        let _ = serde_json::to_string(&r).expect("json");
        let mut csv = Vec::new();
        ace_ledger::focus::export(ledger.store.as_mut(), &r, &rules, &mut csv).expect("export");
        let sel = ace_ledger::trace::Select::default();
        let (t, booked, savings) =
            ace_ledger::trace::rows(ledger.store.as_mut(), &r, &rules, &sel).expect("trace");
        let _ = ace_ledger::trace::table(&t, booked, &savings);
        if window_ms == 60_000 {
            let _ = ace_ledger::html::page(&r);
        }
    }
}

/// Finding 3: a time of 0 is refused; the earliest time booked, decades
/// before the rest, adds one window to the owned pools' period, not the
/// years between.
#[test]
fn a_stray_time_cannot_stretch_the_chargeback_period() {
    let (_dir, url) = common::sqlite_url();
    let (mut ledger, _) = common::golden_ledger(&url);
    let id = ace_ledger::configs::config_id(&common::golden_config());
    let bytes = lines(&[
        event(&id, 0x51, json!({"time_ms": 0})),
        event(&id, 0x52, json!({"time_ms": ace_ledger::kind::MIN_TIME_MS})),
    ]);
    let s = ingest(&mut ledger, "stray.log", &bytes);
    assert_eq!((s.new, rejected_lines(&s)), (1, vec![1]));
    let r = ledger.report(&Rules::default()).expect("report");
    // The golden events' two 5-minute windows, and the stray one's.
    assert_eq!(r.chargeback.period_ms, 900_000);
    let owned = r.chargeback.pool("owned").expect("owned");
    // $2/h for a quarter hour.
    assert_eq!(owned.cost, 500_000_000);
}

#[test]
fn the_charged_period_skips_long_silences_only() {
    use ace_ledger::report::{charged_period, MAX_CHARGED_GAP_MS};
    let w = 300_000;
    assert_eq!(charged_period([0, 300_000].into_iter(), w), 600_000);
    // A quiet night is idle capacity, charged.
    assert_eq!(
        charged_period([0, 8 * 3_600_000].into_iter(), w),
        8 * 3_600_000 + w
    );
    assert_eq!(
        charged_period([0, MAX_CHARGED_GAP_MS + w].into_iter(), w),
        2 * w
    );
    assert_eq!(
        charged_period([i64::MIN, 0, i64::MAX].into_iter(), w),
        3 * w
    );
    assert_eq!(charged_period(std::iter::empty(), w), 0);
}

/// The row booked for one answer of `model` on payg destination `dest`
/// that claims `tokens` in and as many out, under `config`.
fn booked_claim(config: &[u8], dest: &str, model: &str, tokens: u64) -> Row {
    let (_dir, mut ledger, id) = ledger_with(config);
    let patch = json!({"destination": dest, "tier": "payg", "model_requested": model,
                       "model_served": model, "tokens_in": tokens, "tokens_out": tokens});
    let s = ingest(&mut ledger, "claim.log", &lines(&[event(&id, 1, patch)]));
    assert_eq!(s.new, 1, "{:?}", s.rejected);
    rows(ledger.store.as_mut()).swap_remove(0)
}

/// Finding 4: counts past the configuration's `max_context_tokens` are
/// cut to it, as the filter cuts an upstream's claim, and marked
/// `usage_capped`; an answer claiming more than its model's own window
/// books that window. gpt-4o takes 128,000 tokens in and gives 16,384 out
/// (LiteLLM's price file, `gpt-4o`: `max_input_tokens` 128000,
/// `max_output_tokens` 16384, `input_cost_per_token` 2.5e-06,
/// `output_cost_per_token` 1e-05; `litellm/model_prices_and_context_window_backup.json`
/// in litellm 1.110.2), so an answer claiming 1,048,576 of each (the
/// configuration's default bound) books the model's real maximum, USD
/// 0.48384, not the USD 13.11 the global bound allowed.
#[test]
fn a_usage_claim_is_bounded_by_the_context_and_the_models_own_window() {
    let bounded = String::from_utf8(common::golden_config())
        .expect("utf8")
        .replace(
            "\"body\": {\"read\": true}",
            "\"body\": {\"read\": true}, \"max_context_tokens\": 1000",
        );
    let gpt_4o = br#"{"allow_no_policy": true, "destinations": [
        {"name": "openai-gpt-4o", "cluster": "openai", "tier": "payg",
         "usd_per_input_token": 2.5e-6, "usd_per_output_token": 1e-5,
         "max_input_tokens": 128000, "max_output_tokens": 16384}]}"#;
    let cases = [
        // 1000 × 2e-6 + 1000 × 8e-6 = $0.01, not $42,949.67.
        (
            bounded.as_bytes(),
            "payg-a",
            "small",
            u64::from(u32::MAX),
            (1000, 1000),
            10_000_000,
        ),
        // 128,000 × 2.5e-6 + 16,384 × 1e-5 = 0.32 + 0.16384.
        (
            gpt_4o.as_slice(),
            "openai-gpt-4o",
            "gpt-4o",
            1_048_576,
            (128_000, 16_384),
            483_840_000,
        ),
    ];
    for (config, dest, model, claimed, tokens, booked) in cases {
        let r = booked_claim(config, dest, model, claimed);
        assert_eq!(
            (r.tokens_in, r.tokens_out, r.usage_capped, r.booked),
            (tokens.0, tokens.1, true, booked),
            "{model}"
        );
    }
}

/// Finding 5: a forged line that takes a real event's id first cannot hide
/// it: the real one is booked apart, flagged and reported; ingesting both
/// again books nothing twice.
#[test]
fn a_forged_event_id_cannot_hide_the_real_event() {
    let (_dir, mut ledger, id) = ledger();
    let forged = event(&id, 1, json!({"tenant": "mallory"}));
    let real = event(&id, 1, json!({}));
    let bytes = lines(&[forged, real]);
    let s = ingest(&mut ledger, "forged.log", &bytes);
    assert_eq!((s.new, s.already), (2, 0));
    assert_eq!(s.conflicts.len(), 1);
    assert_eq!(s.conflicts[0].line, 2);
    let got = rows(ledger.store.as_mut());
    let real = got
        .iter()
        .find(|r| r.tenant.as_deref() == Some("acme"))
        .expect("the real event is booked");
    assert!(real.event_id.starts_with(&format!("{:032x}~", 1)));
    assert!(real.conflicted() && !real.disagrees(), "{}", real.flags);
    assert_eq!(real.tokens_in, 1000);
    let r = ledger.report(&Rules::default()).expect("report");
    assert_eq!(r.conflicts, std::slice::from_ref(&real.event_id));
    assert_eq!(r.disagreements, 0);
    assert!(r.table().contains("event id conflicts 1"));
    let again = ingest(&mut ledger, "forged.log", &bytes);
    assert_eq!((again.new, again.already), (0, 2));
    assert_eq!(ledger.report(&Rules::default()).expect("report").events, 2);
}

/// Finding 10: two `ace.event/1` lines alike to the byte (a client chose
/// the same `x-request-id`) are two requests; ingesting again books
/// neither twice.
#[test]
fn two_v1_lines_sharing_a_request_id_are_two_events() {
    let (_dir, mut ledger, id) = ledger();
    let v1 = event(
        &id,
        1,
        json!({"schema": "ace.event/1", "request_id": "same"}),
    );
    let bytes = lines(&[v1.clone(), v1]);
    let opts = Options {
        v1_config: Some(id),
        ..Options::default()
    };
    let s = ledger
        .ingest_bytes("v1.log", &bytes, &opts)
        .expect("ingest");
    assert_eq!((s.new, s.already), (2, 0));
    let s = ledger.ingest_bytes("v1.log", &bytes, &opts).expect("again");
    assert_eq!((s.new, s.already), (0, 2));
}

/// Finding 6: text cells that a spreadsheet would run as a formula are
/// prefixed with `'` and quoted; figures stay numbers.
#[test]
fn the_focus_export_neutralises_formulas() {
    let (_dir, mut ledger, id) = ledger();
    let bytes = lines(&[event(
        &id,
        1,
        json!({"request_id": "=HYPERLINK(\"http://evil.example/\",\"x\")", "tenant": "@SUM(A1)",
               "model_served": "-2+3", "latency_class": "+cmd"}),
    )]);
    ingest(&mut ledger, "csv.log", &bytes);
    let rules = Rules::default();
    let r = ledger.report(&rules).expect("report");
    let mut out = Vec::new();
    ace_ledger::focus::export(ledger.store.as_mut(), &r, &rules, &mut out).expect("export");
    let csv = String::from_utf8(out).expect("utf8");
    assert!(
        csv.contains(r#""'=HYPERLINK(""http://evil.example/"",""x"")""#),
        "{csv}"
    );
    assert!(csv.contains(r#""'@SUM(A1)""#), "{csv}");
    assert!(csv.contains(r#""'-2+3""#), "{csv}");
    for bad in [",=", ",\"=", ",@", ",\"@", ",+", ",\"+", ",\"-"] {
        assert!(!csv.contains(bad), "{bad} in {csv}");
    }
}

/// Finding 8: the report table and the trace print a tenant's control
/// characters escaped.
#[test]
fn terminal_output_escapes_control_characters() {
    let (_dir, mut ledger, id) = ledger();
    let evil = "\u{1b}]0;pwned\u{7}\u{1b}[2J\u{9b}31m";
    let bytes = lines(&[event(&id, 1, json!({"tenant": evil, "status": 503}))]);
    ingest(&mut ledger, "tty.log", &bytes);
    let rules = Rules::default();
    let r = ledger.report(&rules).expect("report");
    let sel = ace_ledger::trace::Select::default();
    let (t, booked, savings) =
        ace_ledger::trace::rows(ledger.store.as_mut(), &r, &rules, &sel).expect("trace");
    for text in [r.table(), ace_ledger::trace::table(&t, booked, &savings)] {
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{text:?}"
        );
        assert!(text.contains("\\u{1b}]0;pwned\\u{7}"), "{text}");
    }
}

/// Finding 7: an unknown schema and an unregistered configuration are
/// lines like any other that cannot be booked: named, and the ingest goes
/// on; once the configuration is registered, its lines are booked and no
/// longer counted.
#[test]
fn unknown_schema_and_configuration_lines_are_named_and_the_ingest_goes_on() {
    let (_dir, mut ledger, id) = ledger();
    let later = [common::golden_config(), b"\n".to_vec()].concat();
    let later_id = ace_ledger::configs::config_id(&later);
    let bytes = lines(&[
        event(&id, 1, json!({})),
        event(&id, 2, json!({"schema": "ace.event/9"})),
        event(&later_id, 3, json!({})),
        event(&id, 4, json!({})),
    ]);
    let s = ingest(&mut ledger, "mixed.log", &bytes);
    assert_eq!(s.new, 2);
    assert_eq!(rejected_lines(&s), [2, 3]);
    assert!(s.rejected[0].error.contains("\"ace.event/9\""));
    assert!(s.rejected[1].error.contains("ace ledger ingest --config"));
    let r = ledger.report(&Rules::default()).expect("report");
    assert_eq!(r.rejected_lines, 2);
    assert_eq!(r.unpriced.len(), 1);
    assert_eq!(
        (r.unpriced[0].source.as_str(), r.unpriced[0].line),
        ("mixed.log", 3)
    );
    assert!(r.table().contains("mixed.log:3: field `config`"));

    ledger.register(&later, "later config").expect("register");
    let s = ingest(&mut ledger, "mixed.log", &bytes);
    assert_eq!((s.new, s.already), (1, 2));
    let r = ledger.report(&Rules::default()).expect("report");
    assert_eq!((r.events, r.rejected_lines, r.unpriced.len()), (3, 1, 0));
}

/// Finding 9: a rotated log (same name, new content) and a second
/// standard input keep their own rejected lines; the same input again
/// records none twice.
#[test]
fn rejected_lines_of_a_rotated_log_or_another_stdin_are_all_kept() {
    let (_dir, mut ledger, id) = ledger();
    let first = lines(&[event(&id, 1, json!({})), "-".into(), "-".into()]);
    let rotated = lines(&[event(&id, 2, json!({})), "-".into()]);
    let stdin = lines(&[event(&id, 3, json!({})), "-".into()]);
    assert_eq!(ingest(&mut ledger, "access.log", &first).rejected.len(), 2);
    assert_eq!(
        ingest(&mut ledger, "access.log", &rotated).rejected.len(),
        1
    );
    assert_eq!(ingest(&mut ledger, "-", &stdin).rejected.len(), 1);
    ingest(&mut ledger, "access.log", &first);
    ingest(&mut ledger, "-", &stdin);
    let stored = ledger.store.rejects().expect("rejects");
    assert_eq!(stored.len(), 4, "{stored:?}");
    let r = ledger.report(&Rules::default()).expect("report");
    assert_eq!(r.rejected_lines, 4);
}

/// Finding 11: a configuration a filter ran with, refused by this
/// release's rules for new configurations (`body.read` false while the
/// tables decide on `model`), still prices its events.
#[test]
fn an_earlier_configuration_refused_now_still_prices_its_events() {
    let old = String::from_utf8(common::golden_config())
        .expect("utf8")
        .replace("\"body\": {\"read\": true}", "\"body\": {\"read\": false}");
    let refused = ace_config::Config::parse(old.as_bytes()).expect_err("refused now");
    assert!(refused.to_string().contains("body.read"), "{refused}");
    let (_dir, mut ledger, id) = ledger_with(old.as_bytes());
    let s = ingest(&mut ledger, "old.log", &common::golden_events(&id));
    assert_eq!((s.new, s.rejected.len()), (10, 2));
    let r = ledger.report(&Rules::default()).expect("report");
    assert_eq!(r.booked, 40_042_000);
}

/// A store the previous version wrote (`ace.ledger/1`: rejected lines
/// keyed by source and line) opens, keeps its rejected lines, and books.
#[test]
fn a_store_of_the_previous_schema_is_migrated_when_opened() {
    let (_dir, url) = common::sqlite_url();
    // `ace.ledger/1`: the event table as `ace.ledger/2` had it (the
    // frozen SQL of commit a4dc722), rejected lines keyed by source and
    // line.
    let v1 = common::LEDGER_V2_AT_A4DC722
        .replace(
            "ace_rejects (key TEXT PRIMARY KEY, source TEXT NOT NULL, \
             line BIGINT NOT NULL, error TEXT NOT NULL, event_id TEXT)",
            "ace_rejects (source TEXT NOT NULL, line BIGINT NOT NULL, \
             error TEXT NOT NULL, PRIMARY KEY (source, line))",
        )
        .replace("'ace.ledger/2'", "'ace.ledger/1'")
        .replace(
            "VALUES ('k1', 'old.log', 7, 'not a JSON object', NULL)",
            "VALUES ('old.log', 7, 'not a JSON object')",
        );
    assert!(v1.contains("PRIMARY KEY (source, line)") && v1.contains("ace.ledger/1"));
    rusqlite::Connection::open(&url)
        .expect("sqlite")
        .execute_batch(&v1)
        .expect("old store");
    let (mut ledger, s) = common::golden_ledger(&url);
    assert_eq!(s.new, 10);
    let stored = ledger.store.rejects().expect("rejects");
    assert_eq!(stored.len(), 3);
    let old = stored.iter().find(|r| r.source == "old.log").expect("kept");
    assert_eq!((old.line, old.key.as_str()), (7, "v1:old.log:7"));
    let reopened = Ledger::open(&url);
    assert!(reopened.is_ok());
}

/// A store as commit a4dc722 wrote it (`ace.ledger/2`, its SQL frozen in
/// `common::LEDGER_V2_AT_A4DC722`) is migrated in place when opened and
/// reads its rows back.
#[test]
fn a_store_as_commit_a4dc722_wrote_it_is_migrated_and_reads_back() {
    let (_dir, url) = common::sqlite_url();
    rusqlite::Connection::open(&url)
        .expect("sqlite")
        .execute_batch(common::LEDGER_V2_AT_A4DC722)
        .expect("the older store");
    common::check_the_v2_store_migrates(&url);
}

/// A store with an event column this release does not know (a newer
/// release wrote it) is refused, naming the column, not misread.
#[test]
fn a_store_a_newer_release_wrote_is_refused() {
    let (_dir, url) = common::sqlite_url();
    drop(ace_ledger::store::open(&url).expect("new store"));
    rusqlite::Connection::open(&url)
        .expect("sqlite")
        .execute_batch("ALTER TABLE ace_events ADD COLUMN from_the_future TEXT")
        .expect("alter");
    let Err(e) = ace_ledger::store::open(&url) else {
        panic!("a store with an unknown column opened");
    };
    assert!(e.to_string().contains("from_the_future"), "{e}");
}

/// The hostile file (`tests/golden/hostile.ndjson`): everything bookable
/// is booked, every other line is named, and every output comes out.
#[test]
fn the_hostile_file_books_what_it_can_and_names_every_other_line() {
    let (_dir, url) = common::sqlite_url();
    let (mut ledger, s) = common::hostile_ledger(&url);
    assert_eq!(
        rejected_lines(&s),
        common::HOSTILE_REJECTED,
        "{:#?}",
        s.rejected
    );
    let conflicts: Vec<i64> = s.conflicts.iter().map(|c| c.line).collect();
    assert_eq!(conflicts, [8, 18]);
    assert_eq!((s.new, s.already), (8, 1));
    let rules = Rules::default();
    let r = ledger.report(&rules).expect("report");
    assert_eq!(r.events, 8);
    assert_eq!(r.conflicts.len(), 1);
    assert_eq!(r.unpriced.len(), 1);
    // One window in 2026, and the earliest time booked (2000) adds one.
    assert_eq!(r.chargeback.period_ms, 2 * rules.window_ms);
    let table = r.table();
    assert!(!table.chars().any(|c| c.is_control() && c != '\n'));
    let mut csv = Vec::new();
    ace_ledger::focus::export(ledger.store.as_mut(), &r, &rules, &mut csv).expect("export");
    assert!(!String::from_utf8_lossy(&csv).contains(",\"=HYPERLINK"));
}
