//! The control snapshot decoder, and its resolution against a
//! configuration, on arbitrary bytes: a snapshot or an error naming a
//! field, never a panic; what decodes encodes back to the same bytes; and
//! a resolved snapshot never names more destinations than the
//! configuration has, nor changes which ones exist.
#![no_main]
#![forbid(unsafe_code)]
use ace_config::Config;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn config() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(|| {
        let json = br#"{"allow_no_policy":true,"control":{"cluster":"c"},"destinations":[
            {"name":"owned","cluster":"c0","tier":"inhouse","capacity":8,
             "usd_per_input_token":1e-9,"usd_per_output_token":1e-9,"warm_models":["m"]},
            {"name":"spot","cluster":"c1","tier":"spot","usd_per_gpu_hour":3.0,"tokens_per_second":100},
            {"name":"api","cluster":"c2","tier":"payg",
             "usd_per_input_token":1e-6,"usd_per_output_token":1e-6}]}"#;
        match Config::parse(json) {
            Ok(c) => c,
            Err(e) => panic!("the fuzz configuration is invalid: {e}"),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    match ace_snapshot::decode(data) {
        Ok(s) => {
            let again = ace_snapshot::encode(&s);
            assert_eq!(again.as_deref().ok(), Some(data), "decode then encode differs");
        }
        Err(e) => assert!(!e.field.is_empty()),
    }
    if let Ok(r) = ace_flow::control::decode(config(), data) {
        assert_eq!(r.lives.len(), config().destinations.len());
        for l in &r.lives {
            if let Some((i, o)) = l.usd_per_token {
                assert!(i.is_finite() && o.is_finite() && i >= 0.0 && o >= 0.0);
            }
        }
    }
});
