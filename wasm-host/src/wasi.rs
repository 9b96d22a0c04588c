//! The WASI preview-1 subset Envoy offers proxy-wasm modules.
//!
//! Envoy (cpp-host `exports.cc`) implements a handful of WASI calls itself
//! rather than a full WASI: stdout/stderr become log lines, the environment
//! comes from `vm_config.environment_variables`, clocks and randomness are
//! the proxy's. We do the same, with a virtual clock and seeded randomness,
//! so tests are deterministic. `wasmtime-wasi` would offer files and
//! sockets Envoy never gives a filter.

use crate::abi::LogLevel;
use crate::memory::{read, write, write_u32, write_u64, Cx};
use crate::state::VmState;
use std::collections::HashSet;
use wasmtime::{Linker, Result};

const SUCCESS: i32 = 0;
const EBADF: i32 = 8;
const EFAULT: i32 = 21;
const EINVAL: i32 = 28;
const ENOSYS: i32 = 52;

const MODULE: &str = "wasi_snapshot_preview1";

/// Registers the subset on `linker`, recording names in `defined`.
pub(crate) fn define(
    linker: &mut Linker<VmState>,
    defined: &mut HashSet<(String, String)>,
) -> Result<()> {
    crate::define_imports!(
        linker,
        defined,
        MODULE,
        [
            fd_write,
            fd_read,
            fd_close,
            fd_seek,
            fd_fdstat_get,
            fd_prestat_get,
            fd_prestat_dir_name,
            environ_sizes_get,
            environ_get,
            args_sizes_get,
            args_get,
            clock_time_get,
            clock_res_get,
            random_get,
            sched_yield,
            poll_oneoff,
            proc_exit,
        ]
    );
    Ok(())
}

fn fd_write(mut c: Cx<'_>, fd: i32, iovs: i32, n: i32, out: i32) -> Result<i32> {
    let level = match fd {
        1 => LogLevel::Info,
        2 => LogLevel::Error,
        _ => return Ok(EBADF),
    };
    let mut text = Vec::new();
    for i in 0..n.max(0) {
        let Some(iov) = read(&c, iovs.wrapping_add(i.wrapping_mul(8)), 8) else {
            return Ok(EFAULT);
        };
        let word = |at: usize| {
            iov.get(at..at + 4)
                .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .unwrap_or(0)
        };
        let Some(bytes) = read(&c, word(0), word(4)) else {
            return Ok(EFAULT);
        };
        text.extend_from_slice(&bytes);
    }
    let written = text.len() as u32;
    let msg = String::from_utf8_lossy(&text)
        .trim_end_matches('\n')
        .to_string();
    c.data_mut().log(level, msg);
    Ok(if write_u32(&mut c, out, written).is_some() {
        SUCCESS
    } else {
        EFAULT
    })
}

fn fd_read(_c: Cx<'_>, _fd: i32, _iovs: i32, _n: i32, _out: i32) -> Result<i32> {
    Ok(ENOSYS)
}

fn fd_close(_c: Cx<'_>, _fd: i32) -> Result<i32> {
    Ok(ENOSYS)
}

fn fd_seek(_c: Cx<'_>, _fd: i32, _off: i64, _whence: i32, _out: i32) -> Result<i32> {
    Ok(ENOSYS)
}

fn fd_fdstat_get(mut c: Cx<'_>, fd: i32, out: i32) -> Result<i32> {
    if !(0..=2).contains(&fd) {
        return Ok(EBADF);
    }
    // filetype character device, no flags, all rights.
    let mut stat = [0u8; 24];
    stat[0] = 2;
    stat[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    stat[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    Ok(if write(&mut c, out, &stat).is_some() {
        SUCCESS
    } else {
        EFAULT
    })
}

fn fd_prestat_get(_c: Cx<'_>, _fd: i32, _out: i32) -> Result<i32> {
    Ok(EBADF)
}

fn fd_prestat_dir_name(_c: Cx<'_>, _fd: i32, _p: i32, _l: i32) -> Result<i32> {
    Ok(EBADF)
}

fn environ_sizes_get(mut c: Cx<'_>, count: i32, size: i32) -> Result<i32> {
    let env = &c.data().plugin.environment;
    let n = env.len() as u32;
    let bytes: usize = env.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
    Ok(
        match (
            write_u32(&mut c, count, n),
            write_u32(&mut c, size, bytes as u32),
        ) {
            (Some(()), Some(())) => SUCCESS,
            _ => EFAULT,
        },
    )
}

fn environ_get(mut c: Cx<'_>, ptrs: i32, buf: i32) -> Result<i32> {
    let env = c.data().plugin.environment.clone();
    let mut at = buf;
    for (i, (k, v)) in env.iter().enumerate() {
        let entry = format!("{k}={v}\0");
        if write_u32(&mut c, ptrs.wrapping_add(i as i32 * 4), at as u32).is_none()
            || write(&mut c, at, entry.as_bytes()).is_none()
        {
            return Ok(EFAULT);
        }
        at = at.wrapping_add(entry.len() as i32);
    }
    Ok(SUCCESS)
}

fn args_sizes_get(mut c: Cx<'_>, count: i32, size: i32) -> Result<i32> {
    Ok(
        match (write_u32(&mut c, count, 0), write_u32(&mut c, size, 0)) {
            (Some(()), Some(())) => SUCCESS,
            _ => EFAULT,
        },
    )
}

fn args_get(_c: Cx<'_>, _p: i32, _b: i32) -> Result<i32> {
    Ok(SUCCESS)
}

fn clock_time_get(mut c: Cx<'_>, id: i32, _precision: i64, out: i32) -> Result<i32> {
    let s = c.data();
    let t = match id {
        0 => s.now_ns(),
        1 => s.elapsed_ns,
        _ => return Ok(EINVAL),
    };
    Ok(if write_u64(&mut c, out, t).is_some() {
        SUCCESS
    } else {
        EFAULT
    })
}

fn clock_res_get(mut c: Cx<'_>, _id: i32, out: i32) -> Result<i32> {
    Ok(if write_u64(&mut c, out, 1).is_some() {
        SUCCESS
    } else {
        EFAULT
    })
}

fn random_get(mut c: Cx<'_>, buf: i32, len: i32) -> Result<i32> {
    let len = len as u32 as usize;
    if len > 64 * 1024 {
        return Ok(EINVAL);
    }
    let mut bytes = Vec::with_capacity(len + 8);
    while bytes.len() < len {
        let r = c.data_mut().next_random();
        bytes.extend_from_slice(&r.to_le_bytes());
    }
    bytes.truncate(len);
    Ok(if write(&mut c, buf, &bytes).is_some() {
        SUCCESS
    } else {
        EFAULT
    })
}

fn sched_yield(_c: Cx<'_>) -> Result<i32> {
    Ok(SUCCESS)
}

fn poll_oneoff(_c: Cx<'_>, _i: i32, _o: i32, _n: i32, _out: i32) -> Result<i32> {
    Ok(ENOSYS)
}

fn proc_exit(mut c: Cx<'_>, code: i32) -> Result<()> {
    // Envoy only logs; the guest's own `unreachable` then traps. Trap here
    // with the code so the failure says what happened.
    c.data_mut()
        .log(LogLevel::Error, format!("wasi proc_exit({code})"));
    Err(wasmtime::format_err!("guest called proc_exit({code})"))
}
