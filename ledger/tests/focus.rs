//! The FOCUS 1.3 export checked column by column against the
//! specification's rules (`FinOps-Open-Cost-and-Usage-Spec/FOCUS_Spec`,
//! `specification/datasets/cost_and_usage/columns/<column>.md`, the
//! column's name in lower case, each failure naming it): each column's
//! type, whether it may be null, its allowed values, and the conditional
//! rules that tie the commitment columns to one another and to the charge.
//!
//! The ledger holds a day of traffic on a payg destination and a reserved
//! block (`l40s`), an owned pool no request used, and a reserved block no
//! request used (`ptu`, USD 0.55 an hour: its USD 13.20 a day is bought and
//! wasted).

use crate::common;
use ace_ledger::book::Ledger;
use ace_ledger::focus::{self, COLUMNS};
use ace_ledger::ingest::Options;
use ace_ledger::window::Rules;
use std::collections::HashMap;

/// A column's data type (`specification/attributes/*`).
#[derive(Clone, Copy, Debug)]
enum Type {
    /// A string (StringHandling).
    Str,
    /// A decimal (NumericFormat): an optional `-`, digits, an optional
    /// fraction, no exponent.
    Decimal,
    /// ISO 8601 in UTC with a `Z` (DateTimeFormat).
    DateTime,
    /// A JSON object (KeyValueFormat).
    Json,
}

/// Whether a column may be null ("Allows nulls" in its content
/// constraints).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Nulls {
    Never,
    Allowed,
}

use Nulls::{Allowed, Never};
use Type::{DateTime, Decimal, Json, Str};

/// The service categories FOCUS allows (`servicecategory.md`).
const CATEGORIES: &[&str] = &[
    "AI and Machine Learning",
    "Analytics",
    "Business Applications",
    "Compute",
    "Databases",
    "Developer Tools",
    "Multicloud",
    "Identity",
    "Integration",
    "Internet of Things",
    "Management and Governance",
    "Media",
    "Migration",
    "Mobile",
    "Networking",
    "Security",
    "Storage",
    "Web",
    "Other",
];

/// The subcategories of `AI and Machine Learning` (`servicesubcategory.md`).
const AI_SUBCATEGORIES: &[&str] = &[
    "AI Platforms",
    "Bots",
    "Generative AI",
    "Machine Learning",
    "Natural Language Processing",
    "Other (AI and Machine Learning)",
];

/// The charge categories (`chargecategory.md`).
const CHARGE_CATEGORIES: &[&str] = &["Usage", "Purchase", "Tax", "Credit", "Adjustment"];

/// The charge frequencies (`chargefrequency.md`).
const FREQUENCIES: &[&str] = &["One-Time", "Recurring", "Usage-Based"];

/// The commitment discount categories (`commitmentdiscountcategory.md`).
const COMMITMENT_CATEGORIES: &[&str] = &["Spend", "Usage"];

/// The commitment discount statuses (`commitmentdiscountstatus.md`).
const STATUSES: &[&str] = &["Used", "Unused"];

/// The pricing categories (`pricingcategory.md`).
const PRICING_CATEGORIES: &[&str] = &["Standard", "Dynamic", "Committed", "Other"];

