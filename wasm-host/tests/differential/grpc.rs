//! gRPC calls and streams (`ace-example-grpc-callout`) against the harness's
//! gRPC server: an Envoy cluster with `http2_protocol_options` there, the
//! same scripted server logic behind the host's gRPC cluster here. The
//! client sees the filter's report (statuses, metadata, messages); each
//! server's record of what it received is compared too.

use super::extras::{Extras, GrpcCluster};
use super::{case, differential_extras, Case, Group, Guest};
use ace_harness::grpc::GrpcBehavior;
use ace_harness::upstream::Behavior;

fn clusters() -> Vec<GrpcCluster> {
    let c = |name, behavior, compare| GrpcCluster {
        name,
        behavior,
        compare,
    };
    vec![
        c("grpc", GrpcBehavior::Echo, true),
        c(
            "grpc-denied",
            GrpcBehavior::Status {
                code: 7,
                message: "not for you".into(),
            },
            true,
        ),
        c("grpc-reset", GrpcBehavior::Reset, true),
        c("grpc-hang", GrpcBehavior::Hang, true),
        c("grpc-cancel", GrpcBehavior::Hang, false),
    ]
}

fn group(cases: Vec<Case>) -> (Group, Extras) {
    (
        Group {
            package: Guest::Package("ace-example-grpc-callout"),
            configuration: "",
            cluster_header: None,
            allow_stop_iteration: false,
            clusters: vec![("backend", Behavior::Ok)],
            cases,
        },
        Extras {
            grpc: clusters(),
            ..Extras::default()
        },
    )
}

fn run(cases: Vec<Case>) {
    let (g, e) = group(cases);
    differential_extras(g, &e);
}

#[test]
fn grpc_calls_match_envoy() {
    run(vec![
        case("a unary call answered", "GET", "/call"),
        case("a call to an unknown cluster", "GET", "/call").header("x-grpc-cluster", "nowhere"),
        case("a call answered with an error status", "GET", "/call")
            .header("x-grpc-cluster", "grpc-denied"),
        case("a call whose stream the server resets", "GET", "/call")
            .header("x-grpc-cluster", "grpc-reset"),
        case("a call that times out", "GET", "/call")
            .header("x-grpc-cluster", "grpc-hang")
            .header("x-grpc-timeout-ms", "200"),
        case("a call cancelled at once", "GET", "/call")
            .header("x-grpc-cluster", "grpc-cancel")
            .header("x-grpc-mode", "cancel"),
    ]);
}

#[test]
fn grpc_streams_match_envoy() {
    run(vec![
        case(
            "a stream half-closed with close_grpc_stream",
            "GET",
            "/stream",
        )
        .header("x-grpc-mode", "stream")
        .header("x-grpc-message", "a,b"),
        case("a stream ended by its last message", "GET", "/stream")
            .header("x-grpc-mode", "stream")
            .header("x-grpc-message", "only")
            .header("x-grpc-end", "send"),
        case("a stream the filter cancels", "GET", "/stream")
            .header("x-grpc-mode", "stream")
            .header("x-grpc-message", "first")
            .header("x-grpc-end", "cancel"),
        case("a stream closed with an error status", "GET", "/stream")
            .header("x-grpc-mode", "stream")
            .header("x-grpc-cluster", "grpc-denied"),
        case("a stream the server resets", "GET", "/stream")
            .header("x-grpc-mode", "stream")
            .header("x-grpc-cluster", "grpc-reset"),
        case("a stream to an unknown cluster", "GET", "/stream")
            .header("x-grpc-mode", "stream")
            .header("x-grpc-cluster", "nowhere"),
    ]);
}
