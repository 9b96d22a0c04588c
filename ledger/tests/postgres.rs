//! The shared store: the same events give the same report in SQLite and in
//! a real PostgreSQL that this test starts (it fails, naming `make setup`,
//! when PostgreSQL cannot start), the golden events and the hostile ones.
//! Also idempotence in PostgreSQL.

use crate::common;
use ace_harness::pg::Pg;
use ace_ledger::book::Ledger;
use ace_ledger::ingest::Options;
use ace_ledger::window::Rules;

fn ingest_golden(url: &str) -> Ledger {
    let (ledger, s) = common::golden_ledger(url);
    assert_eq!(s.rejected.len(), 2);
    ledger
}

#[test]
fn sqlite_and_postgres_give_the_same_report() {
    let pg = Pg::start();
    let (_dir, sqlite) = common::sqlite_url();
    let rules = Rules {
        window_ms: 60_000,
        ..Rules::default()
    };
    let mut a = ingest_golden(&sqlite);
    let mut b = ingest_golden(&pg.database("golden"));
    let ra = a.report(&rules).expect("sqlite report");
    let rb = b.report(&rules).expect("postgres report");
    assert_eq!(ra, rb);
    assert_eq!(ra.events, 10);
    assert_eq!(a.store.rejects().expect("r"), b.store.rejects().expect("r"));
    assert_eq!(
        common::all_rows(&mut a),
        common::all_rows(&mut b),
        "row for row, column for column"
    );

    // Ingesting again into PostgreSQL books nothing new.
    assert_eq!(
        again(&mut b, "events.ndjson", common::golden_events),
        (0, 11)
    );
    // Reopening reads the stored configuration back.
    let mut reopened = Ledger::open(&pg.url().replace("/postgres", "/golden")).expect("reopen");
    assert_eq!(reopened.report(&rules).expect("report"), rb);
}

/// Ingest `events` (under the golden configuration's id) into `ledger`
/// again: (new, already).
fn again(ledger: &mut Ledger, source: &str, events: fn(&str) -> Vec<u8>) -> (u64, u64) {
    let id = ace_ledger::configs::config_id(&common::golden_config());
    let s = ledger
        .ingest_bytes(source, &events(&id), &Options::default())
        .expect("again");
    (s.new, s.already)
}

/// The hostile file (`tests/golden/hostile.ndjson`: a NUL, a byte that is
/// not UTF-8, huge numbers, zero and maximal times, a forged duplicate id,
/// formulas, terminal escapes, an unknown schema and configuration) gives
/// the same summary, rows, report, export and trace in both stores, with
/// no panic and every line not booked named. PostgreSQL once rolled back
/// the whole batch on the NUL and named no line.
#[test]
fn the_hostile_file_gives_the_same_report_in_sqlite_and_postgres() {
    let pg = Pg::start();
    let (_dir, sqlite) = common::sqlite_url();
    let (mut a, sa) = common::hostile_ledger(&sqlite);
    let (mut b, sb) = common::hostile_ledger(&pg.database("hostile"));
    let lines: Vec<i64> = sb.rejected.iter().map(|r| r.line).collect();
    assert_eq!(lines, common::HOSTILE_REJECTED, "{:#?}", sb.rejected);
    assert_eq!((sb.new, sb.already), (8, 1));
    assert_eq!(sa, sb, "the same ingest summary");
    let rules = Rules::default();
    let ra = a.report(&rules).expect("sqlite report");
    let rb = b.report(&rules).expect("postgres report");
    assert_eq!(ra, rb);
    assert_eq!(rb.events, 8);
    assert_eq!(
        common::all_rows(&mut a),
        common::all_rows(&mut b),
        "row for row"
    );
    assert_eq!(a.store.rejects().expect("r"), b.store.rejects().expect("r"));
    let tenants: Vec<String> = rb.by_tenant.keys().cloned().collect();
    assert!(
        tenants.contains(&"nul\\u0000tenant".to_string()),
        "{tenants:?}"
    );
    assert!(tenants.contains(&"bad\\xffbyte".to_string()), "{tenants:?}");
    assert_eq!(ra.table(), rb.table());
    let export = |l: &mut Ledger, r| {
        let mut out = Vec::new();
        ace_ledger::focus::export(l.store.as_mut(), r, &rules, &mut out).expect("export");
        out
    };
    assert_eq!(export(&mut a, &ra), export(&mut b, &rb));
    let sel = ace_ledger::trace::Select::default();
    let ta = ace_ledger::trace::rows(a.store.as_mut(), &ra, &rules, &sel).expect("trace");
    let tb = ace_ledger::trace::rows(b.store.as_mut(), &rb, &rules, &sel).expect("trace");
    assert_eq!(ta, tb);
    // Ingesting again books nothing twice in PostgreSQL either.
    assert_eq!(
        again(&mut b, "hostile.ndjson", common::hostile_events),
        (0, 9)
    );
    assert_eq!(b.report(&rules).expect("report"), rb);
}

/// A store as commit a4dc722 wrote it (`ace.ledger/2`, its SQL frozen in
/// `common::LEDGER_V2_AT_A4DC722`), in a real PostgreSQL, is migrated in
/// place when opened and reads its rows back.
#[test]
fn a_postgres_store_as_commit_a4dc722_wrote_it_is_migrated_and_reads_back() {
    let pg = Pg::start();
    let url = pg.database("older");
    postgres::Client::connect(&url, postgres::NoTls)
        .expect("connect")
        .batch_execute(common::LEDGER_V2_AT_A4DC722)
        .expect("the older store");
    common::check_the_v2_store_migrates(&url);
}