/// Column, type, nulls, allowed values (empty: any); its section of the
/// FOCUS 1.3 specification is `specification/datasets/cost_and_usage/columns/`
/// and the column's name in lower case, `.md`.
const RULES: &[(&str, Type, Nulls, &[&str])] = &[
    ("BilledCost", Decimal, Never, &[]),
    ("BillingAccountId", Str, Never, &[]),
    ("BillingAccountName", Str, Allowed, &[]),
    // An ISO 4217 code; the ledger books USD only.
    ("BillingCurrency", Str, Never, &["USD"]),
    ("BillingPeriodEnd", DateTime, Never, &[]),
    ("BillingPeriodStart", DateTime, Never, &[]),
    ("ChargeCategory", Str, Never, CHARGE_CATEGORIES),
    ("ChargeClass", Str, Allowed, &["Correction"]),
    ("ChargeDescription", Str, Allowed, &[]),
    ("ChargeFrequency", Str, Never, FREQUENCIES),
    ("ChargePeriodEnd", DateTime, Never, &[]),
    ("ChargePeriodStart", DateTime, Never, &[]),
    (
        "CommitmentDiscountCategory",
        Str,
        Allowed,
        COMMITMENT_CATEGORIES,
    ),
    ("CommitmentDiscountId", Str, Allowed, &[]),
    ("CommitmentDiscountName", Str, Allowed, &[]),
    ("CommitmentDiscountQuantity", Decimal, Allowed, &[]),
    ("CommitmentDiscountStatus", Str, Allowed, STATUSES),
    ("CommitmentDiscountType", Str, Allowed, &[]),
    ("CommitmentDiscountUnit", Str, Allowed, &[]),
    ("ConsumedQuantity", Decimal, Allowed, &[]),
    ("ConsumedUnit", Str, Allowed, &[]),
    ("ContractApplied", Json, Allowed, &[]),
    ("ContractedCost", Decimal, Never, &[]),
    ("ContractedUnitPrice", Decimal, Allowed, &[]),
    ("EffectiveCost", Decimal, Never, &[]),
    ("InvoiceIssuerName", Str, Never, &[]),
    ("ListCost", Decimal, Never, &[]),
    ("ListUnitPrice", Decimal, Allowed, &[]),
    ("PricingCategory", Str, Allowed, PRICING_CATEGORIES),
    ("PricingQuantity", Decimal, Allowed, &[]),
    ("PricingUnit", Str, Allowed, &[]),
    ("RegionId", Str, Allowed, &[]),
    ("ResourceId", Str, Allowed, &[]),
    ("ResourceName", Str, Allowed, &[]),
    ("ServiceCategory", Str, Never, CATEGORIES),
    ("ServiceName", Str, Never, &[]),
    // New in 1.3.
    ("ServiceProviderName", Str, Never, &[]),
    ("ServiceSubcategory", Str, Never, AI_SUBCATEGORIES),
    ("SkuId", Str, Allowed, &[]),
    ("SkuPriceId", Str, Allowed, &[]),
    ("SubAccountId", Str, Allowed, &[]),
    ("SubAccountName", Str, Allowed, &[]),
    ("Tags", Json, Allowed, &[]),
];

/// One exported row, by column; an empty cell is null.
type Rec = HashMap<String, String>;

fn get<'a>(r: &'a Rec, col: &str) -> Option<&'a str> {
    r.get(col).map(String::as_str).filter(|v| !v.is_empty())
}

fn decimal(v: &str) -> Option<f64> {
    let digits = v.strip_prefix('-').unwrap_or(v);
    let ok = !digits.is_empty()
        && digits.chars().all(|c| c.is_ascii_digit() || c == '.')
        && digits.matches('.').count() <= 1;
    ok.then(|| v.parse().ok()).flatten()
}

