//! Owned capacity from the planner's rolling horizon.
//!
//! `ace plan roll --json` prints one JSON object per committed step:
//! `{"step": 3, "owned": [{"app": 0, "gpus": 6, ...}], ...}` (other members
//! are ignored). Step `k` covers `[start + k * step, start + (k + 1) *
//! step)` of wall-clock time (`--plan-start`, `--plan-step`). A destination
//! with `plan_app = a` and `slots_per_gpu = s` gets capacity `gpus(a) * s`
//! in the current step, 0 when the step gives app `a` no GPUs (the plan
//! lent them to batch work: the destination is closed that hour). Before
//! the first step or after the last, the plan says nothing and no
//! capacity is reported.

use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Deserialize)]
struct Line {
    step: u64,
    owned: Vec<Owned>,
}

#[derive(Deserialize)]
struct Owned {
    app: u32,
    gpus: u32,
}

/// A rolling-horizon plan: per step, the GPUs each RT app owns.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    steps: BTreeMap<u64, BTreeMap<u32, u32>>,
}

impl Plan {
    /// The plan in `text`; an error names the line and field.
    pub fn parse(text: &str) -> Result<Plan, String> {
        let mut steps = BTreeMap::new();
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            if line.trim().is_empty() {
                continue;
            }
            let l: Line = serde_json::from_str(line).map_err(|e| {
                let what = e.to_string();
                let field = ["step", "owned", "app", "gpus"]
                    .into_iter()
                    .find(|f| what.contains(&format!("`{f}`")))
                    .map_or(String::new(), |f| format!(", field `{f}`"));
                format!("line {n}{field}: {what} (expected `ace plan roll --json` output)")
            })?;
            let mut owned = BTreeMap::new();
            for (j, o) in l.owned.iter().enumerate() {
                if owned.insert(o.app, o.gpus).is_some() {
                    return Err(format!(
                        "line {n}, field `owned[{j}].app`: app {} is listed twice",
                        o.app
                    ));
                }
            }
            if steps.insert(l.step, owned).is_some() {
                return Err(format!(
                    "line {n}, field `step`: step {} is given twice",
                    l.step
                ));
            }
        }
        if steps.is_empty() {
            return Err("no steps: expected the lines of `ace plan roll --json`".into());
        }
        Ok(Plan { steps })
    }

    /// The GPUs app `app` owns in step `step`; `None` when the plan has no
    /// such step.
    pub fn gpus(&self, step: u64, app: u32) -> Option<u32> {
        self.steps
            .get(&step)
            .map(|owned| owned.get(&app).copied().unwrap_or(0))
    }
}

/// The step running at `now_ms`, for a plan whose step 0 starts at
/// `start_ms` and whose steps last `step_ms`.
pub fn current_step(now_ms: u64, start_ms: u64, step_ms: u64) -> Option<u64> {
    (now_ms >= start_ms && step_ms > 0).then(|| (now_ms - start_ms) / step_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_apps_and_time() {
        let p = Plan::parse(
            "{\"step\":0,\"owned\":[{\"app\":0,\"gpus\":6,\"gpu_ids\":[0]},{\"app\":1,\"gpus\":2}],\"valid\":true}\n\
             {\"step\":1,\"owned\":[{\"app\":1,\"gpus\":3}]}\n",
        )
        .unwrap();
        assert_eq!(p.gpus(0, 0), Some(6));
        assert_eq!(p.gpus(1, 0), Some(0));
        assert_eq!(p.gpus(1, 1), Some(3));
        assert_eq!(p.gpus(2, 1), None);
        assert_eq!(current_step(999, 1000, 10), None);
        assert_eq!(current_step(1000, 1000, 10), Some(0));
        assert_eq!(current_step(1025, 1000, 10), Some(2));
    }

    #[test]
    fn bad_lines_name_line_and_field() {
        for (text, want) in [
            (
                "{\"step\":0,\"owned\":[]}\n{\"step\":\"x\",\"owned\":[]}\n",
                "line 2",
            ),
            ("{\"owned\":[]}\n", "field `step`"),
            ("{\"step\":0,\"owned\":[{\"app\":1}]}\n", "field `gpus`"),
            (
                "{\"step\":0,\"owned\":[{\"app\":1,\"gpus\":-2}]}\n",
                "line 1",
            ),
            (
                "{\"step\":0,\"owned\":[]}\n{\"step\":0,\"owned\":[]}\n",
                "line 2, field `step`",
            ),
            (
                "{\"step\":0,\"owned\":[{\"app\":1,\"gpus\":1},{\"app\":1,\"gpus\":1}]}\n",
                "owned[1].app",
            ),
            ("\n", "no steps"),
            ("step 0: owned RT []\n", "line 1"),
        ] {
            let e = Plan::parse(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }
}
