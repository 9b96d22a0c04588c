//! What some groups need beyond HTTP upstreams, set up the same way on both
//! sides: gRPC clusters (one [`GrpcUpstream`] each in Envoy, the same
//! [`GrpcBehavior`] driven without a socket on the host) and dynamic
//! metadata set before the filter runs (Envoy's `set_metadata` filter, the
//! host's stream info).

use super::normalize;
use ace_harness::envoy::EnvoyBuilder;
use ace_harness::grpc::{GrpcAction, GrpcBehavior, GrpcEvent, GrpcUpstream};
use ace_wasm_host::{GrpcEvent as HostEvent, GrpcReply, GrpcRequest, Headers, VmBuilder};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};

/// A gRPC cluster of a group.
#[derive(Clone, Debug)]
pub(crate) struct GrpcCluster {
    pub(crate) name: &'static str,
    pub(crate) behavior: GrpcBehavior,
    /// Compare what it received. Off for a cluster whose calls the filter
    /// cancels at once: whether Envoy's request reaches the server before
    /// its reset is a race.
    pub(crate) compare: bool,
}

/// See the module docs.
#[derive(Clone, Debug, Default)]
pub(crate) struct Extras {
    pub(crate) grpc: Vec<GrpcCluster>,
    /// `(namespace, struct)` set on every request before the filter runs.
    pub(crate) metadata: Vec<(&'static str, Value)>,
}

/// One gRPC call as its server received it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct GrpcSeen {
    pub(crate) cluster: String,
    pub(crate) path: String,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) messages: Vec<String>,
    pub(crate) half_closed: bool,
}

/// The calls the host's gRPC clusters received, shared with their handlers.
pub(crate) type GrpcLog = Arc<Mutex<Vec<GrpcSeen>>>;

/// Headers of a gRPC request that vary per run or per connection.
const GRPC_VOLATILE: &[&str] = &["grpc-timeout", "x-envoy-expected-rq-timeout-ms"];

fn grpc_headers(headers: Vec<(String, String)>) -> Vec<(String, String)> {
    normalize(headers.into_iter().map(|(k, v)| {
        if GRPC_VOLATILE.contains(&k.as_str()) {
            (k, "<present>".into())
        } else {
            (k, v)
        }
    }))
}

pub(crate) fn sorted(log: &GrpcLog) -> Vec<GrpcSeen> {
    let mut v = log.lock().unwrap_or_else(|e| e.into_inner()).clone();
    v.sort_by(|a, b| (&a.cluster, &a.path).cmp(&(&b.cluster, &b.path)));
    v
}

pub(crate) fn clear_grpc(servers: &[(GrpcCluster, GrpcUpstream)]) {
    for (_, s) in servers {
        s.clear();
    }
}

impl Extras {
    pub(crate) fn start_grpc_upstreams(&self) -> Vec<(GrpcCluster, GrpcUpstream)> {
        self.grpc
            .iter()
            .map(|c| {
                let s = GrpcUpstream::start(c.behavior.clone())
                    .unwrap_or_else(|e| panic!("gRPC upstream {}: {e}", c.name));
                (c.clone(), s)
            })
            .collect()
    }

