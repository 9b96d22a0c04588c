//! Rolling horizon: committing one step at a time yields an executed
//! schedule that is itself a valid plan for the original day.

use ace_planner::rolling::{owned_capacity, Rolling};
use ace_planner::{check, fast, parse, Cell, Plan};

#[test]
fn committed_steps_form_a_valid_day_and_expose_owned_capacity() {
    for n in [1, 2, 5] {
        let path = format!("{}/scenarios/s{n}", env!("CARGO_MANIFEST_DIR"));
        let s = parse(&std::fs::read_to_string(path).unwrap(), "s").unwrap();
        let mut roll = Rolling::from_scenario(&s).unwrap();
        let mut executed = Plan::empty(&s);
        for t in 0..s.steps {
            let st = roll.step();
            assert!(
                st.report.valid(),
                "S{n} step {t}: {:?}",
                st.report.violations
            );
            // Owned capacity is what RT holds at the committed step.
            for (ri, o) in st.owned.iter().enumerate() {
                assert_eq!(
                    o.gpus, s.rt[ri].demand[t as usize],
                    "S{n} step {t} app {ri}"
                );
            }
            for g in 0..s.gpus {
                let c = match st.plan.at(g, 0) {
                    Cell::Job(j) => {
                        let id = st.scenario.jobs[j as usize].id;
                        Cell::Job(s.jobs.iter().position(|x| x.id == id).unwrap() as u32)
                    }
                    other => other,
                };
                executed.set(g, t, c);
            }
        }
        let r = check(&s, &executed);
        assert!(r.valid(), "S{n} executed day: {:?}", r.violations);
        assert_eq!(r.shortfall, 0);
        // Re-planning should not lose much against one look at the whole day.
        let once = fast::solve(&s).report;
        assert!(
            r.value >= 0.8 * once.value,
            "S{n}: rolling {} vs one-shot {}",
            r.value,
            once.value
        );
        // owned_capacity on a whole-day plan reads any step.
        let day = owned_capacity(&s, &fast::solve(&s).plan, 12);
        assert_eq!(day[0].gpus, s.rt[0].demand[12]);
    }
}
