//! Filters the project did not write: the cdylib examples that the
//! published `proxy-wasm` 0.2.0 package ships (Apache-2.0), fetched from
//! crates.io into cargo's registry cache and built unchanged when a test
//! needs them (`ace_harness::wasm::build_proxy_wasm_example`); none of
//! their code is in this repository. Each scenario runs in Envoy and on the
//! host with equal outcomes.

use super::{case, differential, Case, Group, Guest};
use ace_harness::envoy::EnvoyBuilder;
use ace_harness::upstream::Behavior;
use ace_wasm_host::{FilterModule, Vm};
use std::time::Duration;

fn group(
    example: &'static str,
    configuration: &'static str,
    clusters: Vec<(&'static str, Behavior)>,
    cases: Vec<Case>,
) -> Group {
    Group {
        package: Guest::Example(example),
        configuration,
        cluster_header: None,
        allow_stop_iteration: false,
        clusters,
        cases,
    }
}

/// A group whose only cluster is the route's `backend`, answering 200.
fn with_backend(example: &'static str, configuration: &'static str, cases: Vec<Case>) {
    differential(group(
        example,
        configuration,
        vec![("backend", Behavior::Ok)],
        cases,
    ));
}

fn respond(status: u16, body: &str) -> Behavior {
    Behavior::Respond {
        status,
        headers: vec![("content-type".into(), "text/plain".into())],
        body: body.as_bytes().to_vec(),
    }
}

/// `http_auth_random` holds every request for a callout to cluster
/// `httpbin` (`GET /bytes/1`, 5 s timeout): a non-empty answer whose first
/// byte is even lets it through, anything else is a local 403; responses
/// get `powered-by: proxy-wasm`.
fn http_auth(httpbin: Behavior, cases: Vec<Case>) {
    differential(group(
        "http_auth_random",
        "",
        vec![("backend", Behavior::Ok), ("httpbin", httpbin)],
        cases,
    ));
}

#[test]
fn http_auth_random_with_an_even_byte_matches_envoy() {
    http_auth(
        respond(200, "b"),
        vec![
            case("an even byte lets a GET through", "GET", "/anything"),
            case("and a POST with its body", "POST", "/post")
                .header("content-type", "text/plain")
                .body("payload"),
        ],
    );
}

#[test]
fn http_auth_random_with_an_odd_byte_matches_envoy() {
    http_auth(
        respond(200, "a"),
        vec![case("an odd byte is a local 403", "GET", "/anything")],
    );
}

#[test]
fn http_auth_random_with_a_500_matches_envoy() {
    http_auth(
        respond(500, ""),
        vec![case("an empty 500 is a local 403", "GET", "/anything")],
    );
}

#[test]
fn http_auth_random_with_a_slow_answer_matches_envoy() {
    // The answer comes after a second, within the callout's timeout: its
    // JSON body starts with '{' (odd).
    http_auth(
        Behavior::Slow(Duration::from_secs(1)),
        vec![case("a late answer is still judged", "GET", "/anything")],
    );
}

#[test]
fn http_auth_random_past_its_callout_timeout_matches_envoy() {
    // Past 5 s the callout's response is the async client's 504 with
    // `upstream request timeout` ('u' is odd).
    http_auth(
        Behavior::Slow(Duration::from_secs(7)),
        vec![case(
            "a timed-out callout is a local 403",
            "GET",
            "/anything",
        )],
    );
}

/// `http_headers` logs both header maps (at trace level) and answers
/// `/hello` itself.
#[test]
fn http_headers_matches_envoy() {
    with_backend(
        "http_headers",
        "",
        vec![
            case("/hello is a local 200 with its headers", "GET", "/hello"),
            case("other paths reach the upstream", "GET", "/other").header("x-custom", "a value"),
            case("a POST with a body too", "POST", "/hello/not")
                .header("content-type", "text/plain")
                .body("some body"),
            case("over HTTP/2", "GET", "/hello").h2(),
        ],
    );
}

/// `http_body` buffers the whole response body, drops `content-length`
/// and replaces a body that contains "secret".
fn http_body(upstream: Behavior, cases: Vec<Case>) {
    differential(group("http_body", "", vec![("backend", upstream)], cases));
}

#[test]
fn http_body_redacts_a_secret_like_envoy() {
    http_body(
        respond(200, "the secret is 42"),
        vec![
            case("a body with a secret is redacted", "GET", "/"),
            case("whatever the request carried", "POST", "/")
                .body("a request body")
                .h2(),
        ],
    );
}

#[test]
fn http_body_passes_other_bodies_like_envoy() {
    http_body(
        respond(200, "nothing to hide"),
        vec![case("a body without one is unchanged", "GET", "/")],
    );
}

#[test]
fn http_body_with_a_chunked_response_matches_envoy() {
    http_body(
        Behavior::RespondWithTrailers {
            status: 200,
            headers: vec![("content-type".into(), "text/plain".into())],
            body: b"chunked secret".to_vec(),
            trailers: vec![("x-checksum".into(), "abc".into())],
        },
        vec![
            // An HTTP/1 client does not get the trailers (Envoy's codec
            // drops them); an HTTP/2 client does.
            case("a chunked body with trailers", "GET", "/"),
            case("over HTTP/2", "GET", "/").h2(),
        ],
    );
}

#[test]
fn http_body_with_an_empty_response_matches_envoy() {
    http_body(respond(204, ""), vec![case("an empty body", "GET", "/")]);
}

/// `http_config` adds `custom-header` with its plugin configuration to
/// every response.
#[test]
fn http_config_with_a_configuration_matches_envoy() {
    with_backend(
        "http_config",
        "configured value",
        vec![
            case("the configured value", "GET", "/"),
            case("with another request header", "GET", "/").header("x-other", "1"),
        ],
    );
}

#[test]
fn http_config_without_a_configuration_matches_envoy() {
    with_backend(
        "http_config",
        "",
        vec![case("no configuration: an empty value", "GET", "/")],
    );
}

/// `hello_world` is a root context only: it serves no HTTP stream (the SDK
/// panics creating one, and `FAIL_CLOSED` answers).
#[test]
fn hello_world_as_an_http_filter_fails_closed_like_envoy() {
    with_backend(
        "hello_world",
        "",
        vec![
            case("the stream's creation traps", "GET", "/"),
            case("the VM stays failed", "GET", "/"),
        ],
    );
}

/// What `hello_world` logs: "Hello, World!" from each VM's `on_vm_start`,
/// and a line per 5 s tick from the VMs that serve (not the validation VM).
#[derive(Debug, PartialEq)]
struct Greetings {
    hellos: usize,
    ticked: bool,
}

const HELLO: &str = "Hello, World!";
const TICK: &str = "your lucky number is";

#[test]
fn hello_world_greets_and_ticks_like_envoy() {
    let wasm = ace_harness::wasm::build_proxy_wasm_example("hello_world")
        .unwrap_or_else(|e| panic!("{e}"));
    let envoy = EnvoyBuilder::new()
        .concurrency(2)
        .wasm_filter(&wasm, "")
        .start()
        .unwrap_or_else(|e| panic!("envoy: {e}"));
    // Envoy writes its log file out about every 10 s; the first tick is
    // due 5 s after the start.
    let ticked = envoy.wait_log(TICK, Duration::from_secs(25));
    let in_envoy = Greetings {
        hellos: envoy.log().matches(HELLO).count(),
        ticked,
    };

    let module = FilterModule::from_file(&wasm).unwrap_or_else(|e| panic!("{e}"));
    // Envoy's VMs: the validation VM (run by the first start), the main
    // thread's, one per worker.
    let mut vms: Vec<Vm> = (0..3)
        .map(|i| {
            Vm::builder(&module)
                .validation_vm(i == 0)
                .start()
                .unwrap_or_else(|e| panic!("host VM: {e}"))
        })
        .collect();
    let hellos = vms[0]
        .validation_logs()
        .iter()
        .chain(vms.iter().flat_map(|vm| vm.logs()))
        .filter(|l| l.message.contains(HELLO))
        .count();
    let mut ticked = true;
    for vm in &mut vms {
        vm.advance(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("{e}"));
        ticked &= vm.logged(TICK);
        assert!(vm.failure().is_none(), "{:?}", vm.failure());
    }
    let on_host = Greetings { hellos, ticked };
    assert_eq!(in_envoy, on_host, "Envoy's log:\n{}", envoy.log());
}
