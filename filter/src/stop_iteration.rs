//! Whether Envoy lets the filter hold a request's headers while its body
//! arrives (`allow_on_headers_stop_iteration` in the Wasm filter's
//! `PluginConfig`), found out from what Envoy does, since nothing tells a
//! module.
//!
//! Reading the body (`body.read`) means answering the headers callback
//! with Pause until the body is read. Under ABI 0.2.1 Envoy turns that
//! Pause into "stop everything" unless `allow_on_headers_stop_iteration`
//! is set: the body callbacks never come, and the request hangs until a
//! timeout (the stream's idle timeout, 5 minutes by default). A module
//! cannot read the setting: Envoy 1.40's property paths expose the
//! plugin's name, root id and VM id and the request's attributes, never
//! its `PluginConfig`, and `on_configure` receives only `configuration`.
//! So the filter cannot refuse to start; it watches its first held
//! requests instead:
//!
//! - a body (or trailers) callback on a request held at its headers proves
//!   the setting is there ([`Knob::Allowed`]): the watch stops for good;
//! - a request held for [`CHECK_AFTER_MS`] for which Envoy has received
//!   body bytes (its `request.total_size` grew since the headers were held)
//!   that never reached the filter proves it is not ([`Knob::Missing`]):
//!   with the setting, Envoy hands a body chunk to the filter as it takes
//!   it. That request, every other one held then, and every later one the
//!   filter would hold are refused with 503 naming the setting, instead of
//!   hanging; the finding is logged once per worker VM.
//!
//! A client slow to send its body is never taken for the missing setting:
//! nothing of its body has reached Envoy. The wait before the check covers
//! a filter placed before ACE that hands the body on late (an external
//! processor streaming the body, say). Hosts that do not expose
//! `request.total_size` never conclude, and such requests hang as they
//! would without this watch.
//!
//! This module is host-free (the adapter makes the host calls), so that
//! its rules are tested natively.

/// How long a request is held, at its headers with no body callback,
/// before the filter asks Envoy whether body bytes arrived (ms).
pub const CHECK_AFTER_MS: u64 = 2_000;

/// How many held requests are watched at once while the setting is
/// unknown (a request past it is not watched; it is refused when another
/// one shows the setting missing, at its own headers' next hold).
pub const MAX_WATCHED: usize = 4_096;

/// What the filter knows of `allow_on_headers_stop_iteration`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Knob {
    /// No held request has shown either way yet.
    Unknown,
    /// A body arrived after a headers hold: Envoy has the setting.
    Allowed,
    /// Envoy kept a held request's body from the filter: it does not.
    Missing,
}

/// A request held at its headers, watched until its body shows up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Held {
    /// The stream's context id.
    context: u32,
    /// When its headers were held (ms).
    since_ms: u64,
    /// Envoy's `request.total_size` then, if the host gave it.
    size_then: Option<u64>,
}

/// The watch over one plugin configuration's held requests (one per VM;
/// the setting belongs to the Envoy filter configuration, which each VM's
/// plugin runs under).
#[derive(Debug)]
pub struct Watch {
    knob: Knob,
    held: Vec<Held>,
    logged: bool,
}

impl Default for Watch {
    fn default() -> Watch {
        Watch::new()
    }
}

impl Watch {
    /// A watch that knows nothing yet.
    pub fn new() -> Watch {
        Watch {
            knob: Knob::Unknown,
            held: Vec::with_capacity(64),
            logged: false,
        }
    }

    /// What is known of the setting.
    pub fn knob(&self) -> Knob {
        self.knob
    }

    /// Whether the adapter should read `request.total_size` as it holds a
    /// request's headers (only while the setting is unknown).
    pub fn wants_size(&self) -> bool {
        self.knob == Knob::Unknown && self.held.len() < MAX_WATCHED
    }

    /// Request `context`'s headers were held for its body at `now_ms`,
    /// Envoy's `request.total_size` being `size` then.
    pub fn held(&mut self, context: u32, now_ms: u64, size: Option<u64>) {
        if self.knob != Knob::Unknown || self.held.len() >= MAX_WATCHED {
            return;
        }
        self.held.push(Held {
            context,
            since_ms: now_ms,
            size_then: size,
        });
    }

    /// A body or trailers callback reached request `context`, held at its
    /// headers: Envoy has the setting. (Never after [`Knob::Missing`]:
    /// those requests are answered at their headers.)
    pub fn body_arrived(&mut self) {
        if self.knob == Knob::Unknown {
            self.knob = Knob::Allowed;
            self.held = Vec::new();
        }
    }

    /// Request `context` ended (or is no longer held).
    pub fn ended(&mut self, context: u32) {
        if let Some(i) = self.held.iter().position(|h| h.context == context) {
            self.held.swap_remove(i);
        }
    }

