//! Dynamic metadata set before the filter runs (Envoy's
//! `envoy.filters.http.set_metadata`; the host's
//! `VmBuilder::dynamic_metadata`), read by `ace-example-metadata-probe`
//! through `get_property(["metadata", ...])`: the bytes of each value as
//! Envoy serialises it, and the statuses of paths that are not there.

use super::extras::Extras;
use super::{case, differential_extras, Case, Group, Guest};
use ace_harness::upstream::Behavior;
use serde_json::{json, Value};

fn run(metadata: Vec<(&'static str, Value)>, cases: Vec<Case>) {
    differential_extras(
        Group {
            package: Guest::Package("ace-example-metadata-probe"),
            configuration: "",
            cluster_header: None,
            allow_stop_iteration: false,
            clusters: vec![("backend", Behavior::Ok)],
            cases,
        },
        &Extras {
            metadata,
            ..Extras::default()
        },
    );
}

#[test]
fn dynamic_metadata_values_match_envoy() {
    let read = |name, path| case(name, "GET", "/m").header("x-read", path);
    run(
        vec![(
            "acme",
            json!({
                "user": "ann",
                "n": 3,
                "ratio": 0.5,
                "ok": true,
                "off": false,
                "nested": {"tier": "gold"},
                "list": ["x", "y"],
                "nothing": null
            }),
        )],
        vec![
            read(
                "a string is its raw bytes",
                "metadata/filter_metadata/acme/user",
            ),
            read("an integer is a double", "metadata/filter_metadata/acme/n"),
            read(
                "a fraction is a double",
                "metadata/filter_metadata/acme/ratio",
            ),
            read("true is one byte", "metadata/filter_metadata/acme/ok"),
            read("false is one byte", "metadata/filter_metadata/acme/off"),
            read("a struct is pairs", "metadata/filter_metadata/acme/nested"),
            read("into a struct", "metadata/filter_metadata/acme/nested/tier"),
            read(
                "a list is pairs of items",
                "metadata/filter_metadata/acme/list",
            ),
            read(
                "null cannot be serialised",
                "metadata/filter_metadata/acme/nothing",
            ),
            read("a missing key", "metadata/filter_metadata/acme/absent"),
            read("a missing namespace", "metadata/filter_metadata/other/user"),
            read("below a string", "metadata/filter_metadata/acme/user/x"),
            read("an unknown field", "metadata/no_such_field"),
            case("several reads in one request", "GET", "/m")
                .header("x-read", "metadata/filter_metadata/acme/user")
                .header("x-read", "metadata/filter_metadata/acme/ok"),
        ],
    );
}

#[test]
fn whole_metadata_maps_match_envoy() {
    // One namespace with one key: Envoy's map order is its hash maps'.
    let read = |name, path| case(name, "GET", "/m").header("x-read", path);
    run(
        vec![("solo", json!({"k": "v"}))],
        vec![
            read("the metadata message", "metadata"),
            read("filter_metadata", "metadata/filter_metadata"),
            read("one namespace", "metadata/filter_metadata/solo"),
            read("typed_filter_metadata", "metadata/typed_filter_metadata"),
        ],
    );
}
