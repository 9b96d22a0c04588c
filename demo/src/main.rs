//! `ace-demo` (`make demo`): the main job, end to end, on this machine.
//!
//! Builds the filter for wasm32-wasip1 (or, with `--dynamic-module`, as an
//! Envoy dynamic module), starts a real Envoy with it in front
//! of local upstreams that stand in for an owned GPU pool, a reserved block,
//! on-demand GPUs and a pay-as-you-go API, then plays four scenes and prints
//! where each request went and why: a burst that fills each tier to its
//! knee, a failing owned pool that trips and spills, a throttled reserved
//! block (429 + retry-after), and recovery after the cool-down; then the
//! example policies (scene 5), the control service moving traffic with a
//! price change and an eviction notice (scene 6), and model routing and
//! the response cache under the example policies (scene 7); last, the
//! ledger books Envoy's access log and says of each tenant window why it
//! earned or forfeited its savings (`ledger`). It grows with the product:
//! what it shows is what ACE does today.
//!
//! A binary of its own, not a subcommand of `ace`: it plays against the
//! test harness's scripted upstreams (`ace-harness`), which the product
//! crates do not link.
#![forbid(unsafe_code)]

mod control;
mod ledger;
mod routing;

use ace_cli::outln;
use ace_harness::client::{Request, Response};
use ace_harness::envoy::{Envoy, EnvoyBuilder};
use ace_harness::upstream::{Behavior, Upstream};
use anyhow::{anyhow, Context};
use serde_json::{json, Value};
use std::process::ExitCode;
use std::time::Duration;

/// Arguments of `ace-demo`.
#[derive(Debug, clap::Parser)]
#[command(
    name = "ace-demo",
    version,
    about = "Start Envoy with the ACE filter and a few upstreams, send requests, \
             and print where each went and why"
)]
pub struct Args {
    /// Requests in the opening burst.
    #[arg(long, default_value_t = 10)]
    burst: usize,
    /// Run ACE as an Envoy dynamic module (native, `ace-dynamic`) instead
    /// of the Wasm filter: the same filter, without Wasm's per-call cost.
    #[arg(long)]
    dynamic_module: bool,
}

/// The ACE build the demo runs.
#[derive(Debug)]
enum Module {
    Wasm(std::path::PathBuf),
    Dynamic(std::path::PathBuf),
}

impl Module {
    fn build(dynamic: bool) -> anyhow::Result<Module> {
        if dynamic {
            outln!("building the filter as an Envoy dynamic module ...");
            let lib = ace_harness::dylib::build("ace-dynamic").map_err(|e| anyhow!(e))?;
            Ok(Module::Dynamic(lib))
        } else {
            outln!("building the filter for wasm32-wasip1 ...");
            let wasm = ace_harness::wasm::build("ace-filter").map_err(|e| anyhow!(e))?;
            Ok(Module::Wasm(wasm))
        }
    }

    /// The access-log format that writes ACE's event line per request.
    fn event_log_line(&self) -> &'static str {
        match self {
            Module::Wasm(_) => "%FILTER_STATE(wasm.ace_event:PLAIN)%",
            Module::Dynamic(_) => "%FILTER_STATE(ace_event:PLAIN)%",
        }
    }

    fn path(&self) -> &std::path::Path {
        match self {
            Module::Wasm(p) | Module::Dynamic(p) => p,
        }
    }

    /// `builder` with ACE under plugin configuration `config`, allowed to
    /// hold a request for its body (the example fleet's tables decide on
    /// the model, which the body names), as `envoy/envoy.yaml` ships it.
    fn add(&self, builder: EnvoyBuilder, config: &Value) -> EnvoyBuilder {
        match self {
            Module::Wasm(wasm) => builder.wasm_filter_reading_body(wasm, &config.to_string()),
            Module::Dynamic(lib) => builder.http_filter(ace_harness::dylib::http_filter_json(
                lib,
                "ace",
                Some(&config.to_string()),
            )),
        }
    }
}

