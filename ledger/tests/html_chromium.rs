//! The HTML report opens in a real headless Chromium and its four charts
//! draw: the page's own measuring script reports, per chart, how many SVG
//! shapes have a non-zero size, and Chromium's rendered DOM carries it.
//! With providers' bills imported, its reconciliation table renders: each
//! difference a row on screen with its cause, the proposed configuration
//! change among them, and nothing on the page's console.
//! Fails (never skips), naming `make setup`, when Chromium is missing.

use crate::common;
use ace_harness::chromium::Page;
use ace_ledger::window::Rules;
use std::process::Command;
use std::time::Duration;

fn chromium() -> &'static str {
    ace_harness::chromium::command().unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_html_report_renders_its_charts_in_chromium() {
    let (dir, url) = common::sqlite_url();
    let (mut ledger, _) = common::golden_ledger(&url);
    let report = ledger.report(&Rules::default()).expect("report");
    let page = ace_ledger::html::page(&report).expect("page");
    assert!(
        !page.contains("src=") && !page.contains("<link"),
        "self-contained: the page loads nothing"
    );
    let file = dir.path().join("report.html");
    std::fs::write(&file, &page).expect("write");
    let profile = tempfile::tempdir().expect("profile");
    let out = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=3000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("--dump-dom")
        .arg(format!("file://{}", file.display()))
        .output()
        .expect("run chromium");
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let start =
        dom.find("<pre id=\"drawn\">").expect("the #drawn element") + "<pre id=\"drawn\">".len();
    let end = start + dom[start..].find("</pre>").expect("end of #drawn");
    let drawn: serde_json::Value = serde_json::from_str(&dom[start..end]).unwrap_or_else(|e| {
        panic!(
            "the page's script did not run or wrote no JSON ({e}): {:?}",
            &dom[start..end]
        )
    });
    let charts = drawn.as_array().expect("one entry per chart");
    let ids: Vec<&str> = charts.iter().filter_map(|c| c["chart"].as_str()).collect();
    assert_eq!(
        ids,
        [
            "cost-by-tier",
            "savings-split",
            "pool-utilisation",
            "windows"
        ]
    );
    for c in charts {
        // Axes and mesh alone are a handful of shapes; the data adds more.
        assert!(
            c["shapes"].as_u64().unwrap_or(0) >= 5,
            "chart drew too little: {c}"
        );
        assert!(
            c["area"].as_u64().unwrap_or(0) > 1000,
            "chart has no visible area: {c}"
        );
    }
}

/// What the page shows of the books against the bill, read in Chromium:
/// the section's heading and summary, and per row of `#bills` its cells'
/// text and whether its cause cell is drawn where it is (on screen once
/// scrolled to, with a size, and the element found at its centre).
const BILLS_SHOWN: &str = r#"(() => {
  if (document.readyState !== 'complete') return null;
  const t = document.getElementById('bills');
  if (!t) return {missing: true};
  const h = t.previousElementSibling && t.previousElementSibling.previousElementSibling;
  const rows = Array.from(t.tBodies[0].rows).map((tr) => {
    const cause = tr.cells[tr.cells.length - 1];
    cause.scrollIntoView({block: 'center'});
    const b = cause.getBoundingClientRect();
    const at = document.elementFromPoint(b.left + b.width / 2, b.top + b.height / 2);
    const style = getComputedStyle(cause);
    return {
      cells: Array.from(tr.cells).map((c) => c.innerText),
      drawn: b.width > 0 && b.height > 0 && style.visibility === 'visible' &&
        style.display !== 'none' && (at === cause || cause.contains(at)),
    };
  });
  return {heading: h && h.innerText, summary: t.previousElementSibling.innerText, rows};
})()"#;

#[test]
fn the_reconciliation_renders_in_chromium() {
    chromium();
    let (dir, url) = common::sqlite_url();
    // The documented bills with a price changed (day 1), a cached-token
    // count halved (day 2), a tier downgraded (day 3).
    let mut ledger = crate::bill::booked(&url);
    crate::bill::import(&mut ledger, true);
    let report = ledger.report(&Rules::default()).expect("report");
    assert!(report.bills.differing > 0, "{:#?}", report.bills);
    let file = dir.path().join("bills.html");
    std::fs::write(&file, ace_ledger::html::page(&report).expect("page")).expect("write");
    let mut page = Page::launch().unwrap_or_else(|e| panic!("{e}"));
    page.navigate(&format!("file://{}", file.display()))
        .unwrap_or_else(|e| panic!("{e}"));
    let shown = page
        .wait("the page to load", BILLS_SHOWN, Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(shown["heading"], "Books against the bill", "{shown:#}");
    let summary = shown["summary"].as_str().unwrap_or("");
    assert!(
        summary.starts_with("33 bill lines, 0 rows not imported,"),
        "{summary}"
    );
    let rows: Vec<(Vec<String>, bool)> = shown["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| {
            let cells = serde_json::from_value(r["cells"].clone()).expect("cells");
            (cells, r["drawn"] == true)
        })
        .collect();
    let undrawn: Vec<&Vec<String>> = rows.iter().filter(|r| !r.1).map(|r| &r.0).collect();
    assert!(undrawn.is_empty(), "rows not drawn: {undrawn:#?}");
    // provider, day, model, tenant, billed, booked, difference, cause.
    let row = |provider: &str, day: &str, cause: &str, says: &str| {
        rows.iter().any(|(c, _)| {
            c.len() == 8 && c[0] == provider && c[1] == day && c[7] == cause && c[6].contains(says)
        })
    };
    for provider in ["openai", "anthropic", "azure"] {
        assert!(
            row(
                provider,
                "2024-11-01",
                "price",
                "the tokens agree, the money does not"
            ),
            "{provider}: {rows:#?}"
        );
        assert!(
            row(
                provider,
                "2024-11-02",
                "cached tokens",
                "cached tokens read differently"
            ),
            "{provider}: {rows:#?}"
        );
        assert!(
            row(provider, "2024-11-03", "tier", "billed at tier"),
            "{provider}: {rows:#?}"
        );
    }
    assert!(
        row(
            "anthropic",
            "2024-11-01",
            "price",
            "proposed (not applied): anthropic usd_per_output_token"
        ),
        "{rows:#?}"
    );
    // Drain what the page said since, then nothing on its console.
    page.eval("1").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(page.console, Vec::<String>::new(), "{}", page.log());
}
