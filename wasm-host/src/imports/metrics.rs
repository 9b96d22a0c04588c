//! Counters, gauges and histograms, shared by the VM's process. Envoy
//! keeps a metric's type in its id's low bits; so does this host.

use super::{st, written};
use crate::abi::{MetricType, Status};
use crate::memory::{read, write_u32, write_u64, Cx};
use crate::process::MetricValue;
use crate::state::MetricDef;
use wasmtime::Result;

pub(super) fn proxy_define_metric(
    mut c: Cx<'_>,
    ty: i32,
    np: i32,
    nl: i32,
    out: i32,
) -> Result<i32> {
    let Some(kind) = MetricType::from_i32(ty) else {
        return st(Status::BadArgument);
    };
    let Some(name) = read(&c, np, nl) else {
        return st(Status::InvalidMemoryAccess);
    };
    let name = String::from_utf8_lossy(&name).into_owned();
    let s = c.data_mut();
    s.next_metric += 1;
    // Envoy keeps the type in the id's low bits; so do we.
    let id = (s.next_metric << 2) | ty as u32;
    s.process.define_metric(kind, &name);
    s.metrics.insert(id, MetricDef { kind, name });
    written(write_u32(&mut c, out, id))
}

pub(super) fn proxy_increment_metric(c: Cx<'_>, id: i32, delta: i64) -> Result<i32> {
    let s = c.data();
    // Envoy reads the kind from the id's low bits before looking it up.
    let kind = MetricType::from_i32(id & 3);
    if !matches!(kind, Some(MetricType::Counter | MetricType::Gauge)) {
        return st(Status::BadArgument);
    }
    let Some(def) = s.metrics.get(&(id as u32)) else {
        return st(Status::NotFound);
    };
    match def.kind {
        MetricType::Counter if delta > 0 => s.process.update_metric(&def.name, |m| {
            if let MetricValue::Counter(v) = m {
                *v = v.saturating_add(delta as u64);
            }
        }),
        MetricType::Gauge => s.process.update_metric(&def.name, |m| {
            if let MetricValue::Gauge(v) = m {
                *v = v.saturating_add(delta);
            }
        }),
        _ => return st(Status::BadArgument),
    }
    st(Status::Ok)
}

pub(super) fn proxy_record_metric(c: Cx<'_>, id: i32, value: i64) -> Result<i32> {
    let s = c.data();
    let Some(def) = s.metrics.get(&(id as u32)) else {
        return st(Status::NotFound);
    };
    let value = value as u64;
    s.process.update_metric(&def.name, |m| match m {
        // Envoy: recording on a counter adds.
        MetricValue::Counter(v) => *v = v.saturating_add(value),
        MetricValue::Gauge(v) => *v = value as i64,
        MetricValue::Histogram(samples) => samples.push(value),
    });
    st(Status::Ok)
}

pub(super) fn proxy_get_metric(mut c: Cx<'_>, id: i32, out: i32) -> Result<i32> {
    let s = c.data();
    // Histograms (and ids with no kind) cannot be read: BadArgument
    // before any lookup, as in Envoy.
    if !matches!(
        MetricType::from_i32(id & 3),
        Some(MetricType::Counter | MetricType::Gauge)
    ) {
        return st(Status::BadArgument);
    }
    let Some(def) = s.metrics.get(&(id as u32)) else {
        return st(Status::NotFound);
    };
    let value = match s.process.metric(&def.name) {
        Some(MetricValue::Counter(v)) => v,
        Some(MetricValue::Gauge(v)) => v as u64,
        Some(MetricValue::Histogram(_)) => return st(Status::BadArgument),
        None => return st(Status::NotFound),
    };
    written(write_u64(&mut c, out, value))
}
