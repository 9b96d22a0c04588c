//! Dynamic metadata a test sets before the filter runs, read back through
//! `get_property(["metadata", ...])` with Envoy's serialisation (the
//! differential suite compares the same paths with Envoy).

use crate::common::module;
use ace_wasm_host::{Error, MetadataValue, Request, Route, Vm};
use std::collections::BTreeMap;

fn read(vm: &mut Vm, request: Request, paths: &[&str]) -> Result<String, Error> {
    let mut request = request;
    for p in paths {
        request = request.header("x-read", p);
    }
    let ex = vm.exchange(&Route::Cluster("backend".into()), request, |_| None)?;
    Ok(ex.response.unwrap_or_default().text())
}

#[test]
fn values_read_back_in_envoys_encoding() -> Result<(), Error> {
    let m = module("ace-example-metadata-probe");
    let nested: BTreeMap<String, MetadataValue> = [("tier".to_string(), "gold".into())].into();
    let mut vm = Vm::builder(&m)
        .dynamic_metadata("acme", "user", "ann")
        .dynamic_metadata("acme", "n", 3.0)
        .dynamic_metadata("acme", "nested", MetadataValue::Struct(nested))
        .start()?;
    let text = read(
        &mut vm,
        Request::get("/m").dynamic_metadata("acme", "ok", true),
        &[
            "metadata/filter_metadata/acme/user",
            "metadata/filter_metadata/acme/n",
            "metadata/filter_metadata/acme/ok",
            "metadata/filter_metadata/acme/nested/tier",
            "metadata/filter_metadata/acme/absent",
        ],
    )?;
    assert_eq!(
        text,
        "metadata/filter_metadata/acme/user = 616e6e\n\
         metadata/filter_metadata/acme/n = 0000000000000840\n\
         metadata/filter_metadata/acme/ok = 01\n\
         metadata/filter_metadata/acme/nested/tier = 676f6c64\n\
         metadata/filter_metadata/acme/absent = none"
    );
    // A request's own metadata does not outlive it.
    let again = read(
        &mut vm,
        Request::get("/m"),
        &["metadata/filter_metadata/acme/ok"],
    )?;
    assert_eq!(again, "metadata/filter_metadata/acme/ok = none");
    Ok(())
}

#[test]
fn null_cannot_be_serialised() -> Result<(), Error> {
    let m = module("ace-example-metadata-probe");
    let mut vm = Vm::builder(&m)
        .dynamic_metadata("acme", "nothing", MetadataValue::Null)
        .start()?;
    let text = read(
        &mut vm,
        Request::get("/m"),
        &["metadata/filter_metadata/acme/nothing"],
    )?;
    assert_eq!(
        text,
        "metadata/filter_metadata/acme/nothing = SerializationFailure"
    );
    Ok(())
}