    /// The requests whose `request.total_size` to read at a tick at
    /// `now_ms` (then [`Watch::observed`]): held at least [`CHECK_AFTER_MS`]
    /// with a size to compare to. Into `out` (cleared first), so that a
    /// tick allocates nothing once it has run once.
    pub fn due(&self, now_ms: u64, out: &mut Vec<u32>) {
        out.clear();
        if self.knob != Knob::Unknown {
            return;
        }
        out.extend(
            self.held
                .iter()
                .filter(|h| {
                    h.size_then.is_some() && now_ms.saturating_sub(h.since_ms) >= CHECK_AFTER_MS
                })
                .map(|h| h.context),
        );
    }

    /// Request `context`'s `request.total_size` is `size` now, and no body
    /// callback reached it: if Envoy received bytes since the hold, the
    /// setting is missing. Returns whether that was concluded now.
    pub fn observed(&mut self, context: u32, size: Option<u64>) -> bool {
        if self.knob != Knob::Unknown {
            return false;
        }
        let grew = self
            .held
            .iter()
            .find(|h| h.context == context)
            .and_then(|h| h.size_then)
            .zip(size)
            .is_some_and(|(then, now)| now > then);
        if grew {
            self.knob = Knob::Missing;
        }
        grew
    }

    /// Once the setting is missing: every request still held, each to be
    /// refused (the watch forgets them).
    pub fn take_stuck(&mut self) -> Vec<u32> {
        if self.knob != Knob::Missing {
            return Vec::new();
        }
        std::mem::take(&mut self.held)
            .into_iter()
            .map(|h| h.context)
            .collect()
    }

    /// Whether the finding is still to be logged (true once).
    pub fn log_once(&mut self) -> bool {
        self.knob == Knob::Missing && !std::mem::replace(&mut self.logged, true)
    }
}

/// The refusal's message, naming the setting and where it goes.
pub const MESSAGE: &str = "the ACE filter reads request bodies (body.read) but Envoy does not \
hand them to it: set `allow_on_headers_stop_iteration: true` in the Wasm filter's PluginConfig \
(typed_config.config, beside vm_config; Envoy 1.35 or later; under Istio an EnvoyFilter, as \
envoy/istio/envoyfilter.yaml does), or turn body.read off";

/// The event's and the refusal's reason.
pub const REASON: &str = "body_not_delivered";

#[cfg(test)]
mod tests {
    use super::*;

    fn due(w: &Watch, now: u64) -> Vec<u32> {
        let mut out = Vec::new();
        w.due(now, &mut out);
        out
    }

    #[test]
    fn a_body_after_a_hold_proves_the_setting_and_ends_the_watch() {
        let mut w = Watch::new();
        w.held(7, 0, Some(100));
        w.body_arrived();
        assert_eq!(w.knob(), Knob::Allowed);
        assert!(!w.wants_size());
        w.held(8, 0, Some(100));
        assert!(due(&w, 10_000).is_empty());
        assert!(!w.observed(8, Some(500)));
        assert!(w.take_stuck().is_empty());
    }

    #[test]
    fn bytes_kept_from_a_held_request_prove_it_missing_after_the_wait() {
        let mut w = Watch::new();
        w.held(7, 1_000, Some(100));
        w.held(9, 1_500, Some(90));
        assert!(due(&w, 2_999).is_empty(), "checked before the wait");
        assert_eq!(due(&w, 3_000), vec![7]);
        assert!(w.observed(7, Some(160)));
        assert_eq!(w.knob(), Knob::Missing);
        assert!(w.log_once());
        assert!(!w.log_once(), "logged twice");
        let mut stuck = w.take_stuck();
        stuck.sort_unstable();
        assert_eq!(stuck, vec![7, 9], "every held request is refused");
        w.held(10, 4_000, Some(1));
        assert!(
            w.take_stuck().is_empty(),
            "a later one is answered at its headers"
        );
    }

    #[test]
    fn a_slow_client_or_an_unknown_size_is_never_taken_for_it() {
        let mut w = Watch::new();
        w.held(7, 0, Some(100));
        w.held(8, 0, None);
        assert_eq!(due(&w, 60_000), vec![7]);
        assert!(!w.observed(7, Some(100)), "no body bytes yet");
        assert!(!w.observed(7, None), "the host stopped answering");
        assert!(!w.observed(8, Some(1_000)), "nothing to compare to");
        assert_eq!(w.knob(), Knob::Unknown);
        w.ended(7);
        w.ended(8);
        assert!(due(&w, 60_000).is_empty());
    }

    #[test]
    fn the_watch_is_bounded() {
        let mut w = Watch::new();
        for c in 0..(MAX_WATCHED as u32 + 10) {
            w.held(c, 0, Some(1));
        }
        assert!(!w.wants_size());
        assert_eq!(due(&w, CHECK_AFTER_MS).len(), MAX_WATCHED);
    }
}
