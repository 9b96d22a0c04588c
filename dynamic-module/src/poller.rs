//! The control poller: a bootstrap extension (`envoy.bootstrap.dynamic_modules`)
//! in the same shared library as the filter, that fetches the control
//! service's snapshot through an Envoy cluster once per interval and
//! [`published`] it for every fleet to read.
//!
//! Why a bootstrap extension, not the filter: Envoy 1.40 gives a bootstrap
//! extension a main-thread timer and HTTP callouts, one of each per Envoy.
//! So there is exactly one poll per interval however many workers run,
//! with no lease to win (the Wasm filter's CAS in shared data), and no poll
//! ever rides on a request's worker or waits on one. The HTTP filter's
//! callouts exist only inside a stream, and its `config_scheduled` events
//! fire per worker configuration: neither gives one poller per Envoy.
//! The fleets read what this publishes in the same process
//! ([`published`]: an atomic generation per request).
//!
//! Configuration (the extension's `extension_config`, a `StringValue`):
//! `{"control": {...}}`, the same object as the plugin configuration's
//! `control` (`cluster`, `authority`, `path`, `interval_ms`, `timeout_ms`,
//! `stale_after_ms`, `token`), validated the same way; a bad one is refused
//! with a log line naming the field, and Envoy refuses to start. The
//! filter's configuration carries the same object: the filter only reads
//! it (staleness), this extension polls.
//!
//! Envoy holds all traffic until a bootstrap extension signals that it is
//! initialized; this one signals at once, in `config_new`: traffic never
//! waits for the control service.
//!
//! Per firing of its timer: every fleet catches up with what was
//! published and ages its snapshot, then the `ace.control.age_ms` gauge
//! (the oldest fleet's time since the service was last heard by its
//! configuration, or since polling began) and `ace.control.stale` (1 while
//! any fleet's snapshot is stale); with no fleet that has a `control`
//! object, both follow the transport alone (the last 200 or 304). Then a
//! poll unless one is in flight, with `If-None-Match` the ETag of the last
//! snapshot received. The poller only moves bytes
//! ([`ace_flow::control::Poller`] has the transport's steps): a 200's body
//! is published (a new one counted by `ace.control.snapshots`; the same
//! bytes as the last one again are published as "not modified" for them),
//! a 304 is published as "not modified" for the ETag sent, and each fleet
//! feeds both to its own configuration's consumer
//! ([`ace_flow::control::Consumer`], which has the rules: a rejected
//! snapshot, or a 304 for one, is not hearing). A failed poll or any other
//! status is an error: counted (`ace.control.errors`) and logged once per
//! distinct problem, until an answer comes again; each snapshot a fleet
//! rejects is counted there once too. Counter `ace.control.polls` counts
//! polls sent.

use crate::published::{self, Published};
use ace_config::Control;
use ace_dynamic_abi::bootstrap::{self, CalloutResult, Response, Timer};
use ace_dynamic_abi::{EnvoyBuffer, EnvoyHeader, ModulePtr};
use ace_flow::control::{self, Answered, Reply, Transport};
use std::cell::RefCell;
use std::ffi::c_void;
use std::rc::Rc;
use std::sync::Arc;

pub use ace_flow::control::Metric;

/// What the poller needs of Envoy (and of the process's [`published`]
/// slot and fleets), so that its steps run without either in tests.
pub trait Host: Transport {
    /// Set a gauge.
    fn gauge(&mut self, metric: Metric, value: u64);
    /// Publish a delivery for the fleets.
    fn publish(&mut self, delivery: Published);
    /// Bring every fleet up to `now_ms`: the oldest age among those with a
    /// `control` object and whether any is stale (`None`: no such fleet),
    /// and how many snapshots they refused for the first time since the
    /// last call.
    fn fleets(&mut self, now_ms: u64) -> (Option<(u64, bool)>, u64);
}

