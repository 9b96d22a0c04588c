//! The synthetic fleet shared by the policy benches and the
//! `lookup_cpu` example: the example policies over `n` destinations, with a
//! request space of 100 tenants x 5 data classes x 4 latency classes x 5 TP
//! degrees x 100 models = 10^6.
#![allow(dead_code, clippy::unwrap_used)]

use ace_policy::verify::Rng;
use ace_policy::{Project, Sources};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

const TENANTS: usize = 100;
const MODELS: usize = 100;

/// A fleet of `n` destinations; request space 100 tenants x 5 data classes
/// x 4 latency classes x 5 TP degrees x 100 models = 10^6.
pub fn fleet(n: usize) -> String {
    let mut r = Rng(n as u64);
    let mut s = String::from("version = 1\n");
    s += "[request.data_class]\nvalues = [\"public\", \"internal\", \"confidential\", \"personal_eu\", \"phi\"]\n";
    s += "[request.latency_class]\nvalues = [\"interactive\", \"standard\", \"batch\", \"offline\"]\n";
    s += "[request.tp_degree]\nvalues = [1, 2, 4, 8, 16]\n";
    for t in 0..TENANTS {
        let id = if t == 0 {
            "northbank".to_string()
        } else {
            format!("tenant-{t}")
        };
        let _ = writeln!(s, "[[tenants]]\nid = \"{id}\"");
    }
    for m in 0..MODELS {
        let _ = writeln!(
            s,
            "[[models]]\nid = \"model-{m}\"\nvram_gb = {}",
            [16, 48, 140, 250, 810][m % 5]
        );
    }
    let tiers = ace_core::cost::Tier::ALL.map(ace_core::cost::Tier::as_str);
    let juris = ["EU", "US", "SG", "RU"];
    for d in 0..n {
        let models: Vec<String> = (0..MODELS)
            .filter(|_| r.below(4) == 0)
            .map(|m| format!("model-{m}"))
            .collect();
        let j = juris[r.below(4) as usize];
        let region = if j == "RU" {
            "ru-central-1".to_string()
        } else {
            format!("{j}-{}", r.below(3))
        };
        let certs = if r.below(3) == 0 {
            "[\"hipaa_baa\"]"
        } else {
            "[]"
        };
        let _ = writeln!(
            s,
            "[[destinations]]\nname = \"dest-{d}\"\ncluster = \"cluster_{d}\"\nprovider = \"p\"\ntier = \"{}\"\n\
             jurisdiction = \"{j}\"\nregion = \"{region}\"\naccelerator = \"h100\"\nvram_gb = {}\n\
             interconnect = \"{}\"\nmodels = {models:?}\ncertifications = {certs}",
            tiers[r.below(tiers.len() as u64) as usize],
            [24, 80, 160, 640, 1280][r.below(5) as usize],
            ["nvlink", "pcie"][r.below(2) as usize],
        );
    }
    s
}

pub fn sources(n: usize) -> Sources {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
    let mut s = Sources::read_dir(&dir).unwrap();
    s.manifest = (PathBuf::from("bench-fleet.toml"), fleet(n));
    s
}

/// Request index vectors with every value known, spread over the space.
pub fn requests(p: &Project, count: usize) -> Vec<Vec<u32>> {
    let mut r = Rng(7);
    (0..count)
        .map(|_| {
            p.attributes
                .iter()
                .map(|a| 1 + r.below(a.len() as u64) as u32)
                .collect()
        })
        .collect()
}
