//! One test (or more) per LiteLLM 1.109.3 behaviour the module follows,
//! named for the behaviour and citing its difference (D1-D20 of
//! `sim/peers-source.md` §9.1) and scenario (T1.1 …). Where the source
//! draws at random, the test counts over many seeds or draws.

use super::*;
use crate::fleet::{Answer, Params};
use crate::policy::bench::{profile, Bench};

/// A GPU server `name` of `slots` serving `models`, priced `price` per
/// token each way.
fn gpu(name: &str, slots: u32, models: &[&str], price: f64) -> Params {
    let mut p = crate::fleet::test_gpu(slots);
    p.name = name.into();
    p.models = models.iter().map(|m| m.to_string()).collect();
    p.warm = p.models.clone();
    p.cost.tier = Tier::InHouse;
    p.cost.usd_per_input_token = price;
    p.cost.usd_per_output_token = price;
    p
}

/// An API `name` with `rpm` requests a minute serving `models`.
fn api(name: &str, rpm: u32, models: &[&str], price: f64) -> Params {
    let mut p = gpu(name, 1, models, price);
    p.tier = Tier::Payg;
    p.cost.tier = Tier::Payg;
    p.slots = None;
    p.api_limits = Some((rpm, 1_000_000_000));
    p
}

/// A bench with a request of each profile.
fn bench(params: Vec<Params>, profiles: Vec<Profile>) -> Bench {
    let n = profiles.len() as u32;
    Bench::new(params, profiles, 0..n)
}

impl Bench {
    fn router(&self, s: Strategy, classes: &[&[&str]], seed: u64) -> LiteLlm {
        self.router_as(s, Variant::Default, classes, seed)
    }

    fn router_as(&self, s: Strategy, v: Variant, classes: &[&[&str]], seed: u64) -> LiteLlm {
        LiteLlm::new(
            s,
            v,
            &Setup {
                up: &self.up,
                listed: vec![true; self.up.len()],
                profiles: &self.profiles,
                classes: classes
                    .iter()
                    .map(|c| c.iter().map(|m| m.to_string()).collect())
                    .collect(),
                cost_factors: BTreeMap::new(),
            },
            seed,
        )
    }
}

fn ok(first_ms: u64) -> Answer {
    Answer {
        status: 200,
        first_ms,
        done_ms: first_ms + 100,
        retry_after_s: None,
        cold: false,
        overage: false,
        cached: 0,
    }
}

fn fail(status: u16) -> Answer {
    Answer::failed(status)
}

fn fail_after(status: u16, retry_after_s: u32) -> Answer {
    Answer {
        retry_after_s: Some(retry_after_s),
        ..Answer::failed(status)
    }
}

/// What the client of one request saw: every attempt (time, destination),
/// every wait, and the end (`Ok(dest)` served, `Err(status)`).
#[derive(Debug, Default)]
struct Trace {
    attempts: Vec<(u64, usize)>,
    waits: Vec<u64>,
    end: Option<Result<usize, u16>>,
}

/// Run request `r` from `t0` to its end, each destination answering as
/// `answer` says (a 2xx is over `done_ms` later, and the request with it).
fn drive(
    b: &Bench,
    l: &mut LiteLlm,
    r: u32,
    t0: u64,
    mut answer: impl FnMut(usize) -> Answer,
) -> Trace {
    let mut t = Trace::default();
    let mut now = t0;
    let mut route = l.route(&b.world(now), r);
    loop {
        match route {
            Route::To(d) => {
                t.attempts.push((now, d));
                let a = answer(d);
                now += a.first_ms;
                let next = l.answered(&b.world(now), &Answered::new(r, d, &a, 0, &[]));
                if (200..300).contains(&a.status) {
                    now += a.done_ms - a.first_ms;
                    l.done(&b.world(now), r, d, true);
                    t.end = Some(Ok(d));
                    return t;
                }
                match next {
                    Next::Deliver => {
                        l.finished_without_service(&b.world(now), r);
                        t.end = Some(Err(a.status));
                        return t;
                    }
                    Next::Retry { route: x, .. } => route = x,
                }
            }
            Route::Wait(ms) => {
                t.waits.push(ms);
                now += ms;
                route = l.resume(&b.world(now), r);
            }
            Route::Refuse(s) => {
                l.finished_without_service(&b.world(now), r);
                t.end = Some(Err(s));
                return t;
            }
        }
    }
}

/// The deployment of group `model` on destination `dest`.
fn dep(l: &LiteLlm, model: &str, dest: usize) -> usize {
    let g = l.group_of[model];
    l.deps
        .iter()
        .position(|x| x.group == g && x.dest as usize == dest)
        .unwrap_or_else(|| panic!("no deployment of {model} on {dest}"))
}

/// Start request `r` on a provider and leave it in flight: its
/// destination.
fn hold(b: &Bench, l: &mut LiteLlm, r: u32, now: u64) -> Route {
    l.route(&b.world(now), r)
}

fn two(strategy: Strategy, rpm: (u32, u32)) -> (Bench, LiteLlm) {
    let b = bench(
        vec![api("a", rpm.0, &["m"], 1e-6), api("b", rpm.1, &["m"], 1e-6)],
        vec![profile("m", "public", "interactive"); 8],
    );
    let l = b.router(strategy, &[], 1);
    (b, l)
}

// ---------------------------------------------------------------- D1

