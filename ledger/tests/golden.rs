//! The golden event file (`tests/golden/events.ndjson`), with figures
//! checked by hand (the arithmetic is in the comments):
//!
//! - a destination preferred by a bias whose logged cost was biased: the
//!   ledger books the unbiased cost and flags the difference;
//! - acme's second window forfeits its savings for a served fraction of 1/2;
//! - globex's window forfeits its savings for an SLO attainment of 1/2;
//! - a `-` line and an event naming an unknown destination are reported
//!   with their line numbers; a repeated line is booked once;
//! - a line of an unknown schema or configuration is named, and the
//!   lines after it are booked.

use crate::common;
use ace_ledger::book::Ledger;
use ace_ledger::ingest::Options;
use ace_ledger::split::Split;
use ace_ledger::window::Rules;

fn golden() -> (tempfile::TempDir, Ledger, String) {
    let (dir, url) = common::sqlite_url();
    let mut ledger = Ledger::open(&url).expect("open");
    let id = ledger
        .register(&common::golden_config(), "golden config")
        .expect("register");
    (dir, ledger, id)
}

#[test]
fn golden_events_give_the_hand_checked_figures() {
    let (_dir, url) = common::sqlite_url();
    let (mut ledger, s) = common::golden_ledger(&url);
    assert_eq!((s.lines, s.new, s.already), (13, 10, 1));
    let lines: Vec<i64> = s.rejected.iter().map(|r| r.line).collect();
    assert_eq!(lines, [7, 12], "{:?}", s.rejected);
    assert!(
        s.rejected[0].error.contains("not a JSON object"),
        "{}",
        s.rejected[0].error
    );
    assert!(
        s.rejected[1].error.contains("\"gone\""),
        "{}",
        s.rejected[1].error
    );
    // Only the biased destination's logged cost disagrees.
    assert_eq!(s.disagreements, 1);

    let r = ledger.report(&Rules::default()).expect("report");
    assert_eq!(
        (r.events, r.served, r.not_served, r.rejected_lines),
        (10, 9, 1, 2)
    );
    // Booked, nano-dollars: owned 1500 tok × 1e-8 = 15_000; payg-b 1000 × 3e-6
    // + 500 × 1e-5 = 8_000_000 (bias 0.5 changes nothing); spot 3000 ×
    // 1.5e-6 = 4_500_000; owned cold 200 × 1e-8 + 0.01 = 10_002_000; payg-a
    // 1000 × 2e-6 + 500 × 8e-6 = 6_000_000; reserved overage 2000 × 5e-6 =
    // 10_000_000; owned 15_000; refused 0; spot 1_500_000; owned 10_000.
    assert_eq!(r.booked, 40_042_000);
    // Pay-as-you-go for `big` is payg-b only (tables): 8e6 + 8e6 + 16e6 +
    // 1.3e6 + 8e6 + 13e6 + 8e6 + 3e6 + 6.5e6.
    assert_eq!(r.counterfactual, 71_800_000);
    assert_eq!(
        r.savings,
        Split {
            // 7_985_000 − 8_702_000 (cold load) + 3_000_000 + 7_985_000 + 6_490_000
            utilisation: 16_758_000,
            // spot 11_500_000 + 1_500_000; payg-b 0; payg-a 0 (after routing)
            arbitrage: 13_000_000,
            // `big` asked, `small` served: 8_000_000 − 6_000_000
            routing: 2_000_000,
            caching: 0,
        }
    );
    assert_eq!(r.savings.total(), r.counterfactual - r.booked_served);
    // acme's first window keeps 2_283_000 + 11_500_000 + 2_000_000.
    assert_eq!(r.earned.total(), 15_783_000);
    // acme's second (7_985_000) and globex's (1_500_000 + 6_490_000).
    assert_eq!(r.forfeited.total(), 15_975_000);
    assert_eq!(r.earned.total() + r.forfeited.total(), r.savings.total());

    let forfeited: Vec<(&str, &str)> = r
        .windows
        .iter()
        .filter_map(|w| Some((w.tenant.as_str(), w.forfeited.as_deref()?)))
        .collect();
    assert_eq!(forfeited.len(), 2, "{forfeited:?}");
    assert!(
        forfeited[0].0 == "acme"
            && forfeited[0]
                .1
                .starts_with("served fraction 0.5000 (1 of 2)")
    );
    assert!(
        forfeited[1].0 == "globex"
            && forfeited[1]
                .1
                .starts_with("SLO attainment for latency class interactive 0.5000 (1 of 2)"),
        "{forfeited:?}"
    );
    assert_eq!(r.by_tenant["acme"].earned, 15_783_000);
    assert_eq!(r.by_tenant["globex"].forfeited, 7_990_000);

    // Chargeback over the two 5-minute windows (1/6 h): owned $2/h =
    // 333_333_333; busy 800 ms of 600_000 ms × 4 => used 111_111. Reserved
    // $1/h = 166_666_667; 200 ms of 600_000 × 2 => used 27_778.
    let cb = &r.chargeback;
    assert_eq!(cb.period_ms, 600_000);
    let owned = cb.pool("owned").expect("owned pool");
    assert_eq!(
        (owned.cost, owned.used, owned.idle),
        (333_333_333, 111_111, 333_222_222)
    );
    let reserved = cb.pool("reserved").expect("reserved");
    assert_eq!((reserved.cost, reserved.used), (166_666_667, 27_778));
    let billed: i64 = cb.tenants.values().map(|t| t.total).sum();
    assert_eq!(
        billed,
        r.booked + owned.cost + reserved.cost,
        "nothing hidden, nothing twice"
    );
    // Goodput: output tokens of served requests within SLO (globex's spot
    // request missed it): 500+500+1000+100+500+1000+500+500.
    assert_eq!(r.goodput_tokens, 4600);
}

