//! The shared store: the same events give the same report in SQLite and in
//! a real PostgreSQL that this test starts (it fails, naming `make setup`,
//! when PostgreSQL cannot start). Also idempotence in PostgreSQL.

mod common;

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
    let pg = common::pg::Pg::start();
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
    let mut rows_a = Vec::new();
    let mut rows_b = Vec::new();
    a.store
        .scan(&mut |r| {
            rows_a.push(r);
            Ok(())
        })
        .expect("scan");
    b.store
        .scan(&mut |r| {
            rows_b.push(r);
            Ok(())
        })
        .expect("scan");
    assert_eq!(rows_a, rows_b, "row for row, column for column");

    // Ingesting again into PostgreSQL books nothing new.
    let id = ace_ledger::configs::config_id(&common::golden_config());
    let again = b
        .ingest_bytes(
            "events.ndjson",
            &common::golden_events(&id),
            &Options::default(),
        )
        .expect("again");
    assert_eq!((again.new, again.already), (0, 11));
    // Reopening reads the stored configuration back.
    let mut reopened = Ledger::open(&pg.url().replace("/postgres", "/golden")).expect("reopen");
    assert_eq!(reopened.report(&rules).expect("report"), rb);
}