#[test]
fn d1_deployments_are_per_model_group_and_destination() {
    // One server serving m1 and m2, and a second server, so each group has
    // two deployments: a 429 cools m1's deployment on `s`, not m2's.
    let b = bench(
        vec![
            gpu("s", 8, &["m1", "m2"], 1e-7),
            gpu("u", 8, &["m1", "m2"], 2e-7),
        ],
        vec![
            profile("m1", "public", "interactive"),
            profile("m2", "public", "interactive"),
        ],
    );
    let mut l = b.router(Strategy::CostBased, &[], 1);
    assert_eq!(l.deps.len(), 4, "(m1, s), (m2, s), (m1, u), (m2, u)");
    let t = drive(
        &b,
        &mut l,
        0,
        0,
        |d| if d == 0 { fail(429) } else { ok(10) },
    );
    assert_eq!(t.attempts, vec![(0, 0), (0, 1)], "{t:?}");
    assert!(l.deps[dep(&l, "m1", 0)].cooling(0));
    assert!(
        !l.deps[dep(&l, "m2", 0)].cooling(0),
        "m2 on `s` is not cooled"
    );
    assert_eq!(drive(&b, &mut l, 1, 0, |_| ok(10)).attempts, vec![(0, 0)]);
}

// ---------------------------------------------------------------- D2, D19

#[test]
fn d2_t1_1_a_full_slot_is_the_routers_own_429_then_an_instant_re_pick() {
    // Cost-based always picks the cheaper A; A's one slot is held, so every
    // call gets the router's 429 at once: no cool-down, no failure count,
    // three calls at t+0, then the error (no fallbacks). B is never tried:
    // the slot is not a filter.
    let b = bench(
        vec![gpu("a", 1, &["m"], 1e-7), gpu("b", 1, &["m"], 2e-7)],
        vec![profile("m", "public", "interactive"); 2],
    );
    let mut l = b.router(Strategy::CostBased, &[], 1);
    assert_eq!(hold(&b, &mut l, 0, 0), Route::To(0));
    let t = drive(&b, &mut l, 1, 0, |_| panic!("no provider call"));
    assert_eq!((t.end, t.waits.len()), (Some(Err(429)), 0), "{t:?}");
    let a = &l.deps[0];
    assert_eq!((a.cooling(0), a.fails.get(0), a.in_flight), (false, 0, 1));
    assert_eq!(l.flights.len(), 1, "only the held request is in the router");
}

#[test]
fn d2_t1_1_simple_shuffle_re_picks_after_a_full_slot_across_seeds() {
    // A (1 slot, held) and B, equal weights: each call picks A with
    // probability 1/2 and gets a 429 at t+0; all three calls on A (1/8)
    // end in the 429.
    let mut refused = 0;
    let n = 2000;
    for seed in 0..n {
        let b = bench(
            vec![gpu("a", 1, &["m"], 0.0), gpu("b", 1, &["m"], 0.0)],
            vec![profile("m", "public", "interactive"); 2],
        );
        let mut l = b.router(Strategy::SimpleShuffle, &[], seed);
        // Hold A.
        l.flights.insert(
            0,
            Flight {
                dep: Some(0),
                ..Flight::default()
            },
        );
        l.deps[0].in_flight = 1;
        let t = drive(&b, &mut l, 1, 0, |_| ok(5));
        assert!(t.waits.is_empty());
        match t.end {
            Some(Ok(1)) => assert_eq!(t.attempts, vec![(0, 1)]),
            Some(Err(429)) => refused += 1,
            e => panic!("{e:?}"),
        }
        assert!(!l.deps[0].cooling(0) && l.deps[0].fails.get(0) == 0);
    }
    let f = f64::from(refused) / n as f64;
    assert!((0.10..0.15).contains(&f), "1/8 refused: {f}");
}

#[test]
fn d2_t1_2_rpm_alone_is_a_concurrency_cap() {
    // `calculate_max_parallel_requests`: an API with only rpm=2 admits two
    // calls in flight; the third is the router's 429, the provider never
    // called, and a single-deployment group backs off 0.5 s + U(0, 0.75).
    let b = bench(
        vec![api("a", 2, &["m"], 1e-6)],
        vec![profile("m", "public", "interactive"); 3],
    );
    let mut l = b.router(Strategy::SimpleShuffle, &[], 1);
    assert_eq!(l.deps[0].max_parallel, Some(2));
    assert_eq!(hold(&b, &mut l, 0, 0), Route::To(0));
    assert_eq!(hold(&b, &mut l, 1, 0), Route::To(0));
    match l.route(&b.world(0), 2) {
        Route::Wait(ms) => assert!((500..=1250).contains(&ms), "{ms}"),
        r => panic!("{r:?}"),
    }
    assert_eq!(l.deps[0].in_flight, 2);
    assert_eq!(
        calculate_max_parallel_requests(None, None, Some(10_000)),
        Some(60)
    );
    assert_eq!(
        calculate_max_parallel_requests(None, None, Some(1)),
        Some(1)
    );
    assert_eq!(
        calculate_max_parallel_requests(Some(4), Some(9), None),
        Some(4)
    );
    assert_eq!(calculate_max_parallel_requests(None, None, None), None);
}

// ---------------------------------------------------------------- D12

#[test]
fn d12_t1_3_t5_1a_simple_shuffle_weighs_by_rpm_and_never_filters_on_usage() {
    // A rpm 100 (already 100 successes this minute, booked everywhere),
    // B rpm 300, C a GPU with no rpm: C weighs 0, A keeps a quarter.
    let b = bench(
        vec![
            api("a", 100, &["m"], 1e-6),
            api("b", 300, &["m"], 1e-6),
            gpu("c", 64, &["m"], 1e-7),
        ],
        vec![profile("m", "public", "interactive"); 1],
    );
    let mut l = b.router(Strategy::SimpleShuffle, &[], 3);
    for _ in 0..100 {
        l.deps[0].successes.incr(0);
        l.deps[0].v2.book(0, 1, 150);
        l.deps[0].cost_minute.book(0, 1, 150);
        l.deps[0].latency_minute.book(0, 1, 150);
    }
    let mut count = [0usize; 3];
    for _ in 0..4000 {
        if let Route::To(d) = l.route(&b.world(1000), 0) {
            count[d] += 1;
        }
        l.finished_without_service(&b.world(1000), 0);
    }
    assert_eq!(count[2], 0, "{count:?}");
    let a = count[0] as f64 / 4000.0;
    assert!((0.22..0.28).contains(&a), "{count:?}");
}

