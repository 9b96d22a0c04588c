//! The report as one self-contained HTML page: the figures, and four charts
//! drawn by `plotters` as inline SVG (no script or style is fetched, so the
//! page opens anywhere, offline, and can be mailed as one file).
//!
//! Charts: booked cost by tier per window, the savings split (earned and
//! forfeited), each owned or reserved pool's utilisation per window against
//! its knee, and savings per window with forfeited windows marked. Tenant
//! budgets, when the events' configurations define any or the events name
//! one, are a table of their own; so is the reconciliation with the
//! providers' bills, when one is stored.
//!
//! A few lines of inline script measure what the browser drew (each
//! chart's drawn shapes and their sizes) into `#drawn`, so a headless
//! browser can check the charts rendered.

use crate::money::{usd, usd_f64};
use crate::report::Report;
use anyhow::anyhow;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use std::collections::BTreeSet;

const W: u32 = 760;
const H: u32 = 320;
const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

fn color(i: usize) -> RGBColor {
    COLORS.get(i % COLORS.len()).copied().unwrap_or(BLACK)
}

fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("cannot draw a chart: {e}")
}

/// Minutes since the first window, the charts' x axis.
fn minutes(r: &Report, start_ms: i64) -> f64 {
    let first = r.cost_series.keys().next().copied().unwrap_or(0);
    start_ms.saturating_sub(first) as f64 / 60_000.0
}

fn x_range(r: &Report) -> std::ops::Range<f64> {
    let last = r.cost_series.keys().last().copied().unwrap_or(0);
    let end = minutes(r, last) + r.rules.window_ms as f64 / 60_000.0;
    0.0..end.max(1.0)
}

type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// One chart as SVG: a titled frame over `x` and `y` with a mesh, what
/// `draw` adds, and a legend when `legend` is set.
fn svg(
    title: &str,
    x: std::ops::Range<f64>,
    y: std::ops::Range<f64>,
    (x_desc, y_desc): (&str, &str),
    categories: bool,
    legend: bool,
    draw: impl FnOnce(&mut Chart<'_, '_>) -> anyhow::Result<()>,
) -> anyhow::Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W, H)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(34)
            .y_label_area_size(80)
            .build_cartesian_2d(x, y)
            .map_err(err)?;
        let mut mesh = chart.configure_mesh();
        mesh.x_desc(x_desc).y_desc(y_desc);
        // Dollar amounts per request are tiny: three significant digits.
        let usd = |v: &f64| format!("{v:.2e}");
        if y_desc == "USD" {
            mesh.y_label_formatter(&usd);
        }
        if categories {
            // Named in the plot by the caller: text under an axis tick is
            // placed off-centre without font metrics.
            mesh.disable_x_mesh().x_labels(0);
        }
        mesh.draw().map_err(err)?;
        draw(&mut chart)?;
        if legend {
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(err)?;
        }
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// A labelled line through `pts`, each point marked (a series of one
/// window is a point, not a line).
fn line(
    chart: &mut Chart<'_, '_>,
    pts: Vec<(f64, f64)>,
    c: RGBColor,
    label: &str,
) -> anyhow::Result<()> {
    let marks: Vec<Circle<(f64, f64), i32>> =
        pts.iter().map(|p| Circle::new(*p, 3, c.filled())).collect();
    chart
        .draw_series(LineSeries::new(pts, c.stroke_width(2)))
        .map_err(err)?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
    chart.draw_series(marks).map_err(err)?;
    Ok(())
}

/// The lowest and highest of `vals` and 0, with a margin, as a y range.
fn y_range(vals: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = vals.fold((0.0f64, 0.0f64), |(l, h), v| (l.min(v), h.max(v)));
    (lo * 1.1)..(hi * 1.1).max(1e-9)
}

fn cost_by_tier(r: &Report) -> anyhow::Result<String> {
    let tiers: BTreeSet<&String> = r.cost_series.values().flat_map(|m| m.keys()).collect();
    let y = y_range(
        r.cost_series
            .values()
            .flat_map(|m| m.values())
            .map(|n| usd_f64(*n)),
    );
    let title = "Booked cost by tier per window";
    svg(
        title,
        x_range(r),
        y,
        ("minutes", "USD"),
        false,
        true,
        |chart| {
            for (i, tier) in tiers.into_iter().enumerate() {
                let c = color(i);
                let pts: Vec<(f64, f64)> = r
                    .cost_series
                    .iter()
                    .map(|(s, m)| (minutes(r, *s), usd_f64(m.get(tier).copied().unwrap_or(0))))
                    .collect();
                line(chart, pts, c, tier)?;
            }
            Ok(())
        },
    )
}