#[test]
fn the_bias_changes_no_booked_cost_and_is_flagged() {
    let (_dir, url) = common::sqlite_url();
    let (mut ledger, _) = common::golden_ledger(&url);
    let r = ledger.report(&Rules::default()).expect("report");
    let sel = ace_ledger::trace::Select {
        flagged: true,
        ..Default::default()
    };
    let (rows, booked, _) =
        ace_ledger::trace::rows(ledger.store.as_mut(), &r, &Rules::default(), &sel).expect("trace");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].request_id.as_deref(), Some("r-2"));
    assert_eq!(rows[0].destination.as_deref(), Some("payg-b"));
    assert_eq!(
        booked, 8_000_000,
        "the unbiased list price, not the logged 0.004"
    );
    assert_eq!(rows[0].flags, "marginal_usd");
}

#[test]
fn unknown_schema_and_unknown_configuration_lines_are_named_and_the_rest_booked() {
    let (_dir, mut ledger, id) = golden();
    let events = String::from_utf8(common::golden_events(&id)).expect("utf8");
    let v9 = events.replacen("ace.event/2", "ace.event/9", 1);
    let s = ledger
        .ingest_bytes("v9.ndjson", v9.as_bytes(), &Options::default())
        .expect("ingest");
    assert_eq!((s.new, s.rejected[0].line), (10, 1));
    let msg = &s.rejected[0].error;
    assert!(msg.starts_with("schema \"ace.event/9\""), "{msg}");
    let other = events.replace(&id, "ffffffffffffffff");
    let s = ledger
        .ingest_bytes("other.ndjson", other.as_bytes(), &Options::default())
        .expect("ingest");
    let msg = &s.rejected[0].error;
    assert_eq!((s.new, s.rejected[0].line), (0, 1));
    assert!(
        msg.starts_with("field `config` is \"ffffffffffffffff\""),
        "{msg}"
    );
    assert!(msg.contains("ace ledger ingest --config"), "{msg}");
}

#[test]
fn a_line_cut_mid_write_is_booked_once_completed() {
    let (_dir, mut ledger, id) = golden();
    let events = common::golden_events(&id);
    let cut = events.len() - 40;
    let s = ledger
        .ingest_bytes("cut", &events[..cut], &Options::default())
        .expect("ingest");
    assert_eq!(s.incomplete, Some(13));
    assert_eq!(s.new, 10);
    let s = ledger
        .ingest_bytes("cut", &events, &Options::default())
        .expect("again");
    assert_eq!((s.new, s.already, s.incomplete), (0, 11, None));
}