    /// The gRPC clusters (HTTP/2 with prior knowledge) and the
    /// `set_metadata` filter, ahead of the filter under test.
    pub(crate) fn envoy(
        &self,
        mut b: EnvoyBuilder,
        servers: &[(GrpcCluster, GrpcUpstream)],
    ) -> EnvoyBuilder {
        for (c, s) in servers {
            b = b.cluster_json(json!({
                "name": c.name,
                "type": "STATIC",
                "connect_timeout": "1s",
                "typed_extension_protocol_options": {
                    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                        "explicit_http_config": {"http2_protocol_options": {}}
                    }
                },
                "load_assignment": {
                    "cluster_name": c.name,
                    "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
                        "socket_address": {"address": "127.0.0.1", "port_value": s.port()}
                    }}}]}]
                }
            }));
        }
        if !self.metadata.is_empty() {
            let entries: Vec<Value> = self
                .metadata
                .iter()
                .map(|(ns, v)| json!({"metadata_namespace": ns, "value": v}))
                .collect();
            b = b.http_filter(json!({
                "name": "envoy.filters.http.set_metadata",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config",
                    "metadata": entries
                }
            }));
        }
        b
    }

    pub(crate) fn grpc_seen_in_envoy(
        &self,
        servers: &[(GrpcCluster, GrpcUpstream)],
    ) -> Vec<GrpcSeen> {
        let mut v: Vec<GrpcSeen> = servers
            .iter()
            .filter(|(c, _)| c.compare)
            .flat_map(|(c, s)| {
                s.calls().into_iter().map(|r| GrpcSeen {
                    cluster: c.name.to_string(),
                    path: r.path,
                    headers: grpc_headers(r.headers),
                    messages: r
                        .messages
                        .iter()
                        .map(|m| String::from_utf8_lossy(m).into_owned())
                        .collect(),
                    half_closed: r.half_closed,
                })
            })
            .collect();
        v.sort_by(|a, b| (&a.cluster, &a.path).cmp(&(&b.cluster, &b.path)));
        v
    }

    /// The same gRPC clusters and metadata on the host.
    pub(crate) fn host<'m>(&self, mut builder: VmBuilder<'m>, log: &GrpcLog) -> VmBuilder<'m> {
        for c in &self.grpc {
            let (cluster, log) = (c.clone(), log.clone());
            builder = builder.grpc_cluster_with(c.name, move |req, event| {
                let event = match event {
                    HostEvent::Open => GrpcEvent::Open,
                    HostEvent::Message(m) => GrpcEvent::Message(m.clone()),
                    HostEvent::HalfClose => GrpcEvent::HalfClose,
                };
                if cluster.compare {
                    record(&log, &cluster, req, &event);
                }
                cluster.behavior.on(&event).into_iter().map(reply).collect()
            });
        }
        for (ns, v) in &self.metadata {
            if let Value::Object(fields) = v {
                for (k, v) in fields {
                    builder = builder.dynamic_metadata(ns, k, metadata_value(v));
                }
            }
        }
        builder
    }
}

fn record(log: &GrpcLog, cluster: &GrpcCluster, req: &GrpcRequest, event: &GrpcEvent) {
    let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
    if matches!(event, GrpcEvent::Open) {
        let headers = req
            .headers
            .to_vec()
            .into_iter()
            .filter(|(k, _)| !k.starts_with(':'))
            .collect();
        log.push(GrpcSeen {
            cluster: cluster.name.to_string(),
            path: format!("/{}/{}", req.service, req.method),
            headers: grpc_headers(headers),
            messages: Vec::new(),
            half_closed: false,
        });
        return;
    }
    // The call's entry is the last one this cluster opened for it.
    let path = format!("/{}/{}", req.service, req.method);
    if let Some(seen) = log
        .iter_mut()
        .rev()
        .find(|s| s.cluster == cluster.name && s.path == path)
    {
        match event {
            GrpcEvent::Message(m) => seen.messages.push(String::from_utf8_lossy(m).into_owned()),
            GrpcEvent::HalfClose => seen.half_closed = true,
            GrpcEvent::Open => {}
        }
    }
}

fn headers(pairs: Vec<(String, String)>) -> Headers {
    pairs.into_iter().collect()
}

fn reply(a: GrpcAction) -> GrpcReply {
    match a {
        GrpcAction::InitialMetadata(m) => GrpcReply::InitialMetadata(headers(m)),
        GrpcAction::Message(m) => GrpcReply::Message(m),
        GrpcAction::Close {
            status,
            message,
            metadata,
        } => GrpcReply::Close {
            status,
            message,
            trailing_metadata: headers(metadata),
        },
        GrpcAction::Reset => GrpcReply::Reset,
    }
}

/// A JSON value as the `google.protobuf.Value` Envoy's `set_metadata`
/// builds from it.
pub(crate) fn metadata_value(v: &Value) -> ace_wasm_host::MetadataValue {
    use ace_wasm_host::MetadataValue as M;
    match v {
        Value::Null => M::Null,
        Value::Bool(b) => M::Bool(*b),
        Value::Number(n) => M::Number(n.as_f64().unwrap_or_default()),
        Value::String(s) => M::String(s.clone()),
        Value::Array(items) => M::List(items.iter().map(metadata_value).collect()),
        Value::Object(fields) => M::Struct(
            fields
                .iter()
                .map(|(k, v)| (k.clone(), metadata_value(v)))
                .collect(),
        ),
    }
}