/// A conditional rule: its section and what it says, and whether a row
/// keeps it.
type Condition = (&'static str, fn(&Rec) -> bool);

/// The conditional rules.
const CONDITIONS: &[Condition] = &[
    // Category, type and name are null exactly when the id is.
    ("commitmentdiscountcategory.md: null iff CommitmentDiscountId is null", |r| {
        get(r, "CommitmentDiscountCategory").is_none() == get(r, "CommitmentDiscountId").is_none()
    }),
    ("commitmentdiscounttype.md: null iff CommitmentDiscountId is null", |r| {
        get(r, "CommitmentDiscountType").is_none() == get(r, "CommitmentDiscountId").is_none()
    }),
    ("commitmentdiscountstatus.md: null when CommitmentDiscountId is null", |r| {
        get(r, "CommitmentDiscountId").is_some() || get(r, "CommitmentDiscountStatus").is_none()
    }),
    (
        "commitmentdiscountstatus.md: not null when CommitmentDiscountId is not null and ChargeCategory is Usage",
        |r| {
            !(get(r, "CommitmentDiscountId").is_some() && get(r, "ChargeCategory") == Some("Usage"))
                || get(r, "CommitmentDiscountStatus").is_some()
        },
    ),
    ("commitmentdiscountquantity.md: null when SkuPriceId is null", |r| {
        get(r, "SkuPriceId").is_some() || get(r, "CommitmentDiscountQuantity").is_none()
    }),
    (
        "commitmentdiscountquantity.md: not null for Usage or Purchase with a CommitmentDiscountId (no correction), null otherwise",
        |r| {
            let applies = matches!(get(r, "ChargeCategory"), Some("Usage" | "Purchase"))
                && get(r, "CommitmentDiscountId").is_some()
                && get(r, "ChargeClass") != Some("Correction");
            applies == get(r, "CommitmentDiscountQuantity").is_some()
        },
    ),
    ("commitmentdiscountunit.md: null iff CommitmentDiscountQuantity is null", |r| {
        get(r, "CommitmentDiscountUnit").is_none() == get(r, "CommitmentDiscountQuantity").is_none()
    }),
    (
        "consumedquantity.md: null unless ChargeCategory is Usage and CommitmentDiscountStatus is not Unused; then not null",
        |r| {
            let applies = get(r, "SkuPriceId").is_some()
                && get(r, "ChargeCategory") == Some("Usage")
                && get(r, "CommitmentDiscountStatus") != Some("Unused");
            applies == get(r, "ConsumedQuantity").is_some()
        },
    ),
    ("pricingquantity.md: not null for Usage and Purchase", |r| {
        !matches!(get(r, "ChargeCategory"), Some("Usage" | "Purchase"))
            || get(r, "PricingQuantity").is_some()
    }),
    (
        "pricingquantity.md: a cost is its unit price times PricingQuantity",
        |r| {
            [("ContractedCost", "ContractedUnitPrice"), ("ListCost", "ListUnitPrice")]
                .iter()
                .all(|(cost, unit)| match (get(r, unit), get(r, "PricingQuantity")) {
                    (Some(u), Some(q)) => {
                        let want = decimal(u).unwrap_or(f64::NAN) * decimal(q).unwrap_or(f64::NAN);
                        let got = get(r, cost).and_then(decimal).unwrap_or(f64::NAN);
                        (want - got).abs() <= 1e-9 + got.abs() * 1e-12
                    }
                    _ => true,
                })
        },
    ),
    ("pricingcategory.md: null when SkuPriceId is null", |r| {
        get(r, "SkuPriceId").is_some() || get(r, "PricingCategory").is_none()
    }),
    ("pricingcategory.md: not null for Usage and Purchase", |r| {
        !matches!(get(r, "ChargeCategory"), Some("Usage" | "Purchase"))
            || get(r, "PricingCategory").is_some()
    }),
    (
        "pricingcategory.md: Committed when subject to a commitment discount and not its purchase",
        |r| {
            !(get(r, "CommitmentDiscountId").is_some() && get(r, "ChargeCategory") == Some("Usage"))
                || get(r, "PricingCategory") == Some("Committed")
        },
    ),
    ("chargefrequency.md: not Usage-Based when ChargeCategory is Purchase", |r| {
        get(r, "ChargeCategory") != Some("Purchase") || get(r, "ChargeFrequency") != Some("Usage-Based")
    }),
    (
        "contractapplied.md: null unless a contract commitment applies (ACE knows of none)",
        |r| get(r, "ContractApplied").is_none(),
    ),
    (
        "servicesubcategory.md: its parent is the row's ServiceCategory",
        |r| {
            !AI_SUBCATEGORIES.contains(&get(r, "ServiceSubcategory").unwrap_or_default())
                || get(r, "ServiceCategory") == Some("AI and Machine Learning")
        },
    ),
];

/// The cells of one CSV line (quoted cells with `""` for a quote).
fn cells(line: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        let cell = out.last_mut().expect("a cell");
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                cell.push('"');
            }
            ('"', _) => quoted = !quoted,
            (',', false) => out.push(String::new()),
            _ => cell.push(c),
        }
    }
    out
}