#[test]
fn follow_books_lines_as_they_are_appended_and_completed() {
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let (dir, url) = common::sqlite_url();
    let mut ledger = Ledger::open(&url).expect("open");
    let id = ledger
        .register(&common::golden_config(), "golden config")
        .expect("register");
    let events = common::golden_events(&id);
    let log = dir.path().join("access.log");
    // Envoy has written the first lines and half of the third.
    let third = events
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .nth(1)
        .map(|(i, _)| i + 1)
        .expect("two lines");
    std::fs::write(&log, &events[..third + 30]).expect("write");
    let stop = Arc::new(AtomicBool::new(false));
    let opts = Options {
        follow: true,
        stop: Some(stop.clone()),
        ..Options::default()
    };
    let path = log.display().to_string();
    let follower = std::thread::spawn(move || ledger.ingest_path(&path, &opts));
    // A second reader sees the complete lines booked while Envoy writes.
    let booked = |n: u64| {
        let mut reader = Ledger::open(&url).expect("reader");
        for _ in 0..100 {
            if reader.report(&Rules::default()).expect("report").events == n {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        false
    };
    assert!(booked(2), "the two complete lines are booked");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&log)
        .expect("append");
    f.write_all(&events[third + 30..]).expect("append");
    f.flush().expect("flush");
    assert!(booked(10), "the completed line and the rest are booked");
    stop.store(true, Ordering::Relaxed);
    let s = follower.join().expect("join").expect("ingest");
    assert_eq!((s.lines, s.new, s.already, s.incomplete), (13, 10, 1, None));
    assert_eq!(s.rejected.len(), 2);
}

/// Requests ACE sent to the destination holding their prompt's prefix
/// (`tokens_prefix_held`) are counted apart, with what the holder's prompt
/// cache took off their input: payg-a, reading cached input at a tenth of
/// its 2e-6 list price. A request with no prefix held is not counted,
/// whatever its cache read; a read larger than what was held counts only
/// what was held.
#[test]
fn requests_kept_with_their_prefix_holder_show_what_its_cache_took_off() {
    let (_dir, url) = common::sqlite_url();
    let mut ledger = Ledger::open(&url).expect("open");
    let config = String::from_utf8(common::golden_config())
        .expect("utf8")
        .replacen(
            r#""usd_per_input_token": 2e-6, "usd_per_output_token": 8e-6}"#,
            r#""usd_per_input_token": 2e-6, "usd_per_output_token": 8e-6, "cached_input_factor": 0.1}"#,
            1,
        );
    assert!(config.contains("0.1}"), "the fixture changed: {config}");
    let id = ledger
        .register(config.as_bytes(), "cached")
        .expect("register");
    let line = |n: u32, held: u32, read: u32| {
        format!(
            r#"{{"schema":"ace.event/2","event_id":"{n:032x}","config":"{id}","request_id":null,"time_ms":1796342401000,"tenant":"acme","data_class":"public","latency_class":null,"model_requested":"small","model_served":"small","destination":"payg-a","tier":"payg","tokens_in":3000,"tokens_out":100,"tokens_cache_read":{read},"tokens_cache_write":0,"tokens_prefix_held":{held},"tokens_estimated":false,"status":200,"latency_ms":100,"slo_ms":null,"slo_met":null,"marginal_usd":0.0068,"counterfactual_usd":0.0068,"reason":"cheapest","warm":true,"overage":false,"usage_capped":false,"cached":false}}"#
        )
    };
    let events = [line(1, 2000, 1920), line(2, 0, 2500), line(3, 1000, 2500)].join("\n") + "\n";
    let s = ledger
        .ingest_bytes("prefix.ndjson", events.as_bytes(), &Options::default())
        .expect("ingest");
    assert_eq!((s.new, s.rejected.len()), (3, 0), "{:?}", s.rejected);
    let r = ledger.report(&Rules::default()).expect("report");
    let l = &r.locality;
    // Read 1920 of 2000 held, and 1000 of 1000 (2500 read): 2920 tokens at
    // 0.9 × 2e-6 = 5_256_000 nano-dollars.
    assert_eq!(
        (l.requests, l.held_tokens, l.cache_read_tokens, l.discount),
        (2, 3000, 2920, 5_256_000)
    );
    assert!(
        r.table().contains("prefix locality: 2 requests"),
        "{}",
        r.table()
    );
}

/// Tenant budgets in the report, figures by hand (`common::budget_events`):
/// as of the last event (2026-12-04T00:00:06Z), acme's day budget has
/// spent today's 6_000_000 (payg-a, from the day's first millisecond) and
/// 15_000 (owned), yesterday's not counted: 60.15 % of $0.01, soft. The lab
/// group's month budget has spent 6_000_000 (lab-1 at the month's first
/// millisecond; last month's not counted) and 12_000_000 (lab-2): 1.8 %.
/// Each way a budget limited a request is counted under the budget the
/// event names, one no configuration defines included; names are escaped
/// for the terminal and the page.
#[test]
fn the_report_shows_each_budgets_use_and_what_it_did() {
    let (_dir, url) = common::sqlite_url();
    let mut ledger = common::budget_ledger(&url);
    let r = ledger.report(&Rules::default()).expect("report");
    let evil = "evil\u{1b}[31m<b>";
    let names: Vec<&str> = r.budgets.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["acme-day", "acme-tpm", evil, "gone", "labs"]);
    let day = u64::try_from(common::BUDGET_DAY).expect("day");
    let month = u64::try_from(common::BUDGET_MONTH).expect("month");
    let b = &r.budgets[0];
    assert!(b.configured);
    assert_eq!(
        (b.tenants.as_slice(), b.period.as_deref(), b.usd),
        (&["acme".to_string()][..], Some("day"), Some(0.01))
    );
    assert_eq!(
        (b.start_ms, b.resets_ms, b.spent, b.state.as_deref()),
        (
            Some(day),
            Some(day + 86_400_000),
            Some(6_015_000),
            Some("soft")
        )
    );
    assert!((b.used.expect("used") - 0.6015).abs() < 1e-12);
    assert_eq!(
        (
            b.refused_exhausted,
            b.refused_tokens,
            b.served_soft,
            b.refused_soft,
            b.other
        ),
        (1, 0, 1, 1, 0)
    );
    let tpm = &r.budgets[1];
    assert_eq!(
        (
            tpm.configured,
            tpm.usd,
            tpm.tokens_per_minute,
            tpm.period.as_deref()
        ),
        (true, None, Some(1000), None)
    );
    assert_eq!((tpm.spent, tpm.used, tpm.refused_tokens), (None, None, 1));
    for gone in &r.budgets[2..4] {
        assert_eq!(
            (gone.configured, gone.spent, gone.refused_exhausted),
            (false, None, 1)
        );
    }
    let labs = &r.budgets[4];
    assert_eq!(
        (labs.tenants.len(), labs.period.as_deref(), labs.start_ms),
        (2, Some("month"), Some(month))
    );
    // December 2026 resets on January 1st, 2027.
    assert_eq!(
        (labs.resets_ms, labs.spent, labs.state.as_deref()),
        (Some(1_798_761_600_000), Some(18_000_000), Some("ok"))
    );

    let table = r.table();
    assert!(
        table.contains(
            "budgets, spend in the period holding the last event (2026-12-04T00:00:06.000Z)"
        ),
        "{table}"
    );
    let line = table
        .lines()
        .find(|l| l.starts_with("acme-day "))
        .unwrap_or_else(|| panic!("no acme-day line: {table}"));
    assert!(
        line.contains("0.010000000") && line.contains("0.006015000") && line.contains("soft"),
        "{line}"
    );
    assert!(
        table.contains("evil\\u{1b}[31m<b>") && !table.contains('\u{1b}'),
        "the terminal sees no escape: {table}"
    );

    let json = serde_json::to_value(&r).expect("json");
    assert_eq!(json["budgets"][0]["spent"], 6_015_000);
    assert_eq!(json["budgets"][0]["served_soft"], 1);

    let page = ace_ledger::html::page(&r).expect("page");
    assert!(page.contains("<table id=\"budgets\">"), "{page}");
    assert!(
        page.contains(
            "<td>acme-day</td><td>acme</td><td>day</td><td>0.010000000</td><td>0.006015000</td>"
        ),
        "{page}"
    );
    assert!(page.contains("<td>lab-1, lab-2</td>"), "{page}");
    assert!(
        page.contains("<td>evil\u{1b}[31m&lt;b&gt;</td>") && !page.contains("[31m<b>"),
        "names are escaped in the page"
    );
}

