//! A re-run (`retry_next`) starts from the client's request, never from
//! the failed attempt's: on the suite's reference host, with a stand-in
//! for Envoy's upstream filters (the credential injector overwriting the
//! destination's key, the router's own headers) writing into the same
//! header map the re-run starts from, as Envoy's do.
//!
//! The property: for any fleet of upstream identities (paths, authority,
//! model names, credentials passed or not) and any client request, every
//! attempt reaches its destination exactly as a first attempt to that
//! destination would: the client's headers (less those a client may not
//! send, and its credentials unless the destination passes them), that
//! destination's path, authority and model name, the client's body
//! otherwise; nothing a host or an upstream filter added to one attempt
//! reaches another destination.

#![allow(clippy::panic, clippy::indexing_slicing)] // a test fails by panicking

use ace_conformance::mock::Mock;
use ace_flow::flow::{Flow, Setup, Verdict, Worker};
use proptest::prelude::*;
use serde_json::{json, Value};
use std::cell::RefCell;

/// One destination's upstream identity.
#[derive(Clone, Debug)]
struct Identity {
    path: bool,
    authority: bool,
    rename: bool,
    pass_credentials: bool,
}

/// Four destinations, cheapest first, each with `ids[i]`'s identity.
fn setup(ids: &[Identity]) -> Setup {
    let tiers = ["inhouse", "reserved", "payg", "payg"];
    let destinations: Vec<Value> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let mut upstream = json!({"pass_credentials": id.pass_credentials});
            if id.path {
                upstream["paths"] =
                    json!({"chat_completions": format!("/d{i}/chat/completions?v=1")});
            }
            if id.authority {
                upstream["authority"] = json!(format!("d{i}.provider.test"));
            }
            if id.rename {
                upstream["models"] = json!({"m": format!("m-at-d{i}")});
            }
            let usd = 1e-9 * 10f64.powi(i as i32);
            json!({"name": format!("d{i}"), "cluster": format!("c{i}"), "tier": tiers[i % 4],
                   "capacity": 8, "usd_per_input_token": usd, "usd_per_output_token": usd,
                   "upstream": upstream})
        })
        .collect();
    let config = json!({
        "allow_no_policy": true,
        "retry_next": true,
        "body": {"read": true},
        "health": {"trip_after": 1000, "base_cooldown_ms": 1000},
        "destinations": destinations,
    });
    Setup::parse(config.to_string().as_bytes()).unwrap_or_else(|e| panic!("{e}"))
}

/// What destination `d` must receive for the client's `headers` and
/// `body`, sorted: what a first attempt there sends.
fn expected(
    s: &Setup,
    d: usize,
    headers: &[(String, String)],
    body: &Value,
) -> (Vec<(String, String)>, Value) {
    let dest = &s.config.destinations[d];
    let u = &dest.upstream;
    let credentials = ace_config::CREDENTIAL_HEADERS;
    let mut want: Vec<(String, String)> = headers
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "x-ace-destination" | "x-ace-retry"))
        .filter(|(k, _)| u.pass_credentials || !credentials.contains(&k.as_str()))
        .filter(|(k, _)| k != "content-length")
        .map(|(k, v)| {
            let v = match k.as_str() {
                ":path" => u
                    .path(Some(ace_config::Api::ChatCompletions))
                    .map_or(v.clone(), str::to_string),
                ":authority" => u.authority.clone().unwrap_or(v.clone()),
                _ => v.clone(),
            };
            (k.clone(), v)
        })
        .collect();
    want.push(("x-ace-destination".into(), dest.cluster.clone()));
    want.sort();
    let mut body = body.clone();
    body["model"] = json!(u.model_name("m"));
    (want, body)
}

/// What left for the upstream: the headers (sorted, without
/// `content-length`) and the body.
fn sent(m: &Mock, client_body: &[u8]) -> (Vec<(String, String)>, Value) {
    let mut h: Vec<(String, String)> = m
        .headers
        .iter()
        .filter(|(k, _)| k != "content-length")
        .cloned()
        .collect();
    h.sort();
    let body = m.body.as_deref().unwrap_or(client_body);
    (h, serde_json::from_slice(body).unwrap_or(Value::Null))
}

/// Envoy's upstream filters and router on attempt `n` to cluster
/// `cluster`: the destination's key injected over whatever was there,
/// a header of the attempt's own, the router's attempt count.
fn upstream_filters(m: &mut Mock, cluster: &str, n: usize) {
    m.headers.retain(|(k, _)| k != "authorization");
    m.headers
        .push(("authorization".into(), format!("Bearer key-of-{cluster}")));
    m.headers
        .push((format!("x-injected-{n}"), format!("by {cluster}")));
    m.headers
        .push(("x-envoy-attempt-count".into(), (n + 1).to_string()));
}