/// The demo fleet: (name, tier, capacity, USD per input token, per output token).
const FLEET: [(&str, &str, u32, f64, f64); 4] = [
    ("payg-api-us", "payg", 0, 2.5e-6, 1.0e-5),
    ("ondemand-gpu-eu", "ondemand", 4, 0.0, 0.0),
    ("reserved-ptu-eu", "reserved", 3, 0.0, 0.0),
    ("owned-h100-eu", "inhouse", 3, 2.0e-8, 2.0e-8),
];

fn fleet_config() -> Value {
    let dests: Vec<Value> = FLEET
        .iter()
        .map(|(name, tier, cap, usd_in, usd_out)| {
            let mut d = json!({
                "name": name, "cluster": name.replace('-', "_"), "tier": tier,
                "capacity": cap, "usd_per_input_token": usd_in, "usd_per_output_token": usd_out,
                "knee": 0.67
            });
            if *tier == "ondemand" {
                d["usd_per_gpu_hour"] = json!(4.0);
                d["tokens_per_second"] = json!(2500.0);
            }
            d
        })
        .collect();
    json!({"allow_no_policy": true, "response_headers": true, "destinations": dests, "health": {"trip_after": 3, "base_cooldown_ms": 3000}})
}

fn line(i: usize, what: &str, r: &Response) {
    outln!(
        "  {:<3} {:<26} -> {:<16} {:<9} {:<16} ${:<12} {}",
        i,
        what,
        r.header("x-ace-destination").unwrap_or("(none)"),
        r.header("x-ace-tier").unwrap_or("-"),
        r.header("x-ace-reason").unwrap_or("-"),
        r.header("x-ace-cost-usd")
            .and_then(|c| c.parse::<f64>().ok())
            .map_or_else(|| "-".to_string(), |c| format!("{c:.9}")),
        r.status
    );
}

fn chat(envoy: &Envoy, i: usize) -> anyhow::Result<Response> {
    Request::post_json(
        "/v1/chat/completions",
        &json!({"model": "llama-3-70b", "messages": [{"role": "user", "content": format!("request {i}")}]}),
    )
    .send(envoy.port())
    .with_context(|| format!("request {i}"))
}

fn main() -> ExitCode {
    let args = <Args as clap::Parser>::parse();
    ace_cli::output::exit_code(run(args))
}

