//! Attributes from a verified source, in a real Envoy: the data class comes
//! from a JWT that Envoy's `jwt_authn` filter verified against a local JWKS,
//! so whatever the client's own `x-ace-data-class` header claims, a token
//! that says `personal_eu` keeps the request in the EU.
//!
//! The Wasm filter reads the claim from `jwt_authn`'s payload in dynamic
//! metadata (a nested path). The dynamic module reads one top-level key of
//! a metadata namespace (its ABI's getter), shown here with the value a
//! `set_metadata` filter publishes, as an `ext_authz` service would.

use ace_harness::client::Request;
use ace_harness::envoy::EnvoyBuilder;
use ace_tests::{require_envoy, residency_spec, start, tables_base64, upstream, Filter};
use base64::Engine;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const SECRET: &[u8] = b"ace-trusted-attributes-test-key-0123456789";

/// `sg-cheap` (bit 0, outside the EU, cheapest), `eu-owned` (bit 1):
/// personal_eu may not leave the EU; unknown values go nowhere.
fn tables() -> String {
    tables_base64(&residency_spec(&["sg-cheap", "eu-owned"], 0b01))
}

fn config(namespace: &str, path: &[&str]) -> Value {
    json!({
        "destinations": [
            {"name": "sg-cheap", "cluster": "sg_cheap", "tier": "inhouse", "capacity": 16,
             "usd_per_input_token": 1e-10, "usd_per_output_token": 1e-10},
            {"name": "eu-owned", "cluster": "eu_owned", "tier": "inhouse", "capacity": 16,
             "usd_per_input_token": 1e-9, "usd_per_output_token": 1e-9}
        ],
        "tables_base64": tables(),
        "attribute_sources": {"data_class": {"metadata": {"namespace": namespace, "path": path}}}
    })
}

fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// HMAC-SHA256 (RFC 2104), for signing the test's tokens.
fn hmac_sha256(key: &[u8], message: &[u8]) -> Vec<u8> {
    let mut block = [0u8; 64];
    block[..key.len()].copy_from_slice(key);
    let pad = |byte: u8| block.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .to_vec()
}

/// A token signed with [`SECRET`] whose `data_class` claim is `class`.
fn token(class: &str) -> String {
    let header = b64url(
        json!({"alg": "HS256", "typ": "JWT", "kid": "k1"})
            .to_string()
            .as_bytes(),
    );
    let claims =
        json!({"iss": "ace-test", "sub": "someone", "data_class": class, "exp": 4102444800u64});
    let payload = b64url(claims.to_string().as_bytes());
    let signing = format!("{header}.{payload}");
    let signature = b64url(&hmac_sha256(SECRET, signing.as_bytes()));
    format!("{signing}.{signature}")
}

fn jwt_authn() -> Value {
    let jwks = json!({"keys": [{"kty": "oct", "alg": "HS256", "kid": "k1", "k": b64url(SECRET)}]});
    json!({
        "name": "envoy.filters.http.jwt_authn",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication",
            "providers": {"test": {
                "issuer": "ace-test",
                "local_jwks": {"inline_string": jwks.to_string()},
                "payload_in_metadata": "jwt_payload"
            }},
            "rules": [{"match": {"prefix": "/"}, "requires": {"provider_name": "test"}}]
        }
    })
}

#[test]
fn a_verified_jwt_claim_decides_whatever_the_headers_claim() {
    require_envoy();
    let filter = Filter::Wasm;
    let (sg, eu) = (upstream("sg-cheap"), upstream("eu-owned"));
    let cfg = config(
        "envoy.filters.http.jwt_authn",
        &["jwt_payload", "data_class"],
    );
    let envoy = start(
        &filter
            .event_log(filter.add(
                EnvoyBuilder::new().http_filter(jwt_authn()),
                &cfg.to_string(),
            ))
            .cluster("sg_cheap", sg.port())
            .cluster("eu_owned", eu.port()),
    );
    let send = |token: &str, claim: &str| {
        Request::post_json("/v1/chat/completions", &json!({"model": "m"}))
            .header("authorization", &format!("Bearer {token}"))
            .header("x-ace-data-class", claim)
            .send(envoy.port())
            .unwrap_or_else(|e| panic!("request failed: {e}"))
    };
    // The token says personal_eu; the header lies.
    for _ in 0..3 {
        let r = send(&token("personal_eu"), "public");
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(sg.count(), 0, "personal_eu left the EU on a forged header");
    assert_eq!(eu.count(), 3);
    // The client's header never reaches the upstream.
    assert!(eu
        .requests()
        .iter()
        .all(|r| r.header("x-ace-data-class").is_none()));
    // A public token may take the cheapest destination.
    assert_eq!(send(&token("public"), "personal_eu").status, 200);
    assert_eq!(sg.count(), 1);
    // A token signed with another key never reaches ACE.
    let forged = {
        let t = token("public");
        let cut = t.rfind('.').unwrap_or(0);
        format!(
            "{}.{}",
            &t[..cut],
            b64url(&hmac_sha256(b"other", &t.as_bytes()[..cut]))
        )
    };
    assert_eq!(send(&forged, "public").status, 401);
    let events: Vec<Value> = envoy
        .wait_access_log(4, std::time::Duration::from_secs(10))
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(
        events[0]["data_class"], "personal_eu",
        "the event says what decided"
    );
    assert_eq!(events[0]["destination"], "eu-owned");
}

#[test]
fn the_dynamic_module_reads_a_published_metadata_key_instead_of_the_header() {
    require_envoy();
    let filter = Filter::Dynamic;
    let (sg, eu) = (upstream("sg-cheap"), upstream("eu-owned"));
    let cfg = config("ace.identity", &["data_class"]);
    let publish = json!({
        "name": "envoy.filters.http.set_metadata",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config",
            "metadata": [{"metadata_namespace": "ace.identity", "value": {"data_class": "personal_eu"}}]
        }
    });
    let envoy = start(
        &filter
            .event_log(filter.add(EnvoyBuilder::new().http_filter(publish), &cfg.to_string()))
            .cluster("sg_cheap", sg.port())
            .cluster("eu_owned", eu.port()),
    );
    for _ in 0..3 {
        let r = Request::get("/v1/models")
            .header("x-ace-data-class", "public")
            .send(envoy.port())
            .unwrap_or_else(|e| panic!("request failed: {e}"));
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(sg.count(), 0, "the published class decides, not the header");
    assert_eq!(eu.count(), 3);
    // A nested path is refused by this build, naming the field.
    let nested = config(
        "envoy.filters.http.jwt_authn",
        &["jwt_payload", "data_class"],
    );
    let up = upstream("x");
    let r = filter
        .add(EnvoyBuilder::new(), &nested.to_string())
        .cluster("sg_cheap", up.port())
        .cluster("eu_owned", up.port())
        .start();
    let log = match r {
        Ok(envoy) => envoy.log(),
        Err(e) => e.to_string(),
    };
    assert!(
        log.contains("attribute_sources.data_class.metadata.path"),
        "{log}"
    );
}
