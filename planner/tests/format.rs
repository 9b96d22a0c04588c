//! The scenario format: errors name the line and the fix; the grid renders.

use ace_planner::{compare, fast, parse};

#[test]
fn errors_name_line_and_field() {
    let cases = [
        (
            "gpus 8\njob 0 train 3 4 1 0\n",
            "line 2: job 0: size 3 must be a power of two",
        ),
        (
            "gpus 8\njob 0 train 2 4 1\n",
            "line 2: a job needs 6 fields",
        ),
        (
            "gpus 8\njob 0 training 2 4 1 0\n",
            "line 2: field `kind`: `training`",
        ),
        (
            "gpus 8\nrt 0 1 2 3\n",
            "line 2: rt app 0 has 3 demand values but the horizon has 24",
        ),
        (
            "gpus x\n",
            "line 1: field `gpus`: `x` is not a whole number from 1 to 65536",
        ),
        ("gpus 8\nfoo 1\n", "line 2: unknown keyword `foo`"),
        ("steps 24\n", "the file has no `gpus` line"),
        (
            "gpus 8\njob 0 eval 1 1 1 0\njob 0 eval 1 1 1 0\n",
            "line 3: field `id`: job id 0 is already used on line 2",
        ),
        (
            "gpus 8\njob 0 eval 2 1 1 0 running=7\n",
            "line 2: job 0: running=7 puts a block",
        ),
        (
            "gpus 8\ngamma 1.5\n",
            "line 2: field `gamma`: 1.5 must be in (0, 1]",
        ),
        // Bounds: sizes, durations, positions, penalties.
        (
            "gpus 4294967295\n",
            "line 1: field `gpus`: 4294967295 is outside 1..=65536",
        ),
        (
            "gpus 8\nsteps 4000000000\n",
            "line 2: field `steps`: 4000000000 is outside 1..=8760",
        ),
        (
            "gpus 65536\nsteps 8760\n",
            "line 2: fields `gpus` x `steps`",
        ),
        (
            "gpus 8\njob 0 eval 1 4294967295 1 0\n",
            "line 2: field `duration`: 4294967295 is outside 1..=1000000",
        ),
        (
            "gpus 8\njob 0 eval 1 1 1 0 running=4294967295\n",
            "line 2: field `running`: 4294967295 is outside 0..=65535",
        ),
        (
            "gpus 8\nrt_penalty 1e308\n",
            "line 2: field `rt_penalty`: 1e308 must be in (0, 1000000]",
        ),
        ("gpus 8\nrt_penalty NaN\n", "line 2: field `rt_penalty`"),
        ("gpus 8\nsteps 0\n", "line 2: field `steps`: 0 is outside"),
        (
            "gpus 8\nsteps 2\nrt 0 1 1\nrt 0 1 1\n",
            "line 4: field `id`: rt app id 0 is already used on line 3",
        ),
        (
            "gpus 8\nsteps 2\nrt 0 1 9\n",
            "line 3: field `demand[1]`: rt app 0 wants 9 GPUs",
        ),
    ];
    for (text, want) in cases {
        let e = parse(text, "t").unwrap_err().to_string();
        assert!(e.contains(want), "{text:?}: got {e:?}, want {want:?}");
    }
}