#[test]
fn d12_t5_1b_weight_beats_rpm_and_t5_1c_uniform_without_either() {
    let (b, mut l) = two(Strategy::SimpleShuffle, (1000, 10));
    l.deps[0].weight = Some(1.0);
    l.deps[1].weight = Some(3.0);
    let mut to_b = 0;
    for _ in 0..4000 {
        if l.route(&b.world(0), 0) == Route::To(1) {
            to_b += 1;
        }
        l.finished_without_service(&b.world(0), 0);
    }
    assert!((2850..3150).contains(&to_b), "{to_b}");
    let b = bench(
        vec![gpu("a", 4, &["m"], 0.0), gpu("b", 4, &["m"], 0.0)],
        vec![profile("m", "public", "interactive")],
    );
    let mut l = b.router(Strategy::SimpleShuffle, &[], 5);
    let mut to_b = 0;
    for _ in 0..4000 {
        if l.route(&b.world(0), 0) == Route::To(1) {
            to_b += 1;
        }
        l.finished_without_service(&b.world(0), 0);
    }
    assert!((1850..2150).contains(&to_b), "uniform: {to_b}");
}

// ---------------------------------------------------------------- D3, D14

#[test]
fn d3_t6_1_usage_is_booked_when_the_source_books_it() {
    // v2: rpm at pre-call (kept on failure), tpm on success only, total
    // tokens; the fails counter on the failure.
    let (b, mut l) = two(Strategy::UsageBased, (100, 100));
    let t = drive(&b, &mut l, 0, 0, |_| fail(500));
    let d = t.attempts[0].1;
    let x = &l.deps[d];
    assert!(x.v2.at(0).0 >= 1 && x.v2.at(0).1 == 0, "{:?}", x.v2);
    assert!(x.fails.get(0) >= 1);
    let (b, mut l) = two(Strategy::UsageBased, (100, 100));
    let t = drive(&b, &mut l, 0, 0, |_| ok(10));
    let x = &l.deps[t.attempts[0].1];
    assert_eq!(x.v2.at(200), (1, 150), "prompt + output, on success");
    assert_eq!((x.successes.get(200), x.busy, x.in_flight), (1, 0, 0));
}

#[test]
fn d14_t5_4a_b_usage_based_v2_picks_the_lowest_tokens_within_its_limits() {
    let (b, mut l) = two(Strategy::UsageBased, (100, 100));
    l.deps[0].v2.book(0, 0, 500);
    l.deps[1].v2.book(0, 0, 100);
    assert_eq!(l.route(&b.world(0), 0), Route::To(1));
    l.finished_without_service(&b.world(0), 0);
    // rpm 3 with 2 booked: out at selection (2 + 1 >= 3).
    let (b, mut l) = two(Strategy::UsageBased, (3, 100));
    l.deps[0].v2.book(0, 2, 0);
    l.deps[1].v2.book(0, 0, 1000);
    assert_eq!(l.route(&b.world(0), 0), Route::To(1));
}

#[test]
fn d14_usage_based_v2_ties_are_random() {
    let (b, mut l) = two(Strategy::UsageBased, (1_000_000, 1_000_000));
    let mut to_b = 0;
    for _ in 0..2000 {
        if l.route(&b.world(0), 0) == Route::To(1) {
            to_b += 1;
        }
        l.finished_without_service(&b.world(0), 0);
        // The pick booked an rpm; undo it so the tie stays.
        l.deps[0].v2 = PerMinute::default();
        l.deps[1].v2 = PerMinute::default();
        l.deps[0].in_flight = 0;
        l.deps[1].in_flight = 0;
        l.deps[0].busy = 0;
        l.deps[1].busy = 0;
    }
    assert!((900..1100).contains(&to_b), "{to_b}");
}

#[test]
fn d14_t5_4c_usage_based_v2_pre_call_books_rpm_or_answers_429_and_cools() {
    let (_, mut l) = two(Strategy::UsageBased, (2, 1_000_000));
    assert_eq!(l.pre_call(0, 0), Ok(()));
    assert_eq!(l.deps[0].v2.at(0).0, 1);
    assert_eq!(l.pre_call(0, 0), Ok(()));
    let e = l.pre_call(0, 1000);
    assert_eq!(
        e.map_err(|f| (f.status, f.retry_after_s)),
        Err((Some(429), Some(60)))
    );
    assert_eq!(l.deps[0].v2.at(0).0, 2, "not booked over the limit");
    assert!(
        l.deps[0].cooling(5_999) && !l.deps[0].cooling(6_000),
        "5 s, not 60"
    );
}

// ---------------------------------------------------------------- D4, D5, D6

#[test]
fn d4_t4_5_the_counters_window_starts_at_its_first_event() {
    let mut w = Window::default();
    w.incr(10_000);
    w.incr(69_000);
    assert_eq!(w.get(69_999), 2);
    assert_eq!(w.get(70_000), 0, "60 s after the first event");
    w.incr(71_000);
    assert_eq!((w.get(71_000), w.get(130_999), w.get(131_000)), (1, 1, 0));
}