/// The poller's state, host-free.
#[derive(Debug)]
pub struct Poller {
    poll: control::Poller,
    /// When polling began (the age counts from here until first heard).
    started_ms: u64,
    /// When the service last answered (a 200 or a 304; 0: never), for the
    /// gauges when no fleet reads the control service.
    answered_ms: u64,
    /// The ETag of the last snapshot published, so that a service that
    /// ignores `If-None-Match` does not make every fleet decode the same
    /// bytes again.
    published: Option<String>,
}

impl Poller {
    /// A poller for `control`, starting at `now_ms`.
    pub fn new(control: Control, now_ms: u64) -> Poller {
        Poller {
            poll: control::Poller::new(control),
            started_ms: now_ms,
            answered_ms: 0,
            published: None,
        }
    }

    /// The settings.
    pub fn control(&self) -> &Control {
        self.poll.control()
    }

    /// The poll in flight, if any.
    pub fn pending(&self) -> Option<u64> {
        self.poll.pending()
    }

    /// The last problem logged (cleared when a poll succeeds).
    pub fn problem(&self) -> Option<&str> {
        self.poll.problem()
    }

    /// The timer fired at `now_ms`: catch the fleets up, set the age
    /// gauges, and poll unless a poll is in flight.
    pub fn tick(&mut self, host: &mut impl Host, now_ms: u64) {
        let (fleets, refused) = host.fleets(now_ms);
        if refused > 0 {
            host.count(Metric::Errors, refused);
        }
        let (age, stale) = fleets.unwrap_or_else(|| {
            let age = now_ms.saturating_sub(self.answered_ms.max(self.started_ms));
            (age, age > self.control().stale_after_ms)
        });
        host.gauge(Metric::AgeMs, age);
        host.gauge(Metric::Stale, u64::from(stale));
        let etag = self.published.clone();
        self.poll.poll(host, etag.as_deref(), now_ms);
    }

    /// Poll `id` ended with `reply` at `now_ms` (a reply to anything but
    /// the poll in flight is ignored): publish what it brought.
    pub fn done(&mut self, host: &mut impl Host, id: u64, reply: Reply, now_ms: u64) {
        let delivery = match self.poll.answer(host, id, reply) {
            None => return,
            Some(Answered::Unchanged(etag)) => Published::Unchanged(etag, now_ms),
            Some(Answered::Snapshot(bytes)) => {
                let tag = ace_snapshot::etag(&bytes);
                match tag {
                    Some(tag) if self.published.as_deref() == Some(tag.as_str()) => {
                        Published::Unchanged(tag, now_ms)
                    }
                    tag => {
                        self.published = tag;
                        host.count(Metric::Snapshots, 1);
                        Published::Snapshot(Arc::new(bytes), now_ms)
                    }
                }
            }
        };
        self.answered_ms = self.answered_ms.max(now_ms);
        host.publish(delivery);
    }
}

/// The extension as Envoy holds it (its configuration and its one
/// extension share it): Envoy's handle, metric ids, and the poller.
#[derive(Debug)]
struct Extension {
    envoy: bootstrap::Config,
    /// Envoy's id per [`Metric::ALL`] entry; `None` if Envoy refused it.
    metrics: Vec<Option<usize>>,
    state: RefCell<State>,
}

#[derive(Debug)]
struct State {
    poller: Poller,
    /// Created when the server is initialized; dropped (deleted) at
    /// shutdown.
    timer: Option<Timer>,
}

/// The Envoy side of [`Host`].
struct Envoy<'a> {
    envoy: bootstrap::Config,
    metrics: &'a [Option<usize>],
}

impl Envoy<'_> {
    fn id(&self, metric: Metric) -> Option<usize> {
        let i = Metric::ALL.iter().position(|m| *m == metric)?;
        self.metrics.get(i).copied().flatten()
    }
}