/// Send the client's request through every attempt ACE makes, each
/// failing with an upstream 503 until one answers 200; check every
/// attempt against [`expected`]. The clusters attempted.
fn attempts(
    s: &Setup,
    w: &RefCell<Worker>,
    m: &mut Mock,
    client: &[(String, String)],
    body: &Value,
    fail_first: bool,
) -> Vec<String> {
    let raw = serde_json::to_vec(body).unwrap_or_default();
    m.headers = client.to_vec();
    m.headers
        .push(("content-length".into(), raw.len().to_string()));
    m.body = None;
    m.chunk = raw.clone();
    let mut flows = Vec::new();
    let mut went = Vec::new();
    for n in 0..4 {
        let mut flow = Flow::new();
        let mut v = flow.on_request_headers(s, w, m, false);
        if v == Verdict::Hold {
            // Envoy hands over the body it holds (on a re-run, as the
            // failed attempt left it).
            m.chunk = m.body.clone().unwrap_or_else(|| raw.clone());
            v = flow.on_request_body(s, w, m, true);
        }
        assert_eq!(v, Verdict::Continue, "attempt {n}: {:?}", m.replies);
        let cluster = m.header("x-ace-destination").unwrap_or("").to_string();
        let d = s
            .config
            .destinations
            .iter()
            .position(|x| x.cluster == cluster)
            .unwrap_or_else(|| panic!("attempt {n} went to {cluster:?}"));
        let mut client_headers = client.to_vec();
        client_headers.push(("content-length".into(), raw.len().to_string()));
        assert_eq!(
            sent(m, &raw),
            expected(s, d, &client_headers, body),
            "attempt {n} to {cluster}"
        );
        went.push(cluster.clone());
        upstream_filters(m, &cluster, n);
        let fail = fail_first && n == 0;
        m.response = vec![
            (":status".into(), if fail { "503" } else { "200" }.into()),
            ("x-envoy-upstream-service-time".into(), "3".into()),
        ];
        let v = flow.on_response_headers(s, m);
        flows.push(flow);
        if v != Verdict::Rerun {
            break;
        }
    }
    for mut f in flows {
        f.on_complete(s, w, m);
    }
    went
}

fn identity() -> impl Strategy<Value = Identity> {
    (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
        |(path, authority, rename, pass_credentials)| Identity {
            path,
            authority,
            rename,
            pass_credentials,
        },
    )
}

/// A client's headers: the pseudo-headers, then any of its own, repeated
/// names, credentials and forged marks among them.
fn client_headers() -> impl Strategy<Value = Vec<(String, String)>> {
    let name = prop::sample::select(vec![
        "authorization",
        "api-key",
        "x-api-key",
        "x-goog-api-key",
        "x-custom",
        "accept",
        "x-ace-destination",
        "x-ace-retry",
        "x-trace",
    ]);
    prop::collection::vec((name, "[a-z0-9 ]{0,12}"), 0..8).prop_map(|extra| {
        let mut h = vec![
            (":method".to_string(), "POST".to_string()),
            (":path".to_string(), "/v1/chat/completions".to_string()),
            (":authority".to_string(), "ace.test".to_string()),
            ("content-type".to_string(), "application/json".to_string()),
        ];
        h.extend(extra.into_iter().map(|(k, v)| (k.to_string(), v)));
        h
    })
}

fn mock(s: &Setup) -> Mock {
    let mut m = Mock::new(s);
    m.can_rerun = true;
    m.rewrites = true;
    m
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn nothing_one_attempt_added_reaches_another_destination(
        ids in prop::collection::vec(identity(), 4),
        requests in prop::collection::vec((client_headers(), any::<bool>(), any::<bool>()), 1..4),
    ) {
        let s = setup(&ids);
        let w = RefCell::new(Worker::default());
        let mut m = mock(&s);
        for (client, stream, fail) in requests {
            let body = json!({"model": "m", "stream": stream,
                              "messages": [{"role": "user", "content": "hi"}]});
            let went = attempts(&s, &w, &mut m, &client, &body, fail);
            prop_assert_eq!(went.len(), if fail { 2 } else { 1 });
            prop_assert!(m.parking.is_empty(), "every carry taken back");
        }
    }
}

/// The red team's case, on the reference host: the owned destination's
/// injected key never reaches the pass-through gateway a re-run goes to;
/// the client's own key does.
#[test]
fn a_rerun_carries_the_clients_key_not_the_failed_destinations() {
    let ids = [
        Identity {
            path: false,
            authority: false,
            rename: false,
            pass_credentials: false,
        },
        Identity {
            path: false,
            authority: false,
            rename: false,
            pass_credentials: true,
        },
        Identity {
            path: true,
            authority: true,
            rename: true,
            pass_credentials: false,
        },
        Identity {
            path: true,
            authority: true,
            rename: true,
            pass_credentials: false,
        },
    ];
    let s = setup(&ids);
    let w = RefCell::new(Worker::default());
    let mut m = mock(&s);
    let client = vec![
        (":method".to_string(), "POST".to_string()),
        (":path".to_string(), "/v1/chat/completions".to_string()),
        (":authority".to_string(), "ace.test".to_string()),
        ("content-type".to_string(), "application/json".to_string()),
        ("authorization".to_string(), "Bearer client-own".to_string()),
    ];
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let went = attempts(&s, &w, &mut m, &client, &body, true);
    // `attempts` checked each attempt: c1 got `Bearer client-own`.
    assert_eq!(went, ["c0", "c1"]);
    let e = m.events.last().cloned().unwrap_or_default();
    assert_eq!(
        (&e["destination"], &e["reason"]),
        (&json!("d1"), &json!("retry"))
    );
}
