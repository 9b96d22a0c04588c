//! The numbers and byte formats of proxy-wasm ABI 0.2.1.
//!
//! Everything that crosses the Wasm boundary is an `i32` or a (pointer,
//! length) pair; this module names those numbers so the rest of the host
//! never uses a bare literal, and holds the one serialization format the ABI
//! uses for header maps (and for map-valued properties).
//!
//! The statuses matter more than they look: the Rust SDK panics on any
//! status it does not expect, so a host that answers `NotFound` where Envoy
//! answers `BadArgument` hides (or invents) filter crashes.

/// A proxy-wasm status code (`WasmResult` in Envoy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum Status {
    /// The call succeeded.
    Ok = 0,
    /// The key, header, property, queue or metric does not exist.
    NotFound = 1,
    /// The argument is not acceptable now (e.g. a header map outside its phase).
    BadArgument = 2,
    /// A value could not be serialized.
    SerializationFailure = 3,
    /// A value could not be parsed.
    ParseFailure = 4,
    /// A pointer or length is outside the guest's memory.
    InvalidMemoryAccess = 6,
    /// The shared queue is empty.
    Empty = 7,
    /// A shared-data write carried a stale CAS token.
    CasMismatch = 8,
    /// The host failed.
    InternalFailure = 10,
    /// The host does not implement this operation.
    Unimplemented = 12,
}

impl Status {
    /// The raw value returned to the guest.
    pub fn code(self) -> i32 {
        self as i32
    }
}

/// The header maps a filter can address (`proxy_*_header_map_*`'s first argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MapType {
    /// Request headers, pseudo-headers included.
    RequestHeaders,
    /// Request trailers.
    RequestTrailers,
    /// Response headers, `:status` included.
    ResponseHeaders,
    /// Response trailers.
    ResponseTrailers,
    /// gRPC initial metadata received on a gRPC call.
    GrpcReceiveInitialMetadata,
    /// gRPC trailing metadata received on a gRPC call.
    GrpcReceiveTrailingMetadata,
    /// Headers of a `dispatch_http_call` response.
    HttpCallResponseHeaders,
    /// Trailers of a `dispatch_http_call` response.
    HttpCallResponseTrailers,
}

impl MapType {
    /// Decodes the guest's number, `None` for unknown values.
    pub fn from_i32(v: i32) -> Option<MapType> {
        Some(match v {
            0 => MapType::RequestHeaders,
            1 => MapType::RequestTrailers,
            2 => MapType::ResponseHeaders,
            3 => MapType::ResponseTrailers,
            4 => MapType::GrpcReceiveInitialMetadata,
            5 => MapType::GrpcReceiveTrailingMetadata,
            6 => MapType::HttpCallResponseHeaders,
            7 => MapType::HttpCallResponseTrailers,
            _ => return None,
        })
    }
}

/// The byte buffers a filter can address (`proxy_*_buffer_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BufferType {
    /// The request body seen by the current body callback.
    RequestBody,
    /// The response body seen by the current body callback.
    ResponseBody,
    /// Downstream data (network filters; never available to HTTP filters).
    DownstreamData,
    /// Upstream data (network filters; never available to HTTP filters).
    UpstreamData,
    /// The body of a `dispatch_http_call` response.
    HttpCallResponseBody,
    /// gRPC message (unsupported, as gRPC calls are).
    GrpcReceiveBuffer,
    /// `vm_config.configuration`, readable in `on_vm_start`.
    VmConfiguration,
    /// The plugin `configuration`, readable in `on_configure`.
    PluginConfiguration,
    /// Arguments of a foreign-function callback.
    CallData,
}

impl BufferType {
    /// Decodes the guest's number, `None` for unknown values.
    pub fn from_i32(v: i32) -> Option<BufferType> {
        Some(match v {
            0 => BufferType::RequestBody,
            1 => BufferType::ResponseBody,
            2 => BufferType::DownstreamData,
            3 => BufferType::UpstreamData,
            4 => BufferType::HttpCallResponseBody,
            5 => BufferType::GrpcReceiveBuffer,
            6 => BufferType::VmConfiguration,
            7 => BufferType::PluginConfiguration,
            8 => BufferType::CallData,
            _ => return None,
        })
    }
}

/// What a stream callback asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Let the stream go on to the next filter.
    Continue,
    /// Hold the stream here (Envoy: stop iteration; for bodies, buffer).
    Pause,
}

impl Action {
    pub(crate) fn from_i32(v: i32) -> Action {
        // cpp-host treats anything but Continue as a stop.
        if v == 0 {
            Action::Continue
        } else {
            Action::Pause
        }
    }
}