impl Transport for Envoy<'_> {
    fn send(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        timeout_ms: u64,
    ) -> Result<u64, String> {
        // Envoy's callout wants `host`; `:authority` is the same header to
        // Envoy, but send the one it checks for.
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|&(k, v)| {
                if k == ":authority" {
                    ("host", v)
                } else {
                    (k, v)
                }
            })
            .collect();
        self.envoy
            .http_callout(cluster, &headers, timeout_ms)
            .map_err(|e| e.to_string())
    }

    fn count(&mut self, metric: Metric, n: u64) {
        if let Some(id) = self.id(metric) {
            self.envoy.increment_counter(id, n);
        }
    }
}

impl Host for Envoy<'_> {
    fn gauge(&mut self, metric: Metric, value: u64) {
        if let Some(id) = self.id(metric) {
            self.envoy.set_gauge(id, value);
        }
    }

    fn publish(&mut self, delivery: Published) {
        published::publish(delivery);
    }

    fn fleets(&mut self, now_ms: u64) -> (Option<(u64, bool)>, u64) {
        let worst = crate::fleet::catch_up_all(now_ms);
        (worst, published::take_refused())
    }
}

impl Extension {
    /// Run `f` on the poller with the Envoy host. Nothing happens if the
    /// state is in use: Envoy can call `http_callout_done` from inside the
    /// callout call itself (a local reply), for a poll the poller has not
    /// recorded yet, and it then reports the callout as not created.
    fn with(&self, f: impl FnOnce(&mut State, &mut Envoy<'_>)) {
        let Ok(mut state) = self.state.try_borrow_mut() else {
            return;
        };
        let mut host = Envoy {
            envoy: self.envoy,
            metrics: &self.metrics,
        };
        f(&mut state, &mut host);
    }

    /// Poll (perhaps) and arm the timer for the next interval.
    fn tick(&self) {
        self.with(|state, host| {
            state.poller.tick(host, crate::now_ms());
            if let Some(timer) = &state.timer {
                timer.enable(state.poller.control().interval_ms);
            }
        });
    }
}

/// The extension behind Envoy's pointer.
fn extension<'a>(p: ModulePtr) -> Option<&'a Extension> {
    // SAFETY: a live `Rc<Extension>` from `config_new` or `new`, released
    // only by the matching destroy hook; every hook runs on the main thread.
    unsafe { p.cast::<Extension>().as_ref() }
}

/// A bootstrap extension's configuration: `{"control": {...}}`. Null
/// refuses it (Envoy then refuses to start).
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_config_new(
    envoy: bootstrap::Config,
    _name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> ModulePtr {
    // `envoy` lives until `config_destroy`, which drops the extension that
    // holds it.
    // Traffic never waits for the control service.
    envoy.signal_init_complete();
    // SAFETY: Envoy's buffer, valid during this hook.
    let bytes = unsafe { config.bytes() };
    let control = match Control::parse_poller(bytes) {
        Ok(c) => c,
        Err(e) => {
            log::error!("refusing the control poller's configuration: {e}");
            return std::ptr::null();
        }
    };
    // Envoy freezes metric creation after this hook: define them all now.
    let metrics = Metric::ALL
        .iter()
        .map(|m| {
            let defined = if m.is_counter() {
                envoy.define_counter(m.name())
            } else {
                envoy.define_gauge(m.name())
            };
            defined
                .map_err(|code| log::warn!("cannot define {} (Envoy's code {code})", m.name()))
                .ok()
        })
        .collect();
    log::info!(
        "control poller: GET {} through cluster `{}` every {} ms (timeout {} ms, stale after {} ms)",
        control.path,
        control.cluster,
        control.interval_ms,
        control.timeout_ms,
        control.stale_after_ms
    );
    let extension = Extension {
        envoy,
        metrics,
        state: RefCell::new(State {
            poller: Poller::new(control, crate::now_ms()),
            timer: None,
        }),
    };
    Rc::into_raw(Rc::new(extension)).cast()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_config_destroy(config: ModulePtr) {
    if !config.is_null() {
        // SAFETY: made by `Rc::into_raw` in `config_new`, released once.
        drop(unsafe { Rc::from_raw(config.cast::<Extension>()) });
    }
}

/// The extension: the configuration's poller, shared.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_new(
    config: ModulePtr,
    _envoy: *mut c_void,
) -> ModulePtr {
    if config.is_null() {
        return std::ptr::null();
    }
    // SAFETY: a live `Rc<Extension>` from `config_new`; cloned, not taken.
    let borrowed = unsafe { std::mem::ManuallyDrop::new(Rc::from_raw(config.cast::<Extension>())) };
    Rc::into_raw(Rc::clone(&borrowed)).cast()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_destroy(extension: ModulePtr) {
    if !extension.is_null() {
        // SAFETY: made by `Rc::into_raw` in `new`, released once.
        drop(unsafe { Rc::from_raw(extension.cast::<Extension>()) });
    }
}

/// The clusters exist now: start the timer and poll at once.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_server_initialized(
    _envoy: *mut c_void,
    extension_ptr: ModulePtr,
) {
    let Some(ext) = extension(extension_ptr) else {
        return;
    };
    let timer = ext.envoy.timer();
    if timer.is_none() {
        log::error!("control poller: Envoy gave no timer; the control service is not polled");
    }
    if let Ok(mut state) = ext.state.try_borrow_mut() {
        state.timer = timer;
    }
    ext.tick();
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_timer_fired(
    _envoy: *mut c_void,
    config: ModulePtr,
    _timer: *mut c_void,
) {
    if let Some(ext) = extension(config) {
        ext.tick();
    }
}

// Envoy's hook: it alone calls it, with its own pointers.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_http_callout_done(
    _envoy: *mut c_void,
    config: ModulePtr,
    callout_id: u64,
    result: u32,
    headers: *const EnvoyHeader,
    headers_len: usize,
    body: *const EnvoyBuffer,
    body_len: usize,
) {
    let Some(ext) = extension(config) else {
        return;
    };
    let reply = match CalloutResult::of(result) {
        CalloutResult::Success => {
            // SAFETY: the arguments of this hook, read before it returns.
            let response = unsafe { Response::from_raw(headers, headers_len, body, body_len) };
            let status = response
                .header(":status")
                .and_then(|s| std::str::from_utf8(s).ok())
                .and_then(|s| s.parse().ok());
            // Only a snapshot's body is worth copying.
            let body = if status == Some(200) {
                response.body().fold(Vec::new(), |mut all, chunk| {
                    all.extend_from_slice(chunk);
                    all
                })
            } else {
                Vec::new()
            };
            Reply::Answer { status, body }
        }
        failed => Reply::Failed(failed.to_string()),
    };
    ext.with(|state, host| state.poller.done(host, callout_id, reply, crate::now_ms()));
}

/// Envoy is exiting: stop polling, then let it go on.
// Envoy's hook: it alone calls it, with its own pointers.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_shutdown(
    _envoy: *mut c_void,
    extension_ptr: ModulePtr,
    completion: Option<unsafe extern "C" fn(*mut c_void)>,
    context: *mut c_void,
) {
    if let Some(ext) = extension(extension_ptr) {
        if let Ok(mut state) = ext.state.try_borrow_mut() {
            state.timer = None;
        }
    }
    if let Some(done) = completion {
        // SAFETY: Envoy's completion callback with its context, called
        // once, as Envoy requires before it exits.
        unsafe { done(context) }
    }
}

// The bootstrap hooks Envoy 1.40 requires that the poller does not use.
ace_dynamic_abi::unused_bootstrap_hooks!();

#[cfg(test)]
mod tests {
    use super::*;
    use ace_snapshot::{Drain, DrainReason, Report, Snapshot};

