//! One test per Envoy AI Gateway / Envoy behaviour the module follows,
//! named for it and citing its difference (P1-P7 of `sim/peers-source.md`
//! §9.2) and scenario (T8.1 …). Where Envoy draws at random, the test
//! counts over many draws.

use super::*;
use crate::fleet::{Answer, Params};
use crate::policy::bench::{profile, Bench};

fn gpu(name: &str) -> Params {
    let mut p = crate::fleet::test_gpu(4);
    p.name = name.into();
    p.tier = Tier::InHouse;
    p
}

fn api(name: &str) -> Params {
    let mut p = gpu(name);
    p.tier = Tier::Payg;
    p.slots = None;
    p.api_limits = Some((1_000_000, 1_000_000_000));
    p
}

/// A bench with 4,000 requests of one profile.
fn bench(params: Vec<Params>) -> Bench {
    let profiles = vec![profile("m", "public", "interactive")];
    Bench::new(params, profiles, std::iter::repeat_n(0, 4000))
}

impl Bench {
    fn gateway(&self, seed: u64) -> PriorityGateway {
        PriorityGateway::new(vec![true; self.up.len()], seed)
    }
}

fn answer(status: u16) -> Answer {
    Answer::failed(status)
}

/// Eject `d` (one 5xx is enough under EAIG's guide) at `now`.
fn eject(g: &mut PriorityGateway, d: usize, now: u64) {
    g.outliers[d].record(now, true);
    assert!(g.outliers[d].ejected(now));
}

#[test]
fn p1_t8_1_a_busy_gpu_keeps_its_load() {
    let b = bench(vec![gpu("g"), api("a")]);
    let mut g = b.gateway(1);
    // Far past the server's 4 slots: every request still goes to it.
    for r in 0..40 {
        assert_eq!(g.route(&b.world(0), r), Route::To(0), "request {r}");
    }
    assert_eq!(g.in_flight[0], 40);
}

#[test]
fn p1_the_clusters_circuit_breaker_overflows_locally_not_to_the_next_priority() {
    let b = bench(vec![gpu("g"), api("a")]);
    let mut g = b.gateway(1);
    for r in 0..MAX_REQUESTS {
        assert_eq!(g.route(&b.world(0), r), Route::To(0));
    }
    assert_eq!(g.route(&b.world(0), MAX_REQUESTS), Route::Refuse(503));
    assert_eq!(g.in_flight[1], 0, "nothing spilled to the API");
    // One ends: room again.
    g.done(&b.world(1), 0, 0, true);
    assert_eq!(g.route(&b.world(1), MAX_REQUESTS + 1), Route::To(0));
}

#[test]
fn p2_t8_5_load_spills_by_health_with_the_overprovisioning_factor() {
    let b = bench(vec![gpu("g1"), gpu("g2"), gpu("g3"), gpu("g4"), api("a")]);
    let hosts: Vec<usize> = (0..5).collect();
    let mut g = b.gateway(1);
    let w = b.world(0);
    assert_eq!(g.priority_load(&w, &hosts, [false; LEVELS]).0[0], 100);
    // One of four ejected: 75 % x 1.4 = 105, capped at 100.
    eject(&mut g, 0, 0);
    assert_eq!(g.priority_load(&w, &hosts, [false; LEVELS]).0[0], 100);
    // Two of four: 50 % x 1.4 = 70 on P0, 30 on pay-as-you-go.
    eject(&mut g, 1, 0);
    let (load, panic) = g.priority_load(&w, &hosts, [false; LEVELS]);
    assert_eq!((load[0], load[Tier::Payg.position()]), (70, 30));
    assert!(!panic[0], "at 50 % a level is not in panic");
    let mut on_api = 0;
    for r in 0..2000 {
        if g.pick(&w, r, &[]) == Some(4) {
            on_api += 1;
        }
    }
    assert!((500..700).contains(&on_api), "about 30 %: {on_api}");
}

#[test]
fn p6_t8_4_an_ejected_gpu_sends_everything_to_the_next_priority_then_returns() {
    let b = bench(vec![gpu("g"), api("a")]);
    let mut g = b.gateway(1);
    let r = g.route(&b.world(0), 0);
    assert_eq!(r, Route::To(0));
    let next = g.answered(&b.world(10), &Answered::new(0, 0, &answer(500), 0, &[0]));
    // Ejected after one 5xx for 5 s (to the next 2 s tick).
    assert_eq!(g.outliers[0].ejected_until, 6_000);
    match next {
        Next::Retry { route, .. } => assert_eq!(route, Route::To(1)),
        other => panic!("retried: {other:?}"),
    }
    for r in 1..50 {
        assert_eq!(g.route(&b.world(3_000), r), Route::To(1));
    }
    assert_eq!(g.route(&b.world(6_000), 50), Route::To(0), "back after 5 s");
    // A second ejection soon after lasts twice as long.
    g.answered(
        &b.world(6_100),
        &Answered::new(50, 0, &answer(500), 0, &[0]),
    );
    assert_eq!(
        g.outliers[0].ejected_until,
        16_100_u64.div_ceil(2_000) * 2_000
    );
}