/// Every way `r` breaks a rule of the table or a condition.
fn violations(r: &Rec) -> Vec<String> {
    let mut bad = Vec::new();
    for (col, ty, nulls, allowed) in RULES {
        let section = format!("{}.md", col.to_ascii_lowercase());
        let Some(v) = get(r, col) else {
            if *nulls == Never {
                bad.push(format!("{col} is null ({section})"));
            }
            continue;
        };
        let typed = match ty {
            Str => true,
            Decimal => decimal(v).is_some(),
            DateTime => {
                v.len() == 20 && v.ends_with('Z') && v.as_bytes()[10] == b'T' && {
                    let digits: String = v.chars().filter(char::is_ascii_digit).collect();
                    digits.len() == 14
                }
            }
            Json => serde_json::from_str::<serde_json::Value>(v).is_ok_and(|j| j.is_object()),
        };
        if !typed {
            bad.push(format!("{col} = {v:?} is not a {ty:?} ({section})"));
        }
        if !allowed.is_empty() && !allowed.contains(&v) {
            bad.push(format!("{col} = {v:?} is not an allowed value ({section})"));
        }
    }
    for (rule, holds) in CONDITIONS {
        if !holds(r) {
            bad.push(format!("breaks {rule}"));
        }
    }
    bad
}

const CONFIG: &str = r#"{"allow_no_policy": true, "destinations": [
    {"name": "api", "cluster": "api", "tier": "payg",
     "usd_per_input_token": 2e-6, "usd_per_output_token": 8e-6},
    {"name": "l40s", "cluster": "l40s", "tier": "reserved", "capacity": 4,
     "usd_per_gpu_hour": 0.55, "usd_per_input_token": 1e-8, "usd_per_output_token": 1e-8},
    {"name": "ptu", "cluster": "ptu", "tier": "reserved", "capacity": 4,
     "usd_per_gpu_hour": 0.55},
    {"name": "owned", "cluster": "owned", "tier": "inhouse", "capacity": 2,
     "usd_per_gpu_hour": 2.0}]}"#;

/// The export of a day: requests on `api` and `l40s` at the day's start
/// and 23 h 55 min later (one day charged), rows by column.
fn exported() -> (Vec<String>, Vec<Rec>) {
    let (_dir, url) = common::sqlite_url();
    let mut ledger = Ledger::open(&url).expect("open");
    let id = ledger
        .register(CONFIG.as_bytes(), "focus")
        .expect("register");
    let start = 1_796_342_400_000_i64;
    let line = |n: u32, time: i64, dest: &str, tier: &str, tenant: &str| {
        format!(
            r#"{{"schema":"ace.event/2","event_id":"{n:032x}","config":"{id}","request_id":"=r-{n}","time_ms":{time},"tenant":"{tenant}","data_class":null,"latency_class":null,"model_requested":"m","model_served":"m","destination":"{dest}","tier":"{tier}","tokens_in":1000,"tokens_out":{},"tokens_estimated":false,"status":200,"latency_ms":36000,"slo_ms":null,"slo_met":null,"marginal_usd":null,"counterfactual_usd":null,"reason":"cheapest","warm":true,"overage":false,"usage_capped":false,"cached":false}}"#,
            100 * n
        )
    };
    let events = [
        line(1, start, "api", "payg", "acme"),
        line(2, start + 1000, "l40s", "reserved", "acme"),
        line(3, start + 2000, "l40s", "reserved", "globex"),
        line(4, start + 86_400_000 - 300_000, "l40s", "reserved", "acme"),
    ]
    .join("\n")
        + "\n";
    let s = ledger
        .ingest_bytes("focus.ndjson", events.as_bytes(), &Options::default())
        .expect("ingest");
    assert_eq!((s.new, s.rejected.len()), (4, 0), "{:?}", s.rejected);
    let rules = Rules::default();
    let r = ledger.report(&rules).expect("report");
    let mut out = Vec::new();
    let n = focus::export(ledger.store.as_mut(), &r, &rules, &mut out).expect("export");
    let text = String::from_utf8(out).expect("utf8");
    let mut lines = text.lines();
    let header = cells(lines.next().expect("header"));
    let rows: Vec<Rec> = lines
        .map(|l| header.iter().cloned().zip(cells(l)).collect())
        .collect();
    assert_eq!(rows.len() as u64, n);
    (header, rows)
}