    #[derive(Default)]
    struct Fake {
        sent: Vec<Vec<(String, String)>>,
        refuse: Option<String>,
        counted: Vec<(Metric, u64)>,
        gauges: Vec<(Metric, u64)>,
        published: Vec<Published>,
        /// What the fleets report.
        fleets: Option<(u64, bool)>,
        refused: u64,
    }

    impl Transport for Fake {
        fn send(&mut self, _: &str, headers: &[(&str, &str)], _: u64) -> Result<u64, String> {
            if let Some(why) = &self.refuse {
                return Err(why.clone());
            }
            let h = headers.iter().map(|(k, v)| (k.to_string(), v.to_string()));
            self.sent.push(h.collect());
            Ok(self.sent.len() as u64)
        }
        fn count(&mut self, metric: Metric, n: u64) {
            self.counted.push((metric, n));
        }
    }

    impl Host for Fake {
        fn gauge(&mut self, metric: Metric, value: u64) {
            self.gauges.push((metric, value));
        }
        fn publish(&mut self, delivery: Published) {
            self.published.push(delivery);
        }
        fn fleets(&mut self, _: u64) -> (Option<(u64, bool)>, u64) {
            (self.fleets, std::mem::take(&mut self.refused))
        }
    }

    impl Fake {
        fn count_of(&self, metric: Metric) -> u64 {
            self.counted
                .iter()
                .filter(|(m, _)| *m == metric)
                .map(|(_, n)| n)
                .sum()
        }
        fn last_gauge(&self, metric: Metric) -> Option<u64> {
            self.gauges
                .iter()
                .rev()
                .find(|(m, _)| *m == metric)
                .map(|(_, v)| *v)
        }
        fn snapshots(&self) -> usize {
            let new = |p: &&Published| matches!(p, Published::Snapshot(..));
            self.published.iter().filter(new).count()
        }
    }