#[test]
fn p6_any_other_answer_resets_the_5xx_count_and_the_multiplier_decays() {
    let mut o = Outlier::default();
    o.record(0, true);
    assert_eq!(o.ejections, 1);
    let back = o.ejected_until;
    // 40 s healthy: 20 intervals take the count back to zero.
    o.record(back + 40_000, true);
    assert_eq!(o.ejections, 1, "decayed, then this ejection");
    let mut o = Outlier {
        consecutive_5xx: 3,
        ..Outlier::default()
    };
    o.record(0, false);
    assert_eq!(o.consecutive_5xx, 0, "a non-5xx resets the count");
    // Capped at max_ejection_time.
    let mut o = Outlier {
        ejections: 100,
        ..Outlier::default()
    };
    o.record(0, true);
    assert_eq!(o.ejected_until, MAX_EJECTION_MS);
}

#[test]
fn p7_with_every_host_ejected_the_first_priority_takes_the_load_in_panic() {
    let b = bench(vec![gpu("g"), api("a")]);
    let mut g = b.gateway(1);
    eject(&mut g, 0, 0);
    eject(&mut g, 1, 0);
    let (load, panic) = g.priority_load(&b.world(0), &[0, 1], [false; LEVELS]);
    assert_eq!(load[0], 100);
    assert!(panic[0]);
    assert_eq!(g.route(&b.world(0), 0), Route::To(0), "Envoy still sends");
}

#[test]
fn p3_t8_3_a_429_is_not_retried_under_eaigs_example_policy() {
    let b = bench(vec![gpu("g"), api("a")]);
    let mut g = b.gateway(1);
    g.route(&b.world(0), 0);
    assert_eq!(
        g.answered(&b.world(5), &Answered::new(0, 0, &answer(429), 0, &[0])),
        Next::Deliver
    );
    assert!(!g.outliers[0].ejected(5), "a 429 is not a 5xx");
    // A refused connection (the fleet's 503) and a 500 are.
    for status in [500, 503] {
        let mut g = b.gateway(1);
        g.route(&b.world(0), 0);
        assert!(matches!(
            g.answered(&b.world(5), &Answered::new(0, 0, &answer(status), 0, &[0])),
            Next::Retry { .. }
        ));
    }
}

#[test]
fn p3_up_to_five_retries() {
    let b = bench(vec![gpu("g"), api("a")]);
    let mut g = b.gateway(1);
    g.route(&b.world(0), 0);
    let tried = [0, 1];
    for n in 0..NUM_RETRIES {
        assert!(
            matches!(
                g.answered(&b.world(10), &Answered::new(0, 1, &answer(500), n, &tried)),
                Next::Retry { .. }
            ),
            "retry {n}"
        );
    }
    assert_eq!(
        g.answered(
            &b.world(10),
            &Answered::new(0, 1, &answer(500), NUM_RETRIES, &tried)
        ),
        Next::Deliver
    );
}

#[test]
fn p4_t8_2_a_retry_moves_to_the_next_priority_even_with_healthy_hosts_left() {
    // Two GPU servers at P0: after one attempt there, P0 is excluded.
    let b = bench(vec![gpu("g1"), gpu("g2"), api("a")]);
    let mut moved = 0;
    for seed in 0..200 {
        let mut g = b.gateway(seed);
        let Route::To(first) = g.route(&b.world(0), 0) else {
            panic!("routed")
        };
        // A 503 (refused connection) ejects only the host that failed.
        if let Next::Retry {
            route: Route::To(d),
            ..
        } = g.answered(
            &b.world(5),
            &Answered::new(0, first, &answer(503), 0, &[first]),
        ) {
            if d == 2 {
                moved += 1;
            }
        }
    }
    assert_eq!(moved, 200, "previous_priorities: the API every time");
}

#[test]
fn p4_exclusions_reset_when_no_healthy_priority_is_left() {
    let b = bench(vec![gpu("g"), api("a")]);
    let g = b.gateway(1);
    let mut excluded = [false; LEVELS];
    excluded[0] = true;
    excluded[Tier::Payg.position()] = true;
    let (load, _) = g.priority_load(&b.world(0), &[0, 1], excluded);
    assert_eq!(load[0], 100, "both tried: back to the original load");
}

#[test]
fn p5_the_back_off_is_fully_jittered_and_grows() {
    let mut rng = Rng::new(3);
    for n in 1..=8u32 {
        let ceiling = (BACKOFF_BASE_MS * ((1 << n) - 1)).min(BACKOFF_MAX_MS);
        let draws: Vec<u64> = (0..2000).map(|_| backoff_ms(&mut rng, n)).collect();
        assert!(draws.iter().all(|d| *d < ceiling.max(1)), "retry {n}");
        let mean = draws.iter().sum::<u64>() as f64 / draws.len() as f64;
        let want = ceiling as f64 / 2.0;
        assert!(
            (mean - want).abs() < want * 0.1,
            "retry {n}: {mean} vs {want}"
        );
    }
}

#[test]
fn the_same_seed_makes_the_same_choices() {
    let b = bench(vec![gpu("g1"), gpu("g2"), api("a")]);
    let run = |seed| {
        let mut g = b.gateway(seed);
        (0..200)
            .map(|r| g.route(&b.world(0), r))
            .collect::<Vec<_>>()
    };
    assert_eq!(run(4), run(4));
}