/// Group {A, B}; A's deployment after `seq` (S success, F failure with
/// `status`) at t = 1 s each.
fn after(seq: &str, status: u16, group: &[&str]) -> (LiteLlm, Vec<bool>) {
    let params = group.iter().map(|n| gpu(n, 8, &["m"], 1e-7)).collect();
    let b = bench(params, vec![profile("m", "public", "interactive")]);
    let mut l = b.router(Strategy::CostBased, &[], 1);
    let mut cooled = Vec::new();
    for (i, c) in seq.chars().enumerate() {
        let now = 1000 * i as u64;
        if c == 'S' {
            l.deps[0].successes.incr(now);
        } else {
            l.deps[0].fails.incr(now);
            l.cool(0, now, status, COOLDOWN_MS);
            cooled.push(l.deps[0].cooling(now));
        }
    }
    (l, cooled)
}

#[test]
fn d5_t4_4_the_50_percent_rule_needs_5_completions_and_a_larger_group() {
    let (_, cooled) = after("SSFFF", 500, &["a", "b"]);
    assert_eq!(cooled, vec![false, false, true], "1/3, 2/4, then 3/5");
    let (_, cooled) = after("FFFFF", 500, &["a", "b"]);
    assert_eq!(cooled, vec![false, false, false, false, true]);
    let (_, cooled) = after("FFFFFFFF", 500, &["a"]);
    assert!(cooled.iter().all(|c| !c), "single-deployment group");
}

#[test]
fn d5_t4_1_t4_3_a_429_cools_only_a_deployment_of_a_larger_group() {
    let (l, cooled) = after("F", 429, &["a", "b"]);
    assert_eq!(cooled, vec![true]);
    assert!(l.deps[0].cooling(4_999) && !l.deps[0].cooling(5_000));
    let (_, cooled) = after("FFF", 429, &["a"]);
    assert_eq!(cooled, vec![false; 3]);
}

#[test]
fn d5_t4_6_4xx_cool_only_as_the_source_says() {
    for (status, multi, single) in [
        (400, false, false),
        (403, false, false),
        (422, false, false),
        (401, true, true),
        (404, true, true),
        (402, true, false),
    ] {
        assert_eq!(
            after("F", status, &["a", "b"]).1,
            vec![multi],
            "{status} multi"
        );
        assert_eq!(
            after("F", status, &["a"]).1,
            vec![single],
            "{status} single"
        );
    }
}

#[test]
fn d5_t4_7_connection_errors_are_counted_and_never_cooled() {
    let (b, mut l) = two(Strategy::CostBased, (100, 100));
    for r in 0..6 {
        drive(&b, &mut l, r, 0, |_| fail(503));
    }
    assert!(l.deps[0].fails.get(0) >= 5, "{:?}", l.deps[0].fails);
    assert!(!l.deps[0].cooling(0) && !l.deps[1].cooling(0));
}

#[test]
fn d6_t4_2_cooldown_lasts_retry_after_else_5_s_and_0_is_none() {
    let (b, mut l) = two(Strategy::CostBased, (100, 100));
    drive(&b, &mut l, 0, 0, |d| {
        if d == 0 {
            fail_after(429, 30)
        } else {
            ok(5)
        }
    });
    assert!(l.deps[0].cooling(29_999) && !l.deps[0].cooling(30_000));
    let (b, mut l) = two(Strategy::CostBased, (100, 100));
    drive(&b, &mut l, 0, 0, |d| {
        if d == 0 {
            fail_after(429, 0)
        } else {
            ok(5)
        }
    });
    assert!(!l.deps[0].cooling(0), "retry-after 0: no cool-down");
    // Not extended while in force.
    let (_, _) = (b, l);
    let (mut l, _) = after("F", 429, &["a", "b"]);
    l.cool(0, 4_000, 429, 60_000);
    assert!(!l.deps[0].cooling(5_000), "the first TTL is kept");
}

// ---------------------------------------------------------------- D7, D8

#[test]
fn d7_t2_1_a_retry_re_picks_and_may_hit_the_same_deployment() {
    let mut same = 0;
    let n = 2000;
    for seed in 0..n {
        let b = bench(
            vec![api("a", 100, &["m"], 1e-6), api("b", 100, &["m"], 1e-6)],
            vec![profile("m", "public", "interactive")],
        );
        let mut l = b.router(Strategy::SimpleShuffle, &[], seed);
        let mut first = true;
        let t = drive(&b, &mut l, 0, 0, |_| {
            if std::mem::take(&mut first) {
                fail(500)
            } else {
                ok(5)
            }
        });
        assert_eq!(t.attempts.len(), 2);
        assert_eq!(t.attempts[1].0, t.attempts[0].0, "sleep 0");
        if t.attempts[0].1 == t.attempts[1].1 {
            same += 1;
        }
    }
    let f = f64::from(same) / n as f64;
    assert!((0.45..0.55).contains(&f), "{f}");
}

#[test]
fn d7_t2_2_a_cooled_deployment_is_not_re_picked() {
    for seed in 0..50 {
        let b = bench(
            vec![api("a", 100, &["m"], 1e-6), api("b", 100, &["m"], 1e-6)],
            vec![profile("m", "public", "interactive")],
        );
        let mut l = b.router(Strategy::SimpleShuffle, &[], seed);
        let t = drive(&b, &mut l, 0, 0, |d| if d == 0 { fail(429) } else { ok(5) });
        assert_eq!(t.end, Some(Ok(1)));
        assert!(t.attempts.len() <= 2 && t.waits.is_empty(), "{t:?}");
    }
}

