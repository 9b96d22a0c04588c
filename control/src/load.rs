//! Load from a model server's Prometheus metrics, per engine.
//!
//! | engine | running | waiting | KV use (0-1) |
//! | --- | --- | --- | --- |
//! | `vllm` | `vllm:num_requests_running` | `vllm:num_requests_waiting` | `vllm:kv_cache_usage_perc`, else the older `vllm:gpu_cache_usage_perc` |
//! | `sglang` | `sglang:num_running_reqs` | `sglang:num_queue_reqs` | `sglang:token_usage` |
//! | `trtllm` | `trtllm_num_requests_running` | `trtllm_num_requests_waiting` | `trtllm_kv_cache_utilization` |
//! | `tgi` | `tgi_batch_current_size` | `tgi_queue_size` | `tgi_batch_current_max_tokens` / `tgi_batch_max_total_tokens` |
//!
//! SGLang names are tried with both the `sglang:` and `sglang_` prefixes
//! (SGLang's own `/metrics` writes `sglang:`; wrappers such as Dynamo's
//! wrote `sglang_`), and vLLM's with `_` for `:` (`prometheus_client`'s
//! OpenMetrics writer, which a scrape asking for OpenMetrics gets, writes
//! them so); of alternative names, the first one the server exports is
//! used, never both.
//!
//! **Series.** Running and waiting are summed over the series that count
//! different requests (vLLM's data-parallel `engine` label, SGLang's
//! `dp_rank`, several `model_name`s) and not over the ranks of one
//! model-parallel group: series that differ only in `tp_rank` or `pp_rank`
//! or `moe_ep_rank` (SGLang with `--enable-metrics-for-all-schedulers`)
//! are every rank's
//! view of the same batch, so the largest one counts. KV use is the fullest
//! series'.
//!
//! **Absent is not always missing.** Some engines export a load gauge only
//! once it has been set, and a server that has not served yet (freshly
//! started, or restarted) is idle, not broken:
//!
//! - a family declared by a `# TYPE` line with no series (`prometheus_client`
//!   with a labelled gauge no request has touched: `trtllm-serve`, which
//!   sets its gauges as requests complete) is read as 0;
//! - TGI's router sets its queue and batch gauges only when a request
//!   arrives (`backends/v3/src/{queue,backend}.rs`), and installs its
//!   Prometheus recorder after warm-up, so until its first request its
//!   page is empty (200, no bytes), and `tgi_batch_max_total_tokens`, set
//!   during warm-up, is lost (a TGI 3.3.5 capture under load lacks it);
//!   `trtllm-serve` serves its
//!   page through `prometheus_client`'s multiprocess collector, which
//!   writes nothing, not even a `# TYPE` line, for a gauge no request has
//!   set, while a counter created at start-up is there. So on these two
//!   engines a page with the engine's own metrics (`tgi_*`, `trtllm_*`)
//!   and without the load gauges is a server up and idle, and so is an
//!   empty page from TGI.
//!
//! TGI's KV use is the running batch's token reservation
//! (`tgi_batch_current_max_tokens`) over its budget: `tgi_batch_max_total_tokens`
//! when the page has it, else the manifest's `control.kv_token_budget`
//! (the `--max-batch-total-tokens` TGI logs at start: "Setting max batch
//! total tokens to N"), else unknown (0).
//!
//! Anything else without a running or waiting figure fails the scrape
//! ("are metrics enabled?"): the wrong engine or URL must not read as idle.
//!
//! **Restarts.** `process_start_time_seconds` (the process collector of a
//! single-process `prometheus_client` server: vLLM with one API server) is
//! returned with the figures, so the service can tell a restart from a
//! pause: what the old process had loaded (LoRA adapters) is forgotten
//! until the server lists it again. Multiprocess servers (SGLang,
//! `trtllm-serve`, vLLM with several API servers) and TGI export no start
//! time; for them, and for every engine, figures read after a restart
//! replace the held ones whatever they were, by the rules above.
//!
//! A stale load is never read as idle by this module: the snapshot carries
//! the held figures with `stale = true` and their scrape time, and the
//! filter prices them for a bound of its own (`control.held_load_ms`).
//! The state machine lives in `state.rs`; this module turns one scrape's
//! text into figures.

use crate::prom::{self, Page, Sample};
use ace_snapshot::{Load, MAX_REQUESTS};
use std::collections::BTreeMap;

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

