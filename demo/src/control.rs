//! Scene 6: the control service. A real `ace control serve` pulls the
//! spot pool's GPU price from a feed file and eviction notices from a
//! GCP-shaped metadata endpoint; Envoy's ACE polls it through a cluster,
//! and what it learns moves traffic: never past the policies.

use super::Module;
use ace_cli::outln;
use ace_demo::control_fleet;
use ace_harness::client::Response;
use ace_harness::envoy::{Envoy, EnvoyBuilder};
use ace_harness::model_server::ModelServer;
use ace_harness::upstream::{Behavior, Upstream};
use anyhow::{anyhow, Context};
use serde_json::json;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const INTERVAL: Duration = Duration::from_millis(500);
const TOKEN: &str = "demo-token";

pub fn scene(module: &Module) -> anyhow::Result<()> {
    outln!("\nscene 6: the control service (ace control serve) pulls load, prices, eviction notices\n         and planned capacity; ACE polls it through an Envoy cluster, off the request path");
    let owned = ModelServer::start("eu_owned", "llama-3.1-8b").context("model server")?;
    let spot = ModelServer::start("us_spot", "llama-3.1-8b").context("model server")?;
    let api = Upstream::start("us_api").context("upstream")?;
    let imds = Upstream::start("gcp_metadata").context("upstream")?;
    let answer = |body: &[u8]| Behavior::Respond {
        status: 200,
        headers: vec![],
        body: body.to_vec(),
    };
    imds.set_behavior(answer(b"FALSE"));
    let tmp = tempfile::tempdir().context("temporary directory")?;
    let dir = tmp.path();
    let policies = ace_harness::workspace_root().join("policies");
    control_fleet::write(dir, &policies, (owned.port(), spot.port(), imds.port()))
        .context("writing the scene's fleet")?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let config = control_fleet::service_config(dir, INTERVAL, TOKEN, now);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let service = runtime
        .block_on(ace_control::start(config))
        .map_err(|e| anyhow!("ace control serve: {e}"))?;
    let control_port = service.addr.port();

    let mut plugin = ace_cli::plugin::build(dir, false, false)?;
    plugin["response_headers"] = json!(true);
    let control = json!({"cluster": "ace_control", "token": TOKEN,
        "interval_ms": INTERVAL.as_millis() as u64});
    plugin["control"] = control.clone();
    let mut builder = EnvoyBuilder::new();
    if let Module::Dynamic(lib) = module {
        // The dynamic module polls from Envoy's main thread.
        builder =
            builder.bootstrap_extension(ace_harness::dylib::control_poller_json(lib, &control));
    }
    let envoy = module
        .add(builder, &plugin)
        .cluster("eu_owned", owned.port())
        .cluster("us_spot", spot.port())
        .cluster("us_api", api.port())
        .cluster("ace_control", control_port)
        .start()
        .map_err(|e| anyhow!("{e}"))?;
    outln!(
        "  fleet: eu-owned (inhouse, EU), us-spot (spot, US, $2.00/GPU-hour in the price feed),\n         us-api (pay-as-you-go, US); ace control serve on 127.0.0.1:{control_port}, polled every {} ms",
        INTERVAL.as_millis()
    );
    let limit = INTERVAL * 8;
    let first = wait_for(&envoy, "public", "eu-owned", limit)?;
    show("public request", &first, None);
    show(
        "EU personal data",
        &ask(&envoy, "personal_eu")?,
        Some("only EU destinations may serve it"),
    );

    std::fs::write(dir.join("gpu.json"), control_fleet::gpu_feed(0.01))?;
    let t0 = Instant::now();
    let moved = wait_for(&envoy, "public", "us-spot", limit)?;
    let note = format!("moved after {:.1} s", t0.elapsed().as_secs_f64());
    show("spot price falls to $0.01/GPU-hour", &moved, Some(&note));
    show(
        "EU personal data, spot now cheapest",
        &ask(&envoy, "personal_eu")?,
        Some("the spot pool is in the US: never"),
    );

    imds.set_behavior(answer(b"TRUE"));
    let t0 = Instant::now();
    let drained = wait_for(&envoy, "public", "eu-owned", limit)?;
    let note = format!("spot drained after {:.1} s", t0.elapsed().as_secs_f64());
    show("GCP gives the spot VM 30 s notice", &drained, Some(&note));
    drop(envoy);
    runtime.block_on(service.stop());
    Ok(())
}

fn ask(envoy: &Envoy, data_class: &str) -> anyhow::Result<Response> {
    control_fleet::request(data_class)
        .send(envoy.port())
        .context("request")
}

/// Ask until `want` serves a `data_class` request (at most `limit`).
fn wait_for(
    envoy: &Envoy,
    data_class: &str,
    want: &str,
    limit: Duration,
) -> anyhow::Result<Response> {
    let t0 = Instant::now();
    loop {
        let r = ask(envoy, data_class)?;
        if r.header("x-ace-destination") == Some(want) || t0.elapsed() > limit {
            return Ok(r);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn show(what: &str, r: &Response, note: Option<&str>) {
    let dest = r.header("x-ace-destination").unwrap_or("(refused)");
    let cost = r.header("x-ace-cost-usd").unwrap_or("-");
    outln!(
        "  {what:<40} -> {dest:<10} {:<4} ${cost:<12} {}",
        r.status,
        note.unwrap_or("")
    );
}