#[test]
fn d8_t2_3_t4_3_a_single_deployment_backs_off_by_retry_after_and_sleeps_after_the_last() {
    let b = bench(
        vec![api("a", 100, &["m"], 1e-6)],
        vec![profile("m", "public", "interactive")],
    );
    let mut l = b.router(Strategy::SimpleShuffle, &[], 1);
    let t = drive(&b, &mut l, 0, 0, |_| fail_after(429, 3));
    assert_eq!(t.attempts.len(), 3, "{t:?}");
    assert_eq!(t.waits.len(), 3, "a sleep after the last retry: {t:?}");
    assert!(t.waits.iter().all(|w| (3000..=3750).contains(w)), "{t:?}");
    assert!(!l.deps[0].cooling(0), "never cooled");
    assert_eq!(t.end, Some(Err(429)));
}

#[test]
fn d8_t2_4_without_a_header_the_back_off_doubles_with_jitter() {
    let mut sums = [0u64; 3];
    let n = 400;
    for seed in 0..n {
        let b = bench(
            vec![gpu("a", 8, &["m"], 1e-7)],
            vec![profile("m", "public", "interactive")],
        );
        let mut l = b.router(Strategy::SimpleShuffle, &[], seed);
        let t = drive(&b, &mut l, 0, 0, |_| fail(500));
        assert_eq!(t.waits.len(), 3);
        for (i, (w, base)) in t.waits.iter().zip([500, 1000, 2000]).enumerate() {
            assert!((base..=base + 750).contains(w), "{t:?}");
            sums[i] += w - base;
        }
    }
    for s in sums {
        let mean = s as f64 / n as f64;
        assert!(
            (330.0..420.0).contains(&mean),
            "jitter U(0, 0.75 s): {mean}"
        );
    }
}

#[test]
fn d8_d10_t2_6_with_no_healthy_deployment_the_request_falls_back_at_once() {
    let b = bench(
        vec![
            api("a", 100, &["m"], 1e-6),
            api("b", 100, &["m"], 1e-6),
            api("c", 100, &["n"], 1e-6),
        ],
        vec![profile("m", "public", "interactive")],
    );
    let mut l = b.router(Strategy::SimpleShuffle, &[&["m", "n"]], 1);
    l.deps[0].cooldown_until = 10_000;
    l.deps[1].cooldown_until = 10_000;
    let t = drive(&b, &mut l, 0, 0, |_| ok(5));
    assert_eq!(
        (t.attempts.clone(), t.waits.len()),
        (vec![(0, 2)], 0),
        "{t:?}"
    );
    assert_eq!(l.served_model(0), None, "over");
    let mut l = b.router(Strategy::SimpleShuffle, &[], 1);
    l.deps[0].cooldown_until = 10_000;
    l.deps[1].cooldown_until = 10_000;
    let t = drive(&b, &mut l, 0, 0, |_| ok(5));
    assert_eq!(t.end, Some(Err(429)), "no fallbacks: the router's 429");
}

// ---------------------------------------------------------------- D9, D11

#[test]
fn d9_t2_5_t3_2_a_non_retryable_status_skips_retries_but_falls_back() {
    let b = bench(
        vec![api("a", 100, &["big"], 1e-6), api("b", 100, &["mid"], 1e-6)],
        vec![profile("big", "public", "interactive")],
    );
    let mut l = b.router(Strategy::SimpleShuffle, &[&["big", "mid"]], 1);
    let t = drive(&b, &mut l, 0, 0, |d| if d == 0 { fail(400) } else { ok(5) });
    assert_eq!(t.attempts, vec![(0, 0), (0, 1)], "{t:?}");
    let t = drive(&b, &mut l, 0, 0, |d| if d == 0 { fail(404) } else { ok(5) });
    assert_eq!(t.attempts, vec![(0, 0), (0, 1)]);
    assert!(l.deps[0].cooling(0), "404 cools at once, single or not");
}

#[test]
fn d9_408_409_and_401_on_a_larger_group_are_retried() {
    assert!(should_retry(408) && should_retry(409) && should_retry(429) && should_retry(500));
    assert!(!should_retry(400) && !should_retry(401) && !should_retry(404));
    let f = |s| Failure::router(s);
    assert!(should_retry_this_error(f(408), 1, 1));
    assert!(should_retry_this_error(f(401), 2, 2));
    assert!(!should_retry_this_error(f(401), 1, 1));
    assert!(
        !should_retry_this_error(f(500), 0, 2),
        "no healthy deployment"
    );
    // A 401 on a larger group: retried, the refuser skipped.
    let (b, mut l) = two(Strategy::CostBased, (100, 100));
    let t = drive(&b, &mut l, 0, 0, |d| if d == 0 { fail(401) } else { ok(5) });
    assert_eq!(t.attempts, vec![(0, 0), (0, 1)], "{t:?}");
}

#[test]
fn d11_t3_1_fallbacks_in_order_each_with_full_retries() {
    let b = bench(
        vec![
            api("b1", 100, &["big"], 1e-6),
            api("b2", 100, &["big"], 1e-6),
            api("m1", 100, &["mid"], 1e-6),
            api("m2", 100, &["mid"], 1e-6),
            api("s1", 100, &["small"], 1e-6),
            api("s2", 100, &["small"], 1e-6),
        ],
        vec![profile("big", "public", "interactive")],
    );
    let mut l = b.router(Strategy::SimpleShuffle, &[&["big", "mid", "small"]], 1);
    let t = drive(&b, &mut l, 0, 0, |d| if d < 4 { fail(500) } else { ok(5) });
    let dests: Vec<usize> = t.attempts.iter().map(|a| a.1).collect();
    assert_eq!(dests.len(), 7, "{t:?}");
    assert!(dests[..3].iter().all(|d| *d < 2) && dests[3..6].iter().all(|d| (2..4).contains(d)));
    assert!(t.attempts.iter().all(|a| a.0 == 0) && t.waits.is_empty());
    assert_eq!(t.end.and_then(Result::ok).map(|d| d >= 4), Some(true));
}