#[test]
fn every_column_of_every_row_keeps_the_specifications_rules() {
    let (header, rows) = exported();
    assert_eq!(header, COLUMNS);
    // Every FOCUS column written has its rule; every other is custom.
    for col in &header {
        assert!(
            col.starts_with("x_") || RULES.iter().any(|r| r.0 == col),
            "{col} has no rule in the table"
        );
    }
    for (col, ..) in RULES {
        assert!(header.contains(&col.to_string()), "{col} is not written");
    }
    // 4 requests, a purchase and an idle row per reserved pool, an idle
    // row for the owned one.
    assert_eq!(rows.len(), 4 + 2 + 2 + 1);
    for (i, r) in rows.iter().enumerate() {
        let bad = violations(r);
        assert!(bad.is_empty(), "row {}: {bad:#?}\n{r:#?}", i + 2);
    }
}

/// FOCUS's commitment utilisation: a reserved block is bought (its
/// `Purchase` row bills the day), and each charge on it is `Used` or the
/// rest `Unused`; its effective cost adds up to what it was bought for.
#[test]
fn a_reserved_block_is_bought_then_used_or_wasted() {
    let (_, rows) = exported();
    let of = |dest: &str, capacity: &str| -> Vec<&Rec> {
        rows.iter()
            .filter(|r| get(r, "x_AceDestination") == Some(dest))
            .filter(|r| get(r, "x_AceCapacity") == Some(capacity))
            .collect()
    };
    let num = |r: &Rec, col: &str| get(r, col).and_then(decimal).unwrap_or(f64::NAN);
    // The block no request reached: a day bought (4 slots × 24 h) and all
    // of it unused.
    let bought = of("ptu", "purchase");
    assert_eq!(bought.len(), 1);
    assert_eq!(get(bought[0], "BilledCost"), Some("13.200000000"));
    assert_eq!(get(bought[0], "EffectiveCost"), Some("0.000000000"));
    assert_eq!(num(bought[0], "CommitmentDiscountQuantity"), 96.0);
    let unused = of("ptu", "idle");
    assert_eq!(get(unused[0], "CommitmentDiscountStatus"), Some("Unused"));
    assert_eq!(get(unused[0], "EffectiveCost"), Some("13.200000000"));
    assert_eq!(num(unused[0], "CommitmentDiscountQuantity"), 96.0);
    // The block in use: three requests of 36 s each (0.01 slot-hours),
    // the rest unused; effective costs add up to the day's 13.20.
    let used = of("l40s", "used");
    assert_eq!(used.len(), 3);
    assert!(used
        .iter()
        .all(|r| get(r, "CommitmentDiscountStatus") == Some("Used")));
    let idle = of("l40s", "idle");
    let quantity: f64 = used
        .iter()
        .chain(&idle)
        .map(|r| num(r, "CommitmentDiscountQuantity"))
        .sum();
    assert!((quantity - 96.0).abs() < 1e-6, "{quantity}");
    let nano = |r: &&Rec, col: &str| -> i64 {
        let v = get(r, col).unwrap_or_default().replace('.', "");
        v.parse().unwrap_or(i64::MIN)
    };
    let booked: i64 = used.iter().map(|r| nano(r, "ContractedCost")).sum();
    let effective: i64 = used
        .iter()
        .chain(&idle)
        .map(|r| nano(r, "EffectiveCost"))
        .sum();
    assert_eq!(effective - booked, 13_200_000_000);
    // The owned pool nobody used: its day idle, no commitment.
    let owned = of("owned", "idle");
    assert_eq!(get(owned[0], "EffectiveCost"), Some("48.000000000"));
    assert_eq!(get(owned[0], "CommitmentDiscountId"), None);
    // Text from the log stays neutralised.
    assert!(rows
        .iter()
        .any(|r| get(r, "x_AceRequestId") == Some("'=r-2")));
}
