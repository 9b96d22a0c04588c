//! A small fleet for showing and testing the control service: an owned
//! EU pool, a US spot pool bought by the GPU-hour and a US API, one model,
//! EU personal data kept in the EU by the example policies' residency
//! rule; with the inputs `ace control serve` pulls (a GPU price feed and
//! a planner file) next to the manifest. The demo's scene 6 plays it, and
//! the real-Envoy tests drive it.

use std::path::Path;
use std::time::Duration;

/// The manifest: `eu-owned` (inhouse, capacity 8, its load and planned
/// capacity from the model server on `owned`), `us-spot` (spot,
/// $`2`/GPU-hour in the feed, model server on `spot`, GCP eviction notices
/// from `imds`), `us-api` (pay-as-you-go).
pub fn fleet_toml(owned: u16, spot: u16, imds: u16) -> String {
    format!(
        r#"version = 1
[request.data_class]
values = ["public", "personal_eu"]
[request.latency_class]
values = ["interactive"]
[request.tp_degree]
values = [1]
[[tenants]]
id = "globex"
[[models]]
id = "llama-3.1-8b"
vram_gb = 16
tp_degree = 1
accelerators = ["h100", "a100", "api"]

[[destinations]]
name = "eu-owned"
cluster = "eu_owned"
pools = ["eu", "inhouse"]
provider = "inhouse"
tier = "inhouse"
jurisdiction = "EU"
region = "eu-central-1"
accelerator = "h100"
vram_gb = 80
interconnect = "nvlink"
models = ["llama-3.1-8b"]
certifications = ["iso27001"]
[destinations.cost]
input_usd_per_mtok = 0.05
output_usd_per_mtok = 0.15
capacity = 8
[destinations.control]
url = "http://127.0.0.1:{owned}"
plan_app = 0
slots_per_gpu = 4

[[destinations]]
name = "us-spot"
cluster = "us_spot"
pools = ["us"]
provider = "cloudco"
tier = "spot"
jurisdiction = "US"
region = "us-east-2"
accelerator = "a100"
vram_gb = 80
interconnect = "nvlink"
models = ["llama-3.1-8b"]
certifications = ["soc2"]
[destinations.cost]
gpu_hour_usd = 2.0
gpus = 1
throughput_tps = 1000
capacity = 64
[destinations.control]
url = "http://127.0.0.1:{spot}"
eviction = {{ provider = "gcp", url = "http://127.0.0.1:{imds}" }}
gpu_price_key = "a100-spot"

[[destinations]]
name = "us-api"
cluster = "us_api"
pools = ["us", "api"]
provider = "openai"
tier = "payg"
jurisdiction = "US"
region = "us-east"
accelerator = "api"
vram_gb = 0
interconnect = "none"
models = ["llama-3.1-8b"]
certifications = ["soc2"]
[destinations.cost]
input_usd_per_mtok = 2.5
output_usd_per_mtok = 10.0
"#
    )
}

/// A chat request for the fleet's model from tenant `globex`, with
/// `data_class` (`public` or `personal_eu`).
pub fn request(data_class: &str) -> ace_harness::client::Request {
    ace_harness::client::Request::post_json(
        "/v1/chat/completions",
        &serde_json::json!({"model": "llama-3.1-8b", "messages": [], "max_tokens": 16}),
    )
    .header("x-ace-tenant", "globex")
    .header("x-ace-model", "llama-3.1-8b")
    .header("x-ace-data-class", data_class)
    .header("x-ace-latency-class", "interactive")
    .header("x-ace-tp-degree", "1")
}

/// The GPU price feed with the spot pool's price.
pub fn gpu_feed(usd_per_gpu_hour: f64) -> String {
    serde_json::json!({"prices": [{"key": "a100-spot", "usd_per_gpu_hour": usd_per_gpu_hour,
                                   "from": "2026-01-01T00:00:00Z"}]})
    .to_string()
}

/// One step of `ace plan roll --json` giving the owned pool's app
/// `owned_gpus` GPUs.
pub fn plan_line(step: u32, owned_gpus: u32) -> String {
    serde_json::json!({"step": step, "owned": [{"app": 0, "gpus": owned_gpus}], "started": [],
                       "valid": true, "plan_value": 0.0, "plan_utilization": 0.0})
    .to_string()
        + "\n"
}

/// Write the policy directory into `dir` (schema and the capability and
/// EU-residency policies from `policies`, the manifest above), the feed at
/// $2/GPU-hour as `gpu.json` and a plan giving the owned pool two GPUs as
/// `plan.jsonl`.
pub fn write(dir: &Path, policies: &Path, ports: (u16, u16, u16)) -> std::io::Result<()> {
    for f in [
        "ace.cedarschema",
        "model_capability.cedar",
        "eu_residency.cedar",
    ] {
        std::fs::copy(policies.join(f), dir.join(f))?;
    }
    let (owned, spot, imds) = ports;
    std::fs::write(dir.join("fleet.toml"), fleet_toml(owned, spot, imds))?;
    std::fs::write(dir.join("gpu.json"), gpu_feed(2.0))?;
    std::fs::write(dir.join("plan.jsonl"), plan_line(0, 2))
}

/// `ace control serve`'s configuration for the fleet in `dir`: on a free
/// port, polling every `interval`, with `token`; the plan's step 0 began
/// an hour before `now_ms` and lasts two.
pub fn service_config(
    dir: &Path,
    interval: Duration,
    token: &str,
    now_ms: u64,
) -> ace_control::Config {
    let mut c = ace_control::Config::new(dir.join("fleet.toml"));
    c.listen = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    c.interval = interval;
    c.token = Some(token.to_string());
    c.gpu_prices = Some(ace_control::FeedSource::File(dir.join("gpu.json")));
    c.plan = Some(ace_control::PlanSource {
        path: dir.join("plan.jsonl"),
        start_ms: now_ms.saturating_sub(3_600_000),
        step: Duration::from_secs(7200),
    });
    c
}
