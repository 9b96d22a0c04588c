//! Logging, the clock and the tick timer.

use super::{st, written};
use crate::abi::{LogLevel, Status};
use crate::memory::{read, write_u32, write_u64, Cx};
use wasmtime::Result;

pub(super) fn proxy_log(mut c: Cx<'_>, level: i32, ptr: i32, len: i32) -> Result<i32> {
    let Some(level) = LogLevel::from_i32(level) else {
        return st(Status::BadArgument);
    };
    let Some(msg) = read(&c, ptr, len) else {
        return st(Status::InvalidMemoryAccess);
    };
    c.data_mut()
        .log(level, String::from_utf8_lossy(&msg).into_owned());
    st(Status::Ok)
}

pub(super) fn proxy_get_log_level(mut c: Cx<'_>, out: i32) -> Result<i32> {
    let level = c.data().log_level as u32;
    written(write_u32(&mut c, out, level))
}

pub(super) fn proxy_get_current_time_nanoseconds(mut c: Cx<'_>, out: i32) -> Result<i32> {
    let now = c.data().now_ns();
    written(write_u64(&mut c, out, now))
}

pub(super) fn proxy_set_tick_period_milliseconds(mut c: Cx<'_>, ms: i32) -> Result<i32> {
    let s = c.data_mut();
    s.tick_period_ms = u64::from(ms as u32);
    s.next_tick_ns = if s.tick_period_ms == 0 {
        None
    } else {
        Some(s.elapsed_ns + s.tick_period_ms * 1_000_000)
    };
    st(Status::Ok)
}