fn savings_split(r: &Report) -> anyhow::Result<String> {
    let parts = [
        ("utilisation", r.earned.utilisation, r.forfeited.utilisation),
        ("arbitrage", r.earned.arbitrage, r.forfeited.arbitrage),
        ("model routing", r.earned.routing, r.forfeited.routing),
        ("caching", r.earned.caching, r.forfeited.caching),
    ];
    let y = y_range(parts.iter().flat_map(|p| [usd_f64(p.1), usd_f64(p.2)]));
    let title = "Savings split: earned (solid) and forfeited (light)";
    let top = y.end;
    svg(title, 0.0..4.0, y, ("", "USD"), true, false, |chart| {
        let names = parts
            .iter()
            .enumerate()
            .map(|(i, p)| Text::new(p.0, (i as f64 + 0.15, top), ("sans-serif", 14).into_font()));
        chart.draw_series(names).map_err(err)?;
        let bars = parts.iter().enumerate().flat_map(|(i, (_, e, f))| {
            let x = i as f64;
            [
                Rectangle::new([(x + 0.15, 0.0), (x + 0.5, usd_f64(*e))], color(0).filled()),
                Rectangle::new(
                    [(x + 0.5, 0.0), (x + 0.85, usd_f64(*f))],
                    color(3).mix(0.45).filled(),
                ),
            ]
        });
        chart.draw_series(bars).map_err(err)?;
        Ok(())
    })
}

fn pool_utilisation(r: &Report) -> anyhow::Result<String> {
    let y = y_range(
        r.pools
            .iter()
            .flat_map(|p| p.points.iter().map(|q| q.1).chain([p.knee, 1.0])),
    );
    let span = x_range(r);
    let title = "Owned and reserved pools: utilisation against the knee (dashed)";
    svg(
        title,
        span.clone(),
        y,
        ("minutes", "utilisation"),
        false,
        true,
        |chart| {
            for (i, p) in r.pools.iter().enumerate() {
                let c = color(i);
                let pts: Vec<(f64, f64)> =
                    p.points.iter().map(|(s, u)| (minutes(r, *s), *u)).collect();
                line(chart, pts, c, &p.destination)?;
                let step = (span.end - span.start) / 40.0;
                let dashes = (0..40).map(|k| {
                    let x = span.start + step * f64::from(k);
                    PathElement::new(
                        vec![(x, p.knee), (x + step / 2.0, p.knee)],
                        c.stroke_width(1),
                    )
                });
                chart.draw_series(dashes).map_err(err)?;
            }
            Ok(())
        },
    )
}