/// Budget readings (what the control service publishes) and the report's
/// budget lines are the same from a real PostgreSQL as from SQLite for the
/// same events (`common::budget_events`): the stores sum the spend, so
/// the two engines' SQL must agree to the nano-dollar.
#[test]
fn budget_readings_are_the_same_in_sqlite_and_postgres() {
    let pg = Pg::start();
    let (_dir, sqlite) = common::sqlite_url();
    let mut a = common::budget_ledger(&sqlite);
    let mut b = common::budget_ledger(&pg.database("budgets"));
    let setup = ace_flow::Setup::parse_for_pricing(&common::budget_config()).expect("config");
    let budgets = &setup.config.budgets;
    // As of the last event, a day later (acme's day is over), and a month
    // later (so is the lab group's month).
    let last = u64::try_from(common::BUDGET_DAY).expect("day") + 6000;
    for now in [last, last + 86_400_000, last + 31 * 86_400_000] {
        let ra = ace_ledger::budget::readings(a.store.as_mut(), budgets, now).expect("sqlite");
        let rb = ace_ledger::budget::readings(b.store.as_mut(), budgets, now).expect("postgres");
        assert_eq!(ra, rb, "as of {now}");
    }
    let got = ace_ledger::budget::readings(b.store.as_mut(), budgets, last).expect("postgres");
    let spent: Vec<(&str, f64, &str)> = got
        .iter()
        .map(|r| (r.name.as_str(), r.spent_usd, r.state.as_str()))
        .collect();
    assert_eq!(
        spent,
        [("acme-day", 0.006015, "soft"), ("labs", 0.018, "ok")]
    );
    let rules = Rules::default();
    let (ra, rb) = (a.report(&rules).expect("r"), b.report(&rules).expect("r"));
    assert_eq!(ra.budgets.len(), 5);
    assert_eq!(ra, rb);
    assert_eq!(ra.table(), rb.table());
}

/// Rows (issue 50): "One store row with a negative `booked_nano` lowers a
/// budget reading to 0 (the clamp is on the sum, not the rows)." and "A
/// row dated years ahead counts in every period until then (no upper time
/// bound in the budget query)." The same hostile rows in SQLite and in a
/// real PostgreSQL read alike, each row counting at least 0 and only from
/// a minute before its time, and never in a period it is not dated in.
#[test]
fn hostile_rows_neither_lower_nor_raise_a_reading_in_sqlite_and_postgres() {
    let pg = Pg::start();
    let (_dir, sqlite) = common::sqlite_url();
    for url in [sqlite, pg.database("hostile_rows")] {
        hostile_rows_read_as_booked(&url);
    }
}

/// [`hostile_rows_neither_lower_nor_raise_a_reading_in_sqlite_and_postgres`]
/// on the store at `url`.
fn hostile_rows_read_as_booked(url: &str) {
    use ace_ledger::budget::{readings, AHEAD_MS};
    use ace_ledger::row::Row;
    /// 2026-12-07T01:30:00Z, and the next day's start.
    const NOW: u64 = 1_796_607_000_000;
    const NEXT_DAY: u64 = 1_796_688_000_000;
    const USD: i64 = 1_000_000_000;
    let row = |n: u32, time_ms: u64, booked: i64| Row {
        event_id: format!("{n:032x}"),
        tenant: Some("a".into()),
        time_ms: time_ms as i64,
        booked,
        ..Row::default()
    };
    let mut store = ace_ledger::store::open(url).expect("open");
    store
        .insert(&[
            row(1, NOW - 1_000, 2 * USD),
            // Never booked by the ledger: a hand or a hostile edit.
            row(2, NOW - 500, -5 * USD),
            row(3, NOW + 10 * 365 * 86_400_000, 100 * USD),
            // Within a minute ahead (a proxy's clock ahead): counts.
            row(4, NOW + AHEAD_MS / 2, USD),
            // Further ahead: counts once its time is a minute away.
            row(5, NOW + AHEAD_MS + 30_000, 4 * USD),
            // The next day's, a few seconds in.
            row(6, NEXT_DAY + 10_000, 8 * USD),
        ])
        .expect("insert");
    let raw: Vec<ace_config::BudgetSettings> = serde_json::from_str(
        r#"[{"name":"day","tenants":["a"],"usd":10},
            {"name":"hour","tenants":["a"],"usd":10,"period":"rolling","window_s":3600}]"#,
    )
    .expect("budgets");
    let budgets = ace_config::Budgets::validate(&raw).expect("valid");
    let mut spent = |now: u64| -> Vec<f64> {
        readings(store.as_mut(), &budgets, now)
            .unwrap_or_else(|e| panic!("{url}: {e:#}"))
            .iter()
            .map(|r| r.spent_usd)
            .collect()
    };
    // Rows 1 and 4; the negative row lowers nothing, the years-ahead row
    // and the one 90 s ahead are not counted yet.
    assert_eq!(spent(NOW), [3.0, 3.0], "{url}");
    // A minute on, row 5 is within a minute.
    assert_eq!(spent(NOW + 60_000), [7.0, 7.0], "{url}");
    // Thirty seconds before the day ends, row 6 (40 s ahead) is the next
    // day's; the last hour, with no end, counts it.
    assert_eq!(spent(NEXT_DAY - 30_000), [7.0, 8.0], "{url}");
    assert_eq!(spent(NEXT_DAY + 20_000), [8.0, 8.0], "{url}");
}
