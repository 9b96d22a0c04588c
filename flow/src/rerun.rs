//! ACE's re-run of a failed request (`retry_next`), on a host that can
//! run a request again within the same request (the dynamic module, with
//! Envoy's `recreate_stream`).
//!
//! A re-run starts from the client's request, never from the failed
//! attempt's. Envoy runs the request again from its header map as the
//! first attempt left it: what ACE wrote there for the destination that
//! failed (its path, authority, the destination header), and what the
//! router and its upstream filters added to the same map (the key Envoy's
//! `credential_injector` injects for that destination's provider), would
//! otherwise travel on to the next destination. And a filter before ACE
//! may have consumed what it verified (`jwt_authn` removes the token
//! header by default), so running it again cannot verify the request
//! again. So, before the re-run is asked for, the flow:
//!
//! 1. puts the header map back as the client sent it (as ACE first saw
//!    it, less the headers a client may not send): [`restore`];
//! 2. parks what the re-run needs and Envoy does not carry over, a
//!    [`Carry`]: the destination that failed, the body as the client sent
//!    it where ACE rewrote it for that destination, and the values read
//!    from verified sources, in the host's [`Parking`];
//! 3. marks the request with this process's token and the carry's key
//!    ([`mark`]).
//!
//! The re-run takes the carry back by its mark's key ([`key`]). A mark
//! without this process's token (a client's) is removed and ignored; a
//! mark whose carry is gone is refused rather than run on a request that
//! may no longer be the client's.

use crate::config::Config;
use crate::headers::Pairs;
use crate::host::Host;
pub use crate::parking::{Carry, Parking, PARKED};

/// The request header that marks ACE's own re-run of a request
/// (`retry_next`): this process's token and the key of the request's
/// [`Carry`]. A value without the token (a client's) is removed and
/// ignored.
pub const RETRY_HEADER: &str = "x-ace-retry";

/// The event's and `x-ace-reason`'s reason for a re-run request.
pub const RETRY_REASON: &str = "retry";

/// A random token for this process (or VM), so that clients cannot forge
/// a re-run mark and steer requests away from a destination.
fn token() -> u64 {
    static TOKEN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TOKEN.get_or_init(crate::request::random_u64)
}

/// The re-run mark for the carry kept under `key`.
pub fn mark(key: u64) -> String {
    format!("{:016x}.{key}", token())
}

/// The carry's key a re-run mark names, if the mark is ours.
pub fn key(value: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(value).ok()?;
    let (token_hex, key) = text.trim().split_once('.')?;
    if u64::from_str_radix(token_hex, 16).ok()? != token() {
        return None;
    }
    key.parse().ok()
}

/// Whether header `name` is one a client may not send (and so is never
/// put back): the destination header, the header of an attribute with a
/// verified source, the re-run mark.
fn forbidden(cfg: &Config, name: &[u8]) -> bool {
    let is = |h: &str| name.eq_ignore_ascii_case(h.as_bytes());
    is(&cfg.destination_header)
        || is(RETRY_HEADER)
        || cfg.policy.as_ref().is_some_and(|p| {
            p.attributes
                .iter()
                .any(|a| a.trusted.is_some() && is(&a.header))
        })
}

/// The values of header `name` in `pairs`, in order.
fn values<'p>(pairs: &'p Pairs, name: &'p [u8]) -> impl Iterator<Item = &'p [u8]> + 'p {
    pairs
        .iter()
        .filter(move |(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v)
}

/// Put the request's header map back as the client sent it, `original`
/// (the map as ACE first read it): every header it did not have goes
/// (pseudo-headers excepted: Envoy needs them, and they are set back),
/// and every header whose values changed gets the client's values back.
/// Headers a client may not send are never put back. False, the map
/// part-restored, when the host refused a change or a value is not text:
/// the request must not run again.
pub fn restore<H: Host>(cfg: &Config, original: &Pairs, host: &mut H) -> bool {
    let now = host.request_headers();
    for (i, (name, _)) in now.iter().enumerate() {
        let first = now
            .iter()
            .take(i)
            .all(|(k, _)| !k.eq_ignore_ascii_case(name));
        let gone = values(original, name).next().is_none() || forbidden(cfg, name);
        if first && gone && !name.starts_with(b":") {
            let Ok(name) = std::str::from_utf8(name) else {
                return false;
            };
            if !host.remove_request_header(name) {
                return false;
            }
        }
    }
    for (i, (name, _)) in original.iter().enumerate() {
        let first = original
            .iter()
            .take(i)
            .all(|(k, _)| !k.eq_ignore_ascii_case(name));
        if !first || forbidden(cfg, name) || values(original, name).eq(values(&now, name)) {
            continue;
        }
        let Ok(key) = std::str::from_utf8(name) else {
            return false;
        };
        for (n, v) in values(original, name).enumerate() {
            let Ok(v) = std::str::from_utf8(v) else {
                return false;
            };
            let done = if n == 0 {
                host.set_request_header(key, v)
            } else {
                host.add_request_header(key, v)
            };
            if !done {
                return false;
            }
        }
    }
    true
}

/// What the request's verified sources say now, by attribute index: the
/// values a re-run takes over.
pub fn verified<H: Host>(cfg: &Config, host: &mut H) -> Vec<(usize, Vec<u8>)> {
    let Some(p) = &cfg.policy else {
        return Vec::new();
    };
    p.attributes
        .iter()
        .enumerate()
        .filter_map(|(i, a)| Some((i, host.trusted(a.trusted.as_ref()?)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn carry(failed: usize) -> Box<Carry> {
        Box::new(Carry {
            failed,
            body: None,
            verified: Vec::new(),
        })
    }

    #[test]
    fn only_this_processs_mark_names_a_carry() {
        let ours = mark(2);
        assert_eq!(key(ours.as_bytes()), Some(2));
        assert_eq!(key(format!(" {ours} ").as_bytes()), Some(2));
        let forged = format!("{:016x}.2", token() ^ 1);
        assert_eq!(key(forged.as_bytes()), None);
        for junk in [
            &b""[..],
            b".",
            b"2",
            b"zz.2",
            b"\xff\xfe.1",
            ours.trim_end_matches('2').as_bytes(),
        ] {
            assert_eq!(key(junk), None, "{junk:?}");
        }
    }

    #[test]
    fn a_carry_is_taken_once_and_the_parking_is_bounded() {
        let p = Parking::new();
        let k = p.park(carry(3));
        assert_eq!(p.take(k).map(|c| c.failed), Some(3));
        assert_eq!(p.take(k), None, "taken once");
        let keys: Vec<u64> = (0..PARKED + 5).map(|i| p.park(carry(i))).collect();
        assert_eq!(p.len(), PARKED);
        assert_eq!(p.take(keys[0]), None, "the oldest went");
        assert_eq!(p.take(keys[PARKED + 4]).map(|c| c.failed), Some(PARKED + 4));
    }
}