fn windows(r: &Report) -> anyhow::Result<String> {
    let y = y_range(r.windows.iter().map(|w| usd_f64(w.savings.total())));
    let width = r.rules.window_ms as f64 / 60_000.0;
    let tenants: Vec<&String> = r.by_tenant.keys().collect();
    let slot = width * 0.8 / tenants.len().max(1) as f64;
    let title = "Savings per tenant window: kept (blue) and forfeited (red)";
    svg(
        title,
        x_range(r),
        y,
        ("minutes", "USD"),
        false,
        false,
        |chart| {
            let bars = r.windows.iter().map(|w| {
                let k = tenants.iter().position(|t| **t == w.tenant).unwrap_or(0) as f64;
                let x = minutes(r, w.start_ms) + width * 0.1 + slot * k;
                let c = if w.forfeited.is_some() {
                    color(3)
                } else {
                    color(0)
                };
                Rectangle::new(
                    [(x, 0.0), (x + slot * 0.9, usd_f64(w.savings.total()))],
                    c.filled(),
                )
            });
            chart.draw_series(bars).map_err(err)?;
            Ok(())
        },
    )
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The budgets as a table (empty when there are none): names and
/// tenants come from the configuration or the log, so every cell is
/// escaped.
fn budget_table(r: &Report) -> String {
    if r.budgets.is_empty() {
        return String::new();
    }
    let mut html = format!(
        "<h2>Budgets</h2>\n<p>Spend in the period holding the last event ({}); requests \
         refused (429) for each budget, and served or refused while it was soft.</p>\n\
         <table id=\"budgets\"><thead><tr><th>budget</th><th>tenants</th><th>period</th>\
         <th>amount</th><th>spent</th><th>used</th><th>state</th><th>refused: exhausted</th>\
         <th>refused: tokens per minute</th><th>served soft</th><th>refused soft</th>\
         <th>other</th></tr></thead><tbody>\n",
        crate::time::rfc3339(r.last_ms)
    );
    for b in &r.budgets {
        let tenants = if b.configured {
            b.tenants.join(", ")
        } else {
            "(in no configuration of these events)".into()
        };
        let cells = [
            b.name.clone(),
            tenants,
            crate::report::budget_period(b),
            crate::report::budget_amount(b),
            b.spent.map_or("-".into(), usd),
            crate::report::budget_used(b),
            b.state.clone().unwrap_or_else(|| "-".into()),
            b.refused_exhausted.to_string(),
            b.refused_tokens.to_string(),
            b.served_soft.to_string(),
            b.refused_soft.to_string(),
            b.other.to_string(),
        ];
        row(&mut html, &cells);
    }
    html.push_str("</tbody></table>\n");
    html
}

/// One table row of `cells`, each escaped (names come from the log, a
/// configuration or a bill).
fn row(html: &mut String, cells: &[String]) {
    html.push_str("<tr>");
    for c in cells {
        html.push_str(&format!("<td>{}</td>", escape(c)));
    }
    html.push_str("</tr>\n");
}

/// The books against the bill as a table (empty when no bill is
/// stored): one row per difference, each with its cause, and each
/// proposed configuration change (never applied).
fn bill_table(r: &Report) -> String {
    let b = &r.bills;
    if b.bill_lines == 0 {
        return String::new();
    }
    let mut html = format!(
        "<h2>Books against the bill</h2>\n<p>{} bill lines, {} rows not imported, {} \
         comparisons, {} differing.</p>\n<table id=\"bills\"><thead><tr><th>provider</th>\
         <th>day</th><th>model</th><th>tenant</th><th>billed</th><th>booked</th>\
         <th>difference</th><th>cause</th></tr></thead><tbody>\n",
        b.bill_lines,
        b.rows_not_imported,
        b.comparisons.len(),
        b.differing
    );
    let money = |n: Option<i64>| -> String { n.map_or("-".into(), |n| format!("${}", usd(n))) };
    for c in &b.comparisons {
        let mut rows: Vec<(String, String)> = c
            .differences
            .iter()
            .map(|d| (d.why.clone(), d.cause.as_str().to_string()))
            .collect();
        rows.extend(c.proposals.iter().map(|p| {
            (
                format!(
                    "proposed (not applied): {} {} {:e} -> {:e} ({})",
                    p.destination, p.field, p.current, p.proposed, p.from
                ),
                "price".to_string(),
            )
        }));
        if rows.is_empty() {
            rows.push(("agree".into(), "-".into()));
        }
        for (what, cause) in rows {
            let cells = [
                c.key.provider.clone(),
                c.key.day.clone(),
                c.key.model.clone(),
                c.key.tenant.clone().unwrap_or_else(|| "-".into()),
                money(c.billed.cost),
                money(c.booked.cost),
                what,
                cause,
            ];
            row(&mut html, &cells);
        }
    }
    html.push_str("</tbody></table>\n");
    html
}

/// Measures each chart's drawn shapes (count and total box area) into
/// `#drawn` as JSON once the page has laid out.
const MEASURE: &str = r#"<script>
window.addEventListener('load', function () {
  var out = [];
  document.querySelectorAll('figure.chart').forEach(function (f) {
    var n = 0, area = 0;
    f.querySelectorAll('svg polyline, svg path, svg rect, svg circle').forEach(function (el) {
      var b = el.getBBox();
      if (b.width > 0 || b.height > 0) { n += 1; area += Math.max(b.width, 1) * Math.max(b.height, 1); }
    });
    out.push({chart: f.id, shapes: n, area: Math.round(area)});
  });
  document.getElementById('drawn').textContent = JSON.stringify(out);
});
</script>"#;

/// The whole page.
pub fn page(r: &Report) -> anyhow::Result<String> {
    let charts = [
        ("cost-by-tier", cost_by_tier(r)?),
        ("savings-split", savings_split(r)?),
        ("pool-utilisation", pool_utilisation(r)?),
        ("windows", windows(r)?),
    ];
    let mut html = String::from(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>ACE ledger</title><style>body{font-family:sans-serif;margin:2em;max-width:1100px}\
         pre{background:#f6f6f6;padding:1em;overflow-x:auto}figure{margin:1em 0}\
         table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .5em;text-align:right}</style></head><body>\n",
    );
    html.push_str(&format!(
        "<h1>ACE ledger</h1>\n<p>Savings earned ${} of ${} ({} forfeited), booked ${} against ${} all pay-as-you-go.</p>\n",
        usd(r.earned.total()),
        usd(r.savings.total()),
        usd(r.forfeited.total()),
        usd(r.booked),
        usd(r.counterfactual)
    ));
    for (id, svg) in &charts {
        html.push_str(&format!(
            "<figure class=\"chart\" id=\"{id}\">{svg}</figure>\n"
        ));
    }
    html.push_str(&budget_table(r));
    html.push_str(&bill_table(r));
    html.push_str(&format!(
        "<h2>Figures</h2>\n<pre>{}</pre>\n",
        escape(&r.table())
    ));
    html.push_str("<pre id=\"drawn\"></pre>\n");
    html.push_str(MEASURE);
    html.push_str("\n</body></html>\n");
    Ok(html)
}
