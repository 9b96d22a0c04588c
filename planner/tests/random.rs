//! 1,000 random scenarios from the documented generator: fast mode never
//! produces an invalid plan and never loses value to FIFO.

use ace_planner::study;

#[test]
fn fast_mode_on_1000_random_scenarios() {
    let st = study::random(1000, 1);
    assert_eq!(st.scenarios, 1000);
    assert_eq!(st.fast_invalid, 0, "{st:?}");
    assert_eq!(st.fast_below_fifo_value, 0, "{st:?}");
    assert!(st.value_gain_vs_fifo_pct.mean > 0.0, "{st:?}");
    println!("{st:#?}");
}
