//! The wasm-bindgen surface: JSON strings and bytes in and out, nothing
//! thrown for bad input.
//!
//! Why JSON strings rather than JavaScript objects: the page needs a handful
//! of calls, and `serde_json` (already in the compiler) keeps the binding
//! free of a second serialisation layer. Every answer is an object with
//! `ok`; when `ok` is false it carries `problems` (file, line, column,
//! message, hint) or an `error` text.

use crate::session::{self, Input, Problem, Session};
use serde::Serialize;
use serde_json::json;
use wasm_bindgen::prelude::*;

fn answer<T: Serialize>(result: Result<T, Vec<Problem>>) -> String {
    match result {
        Ok(v) => json!({ "ok": true, "value": v }),
        Err(problems) => json!({ "ok": false, "problems": problems }),
    }
    .to_string()
}

fn failed(error: String) -> String {
    json!({ "ok": false, "error": error }).to_string()
}

/// The page's compiler: holds the last input that compiled.
#[wasm_bindgen]
#[derive(Debug, Default)]
pub struct Playground {
    session: Option<Session>,
}

#[wasm_bindgen]
impl Playground {
    /// A playground with nothing compiled.
    #[wasm_bindgen(constructor)]
    pub fn new() -> Playground {
        Playground::default()
    }

    /// Compiles `input` (`{"schema": {"name", "text"}, "manifest": {...},
    /// "policies": [...]}`); answers the summary (size, checksum,
    /// destinations, attributes, factors, warnings, dump) or the problems.
    /// After a failed compile nothing is held.
    pub fn compile(&mut self, input: &str) -> String {
        self.session = None;
        let input = match Input::parse(input) {
            Ok(i) => i,
            Err(e) => return failed(e),
        };
        answer(Session::compile(&input).and_then(|s| {
            let summary = s.summary()?;
            self.session = Some(s);
            Ok(summary)
        }))
    }

    /// The compiled tables file (`tables.acet`); empty before a compile.
    pub fn tables(&self) -> Vec<u8> {
        self.session
            .as_ref()
            .map_or_else(Vec::new, |s| s.tables().to_vec())
    }

    /// The filter's plugin configuration, as `ace plugin-config` writes it.
    pub fn plugin_config(&self, restrict: bool, read_body: bool) -> String {
        match &self.session {
            Some(s) => answer(s.plugin_config(restrict, read_body)),
            None => failed(NOTHING_COMPILED.into()),
        }
    }

    /// Every destination's decision for `request` (a JSON object of
    /// request attributes), as `ace policy explain` gives it.
    pub fn explain(&mut self, request: &str) -> String {
        match &mut self.session {
            Some(s) => match s.explain(request) {
                Ok(e) => json!({ "ok": true, "value": e }).to_string(),
                Err(e) => failed(e),
            },
            None => failed(NOTHING_COMPILED.into()),
        }
    }
}

const NOTHING_COMPILED: &str =
    "nothing is compiled: fix the problems the compile reported, then ask again";

/// Proves `tables` equal to Cedar for `input` over the request space, as
/// `ace policy verify` does, calling `progress(checked, total)` as it goes
/// (run it in a Web Worker: it takes as long as the CLI's verify).
#[wasm_bindgen]
pub fn verify(input: &str, tables: &[u8], progress: &js_sys::Function) -> String {
    let input = match Input::parse(input) {
        Ok(i) => i,
        Err(e) => return failed(e),
    };
    let mut report = |done: u64, total: u64| {
        // A throwing callback must not stop the proof; the page only loses
        // one progress update.
        let _ = progress.call2(
            &JsValue::NULL,
            &JsValue::from_f64(done as f64),
            &JsValue::from_f64(total as f64),
        );
    };
    match session::verify(&input, tables, &mut report) {
        Ok(v) => json!({ "ok": true, "value": v }).to_string(),
        Err(e) => failed(e),
    }
}
