//! Every case ([`ace_conformance::cases`]) on every host: one test per
//! (case, host), named `<case>::<host>`.

ace_conformance::fake_envoy_callbacks!();

use ace_conformance::{check, HostKind};

macro_rules! cases {
    ($($case:ident),* $(,)?) => {
        $(
            mod $case {
                use super::*;
                #[test]
                fn mock() {
                    check(stringify!($case), HostKind::Mock);
                }
                #[test]
                fn sim() {
                    check(stringify!($case), HostKind::Sim);
                }
                #[test]
                fn wasm() {
                    check(stringify!($case), HostKind::Wasm);
                }
                #[test]
                fn dynamic() {
                    check(stringify!($case), HostKind::Dynamic);
                }
            }
        )*

        /// Every case in `cases::ALL` has its tests here.
        #[test]
        fn every_case_is_listed() {
            let listed = [$(stringify!($case)),*];
            for c in ace_conformance::cases::ALL {
                assert!(listed.contains(&c.name), "add {} to tests/conformance.rs", c.name);
            }
            assert_eq!(listed.len(), ace_conformance::cases::ALL.len());
        }
    };
}

cases!(
    a_budget_steps_down_then_refuses,
    refusals_name_their_reason,
    the_cheapest_feasible_destination_is_chosen,
    failures_trip_then_spill_then_a_probe_closes,
    a_429_moves_the_cap_left,
    a_providers_own_figures_spill_before_its_429,
    a_slow_answer_derates,
    a_usage_claim_is_booked_within_its_models_window,
    usage_from_json_and_sse_is_booked,
    cached_input_is_booked_at_each_destinations_cached_price,
    a_conversation_stays_where_its_prefix_is_held,
    a_held_body_decides_the_estimate,
    each_upstream_is_addressed_as_it_expects,
    a_good_snapshot_moves_the_choice,
    a_rejected_snapshot_leaves_the_last_good_one,
    a_rejected_snapshot_is_not_hearing_the_service,
    a_silent_service_goes_stale_and_its_loads_are_dropped,
    a_stale_destination_load_is_priced_then_dropped,
);