/// Log levels of `proxy_log`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    /// 0
    Trace,
    /// 1
    Debug,
    /// 2
    Info,
    /// 3
    Warn,
    /// 4
    Error,
    /// 5; the SDK's panic hook logs the panic message here.
    Critical,
}

impl LogLevel {
    /// Decodes the guest's number, `None` for unknown values.
    pub fn from_i32(v: i32) -> Option<LogLevel> {
        Some(match v {
            0 => LogLevel::Trace,
            1 => LogLevel::Debug,
            2 => LogLevel::Info,
            3 => LogLevel::Warn,
            4 => LogLevel::Error,
            5 => LogLevel::Critical,
            _ => return None,
        })
    }
}

/// Metric kinds of `proxy_define_metric`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetricType {
    /// Monotonic; increments must be positive.
    Counter,
    /// Goes up and down; `record` sets it.
    Gauge,
    /// Records samples; cannot be read back through the ABI.
    Histogram,
}

impl MetricType {
    /// Decodes the guest's number, `None` for unknown values.
    pub fn from_i32(v: i32) -> Option<MetricType> {
        Some(match v {
            0 => MetricType::Counter,
            1 => MetricType::Gauge,
            2 => MetricType::Histogram,
            _ => return None,
        })
    }
}

/// The largest guest-supplied header map Envoy accepts, in bytes.
pub const MAX_MAP_BYTES: usize = 1 << 20;
/// The most pairs Envoy accepts in a guest-supplied header map.
pub const MAX_MAP_PAIRS: usize = 1024;

/// Serializes pairs in the ABI's map format: `u32 N`, `N × (u32 klen, u32
/// vlen)`, then each key and value followed by a NUL (lengths exclude it).
pub fn encode_pairs<K: AsRef<[u8]>, V: AsRef<[u8]>>(pairs: &[(K, V)]) -> Vec<u8> {
    let data: usize = pairs
        .iter()
        .map(|(k, v)| k.as_ref().len() + v.as_ref().len() + 2)
        .sum();
    let mut out = Vec::with_capacity(4 + pairs.len() * 8 + data);
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (k, v) in pairs {
        out.extend_from_slice(&(k.as_ref().len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.as_ref().len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_ref());
        out.push(0);
        out.extend_from_slice(v.as_ref());
        out.push(0);
    }
    out
}

/// Parses the ABI's map format, as Envoy does for guest-supplied maps:
/// `None` when the bytes are malformed or exceed [`MAX_MAP_BYTES`] /
/// [`MAX_MAP_PAIRS`]. Empty input is an empty map.
pub fn decode_pairs(bytes: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    if bytes.len() > MAX_MAP_BYTES {
        return None;
    }
    let word = |at: usize| -> Option<usize> {
        let b = bytes.get(at..at.checked_add(4)?)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let n = word(0)?;
    if n > MAX_MAP_PAIRS {
        return None;
    }
    let mut sizes = Vec::with_capacity(n);
    for i in 0..n {
        sizes.push((word(4 + i * 8)?, word(8 + i * 8)?));
    }
    let mut at = 4 + n * 8;
    let mut take = |len: usize| -> Option<Vec<u8>> {
        let end = at.checked_add(len)?;
        let s = bytes.get(at..end)?.to_vec();
        // Each string is followed by a NUL separator.
        if bytes.get(end) != Some(&0) {
            return None;
        }
        at = end + 1;
        Some(s)
    };
    let mut pairs = Vec::with_capacity(n);
    for (kl, vl) in sizes {
        let k = take(kl)?;
        let v = take(vl)?;
        pairs.push((k, v));
    }
    Some(pairs)
}

/// Splits a property path (segments joined by NUL) into its segments.
pub fn split_path(path: &[u8]) -> Vec<&[u8]> {
    path.split(|b| *b == 0).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_match_the_spec_example() {
        let bytes = encode_pairs(&[("a", "1"), ("b", "22")]);
        let want: Vec<u8> = vec![
            2, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, b'a', 0, b'1', 0, b'b', 0,
            b'2', b'2', 0,
        ];
        assert_eq!(bytes, want);
        let back = decode_pairs(&bytes);
        assert_eq!(
            back,
            Some(vec![
                (b"a".to_vec(), b"1".to_vec()),
                (b"b".to_vec(), b"22".to_vec())
            ])
        );
    }

    #[test]
    fn malformed_pairs_are_rejected_not_panicked_on() {
        assert_eq!(decode_pairs(&[1, 0, 0]), None);
        assert_eq!(decode_pairs(&[1, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0]), None);
        assert_eq!(decode_pairs(&[0, 0, 0, 0]), Some(vec![]));
        assert_eq!(decode_pairs(&[0xff, 0xff, 0xff, 0xff]), None);
    }
}