/// Inputs that are well formed but admit no plan: a distinct error, with the
/// line of the item to fix and the reason.
#[test]
fn infeasible_inputs_say_why() {
    let cases = [
        (
            "gpus 8\njob 0 eval 4 2 1 0 running=0\njob 1 eval 4 2 1 0 running=2\n",
            "line 3: no valid plan: running job 0 and running job 1 both held GPU 2 before step 0",
        ),
        (
            "gpus 8\nsteps 2\nrt 0 1 1 prev=3\njob 0 eval 4 2 1 0 running=2\n",
            "line 3: no valid plan: running job 0 and rt app 0 (prev=) both held GPU 3",
        ),
        (
            "gpus 8\nsteps 2\nrt 0 1 1 prev=3\nrt 1 1 1 prev=3\n",
            "line 4: no valid plan: rt app 0 (prev=) and rt app 1 (prev=) both held GPU 3",
        ),
        (
            "gpus 8\nsteps 3\nrt 0 0 0 0 cap=1 prev=0,1,2,3,4\n",
            "line 3: no valid plan: rt app 0 held 5 GPUs before step 0 (prev=) and may drop at \
             most 2 per step (2 x cap=1), so it still holds at least 3 at step 0",
        ),
    ];
    for (text, want) in cases {
        let e = parse(text, "t").unwrap_err();
        assert!(e.infeasible, "{text:?}: {e}");
        let e = e.to_string();
        assert!(e.contains(want), "{text:?}: got {e:?}, want {want:?}");
    }
    // A prev= set that can be shed in time is fine.
    assert!(parse("gpus 8\nsteps 3\nrt 0 3 1 0 cap=1 prev=0,1,2,3,4\n", "t").is_ok());
}

#[test]
fn s1_grid_is_readable() {
    let path = format!("{}/scenarios/s1", env!("CARGO_MANIFEST_DIR"));
    let s = parse(&std::fs::read_to_string(path).unwrap(), "s1").unwrap();
    let out = fast::solve(&s);
    let g = compare::grid(&s, &out.plan, 128);
    let lines: Vec<&str> = g.lines().collect();
    assert_eq!(lines.len(), 1 + 8, "header + one row per GPU:\n{g}");
    assert!(lines[0].starts_with("GPU   0  1  2"));
    // Every row has 24 cells of 2 characters plus separators.
    for l in &lines[1..] {
        assert_eq!(l.len(), 5 + 24 * 3, "{l:?}");
    }
    // RT app 0 peaks at 4 GPUs at hour 12.
    let col = 5 + 12 * 3;
    let rt = lines[1..]
        .iter()
        .filter(|l| &l[col..col + 2] == "R0")
        .count();
    assert_eq!(rt, 4, "\n{g}");
    let c = compare::compare(&s, None);
    let t = compare::table(&c);
    assert!(
        t.contains("fifo") && t.contains("53.6%") && t.contains("fast vs fifo"),
        "{t}"
    );
}

/// The grid names every job and app in full, and the plan view lists every
/// placement and every app's GPUs per step.
#[test]
fn grid_and_plan_view_name_everything() {
    let mut text = String::from("gpus 16\nsteps 3\n");
    for a in 0..12 {
        text.push_str(&format!("rt {} 1 1 1\n", 100 + a));
    }
    text.push_str("job 12345 eval 2 3 5 0\njob 7 eval 2 3 5 0\n");
    let s = parse(&text, "ids").unwrap();
    let out = fast::solve(&s);
    assert!(out.report.valid(), "{:?}", out.report.violations);
    let g = compare::grid(&s, &out.plan, 128);
    for label in ["R100", "R111", "12345", "7"] {
        assert!(
            g.split_whitespace().any(|c| c == label),
            "{label} missing:\n{g}"
        );
    }
    let widths: Vec<usize> = g.lines().take(17).map(str::len).collect();
    assert!(widths.windows(2).all(|w| w[0] == w[1]), "ragged grid:\n{g}");
    let v = compare::PlanView::of(&s, &out.plan);
    let ids: Vec<u32> = v.jobs.iter().map(|j| j.id).collect();
    assert!(ids.contains(&12345) && ids.contains(&7), "{v:?}");
    assert_eq!(v.rt.len(), 12);
    assert!(v
        .rt
        .iter()
        .all(|r| r.gpus.len() == 3 && r.gpus[0].len() == 1));
    let c = compare::compare(&s, None);
    let json = serde_json::to_value(&c).unwrap();
    assert_eq!(json["fast"]["plan"]["rt"][11]["id"], 111);
    assert!(json["fast"]["plan"]["jobs"].as_array().unwrap().len() == 2);
}