#[test]
fn d11_nested_fallbacks_skip_attempted_groups_and_stop_at_max_depth() {
    // a → [b], b → [a, c] (nested), c → [d], …: depth-first, a once.
    let models = ["a", "b", "c", "d", "e", "f", "g", "h"];
    let params = models
        .iter()
        .map(|m| api(m, 100, &[m], 1e-6))
        .collect::<Vec<_>>();
    let b = bench(params, vec![profile("a", "public", "interactive")]);
    let chain: Vec<[&str; 2]> = models.windows(2).map(|w| [w[0], w[1]]).collect();
    let classes: Vec<&[&str]> = chain.iter().map(|c| c.as_slice()).collect();
    let mut l = b.router(Strategy::SimpleShuffle, &classes, 1);
    let t = drive(&b, &mut l, 0, 0, |_| fail(500));
    let groups: Vec<usize> = t.attempts.iter().map(|a| a.1).collect();
    // a, then 5 nested hops (b … f), 3 calls each; g is past max_fallbacks.
    assert_eq!(groups.len(), 18, "{groups:?}");
    assert_eq!(groups.iter().max(), Some(&5));
}

// ---------------------------------------------------------------- D13

#[test]
fn d13_t5_2_least_busy_counts_per_group_ties_to_the_first() {
    let b = bench(
        vec![
            gpu("a", 8, &["m1", "m2"], 0.0),
            gpu("b", 8, &["m1", "m2"], 0.0),
        ],
        vec![
            profile("m1", "public", "interactive"),
            profile("m2", "public", "interactive"),
            profile("m1", "public", "interactive"),
            profile("m1", "public", "interactive"),
        ],
    );
    let mut l = b.router(Strategy::LeastBusy, &[], 1);
    // T5.2c: a tie goes to the first.
    assert_eq!(hold(&b, &mut l, 0, 0), Route::To(0));
    // T5.2b: m2's count is its own: a tie again, the first.
    assert_eq!(hold(&b, &mut l, 1, 0), Route::To(0));
    // T5.2a: A has 1 of m1, B 0.
    assert_eq!(hold(&b, &mut l, 2, 0), Route::To(1));
    assert_eq!(hold(&b, &mut l, 3, 0), Route::To(0));
}

// ---------------------------------------------------------------- D15

fn latency_bench() -> (Bench, LiteLlm) {
    let b = bench(
        vec![api("a", 100, &["m"], 1e-6), api("b", 100, &["m"], 1e-6)],
        vec![
            profile("m", "public", "interactive"),
            profile("m", "public", "batch"),
        ],
    );
    let l = b.router(Strategy::LatencyBased, &[], 1);
    (b, l)
}

#[test]
fn d15_t5_3a_b_c_latency_untried_first_streams_by_ttft_last_ten() {
    let (b, mut l) = latency_bench();
    l.deps[1].ttft.extend([0.25]);
    assert_eq!(l.route(&b.world(0), 0), Route::To(0), "untried: 0");
    l.finished_without_service(&b.world(0), 0);
    l.deps[0].ttft.extend([0.2, 0.4]);
    assert_eq!(l.route(&b.world(0), 0), Route::To(1), "0.25 < 0.3");
    l.finished_without_service(&b.world(0), 0);
    let mut v = VecDeque::new();
    push_sample(&mut v, 5.0);
    for _ in 0..10 {
        push_sample(&mut v, 0.1);
    }
    let x = Dep {
        ttft: v,
        ..Dep::default()
    };
    assert!((latency_of(&x, true) - 0.1).abs() < 1e-12);
}

#[test]
fn d15_samples_are_written_at_success_ttft_for_streams_per_token_otherwise() {
    let (b, mut l) = latency_bench();
    // A stream: TTFT 0.2 s written when the response ends, not before.
    let d = match l.route(&b.world(0), 0) {
        Route::To(d) => d as u32,
        r => panic!("{r:?}"),
    };
    l.answered(
        &b.world(200),
        &Answered::new(0, d as usize, &ok(200), 0, &[]),
    );
    assert!(l.deps[d as usize].ttft.is_empty(), "nothing at first byte");
    l.done(&b.world(1200), 0, d as usize, true);
    assert_eq!(l.deps[d as usize].ttft, [0.2]);
    assert_eq!(l.deps[d as usize].latency, [1.2 / 50.0]);
    // Not a stream: no TTFT sample.
    let d = match l.route(&b.world(2000), 1) {
        Route::To(d) => d,
        r => panic!("{r:?}"),
    };
    l.answered(&b.world(2100), &Answered::new(1, d, &ok(100), 0, &[]));
    l.done(&b.world(3000), 1, d, true);
    assert!(l.deps[d].ttft.len() <= 1);
}

