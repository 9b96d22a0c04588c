//! The comparison's charts, as SVG files (plotters): the cost-versus-SLO
//! frontier, owned-GPU utilisation over the day, and cost by tier.

use crate::report::Comparison;
use ace_core::cost::Tier;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::{Path, PathBuf};

const COLORS: [RGBColor; 12] = [
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0x17, 0xbe, 0xcf),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x00, 0x00, 0x80),
    RGBColor(0x99, 0x99, 0x00),
];

fn color(i: usize) -> RGBColor {
    COLORS.get(i % COLORS.len()).copied().unwrap_or(BLACK)
}

fn err<E: std::fmt::Display>(path: &Path) -> impl Fn(E) -> String + '_ {
    move |e| format!("cannot draw `{}`: {e}", path.display())
}

/// Write the three charts into `dir`; the files written.
pub fn write_all(c: &Comparison, dir: &Path) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create `{}`: {e}", dir.display()))?;
    let files = [
        dir.join("frontier.svg"),
        dir.join("utilisation.svg"),
        dir.join("cost-by-tier.svg"),
    ];
    let [a, b, t] = &files;
    frontier(c, a)?;
    utilisation(c, b)?;
    by_tier(c, t)?;
    Ok(files.to_vec())
}

/// Cost (x) against SLO attainment (y), one point per policy.
fn frontier(c: &Comparison, path: &Path) -> Result<(), String> {
    let e = err(path);
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(&e)?;
    let max_cost = c
        .policies
        .iter()
        .map(|p| p.cost_usd.mean)
        .fold(1.0, f64::max)
        * 1.1;
    let min_slo = c
        .policies
        .iter()
        .map(|p| p.slo.mean)
        .fold(1.0, f64::min)
        .min(0.9)
        * 100.0;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Cost against SLO attainment (mean over seeds)",
            ("sans-serif", 20),
        )
        .margin(20)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..max_cost, (min_slo - 1.0)..100.5)
        .map_err(&e)?;
    chart
        .configure_mesh()
        .x_desc("cost, USD per run")
        .y_desc("SLO attainment, %")
        .draw()
        .map_err(&e)?;
    for (i, p) in c.policies.iter().enumerate() {
        let col = color(i);
        let at = (p.cost_usd.mean, p.slo.mean * 100.0);
        chart
            .draw_series([Circle::new(at, 6, col.filled())])
            .map_err(&e)?
            .label(p.policy.clone())
            .legend(move |(x, y)| Circle::new((x, y), 5, col.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::MiddleRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(&e)?;
    root.present().map_err(&e)
}

/// Owned utilisation per hour, one line per policy.
fn utilisation(c: &Comparison, path: &Path) -> Result<(), String> {
    let e = err(path);
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(&e)?;
    let hours = c
        .policies
        .iter()
        .map(|p| p.owned_utilisation_by_hour.len())
        .max()
        .unwrap_or(24)
        .max(1);
    let mut chart = ChartBuilder::on(&root)
        .caption("Owned-GPU utilisation over the run", ("sans-serif", 20))
        .margin(20)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0..hours, 0.0..100.0)
        .map_err(&e)?;
    chart
        .configure_mesh()
        .x_desc("hour")
        .y_desc("running sequences / slots, %")
        .draw()
        .map_err(&e)?;
    for (i, p) in c.policies.iter().enumerate() {
        let col = color(i);
        chart
            .draw_series(LineSeries::new(
                p.owned_utilisation_by_hour
                    .iter()
                    .enumerate()
                    .map(|(h, u)| (h, u * 100.0)),
                col.stroke_width(2),
            ))
            .map_err(&e)?
            .label(p.policy.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], col.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(&e)?;
    root.present().map_err(&e)
}

/// Cost by tier, stacked, one bar per policy.
fn by_tier(c: &Comparison, path: &Path) -> Result<(), String> {
    let e = err(path);
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(&e)?;
    let n = c.policies.len().max(1);
    let max = c
        .policies
        .iter()
        .map(|p| p.cost_by_tier.iter().sum::<f64>())
        .fold(1.0, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption("Cost by tier (mean over seeds)", ("sans-serif", 20))
        .margin(20)
        .x_label_area_size(150)
        .y_label_area_size(60)
        .build_cartesian_2d((0..n.saturating_sub(1)).into_segmented(), 0.0..max)
        .map_err(&e)?;
    let names: Vec<String> = c.policies.iter().map(|p| p.policy.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_label_formatter(&|_| String::new())
        .y_desc("USD")
        .draw()
        .map_err(&e)?;
    // The policy names, one per bar, written downwards from the axis
    // (the mesh centres rotated labels on the axis, hiding half of each).
    let style = TextStyle::from(
        ("sans-serif", 12)
            .into_font()
            .transform(FontTransform::Rotate90),
    )
    .pos(Pos::new(HPos::Left, VPos::Center));
    for (i, name) in names.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(SegmentValue::CenterOf(i), 0.0));
        root.draw(&Text::new(name.clone(), (x, y + 8), style.clone()))
            .map_err(&e)?;
    }
    for (t, tier) in Tier::ALL.iter().enumerate() {
        let col = color(t + 1);
        chart
            .draw_series(c.policies.iter().enumerate().map(|(i, p)| {
                let below: f64 = p.cost_by_tier.iter().take(t).sum();
                let top = below + p.cost_by_tier.get(t).copied().unwrap_or(0.0);
                let mut bar = Rectangle::new(
                    [
                        (SegmentValue::Exact(i), below),
                        (SegmentValue::Exact(i + 1), top),
                    ],
                    col.filled(),
                );
                bar.set_margin(0, 0, 8, 8);
                bar
            }))
            .map_err(&e)?
            .label(tier.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], col.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(&e)?;
    root.present().map_err(&e)
}