/// Which metric names mean what on one engine; of alternatives, the first
/// the server exports wins.
struct Names {
    running: &'static [&'static str],
    waiting: &'static [&'static str],
    kv: Kv,
    /// The prefix of the engine's own metrics, when it sets some at
    /// start-up whatever its traffic and its load gauges only on first
    /// use: with one such metric present and the load gauges absent, the
    /// server is up and idle.
    started: Option<&'static str>,
}

/// How an engine reports its KV-cache use.
enum Kv {
    /// A fraction from 0 to 1.
    Fraction(&'static [&'static str]),
    /// Tokens reserved by the running batch over the batch's token budget.
    Tokens {
        used: &'static str,
        budget: &'static str,
    },
}

impl Names {
    /// Whether a sample named `n` is one this engine's figures read.
    fn reads(&self, n: &str) -> bool {
        let kv = match &self.kv {
            Kv::Fraction(names) => names.contains(&n),
            Kv::Tokens { used, budget } => n == *used || n == *budget,
        };
        kv || self.running.contains(&n)
            || self.waiting.contains(&n)
            || n == "vllm:lora_requests_info"
            || n == "process_start_time_seconds"
    }
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

    fn names(self) -> Names {
        match self {
            Engine::Vllm => Names {
                running: &["vllm:num_requests_running", "vllm_num_requests_running"],
                waiting: &["vllm:num_requests_waiting", "vllm_num_requests_waiting"],
                kv: Kv::Fraction(&[
                    "vllm:kv_cache_usage_perc",
                    "vllm_kv_cache_usage_perc",
                    "vllm:gpu_cache_usage_perc",
                    "vllm_gpu_cache_usage_perc",
                ]),
                started: None,
            },
            Engine::Sglang => Names {
                running: &["sglang:num_running_reqs", "sglang_num_running_reqs"],
                waiting: &["sglang:num_queue_reqs", "sglang_num_queue_reqs"],
                kv: Kv::Fraction(&["sglang:token_usage", "sglang_token_usage"]),
                started: None,
            },
            Engine::Trtllm => Names {
                running: &["trtllm_num_requests_running"],
                waiting: &["trtllm_num_requests_waiting"],
                kv: Kv::Fraction(&["trtllm_kv_cache_utilization"]),
                started: Some("trtllm_"),
            },
            Engine::Tgi => Names {
                running: &["tgi_batch_current_size"],
                waiting: &["tgi_queue_size"],
                kv: Kv::Tokens {
                    used: "tgi_batch_current_max_tokens",
                    budget: "tgi_batch_max_total_tokens",
                },
                started: Some("tgi_"),
            },
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
    /// When the server's process started (`process_start_time_seconds`),
    /// Unix seconds, when it says.
    pub started_s: Option<f64>,
}

/// The figures in a scrape's text, or why there are none.
/// `kv_token_budget` is the batch's token budget when the manifest gives
/// it (`control.kv_token_budget`), for an engine that reports its KV use
/// in tokens and may not export its budget (TGI).
pub fn read(engine: Engine, text: &str, kv_token_budget: Option<u64>) -> Result<Figures, String> {
    let names = engine.names();
    let page = prom::parse_keeping(text, |n| names.reads(n))?;
    let up_and_idle = names.started.is_some_and(|prefix| {
        page.names.iter().any(|n| n.starts_with(prefix))
            || (engine == Engine::Tgi && page.names.is_empty())
    });
    let running = requests(&page, names.running, up_and_idle)?;
    let waiting = requests(&page, names.waiting, up_and_idle)?;
    let kv_permille = match names.kv {
        Kv::Fraction(kv) => match family(&page.samples, kv) {
            None => 0,
            Some((name, series)) => {
                let mut max = 0.0f64;
                for v in series.map(|s| s.value) {
                    if !(v.is_finite() && v >= 0.0) {
                        return Err(format!("`{name}` is {v}, not a fraction from 0 to 1"));
                    }
                    max = max.max(v);
                }
                permille(max)
            }
        },
        Kv::Tokens { used, budget } => {
            let used = largest(&page, used)?;
            let budget = largest(&page, budget)?.or(kv_token_budget.map(|b| b as f64));
            match (used, budget) {
                (Some(u), Some(b)) if b > 0.0 => permille(u / b),
                _ => 0,
            }
        }
    };
    let adapters = (engine == Engine::Vllm)
        .then(|| lora_adapters(&page.samples))
        .flatten();
    let started_s = page
        .samples
        .iter()
        .find(|s| s.name == "process_start_time_seconds")
        .map(|s| s.value)
        .filter(|v| v.is_finite() && *v > 0.0);
    Ok(Figures {
        load: Load {
            running,
            waiting,
            kv_permille,
            stale: false,
            scraped_ms: 0,
        },
        adapters,
        started_s,
    })
}

/// A fraction as thousandths; rounding can put a full cache a hair above 1.
fn permille(f: f64) -> u16 {
    (f.clamp(0.0, 1.0) * 1000.0).round() as u16
}

/// The largest value of metric `name`, if the page has it.
fn largest(page: &Page, name: &'static str) -> Result<Option<f64>, String> {
    let mut out: Option<f64> = None;
    for s in page.samples.iter().filter(|s| s.name == name) {
        if !(s.value.is_finite() && s.value >= 0.0) {
            return Err(format!("`{name}` is {}, not a count of tokens", s.value));
        }
        out = Some(out.map_or(s.value, |m: f64| m.max(s.value)));
    }
    Ok(out)
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

/// Labels whose series are ranks of one model-parallel group: the same
/// requests seen by each rank.
const RANK_LABELS: [&str; 3] = ["tp_rank", "pp_rank", "moe_ep_rank"];

fn requests(page: &Page, names: &[&'static str], up_and_idle: bool) -> Result<u32, String> {
    let Some((name, series)) = family(&page.samples, names) else {
        // Declared and never set, or an engine that is up and has not
        // served yet: idle.
        if up_and_idle || names.iter().any(|n| page.declares(n)) {
            return Ok(0);
        }
        return Err(format!(
            "no `{}` in the metrics: is the engine right, and are metrics enabled?",
            names.join("` or `")
        ));
    };
    // Per group of ranks, the largest figure; the groups summed.
    let mut groups: BTreeMap<Vec<(&str, &str)>, f64> = BTreeMap::new();
    for s in series {
        let v = s.value;
        if !(v.is_finite() && v >= 0.0) {
            return Err(format!("`{name}` is {v}, not a count of requests"));
        }
        let mut key: Vec<(&str, &str)> = s
            .labels
            .iter()
            .filter(|(k, _)| !RANK_LABELS.contains(&k.as_str()))
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        key.sort_unstable();
        let g = groups.entry(key).or_insert(0.0);
        *g = g.max(v);
    }
    let n = groups.values().sum::<f64>().round();
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

    fn figures(engine: Engine, page: &str) -> (u32, u32, u16) {
        let l = read(engine, page, None).unwrap().load;
        (l.running, l.waiting, l.kv_permille)
    }

    #[test]
    fn real_pages_read_as_their_engines_mean_them() {
        // vLLM V1, two data-parallel engines: summed; the fullest cache.
        let v1 = read(Engine::Vllm, fixture!("vllm-v1.prom"), None).unwrap();
        assert_eq!(
            (v1.load.running, v1.load.waiting, v1.load.kv_permille),
            (5, 1, 500)
        );
        assert_eq!(
            v1.adapters,
            Some(vec!["chat-lora".to_string(), "sql-lora".into()])
        );
        assert!(v1.started_s.is_some());
        // vLLM V0's names.
        assert_eq!(figures(Engine::Vllm, fixture!("vllm-v0.prom")), (4, 2, 400));
        // SGLang, two tensor-parallel ranks reporting one batch: 7/12, not
        // 14/24; two data-parallel ranks: summed.
        assert_eq!(
            figures(Engine::Sglang, fixture!("sglang-tp2.prom")),
            (7, 12, 500)
        );
        assert_eq!(
            figures(Engine::Sglang, fixture!("sglang-dp2.prom")),
            (7, 12, 750)
        );
        // trtllm-serve before and after its first requests complete.
        assert_eq!(
            figures(Engine::Trtllm, fixture!("trtllm-fresh.prom")),
            (0, 0, 0)
        );
        assert_eq!(
            figures(Engine::Trtllm, fixture!("trtllm-busy.prom")),
            (5, 2, 600)
        );
        // TGI: up and idle after warm-up or a restart; busy, with its KV
        // use the batch's token reservation over its budget.
        assert_eq!(figures(Engine::Tgi, fixture!("tgi-fresh.prom")), (0, 0, 0));
        assert_eq!(
            figures(Engine::Tgi, fixture!("tgi-restarted.prom")),
            (0, 0, 0)
        );
        // TGI does not export its budget: the manifest gives it, or the
        // KV use is unknown.
        assert_eq!(figures(Engine::Tgi, fixture!("tgi-busy.prom")), (3, 9, 0));
        let busy = read(Engine::Tgi, fixture!("tgi-busy.prom"), Some(16_384)).unwrap();
        assert_eq!(busy.load.kv_permille, 250);
        // Where the page has it, it wins.
        let with = format!(
            "{}tgi_batch_max_total_tokens 8192\n",
            fixture!("tgi-busy.prom")
        );
        assert_eq!(
            read(Engine::Tgi, &with, Some(16_384))
                .unwrap()
                .load
                .kv_permille,
            500
        );
        // OpenMetrics with an exemplar on a histogram bucket.
        assert_eq!(
            figures(Engine::Vllm, fixture!("openmetrics-exemplars.om")),
            (3, 1, 200)
        );
    }

    #[test]
    fn an_idle_engine_is_told_from_a_wrong_one() {
        // Another engine's page, or none at all, still fails the scrape.
        for (engine, page) in [
            (Engine::Tgi, fixture!("vllm-v1.prom")),
            (Engine::Trtllm, fixture!("sglang-tp2.prom")),
            (Engine::Vllm, ""),
            (Engine::Trtllm, ""),
            (Engine::Trtllm, "# just a comment\n"),
        ] {
            let e = read(engine, page, None).unwrap_err();
            assert!(e.contains("are metrics enabled?"), "{engine:?}: {e}");
        }
        // A labelled gauge declared and never set (a single-process
        // prometheus_client server) reads as 0.
        let page = "# TYPE vllm:num_requests_running gauge\n\
            # TYPE vllm:num_requests_waiting gauge\n";
        assert_eq!(figures(Engine::Vllm, page), (0, 0, 0));
    }

    #[test]
    fn vllm_sums_engines_and_falls_back_to_the_old_kv_name() {
        let text = "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3\n\
            vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 2\n\
            vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 1\n\
            vllm:gpu_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n\
            vllm:gpu_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.5\n\
            vllm:lora_requests_info{running_lora_adapters=\"old\",max_lora=\"2\"} 100\n\
            vllm:lora_requests_info{running_lora_adapters=\"sql,chat\",max_lora=\"2\"} 200\n";
        let f = read(Engine::Vllm, text, None).unwrap();
        assert_eq!(
            f.load,
            Load {
                running: 5,
                waiting: 1,
                kv_permille: 500,
                stale: false,
                scraped_ms: 0,
            }
        );
        assert_eq!(f.adapters, Some(vec!["chat".into(), "sql".into()]));
        // The current name wins over the deprecated one.
        let both = format!("{text}vllm:kv_cache_usage_perc{{engine=\"0\"}} 0.1\n");
        assert_eq!(
            read(Engine::Vllm, &both, None).unwrap().load.kv_permille,
            100
        );
    }

    #[test]
    fn sglang_either_prefix_trtllm_and_tgi() {
        let colon = "sglang:num_running_reqs{tp_rank=\"0\"} 4\nsglang:num_queue_reqs 2\nsglang:token_usage 0.75\n";
        let under = colon.replace("sglang:", "sglang_");
        for t in [colon, under.as_str()] {
            let l = read(Engine::Sglang, t, None).unwrap().load;
            assert_eq!((l.running, l.waiting, l.kv_permille), (4, 2, 750));
        }
        let t = "trtllm_num_requests_running 7\ntrtllm_num_requests_waiting 0\ntrtllm_kv_cache_utilization 1.0000001\n";
        let l = read(Engine::Trtllm, t, None).unwrap().load;
        assert_eq!((l.running, l.waiting, l.kv_permille), (7, 0, 1000));
        let t = "tgi_batch_current_size 3\ntgi_queue_size 9\n";
        let f = read(Engine::Tgi, t, None).unwrap();
        assert_eq!(
            (f.load.running, f.load.waiting, f.load.kv_permille),
            (3, 9, 0)
        );
        assert_eq!(f.adapters, None);
    }

    #[test]
    fn missing_or_hostile_figures_fail_the_scrape() {
        let e = read(Engine::Vllm, "tgi_queue_size 1\n", None).unwrap_err();
        assert!(e.contains("vllm:num_requests_running"), "{e}");
        let e = read(Engine::Sglang, "sglang_num_queue_reqs 1\n", None).unwrap_err();
        assert!(
            e.contains("sglang:num_running_reqs` or `sglang_num_running_reqs"),
            "{e}"
        );
        for bad in ["-1", "NaN", "+Inf", "1e12"] {
            let t = format!("tgi_batch_current_size {bad}\ntgi_queue_size 0\n");
            assert!(read(Engine::Tgi, &t, None).is_err(), "{bad}");
        }
    }
}