fn run(args: Args) -> anyhow::Result<ExitCode> {
    outln!("ACE demo: merit-order dispatch inside a real Envoy\n");
    let module = Module::build(args.dynamic_module)?;
    let size = std::fs::metadata(module.path())
        .map(|m| m.len())
        .unwrap_or(0);
    outln!("  {} ({} KiB)\n", module.path().display(), size / 1024);

    outln!("fleet (capacity = concurrent requests; knee at 67 % of it):");
    let mut ups = Vec::new();
    let mut builder = EnvoyBuilder::new();
    for (name, tier, cap, usd_in, usd_out) in FLEET {
        let up = Upstream::start(name).with_context(|| format!("starting upstream {name}"))?;
        let cap_s = if cap == 0 {
            "unlimited".to_string()
        } else {
            cap.to_string()
        };
        outln!(
            "  {name:<16} {tier:<9} capacity {cap_s:<9} ${usd_in:e}/in-token ${usd_out:e}/out-token  127.0.0.1:{}",
            up.port()
        );
        builder = builder.cluster(&name.replace('-', "_"), up.port());
        ups.push(up);
    }
    let [payg, ondemand, reserved, owned] = match <[Upstream; 4]>::try_from(ups) {
        Ok(a) => a,
        Err(_) => return Err(anyhow!("expected four upstreams")),
    };
    let envoy = module
        .add(
            builder.access_log_line(module.event_log_line()),
            &fleet_config(),
        )
        .start()
        .map_err(|e| anyhow!("{e}"))
        .context("starting Envoy with the ACE filter")?;
    outln!(
        "\nEnvoy 1.40 on 127.0.0.1:{} (admin :{}), 2 workers sharing health through {}\n",
        envoy.port(),
        envoy.admin_port(),
        match module {
            Module::Wasm(_) => "shared data",
            Module::Dynamic(_) => "process memory",
        }
    );
    outln!(
        "  #   request                       served by        tier      reason           booked        status"
    );

    ledger::window_for(
        "the burst falls in one window",
        Duration::from_millis(60 * args.burst as u64 + 1000),
        None,
    );
    outln!(
        "scene 1: a burst of {} concurrent slow requests fills each tier to its knee",
        args.burst
    );
    for u in [&payg, &ondemand, &reserved, &owned] {
        u.set_behavior(Behavior::Slow(Duration::from_millis(1500)));
    }
    let port = envoy.port();
    let burst: Vec<_> = (0..args.burst)
        .map(|i| {
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(60 * i as u64));
                Request::post_json(
                    "/v1/chat/completions",
                    &json!({"model": "llama-3-70b", "n": i}),
                )
                .send(port)
            })
        })
        .collect();
    for (i, h) in burst.into_iter().enumerate() {
        match h.join() {
            Ok(Ok(r)) => line(i, "burst", &r),
            Ok(Err(e)) => outln!("  {i:<3} burst request failed: {e}"),
            Err(_) => outln!("  {i:<3} burst client thread panicked"),
        }
    }
    for u in [&payg, &ondemand, &reserved, &owned] {
        u.set_behavior(Behavior::Ok);
    }
    let burst_done = ledger::Mark::now();

    let mut n = args.burst;
    ledger::window_for(
        "scenes 2-4 (tenant-less, as the burst) are judged apart from the burst",
        Duration::from_secs(6),
        Some(burst_done),
    );
    outln!("\nscene 2: the reserved block (sunk cost, so first in merit order) starts answering 503;\n         after 3 failures it trips and traffic spills to the next-cheapest");
    reserved.set_behavior(Behavior::Status(503));
    for _ in 0..5 {
        line(n, "chat", &chat(&envoy, n)?);
        n += 1;
    }

    outln!("\nscene 3: the owned pool throttles (429, retry-after: 2): its cap halves (3 -> 1), so\n         the next request would sit past its knee and the next tier up is cheaper");
    owned.set_behavior(Behavior::RateLimited { retry_after_s: 2 });
    line(n, "chat", &chat(&envoy, n)?);
    n += 1;
    owned.set_behavior(Behavior::Ok);
    for _ in 0..2 {
        line(n, "chat", &chat(&envoy, n)?);
        n += 1;
    }

    outln!("\nscene 4: the reserved block recovers; after the cool-down one probe goes, then it is back");
    reserved.set_behavior(Behavior::Ok);
    std::thread::sleep(Duration::from_millis(3200));
    for _ in 0..3 {
        line(n, "chat", &chat(&envoy, n)?);
        n += 1;
    }

    outln!("\nrequests received per upstream:");
    for u in [&owned, &reserved, &ondemand, &payg] {
        outln!("  {:<16} {}", u.name(), u.count());
    }
    let served = envoy.wait_access_log(n, Duration::from_secs(10));
    drop(envoy);
    let (policy_config, policy_served) = policy_scene(&module)?;
    let policy_done = ledger::Mark::now();
    control::scene(&module)?;
    let (routing_config, routing_served) = routing::scene(&module, policy_done)?;
    outln!(
        "\nwhy: feasibility first (compiled Cedar policies, failing closed), then among the\n\
         feasible and healthy destinations the lowest effective cost wins: the tier's cost at\n\
         its load, plus a latency penalty past the knee. A 5xx trips a destination for a\n\
         cool-down that grows on repeat, a 429 cuts its cap for retry-after, and clients can\n\
         never pick a destination themselves."
    );
    ledger::summary(&[
        ("scenes 1-4", &fleet_config(), &served),
        ("scene 5", &policy_config, &policy_served),
        ("scene 7", &routing_config, &routing_served),
    ])?;
    Ok(ExitCode::SUCCESS)
}

