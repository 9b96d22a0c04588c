//! The HTML report opens in a real headless Chromium and its four charts
//! draw: the page's own measuring script reports, per chart, how many SVG
//! shapes have a non-zero size, and Chromium's rendered DOM carries it.
//! Fails (never skips), naming `make setup`, when Chromium is missing.

use crate::common;
use ace_ledger::window::Rules;
use std::process::Command;

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