    fn poller() -> Poller {
        let control =
            Control::parse_poller(br#"{"control":{"cluster":"ace_control","interval_ms":500,"stale_after_ms":1500,"token":"t"}}"#)
                .unwrap();
        Poller::new(control, 1_000)
    }

    fn snapshot(version: u64) -> Vec<u8> {
        let mut r = Report {
            name: "cheap".into(),
            ..Report::default()
        };
        r.drain = Some(Drain {
            until_ms: 9,
            reason: DrainReason::Operator,
        });
        ace_snapshot::encode(&Snapshot {
            version,
            generated_ms: 0,
            reports: vec![r],
            budgets: Vec::new(),
        })
        .unwrap()
    }

    fn ok(body: Vec<u8>) -> Reply {
        Reply::Answer {
            status: Some(200),
            body,
        }
    }

    fn not_modified() -> Reply {
        Reply::Answer {
            status: Some(304),
            body: vec![],
        }
    }

    #[test]
    fn one_poll_in_flight_and_the_etag_comes_back() {
        let (mut p, mut h) = (poller(), Fake::default());
        p.tick(&mut h, 1_000);
        p.tick(&mut h, 1_500);
        assert_eq!(h.sent.len(), 1, "no second poll while one is in flight");
        let first = &h.sent[0];
        assert!(first.contains(&(":authority".into(), "ace_control".into())));
        assert!(first.contains(&("authorization".into(), "Bearer t".into())));
        assert!(!first.iter().any(|(k, _)| k == "if-none-match"));
        p.done(&mut h, 1, ok(snapshot(1)), 1_600);
        assert_eq!(h.snapshots(), 1);
        assert_eq!(h.count_of(Metric::Snapshots), 1);
        p.tick(&mut h, 2_000);
        let tag = ace_snapshot::etag(&snapshot(1)).unwrap();
        assert!(h.sent[1].contains(&("if-none-match".into(), tag.clone())));
        p.done(&mut h, 2, not_modified(), 2_100);
        assert_eq!(
            h.published.last(),
            Some(&Published::Unchanged(tag, 2_100)),
            "a 304 is published for the ETag sent"
        );
        assert_eq!(h.snapshots(), 1, "a 304 publishes no snapshot");
        assert_eq!(h.count_of(Metric::Polls), 2);
        assert_eq!(h.count_of(Metric::Errors), 0);
    }

    #[test]
    fn the_same_bytes_again_are_published_as_unchanged() {
        let (mut p, mut h) = (poller(), Fake::default());
        p.tick(&mut h, 1_000);
        p.done(&mut h, 1, ok(snapshot(1)), 1_100);
        p.tick(&mut h, 1_500);
        p.done(&mut h, 2, ok(snapshot(1)), 1_600);
        assert_eq!(h.snapshots(), 1);
        let tag = ace_snapshot::etag(&snapshot(1)).unwrap();
        assert_eq!(h.published.last(), Some(&Published::Unchanged(tag, 1_600)));
        p.tick(&mut h, 2_000);
        p.done(&mut h, 3, ok(snapshot(2)), 2_100);
        assert_eq!(h.snapshots(), 2, "a new version is published");
    }

    #[test]
    fn a_lasting_problem_is_counted_each_time_and_logged_once() {
        let (mut p, mut h) = (poller(), Fake::default());
        for (i, at) in [1_000u64, 1_500, 2_000].iter().enumerate() {
            p.tick(&mut h, *at);
            let reply = Reply::Answer {
                status: Some(503),
                body: vec![],
            };
            p.done(&mut h, i as u64 + 1, reply, at + 10);
        }
        assert_eq!(h.count_of(Metric::Errors), 3);
        let problem = p.problem().unwrap().to_string();
        assert!(
            problem.contains("503") && problem.contains("ace_control"),
            "{problem}"
        );
        assert!(h.published.is_empty());
        // Bytes that do not decode are moved like any: the fleets reject
        // them, and their first rejections are counted on the next tick.
        p.tick(&mut h, 2_500);
        p.done(&mut h, 4, ok(b"garbage".to_vec()), 2_510);
        assert_eq!(p.problem(), None, "the next problem is news again");
        h.refused = 2;
        p.tick(&mut h, 3_000);
        assert_eq!(h.count_of(Metric::Errors), 5);
    }

    #[test]
    fn age_and_staleness_gauges_follow_the_fleets_or_else_the_last_answer() {
        let (mut p, mut h) = (poller(), Fake::default());
        p.tick(&mut h, 1_000);
        assert_eq!(h.last_gauge(Metric::AgeMs), Some(0));
        p.done(
            &mut h,
            1,
            Reply::Failed("the stream was reset".into()),
            1_100,
        );
        p.tick(&mut h, 2_600);
        assert_eq!(h.last_gauge(Metric::AgeMs), Some(1_600));
        assert_eq!(h.last_gauge(Metric::Stale), Some(1));
        p.done(&mut h, 2, ok(snapshot(1)), 2_700);
        p.tick(&mut h, 3_000);
        assert_eq!(h.last_gauge(Metric::AgeMs), Some(300));
        assert_eq!(h.last_gauge(Metric::Stale), Some(0));
        // A fleet that rejected everything since is stale, whatever came.
        h.fleets = Some((2_000, true));
        p.tick(&mut h, 3_500);
        assert_eq!(h.last_gauge(Metric::AgeMs), Some(2_000));
        assert_eq!(h.last_gauge(Metric::Stale), Some(1));
    }

    #[test]
    fn a_poll_that_cannot_be_sent_or_never_returns_is_not_waited_on() {
        let (mut p, mut h) = (poller(), Fake::default());
        h.refuse = Some("no such cluster in Envoy's configuration".into());
        p.tick(&mut h, 1_000);
        assert_eq!(p.pending(), None);
        assert!(p.problem().unwrap().contains("no such cluster"));
        h.refuse = None;
        p.tick(&mut h, 1_500);
        assert_eq!(p.pending(), Some(1));
        p.done(&mut h, 7, ok(snapshot(1)), 1_600);
        assert_eq!(p.pending(), Some(1), "another id's answer is ignored");
        p.tick(&mut h, 2_400);
        assert_eq!(h.sent.len(), 1, "within timeout and an interval: wait");
        p.tick(&mut h, 2_600);
        assert_eq!(h.sent.len(), 2, "given up, polled again");
    }
}
