//! The scenario parser on arbitrary text: a scenario or an error naming its
//! line, never a panic or a huge allocation. Scenarios that parse are
//! feasible, and small ones go through fast mode, whose plan must be valid.
#![no_main]
#![forbid(unsafe_code)]

use ace_planner::{check, fast, feasible, parse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse(text, "fuzz") {
        Err(e) => {
            assert!(!e.message.is_empty());
            assert!(e.line > 0 || e.message.contains("`gpus`"), "{e}");
        }
        Ok(s) => {
            assert!(feasible::check(&s).is_ok());
            let small = u64::from(s.gpus) * u64::from(s.steps) <= 4_096 && s.jobs.len() <= 32;
            if small {
                let out = fast::solve(&s);
                let r = check(&s, &out.plan);
                assert!(r.valid(), "{:?}\n{text}", r.violations);
            }
        }
    }
});