#[test]
fn every_window_says_why_it_kept_or_forfeited_its_savings() {
    let (_dir, url) = common::sqlite_url();
    let (mut ledger, _) = common::golden_ledger(&url);
    let r = ledger.report(&Rules::default()).expect("report");
    let every = r.table_listing(ace_ledger::report::Windows::Every);
    // acme's first window keeps its 15_783_000 (above): every bound held.
    let earned = "  earned acme @ 2026-12-04T00:00:00.000Z: 6 events, savings $0.015783000, \
                  kept $0.015783000, forfeited $0.000000000\n      served fraction 1.0000 (6 of 6) \
                  >= 0.99; SLO attainment for latency class interactive 1.0000 (4 of 4) >= 0.95; \
                  no cache hit checked\n";
    assert!(every.contains(earned), "{every}");
    // acme's second forfeits for its served fraction; its SLO held.
    let forfeited = "  forfeited acme @ 2026-12-04T00:05:00.000Z: 2 events, savings $0.007985000, \
                     kept $0.000000000, forfeited $0.007985000\n      served fraction 0.5000 \
                     (1 of 2) < 0.99; held: SLO attainment for latency class interactive 1.0000 \
                     (1 of 1) >= 0.95; no cache hit checked\n";
    assert!(every.contains(forfeited), "{every}");
    assert!(every.contains("  forfeited globex @ "), "{every}");
    // `ace ledger report`'s table names the forfeited windows only.
    let table = r.table();
    assert!(!table.contains("earned acme"), "{table}");
    assert!(
        table.contains("  forfeited acme @ 2026-12-04T00:05:00.000Z (1796342700000 ms): $0.007985000: served fraction 0.5000 (1 of 2) < 0.99\n"),
        "{table}"
    );
}

