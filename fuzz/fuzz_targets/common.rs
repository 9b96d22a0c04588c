//! Shared by the loader targets: once a table loads, every accessor and
//! lookup must answer without panicking, whatever the bytes were.

use ace_core::tables::Tables;

pub fn exercise(data: &[u8]) {
    let Ok(t) = Tables::load(data) else {
        return;
    };
    // Lookups driven by the input's own bytes, unknowns and out-of-range
    // indices included.
    let n = t.attribute_count();
    let mut idx = vec![0u32; n];
    let mut out = vec![0u64; t.words() + 1];
    for (round, chunk) in data.chunks(n.max(1)).take(64).enumerate() {
        for (slot, &b) in idx.iter_mut().zip(chunk) {
            *slot = u32::from(b) % (t.value_count(0) + 3) + round as u32 % 2;
        }
        let _ = t.feasible(&idx, &mut out);
        assert!(
            out.iter().skip(t.words()).all(|&w| w == 0),
            "feasible wrote past words()"
        );
    }
    let _ = t.feasible(&idx[..n.saturating_sub(1)], &mut out);
    let _ = t.feasible(&idx, &mut out[..0]);
    for a in 0..n as u32 + 1 {
        if let Some(name) = t.attribute_name(a) {
            assert_eq!(t.attribute_index(name).is_some(), true);
        }
        for v in 0..t.value_count(a) + 2 {
            if let Some(s) = t.value_name(a, v) {
                assert_eq!(t.value_index(a, s), v, "value lookup does not round-trip");
            }
        }
        let _ = t.value_index(a, "");
    }
    for d in 0..t.destination_count() + 1 {
        let _ = t.destination_cluster(d);
        let _ = t.destination_name(d);
    }
    for f in 0..t.factor_count() + 1 {
        if let Some(f) = t.factor(f) {
            let _ = f.attributes().count();
            for r in 0..f.row_count().min(8) {
                let _ = f.word(r, 0);
            }
        }
    }
}
