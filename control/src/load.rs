//! Load from a model server's Prometheus metrics, per engine.
//!
//! | engine | running | waiting | KV use (0-1) |
//! | --- | --- | --- | --- |
//! | `vllm` | `vllm:num_requests_running` | `vllm:num_requests_waiting` | `vllm:kv_cache_usage_perc`, else the older `vllm:gpu_cache_usage_perc` |
//! | `sglang` | `sglang:num_running_reqs` | `sglang:num_queue_reqs` | `sglang:token_usage` |
//! | `trtllm` | `trtllm_num_requests_running` | `trtllm_num_requests_waiting` | `trtllm_kv_cache_utilization` |
//! | `tgi` | `tgi_batch_current_size` | `tgi_queue_size` | none (reported as 0) |
//!
//! SGLang names are tried with both the `sglang:` and `sglang_` prefixes
//! (the prefix has changed between releases); of alternative names, the
//! first one the server exports is used, never both. Running and waiting
//! are summed over every series (vLLM's data-parallel `engine` label,
//! several `model_name`s); KV use is the fullest series'.
//!
//! # Failure rule
//!
//! A scrape that fails (connection, timeout, HTTP status, a malformed
//! line, a missing running or waiting metric, a negative or absurd
//! figure) keeps the destination's last good figures and marks them
//! `stale`; so does a last good scrape older than `--stale-after`. A
//! stale load is never read as idle: the snapshot carries the held
//! figures with `stale = true`, and a destination that has never been
//! scraped successfully has no load figure at all. (The inference
//! extension's endpoint picker goes further and treats stale metrics as
//! saturated; ACE leaves that choice to the filter, which sees the flag.)
//! The state machine lives in `state.rs`; this module turns one scrape's
//! text into figures.

use crate::prom::{self, Sample};
use ace_snapshot::{Load, MAX_REQUESTS};

/// A serving engine: which metric names mean what.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// vLLM.
    Vllm,
    /// SGLang.
    Sglang,
    /// TensorRT-LLM's `trtllm-serve`.
    Trtllm,
    /// Hugging Face Text Generation Inference.
    Tgi,
}

impl Engine {
    /// The engine named in the manifest (`vllm`, `sglang`, `trtllm`, `tgi`).
    pub fn parse(s: &str) -> Option<Engine> {
        Some(match s {
            "vllm" => Engine::Vllm,
            "sglang" => Engine::Sglang,
            "trtllm" => Engine::Trtllm,
            "tgi" => Engine::Tgi,
            _ => return None,
        })
    }

    /// Alternative names for (running, waiting, KV use), first found wins.
    fn names(self) -> [&'static [&'static str]; 3] {
        match self {
            Engine::Vllm => [
                &["vllm:num_requests_running"],
                &["vllm:num_requests_waiting"],
                &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
            ],
            Engine::Sglang => [
                &["sglang:num_running_reqs", "sglang_num_running_reqs"],
                &["sglang:num_queue_reqs", "sglang_num_queue_reqs"],
                &["sglang:token_usage", "sglang_token_usage"],
            ],
            Engine::Trtllm => [
                &["trtllm_num_requests_running"],
                &["trtllm_num_requests_waiting"],
                &["trtllm_kv_cache_utilization"],
            ],
            Engine::Tgi => [&["tgi_batch_current_size"], &["tgi_queue_size"], &[]],
        }
    }
}

/// What one scrape says.
#[derive(Clone, Debug, PartialEq)]
pub struct Figures {
    /// Load, not stale.
    pub load: Load,
    /// vLLM's running LoRA adapters (`vllm:lora_requests_info`), when the
    /// server exports it.
    pub adapters: Option<Vec<String>>,
}

/// The figures in a scrape's text, or why there are none.
pub fn read(engine: Engine, text: &str) -> Result<Figures, String> {
    let samples = prom::parse(text)?;
    let [running, waiting, kv] = engine.names();
    let running = requests(&samples, running)?;
    let waiting = requests(&samples, waiting)?;
    let kv_permille = match family(&samples, kv) {
        None => 0,
        Some((name, series)) => {
            let mut max = 0.0f64;
            for v in series.map(|s| s.value) {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(format!("`{name}` is {v}, not a fraction from 0 to 1"));
                }
                max = max.max(v);
            }
            // Rounding can put a full cache a hair above 1.
            (max.min(1.0) * 1000.0).round() as u16
        }
    };
    let adapters = (engine == Engine::Vllm)
        .then(|| lora_adapters(&samples))
        .flatten();
    Ok(Figures {
        load: Load {
            running,
            waiting,
            kv_permille,
            stale: false,
        },
        adapters,
    })
}

