//! Prints fast mode vs FIFO and the stand-in over random scenarios and over
//! random arrival orders of the seven golden scenarios (the numbers in
//! BENCHMARKS.md). `cargo run --release -p ace-planner --example study -- 1000 200`
use ace_planner::{parse, study};

fn row(name: &str, s: &study::Stats) {
    println!(
        "  {name:<28} mean {:>7.1}  p10 {:>7.1}  p50 {:>7.1}  p90 {:>7.1}  min {:>7.1}  max {:>7.1}",
        s.mean, s.p10, s.p50, s.p90, s.min, s.max
    );
}

fn show(title: &str, st: &study::Study) {
    println!(
        "{title}: {} scenarios, fast invalid {}, below FIFO value {}, below stand-in value {}",
        st.scenarios, st.fast_invalid, st.fast_below_fifo_value, st.fast_below_greedy_value
    );
    row("value gain vs FIFO (%)", &st.value_gain_vs_fifo_pct);
    row("util gain vs FIFO (pts)", &st.util_gain_vs_fifo_pts);
    row("value gain vs stand-in (%)", &st.value_gain_vs_greedy_pct);
    row("util gain vs stand-in (pts)", &st.util_gain_vs_greedy_pts);
}

fn main() {
    let mut args = std::env::args().skip(1);
    let count: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let orders: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(200);
    show("random scenarios", &study::random(count, 1));
    for n in 1..=7 {
        let path = format!("{}/scenarios/s{n}", env!("CARGO_MANIFEST_DIR"));
        let Ok(text) = std::fs::read_to_string(&path) else {
            eprintln!("cannot read {path}");
            return;
        };
        match parse(&text, &format!("s{n}")) {
            Ok(s) => show(
                &format!("S{n} arrival orders"),
                &study::orders(&s, orders, 1),
            ),
            Err(e) => eprintln!("{path}: {e}"),
        }
    }
}