/// Capacity is paid for used or not: a reserved L40S block at USD 0.55
/// an hour that no request reached still charges its whole day, USD
/// 13.20, as idle capacity under `(unused capacity)`, beside the owned
/// pool that served. Two events 23 h 55 min apart, in 5-minute windows:
/// a charged period of exactly one day.
#[test]
fn a_standing_pool_no_request_used_charges_its_whole_cost_as_idle() {
    use ace_ledger::chargeback::UNUSED;
    let (_dir, url) = common::sqlite_url();
    let mut ledger = Ledger::open(&url).expect("open");
    let config = br#"{"allow_no_policy": true, "destinations": [
        {"name": "api", "cluster": "api", "tier": "payg",
         "usd_per_input_token": 2e-6, "usd_per_output_token": 8e-6},
        {"name": "l40s", "cluster": "l40s", "tier": "reserved", "capacity": 4,
         "usd_per_gpu_hour": 0.55}]}"#;
    let id = ledger.register(config, "standing").expect("register");
    let day = 86_400_000_i64;
    let start = 1_796_342_400_000_i64;
    let line = |n: u32, time: i64| {
        format!(
            r#"{{"schema":"ace.event/2","event_id":"{n:032x}","config":"{id}","request_id":null,"time_ms":{time},"tenant":"acme","data_class":null,"latency_class":null,"model_requested":"m","model_served":"m","destination":"api","tier":"payg","tokens_in":1000,"tokens_out":100,"tokens_estimated":false,"status":200,"latency_ms":100,"slo_ms":null,"slo_met":null,"marginal_usd":0.0028,"counterfactual_usd":0.0028,"reason":"cheapest","warm":true,"overage":false,"usage_capped":false,"cached":false}}"#
        )
    };
    let events = [line(1, start), line(2, start + day - 300_000)].join("\n") + "\n";
    let s = ledger
        .ingest_bytes("standing.ndjson", events.as_bytes(), &Options::default())
        .expect("ingest");
    assert_eq!((s.new, s.rejected.len()), (2, 0), "{:?}", s.rejected);
    let r = ledger.report(&Rules::default()).expect("report");
    assert_eq!(r.chargeback.period_ms, day);
    let pool = r
        .chargeback
        .pool("l40s")
        .expect("the unused reserved block is charged");
    let day_cost = 13_200_000_000;
    assert_eq!(
        (pool.cost, pool.used, pool.idle, pool.utilisation),
        (day_cost, 0, day_cost, 0.0)
    );
    let unused = &r.chargeback.tenants[UNUSED];
    assert_eq!((unused.idle_capacity, unused.total), (day_cost, day_cost));
    // Every tenant's total adds up to the booked cost plus the pool's.
    let totals: i64 = r.chargeback.tenants.values().map(|t| t.total).sum();
    assert_eq!(totals, r.booked + day_cost);
    let table = r.table();
    let unused_line = table
        .lines()
        .find(|l| l.starts_with(UNUSED))
        .unwrap_or_default();
    assert!(unused_line.ends_with("13.200000000"), "{table}");
    assert!(table.contains("l40s"), "{table}");
}