/// The first of `names` that has samples, and those samples.
fn family<'a>(
    samples: &'a [Sample],
    names: &[&'static str],
) -> Option<(&'static str, impl Iterator<Item = &'a Sample>)> {
    let name = *names
        .iter()
        .find(|n| samples.iter().any(|s| s.name == **n))?;
    Some((name, samples.iter().filter(move |s| s.name == name)))
}

fn requests(samples: &[Sample], names: &[&'static str]) -> Result<u32, String> {
    let (name, series) = family(samples, names).ok_or_else(|| {
        format!(
            "no `{}` in the metrics: is the engine right, and are metrics enabled?",
            names.join("` or `")
        )
    })?;
    let mut sum = 0.0f64;
    for v in series.map(|s| s.value) {
        if !(v.is_finite() && v >= 0.0) {
            return Err(format!("`{name}` is {v}, not a count of requests"));
        }
        sum += v;
    }
    let n = sum.round();
    if n > f64::from(MAX_REQUESTS) {
        return Err(format!(
            "`{name}` sums to {n}, above the snapshot's limit of {MAX_REQUESTS}"
        ));
    }
    Ok(n as u32)
}

/// Running adapters from the `vllm:lora_requests_info` series with the
/// latest value (its value is a wall-clock timestamp).
fn lora_adapters(samples: &[Sample]) -> Option<Vec<String>> {
    let latest = samples
        .iter()
        .filter(|s| s.name == "vllm:lora_requests_info" && s.value.is_finite())
        .max_by(|a, b| a.value.total_cmp(&b.value))?;
    let mut names: Vec<String> = latest
        .label("running_lora_adapters")
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    names.sort();
    names.dedup();
    Some(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_sums_engines_and_falls_back_to_the_old_kv_name() {
        let text = "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3\n\
            vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 2\n\
            vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 1\n\
            vllm:gpu_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n\
            vllm:gpu_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.5\n\
            vllm:lora_requests_info{running_lora_adapters=\"old\",max_lora=\"2\"} 100\n\
            vllm:lora_requests_info{running_lora_adapters=\"sql,chat\",max_lora=\"2\"} 200\n";
        let f = read(Engine::Vllm, text).unwrap();
        assert_eq!(
            f.load,
            Load {
                running: 5,
                waiting: 1,
                kv_permille: 500,
                stale: false
            }
        );
        assert_eq!(f.adapters, Some(vec!["chat".into(), "sql".into()]));
        // The current name wins over the deprecated one.
        let both = format!("{text}vllm:kv_cache_usage_perc{{engine=\"0\"}} 0.1\n");
        assert_eq!(read(Engine::Vllm, &both).unwrap().load.kv_permille, 100);
    }

    #[test]
    fn sglang_either_prefix_trtllm_and_tgi() {
        let colon = "sglang:num_running_reqs{tp_rank=\"0\"} 4\nsglang:num_queue_reqs 2\nsglang:token_usage 0.75\n";
        let under = colon.replace("sglang:", "sglang_");
        for t in [colon, under.as_str()] {
            let l = read(Engine::Sglang, t).unwrap().load;
            assert_eq!((l.running, l.waiting, l.kv_permille), (4, 2, 750));
        }
        let t = "trtllm_num_requests_running 7\ntrtllm_num_requests_waiting 0\ntrtllm_kv_cache_utilization 1.0000001\n";
        let l = read(Engine::Trtllm, t).unwrap().load;
        assert_eq!((l.running, l.waiting, l.kv_permille), (7, 0, 1000));
        let t = "tgi_batch_current_size 3\ntgi_queue_size 9\n";
        let f = read(Engine::Tgi, t).unwrap();
        assert_eq!(
            (f.load.running, f.load.waiting, f.load.kv_permille),
            (3, 9, 0)
        );
        assert_eq!(f.adapters, None);
    }

    #[test]
    fn missing_or_hostile_figures_fail_the_scrape() {
        let e = read(Engine::Vllm, "tgi_queue_size 1\n").unwrap_err();
        assert!(e.contains("vllm:num_requests_running"), "{e}");
        let e = read(Engine::Sglang, "sglang_num_queue_reqs 1\n").unwrap_err();
        assert!(
            e.contains("sglang:num_running_reqs` or `sglang_num_running_reqs"),
            "{e}"
        );
        for bad in ["-1", "NaN", "+Inf", "1e12"] {
            let t = format!("tgi_batch_current_size {bad}\ntgi_queue_size 0\n");
            assert!(read(Engine::Tgi, &t).is_err(), "{bad}");
        }
    }
}