#[test]
fn d15_t5_3d_e_f_buffer_timeout_penalty_rpm_filter_and_random_ties() {
    let (b, mut l) = latency_bench();
    l.deps[0].latency.extend([1.0]);
    l.deps[1].latency.extend([1.4]);
    let count = |l: &mut LiteLlm| {
        let mut to_b = 0;
        for _ in 0..2000 {
            if l.route(&b.world(0), 1) == Route::To(1) {
                to_b += 1;
            }
            l.finished_without_service(&b.world(0), 1);
        }
        to_b
    };
    assert_eq!(count(&mut l), 0, "buffer 0: only the lowest");
    l.latency_buffer = 0.5;
    let to_b = count(&mut l);
    assert!((900..1100).contains(&to_b), "buffer 0.5: both, {to_b}");
    // T5.3e: a timeout adds 1000 s to a non-stream's mean.
    let (b, mut l) = latency_bench();
    let t = drive(&b, &mut l, 1, 0, |d| if d == 0 { fail(408) } else { ok(5) });
    assert_eq!(t.attempts[0].1, 0);
    assert!(l.deps[0].latency.contains(&TIMEOUT_PENALTY_S));
    // T5.3f: rpm 2 with 2 successes this minute: out.
    let (b, mut l) = latency_bench();
    l.deps[0].rpm = Some(2);
    l.deps[0].latency_minute.book(0, 2, 0);
    assert_eq!(l.route(&b.world(0), 0), Route::To(1));
    l.finished_without_service(&b.world(0), 0);
    // Random among equals (both untried).
    let (_, mut l) = latency_bench();
    let to_b = count(&mut l);
    assert!((900..1100).contains(&to_b), "{to_b}");
}

#[test]
fn d15_the_latency_map_expires_an_hour_after_it_was_created() {
    let (b, mut l) = latency_bench();
    drive(&b, &mut l, 0, 0, |_| ok(300));
    assert!(!l.deps.iter().all(|x| x.ttft.is_empty()));
    l.expire_maps(0, 399 + LATENCY_MAP_TTL_MS);
    assert!(
        !l.deps.iter().all(|x| x.ttft.is_empty()),
        "created at the success, t = 400 ms"
    );
    l.expire_maps(0, 400 + LATENCY_MAP_TTL_MS);
    assert!(l
        .deps
        .iter()
        .all(|x| x.ttft.is_empty() && x.latency.is_empty()));
}

// ---------------------------------------------------------------- D16

#[test]
fn d16_t5_5_cost_based_reads_a_zero_price_as_unset() {
    // T5.5a.
    let b = bench(
        vec![
            api("a", 100, &["m"], 1.5e-6),
            api("b", 100, &["m"], 0.75e-6),
        ],
        vec![profile("m", "public", "interactive")],
    );
    let mut l = b.router(Strategy::CostBased, &[], 1);
    assert_eq!(l.route(&b.world(0), 0), Route::To(1));
    l.finished_without_service(&b.world(0), 0);
    // T5.5b: A priced 0 costs 5.0 + 5.0.
    let b = bench(
        vec![gpu("a", 8, &["m"], 0.0), api("b", 100, &["m"], 1e-6)],
        vec![profile("m", "public", "interactive")],
    );
    let mut l = b.router(Strategy::CostBased, &[], 1);
    assert_eq!(l.deps[0].price, 2.0 * UNSET_PRICE);
    assert_eq!(l.route(&b.world(0), 0), Route::To(1));
    l.finished_without_service(&b.world(0), 0);
    // T5.5c: a tie goes to the first success; T5.5d: rpm on successes.
    let (b, mut l) = two(Strategy::CostBased, (100, 1));
    assert_eq!(l.route(&b.world(0), 0), Route::To(0), "candidate order");
    l.finished_without_service(&b.world(0), 0);
    l.groups[0].cost_order = vec![1, 0];
    l.groups[0].cost_map_at = Some(0);
    assert_eq!(l.route(&b.world(0), 0), Route::To(1), "first success");
    l.finished_without_service(&b.world(0), 0);
    l.deps[1].cost_minute.book(0, 1, 0);
    assert_eq!(l.route(&b.world(0), 0), Route::To(0), "B's rpm is used");
}

// ---------------------------------------------------------------- D17

#[test]
fn d17_t7_2_residency_keeps_eu_personal_data_on_eu_deployments() {
    let mut eu = api("eu", 100, &["m"], 2e-6);
    eu.eu = true;
    let b = bench(
        vec![api("us", 100, &["m"], 1e-6), eu],
        vec![
            profile("m", "personal_eu", "interactive"),
            profile("m", "public", "interactive"),
        ],
    );
    let mut l = b.router(Strategy::CostBased, &[], 1);
    assert_eq!(l.route(&b.world(0), 0), Route::To(1));
    assert_eq!(l.route(&b.world(0), 1), Route::To(0));
}

// ---------------------------------------------------------------- D20, determinism

#[test]
fn d20_strategies_carry_litellms_names() {
    let names: Vec<&str> = Strategy::ALL.iter().map(|s| s.litellm_name()).collect();
    assert_eq!(
        names,
        [
            "simple-shuffle",
            "least-busy",
            "usage-based-routing-v2",
            "latency-based-routing",
            "cost-based-routing"
        ]
    );
    assert_eq!(
        Variant::OPERATOR.map(|v| v.name(Strategy::CostBased)),
        [
            "litellm-cost-based-knee",
            "litellm-cost-based-compliant",
            "litellm-cost-based-team-alias",
            "litellm-cost-based-team-alias-split",
            "litellm-cost-based-order",
            "litellm-cost-based-order-split"
        ]
    );
}

