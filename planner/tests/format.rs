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
            "line 1: field `gpus`: `x` is not a valid number",
        ),
        ("gpus 8\nfoo 1\n", "line 2: unknown keyword `foo`"),
        ("steps 24\n", "needs a `gpus N` line"),
        (
            "gpus 8\njob 0 eval 1 1 1 0\njob 0 eval 1 1 1 0\n",
            "job id 0 appears twice",
        ),
        (
            "gpus 8\njob 0 eval 2 1 1 0 running=7\n",
            "line 2: job 0: running=7 puts a block",
        ),
        ("gpus 8\ngamma 1.5\n", "`gamma` must be in (0, 1]"),
    ];
    for (text, want) in cases {
        let e = parse(text, "t").unwrap_err().to_string();
        assert!(e.contains(want), "{text:?}: got {e:?}, want {want:?}");
    }
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
