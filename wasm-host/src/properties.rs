//! `proxy_get_property`: the attributes Envoy exposes, encoded as Envoy
//! encodes them.
//!
//! Paths are NUL-separated segments. Strings are raw bytes, integers 8-byte
//! little-endian, booleans one byte, maps in the ABI pair format. A first
//! segment Envoy does not know is looked up in the stream's filter state
//! (what `set_property` wrote), as Envoy's `Context::FindValue` does.
//! `metadata` is the stream's dynamic metadata ([`crate::metadata`]). A root
//! context has no stream, so only the `plugin_*` attributes resolve there.
//! The spec calls paths host-specific; these are Envoy 1.40's names (no
//! deprecated pre-1.33 aliases). Attributes Envoy derives from the request
//! headers (`request.path`, `.method`, `.host`, ...) exist only while it
//! holds those headers: once the request went on, they are NotFound, as
//! the differential suite observed.

use crate::abi::Status;
use crate::state::{StreamState, VmState};

fn int(v: i64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

fn split_addr(addr: &str) -> (&str, Option<i64>) {
    match addr.rsplit_once(':') {
        Some((host, port)) => (host, port.parse().ok()),
        None => (addr, None),
    }
}

/// Resolves a property for the current context: the value, or the status
/// Envoy answers (NotFound, or SerializationFailure for a value it cannot
/// encode).
pub(crate) fn resolve(s: &VmState, path: &[&[u8]]) -> Result<Vec<u8>, Status> {
    if path.first() == Some(&&b"metadata"[..]) {
        let stream = s.streams.get(&s.context()).ok_or(Status::NotFound)?;
        return stream
            .info
            .dynamic_metadata
            .property(path.get(1..).unwrap_or_default());
    }
    get(s, path).ok_or(Status::NotFound)
}

/// Resolves a property for the current context, `None` for NotFound.
fn get(s: &VmState, path: &[&[u8]]) -> Option<Vec<u8>> {
    let first = *path.first()?;
    match first {
        b"plugin_name" => return Some(s.plugin.name.clone().into_bytes()),
        b"plugin_root_id" => return Some(s.plugin.root_id.clone().into_bytes()),
        b"plugin_vm_id" => return Some(s.plugin.vm_id.clone().into_bytes()),
        _ => {}
    }
    let stream = s.streams.get(&s.context())?;
    let second = path.get(1).copied();
    match first {
        b"request" => request(stream, second?),
        b"response" => response(stream, second?),
        b"source" => address(&stream.info.source_address, second?),
        b"destination" => address(&stream.info.destination_address, second?),
        b"upstream" => address(stream.info.upstream_address.as_deref()?, second?),
        b"connection" => {
            let i = &stream.info;
            match second? {
                b"id" => Some(int(i.connection_id as i64)),
                b"mtls" => Some(vec![u8::from(i.mtls)]),
                b"requested_server_name" => Some(i.requested_server_name.clone().into_bytes()),
                _ => None,
            }
        }
        b"xds" => {
            let i = &stream.info;
            match second? {
                b"cluster_name" => i.cluster_name.clone().map(String::into_bytes),
                b"route_name" => Some(i.route_name.clone().into_bytes()),
                b"virtual_host_name" => Some(i.virtual_host_name.clone().into_bytes()),
                _ => None,
            }
        }
        _ if path.len() == 1 => stream.filter_state.get(first).cloned(),
        _ => None,
    }
}

fn request(st: &StreamState, field: &[u8]) -> Option<Vec<u8>> {
    // Envoy derives these from the request header map, which it only holds
    // while the request headers are available (observed: in
    // `on_response_headers` they are all NotFound, `request.protocol` is not).
    let held = st.request.headers_open || st.access_log_phase;
    match field {
        b"protocol" => return Some(st.info.protocol.clone().into_bytes()),
        b"size" => return Some(int(st.request.body.len() as i64)),
        _ if !held => return None,
        _ => {}
    }
    let h = &st.request.headers;
    let header = |name: &str| h.get_bytes(name).map(<[u8]>::to_vec);
    match field {
        b"path" => header(":path"),
        b"url_path" => {
            let p = h.get_bytes(":path")?;
            let end = p.iter().position(|b| *b == b'?').unwrap_or(p.len());
            p.get(..end).map(<[u8]>::to_vec)
        }
        b"query" => {
            let p = h.get_bytes(":path")?;
            let q = p.iter().position(|b| *b == b'?').map_or(p.len(), |i| i + 1);
            Some(p.get(q..).unwrap_or_default().to_vec())
        }
        b"host" => header(":authority"),
        b"scheme" => header(":scheme"),
        b"method" => header(":method"),
        b"referer" => header("referer"),
        b"useragent" => header("user-agent"),
        b"id" => header("x-request-id"),
        b"headers" => Some(h.encode()),
        _ => None,
    }
}

fn response(st: &StreamState, field: &[u8]) -> Option<Vec<u8>> {
    let i = &st.info;
    match field {
        b"code" => i.response_code.map(|c| int(i64::from(c))),
        b"code_details" => i.response_code_details.clone().map(String::into_bytes),
        b"flags" => Some(int(i.response_flags as i64)),
        b"headers" => Some(st.response.headers.encode()),
        b"trailers" => Some(st.response.trailers.encode()),
        _ => None,
    }
}

fn address(addr: &str, field: &[u8]) -> Option<Vec<u8>> {
    match field {
        b"address" => Some(addr.as_bytes().to_vec()),
        b"port" => split_addr(addr).1.map(int),
        _ => None,
    }
}