#[test]
fn the_same_seed_makes_the_same_choices() {
    let run = |seed| {
        let (b, mut l) = two(Strategy::SimpleShuffle, (100, 100));
        l.rng = Rng::fork(seed, "simple-shuffle");
        (0..200)
            .map(|_| {
                let r = l.route(&b.world(0), 0);
                l.finished_without_service(&b.world(0), 0);
                r
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(run(3), run(3));
    assert_ne!(run(3), run(4));
}

// ---------------------------------------------------------------- variants

#[test]
fn the_knee_variant_caps_gpu_deployments_at_their_knee() {
    let b = bench(
        vec![gpu("a", 10, &["m"], 1e-7), api("b", 100, &["m"], 1e-6)],
        vec![profile("m", "public", "interactive")],
    );
    let l = b.router_as(Strategy::CostBased, Variant::KneeCap, &[], 1);
    assert_eq!(
        (l.deps[0].max_parallel, l.deps[1].max_parallel),
        (Some(8), Some(100))
    );
}

#[test]
fn the_split_variants_share_a_servers_knee_among_its_deployments() {
    let b = bench(
        vec![
            gpu("a", 10, &["m", "n"], 1e-7),
            gpu("c", 10, &["m"], 1e-7),
            api("b", 100, &["m", "n"], 1e-6),
        ],
        vec![profile("m", "public", "interactive")],
    );
    let caps = |v| {
        let l = b.router_as(Strategy::CostBased, v, &[], 1);
        l.deps.iter().map(|d| d.max_parallel).collect::<Vec<_>>()
    };
    // Server a holds two models: 8 each under the plain knee cap (16 in
    // all, past its knee), 4 each split; c and the API as they were.
    assert_eq!(
        caps(Variant::Order),
        [Some(8), Some(8), Some(8), Some(100), Some(100)]
    );
    for v in [Variant::OrderSplit, Variant::TeamAliasSplit] {
        assert_eq!(caps(v), [Some(4), Some(4), Some(8), Some(100), Some(100)]);
    }
}

#[test]
fn the_compliant_variant_routes_only_where_the_tables_allow() {
    // Two destinations; the profile's tables allow only the second, and
    // no substitute at all.
    let mut p = profile("m", "public", "interactive");
    p.feasible = vec![0b10];
    let b = bench(
        vec![
            api("a", 100, &["m", "n"], 1e-7),
            api("b", 100, &["m"], 1e-6),
        ],
        vec![p],
    );
    let mut l = b.router_as(Strategy::CostBased, Variant::Compliant, &[&["m", "n"]], 1);
    assert_eq!(
        l.route(&b.world(0), 0),
        Route::To(1),
        "the cheaper A is not tagged"
    );
    l.finished_without_service(&b.world(0), 0);
    let t = drive(&b, &mut l, 0, 0, |_| fail(500));
    assert!(
        t.attempts.iter().all(|a| a.1 == 1),
        "the fallback group n has no tagged deployment: {t:?}"
    );
    assert_eq!(t.end, Some(Err(500)));
}

#[test]
fn the_team_alias_variant_substitutes_only_for_teams_that_may() {
    // Class [x, y]; y is on the owned server. Tenant t may be served y for
    // x; tenant u may not.
    let mut may = profile("x", "public", "interactive");
    may.substitutes = vec![("y".into(), vec![0b1])];
    let mut may_not = profile("x", "public", "interactive");
    may_not.tenant = "u".into();
    let b = bench(
        vec![gpu("owned", 8, &["y"], 1e-7), api("api", 100, &["x"], 1e-6)],
        vec![may, may_not],
    );
    let mut l = b.router_as(Strategy::CostBased, Variant::TeamAlias, &[&["x", "y"]], 1);
    assert_eq!(l.route(&b.world(0), 0), Route::To(0));
    assert_eq!(l.served_model(0), Some("y"));
    assert_eq!(l.route(&b.world(0), 1), Route::To(1));
    assert_eq!(l.served_model(1), None);
}

#[test]
fn d18_t7_1_order_keeps_the_lowest_tier_left_after_cooldowns() {
    let mut reserved = gpu("b", 8, &["m"], 1e-6);
    reserved.tier = Tier::Reserved;
    let b = bench(
        vec![
            gpu("a", 8, &["m"], 1e-5),
            reserved,
            api("c", 100, &["m"], 1e-9),
        ],
        vec![profile("m", "public", "interactive")],
    );
    let mut l = b.router_as(Strategy::CostBased, Variant::Order, &[], 1);
    assert_eq!(
        l.deps.iter().map(|d| d.order).collect::<Vec<_>>(),
        [Some(1), Some(2), Some(5)]
    );
    for _ in 0..20 {
        // The cheapest, C, is never picked while A is up.
        assert_eq!(l.route(&b.world(0), 0), Route::To(0));
        l.finished_without_service(&b.world(0), 0);
    }
    l.deps[0].cooldown_until = 5_000;
    assert_eq!(l.route(&b.world(1), 0), Route::To(1), "A cooling: B");
    l.finished_without_service(&b.world(1), 0);
    l.deps[1].cooldown_until = 5_000;
    assert_eq!(l.route(&b.world(2), 0), Route::To(2), "A and B cooling: C");
}

#[test]
fn d18_t3_4_a_failed_tier_falls_back_to_the_next_order_of_its_group() {
    let mut reserved = gpu("b", 8, &["m"], 1e-6);
    reserved.tier = Tier::Reserved;
    let b = bench(
        vec![gpu("a", 8, &["m"], 1e-6), reserved],
        vec![profile("m", "public", "interactive")],
    );
    let mut l = b.router_as(Strategy::CostBased, Variant::Order, &[], 1);
    let t = drive(&b, &mut l, 0, 0, |d| if d == 0 { fail(500) } else { ok(5) });
    let dests: Vec<usize> = t.attempts.iter().map(|a| a.1).collect();
    assert_eq!(
        dests,
        [0, 0, 0, 1],
        "three calls on A, then one hop to B: {t:?}"
    );
    assert_eq!(t.end, Some(Ok(1)));
}

#[test]
fn fallbacks_are_each_models_classmates_in_order() {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let chains = fallback_chains(&[s(&["big", "mid", "small"]), s(&["mid", "other"])]);
    assert_eq!(chains["big"], s(&["mid", "small"]));
    assert_eq!(chains["mid"], s(&["big", "small", "other"]));
    assert_eq!(chains["other"], s(&["mid"]));
    assert!(fallback_chains(&[]).is_empty());
}