/// Envoy with ACE under `config`, logging its events, in front of one
/// local upstream per destination of `config` (named after it).
fn fleet_envoy(module: &Module, config: &Value) -> anyhow::Result<(Envoy, Vec<Upstream>)> {
    let mut builder = module.add(
        EnvoyBuilder::new().access_log_line(module.event_log_line()),
        config,
    );
    let mut ups = Vec::new();
    for d in config["destinations"].as_array().into_iter().flatten() {
        let name = d["name"].as_str().unwrap_or("?");
        let up = Upstream::start(name).with_context(|| format!("starting upstream {name}"))?;
        builder = builder.cluster(d["cluster"].as_str().unwrap_or("?"), up.port());
        ups.push(up);
    }
    let envoy = builder.start().map_err(|e| anyhow!("{e}"))?;
    Ok((envoy, ups))
}

/// Scene 5: the shipped example policies (`policies/`), compiled into the
/// filter's configuration, in front of one local upstream per destination.
/// Returns the configuration and Envoy's access log of ACE events.
fn policy_scene(module: &Module) -> anyhow::Result<(Value, Vec<String>)> {
    let dir = ace_harness::workspace_root().join("policies");
    outln!(
        "\nscene 5: the example fleet and Cedar policies in {} (12 destinations, 4 jurisdictions)",
        dir.display()
    );
    let mut config = ace_cli::plugin::build(&dir, false, false)?;
    config["response_headers"] = json!(true);
    let project = ace_policy::load_dir(&dir).map_err(|e| anyhow!("{e}"))?;
    let jurisdiction = |name: &str| {
        project
            .manifest
            .manifest
            .destinations
            .iter()
            .map(|d| d.as_ref())
            .find(|d| d.name.as_ref() == name)
            .map_or("?".to_string(), |d| d.jurisdiction.clone())
    };
    let (envoy, ups) = fleet_envoy(module, &config)?;
    ledger::window_for("scene 5 falls in one window", Duration::from_secs(4), None);
    let ask = |tenant: &str, class: &str, model: &str| -> anyhow::Result<Response> {
        Request::post_json("/v1/chat/completions", &json!({"model": model}))
            .header("x-ace-tenant", tenant)
            .header("x-ace-data-class", class)
            .header("x-ace-latency-class", "interactive")
            .header("x-ace-tp-degree", "1")
            .header("x-ace-model", model)
            .send(envoy.port())
            .context("request")
    };
    let show = |what: &str, r: &Response| {
        let dest = r.header("x-ace-destination").unwrap_or("(none)");
        let extra = if r.status == 200 {
            format!(
                "{} in {}",
                r.header("x-ace-reason").unwrap_or("-"),
                jurisdiction(dest)
            )
        } else {
            r.json()
                .ok()
                .and_then(|v| v["error"]["type"].as_str().map(str::to_string))
                .unwrap_or_default()
        };
        outln!("  {what:<48} -> {dest:<18} {:<4} {extra}", r.status);
    };
    // (tenant, data class, model, note): each asked once, then shown.
    let case = |(tenant, class, model, note): (&str, &str, &str, &str)| {
        let what = format!("{tenant}, {class}, {model} {note}");
        ask(tenant, class, model).map(|r| show(&what, &r))
    };
    for c in [
        ("globex", "public", "llama-3.1-8b", ""),
        ("northbank", "personal_eu", "llama-3.1-8b", ""),
        ("acme-health", "phi", "llama-3.1-70b", ""),
        ("northbank", "personal_eu", "gpt-4o", "(US only)"),
        ("globex", "top-secret", "llama-3.1-8b", "(unknown class)"),
    ] {
        case(c)?;
    }
    outln!("  every EU destination starts failing ...");
    for u in &ups {
        if jurisdiction(u.name()) == "EU" {
            u.set_behavior(Behavior::Status(503));
        }
    }
    for _ in 0..15 {
        let _ = ask("northbank", "personal_eu", "llama-3.1-8b")?;
    }
    case(("northbank", "personal_eu", "llama-3.1-8b", ""))?;
    case(("globex", "public", "llama-3.1-8b", ""))?;
    // Five cases, fifteen failing requests, two more cases.
    Ok((config, envoy.wait_access_log(22, Duration::from_secs(10))))
}
