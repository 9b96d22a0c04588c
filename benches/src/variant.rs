//! The variants `envoy-load` measures: what sits in front of the upstream
//! in each one's Envoy, the name `--only` takes, the label its rows print
//! under, and the request it is driven with.

use clap::builder::PossibleValue;
use clap::ValueEnum;

/// What sits in front of the upstream in one variant's Envoy
/// ([`Variant::about`] says what each is).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    Plain,
    Noop,
    Minimal,
    Floor,
    DynFloor,
    Ace,
    AceDyn,
    AceControl,
    AceDynControl,
    AcePolicy,
    AceRoute,
    AceHit,
    AceCheck,
    AceAddressed,
    AcePrefix,
    AceDynPolicy,
    AceDynRoute,
    AceDynHit,
    AceDynCheck,
    AceDynAddressed,
    AceDynPrefix,
    ShippedPlain,
    Shipped,
    ShippedDyn,
    ShippedNoLog,
    ShippedDynNoLog,
    ShippedNoTables,
    ShippedDynNoTables,
    ShippedNoBody,
    ShippedDynNoBody,
}

impl Variant {
    /// Every variant, in the order they run and print.
    pub const ALL: [Variant; 30] = [
        Variant::Plain,
        Variant::Noop,
        Variant::Minimal,
        Variant::Floor,
        Variant::DynFloor,
        Variant::Ace,
        Variant::AceDyn,
        Variant::AceControl,
        Variant::AceDynControl,
        Variant::AcePolicy,
        Variant::AceRoute,
        Variant::AceHit,
        Variant::AceCheck,
        Variant::AceAddressed,
        Variant::AcePrefix,
        Variant::AceDynPolicy,
        Variant::AceDynRoute,
        Variant::AceDynHit,
        Variant::AceDynCheck,
        Variant::AceDynAddressed,
        Variant::AceDynPrefix,
        Variant::ShippedPlain,
        Variant::Shipped,
        Variant::ShippedDyn,
        Variant::ShippedNoLog,
        Variant::ShippedDynNoLog,
        Variant::ShippedNoTables,
        Variant::ShippedDynNoTables,
        Variant::ShippedNoBody,
        Variant::ShippedDynNoBody,
    ];

    /// The name `--only` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Variant::Plain => "plain",
            Variant::Noop => "noop",
            Variant::Minimal => "minimal",
            Variant::Floor => "floor",
            Variant::DynFloor => "dynfloor",
            Variant::Ace => "ace",
            Variant::AceDyn => "acedyn",
            Variant::AceControl => "acectl",
            Variant::AceDynControl => "acedynctl",
            Variant::AcePolicy => "acepol",
            Variant::AceRoute => "aceroute",
            Variant::AceHit => "acehit",
            Variant::AceCheck => "acecheck",
            Variant::AceAddressed => "aceaddr",
            Variant::AcePrefix => "aceprefix",
            Variant::AceDynPolicy => "acedynpol",
            Variant::AceDynRoute => "acedynroute",
            Variant::AceDynHit => "acedynhit",
            Variant::AceDynCheck => "acedyncheck",
            Variant::AceDynAddressed => "acedynaddr",
            Variant::AceDynPrefix => "acedynprefix",
            Variant::ShippedPlain => "shippedplain",
            Variant::Shipped => "shipped",
            Variant::ShippedDyn => "shippeddyn",
            Variant::ShippedNoLog => "shipped-nolog",
            Variant::ShippedDynNoLog => "shippeddyn-nolog",
            Variant::ShippedNoBody => "shipped-nobody",
            Variant::ShippedDynNoBody => "shippeddyn-nobody",
            Variant::ShippedNoTables => "shipped-notables",
            Variant::ShippedDynNoTables => "shippeddyn-notables",
        }
    }

    /// The name its rows print under.
    pub fn label(self) -> &'static str {
        match self {
            Variant::Plain => "plain Envoy",
            Variant::Noop => "no-op Wasm filter",
            Variant::Minimal => "minimal Wasm filter",
            Variant::Floor => "ACE's host calls only",
            Variant::DynFloor => "host calls, dynamic module",
            Variant::Ace => "ACE filter",
            Variant::AceDyn => "ACE, dynamic module",
            Variant::AceControl => "ACE filter, control on",
            Variant::AceDynControl => "ACE dynamic, control on",
            Variant::AcePolicy => "ACE, example policies",
            Variant::AceRoute => "ACE, model routing",
            Variant::AceHit => "ACE, cache hit",
            Variant::AceCheck => "ACE, cache check",
            Variant::AceAddressed => "ACE, upstream identity",
            Variant::AcePrefix => "ACE, prefix locality",
            Variant::AceDynPolicy => "dynamic, example policies",
            Variant::AceDynRoute => "dynamic, model routing",
            Variant::AceDynHit => "dynamic, cache hit",
            Variant::AceDynCheck => "dynamic, cache check",
            Variant::AceDynAddressed => "dynamic, upstream identity",
            Variant::AceDynPrefix => "dynamic, prefix locality",
            Variant::ShippedPlain => "plain Envoy, as shipped",
            Variant::Shipped => "ACE Wasm, as shipped",
            Variant::ShippedDyn => "ACE dynamic, as shipped",
            Variant::ShippedNoLog => "Wasm shipped, no log",
            Variant::ShippedDynNoLog => "dynamic shipped, no log",
            Variant::ShippedNoBody => "Wasm shipped, no body",
            Variant::ShippedDynNoBody => "dynamic shipped, no body",
            Variant::ShippedNoTables => "Wasm shipped, no tables",
            Variant::ShippedDynNoTables => "dynamic shipped, no tables",
        }
    }

    /// The shipped bootstrap it runs, and what is taken out of it
    /// ([`shipped`](crate::setup::shipped)); `None` for the variants built from scratch.
    pub fn shipped(self) -> Option<(Build, Ablation)> {
        Some(match self {
            Variant::ShippedPlain => (Build::Plain, Ablation::None),
            Variant::Shipped => (Build::Wasm, Ablation::None),
            Variant::ShippedDyn => (Build::Dynamic, Ablation::None),
            Variant::ShippedNoLog => (Build::Wasm, Ablation::Log),
            Variant::ShippedDynNoLog => (Build::Dynamic, Ablation::Log),
            Variant::ShippedNoTables => (Build::Wasm, Ablation::Tables),
            Variant::ShippedDynNoTables => (Build::Dynamic, Ablation::Tables),
            Variant::ShippedNoBody => (Build::Wasm, Ablation::Body),
            Variant::ShippedDynNoBody => (Build::Dynamic, Ablation::Body),
            _ => return None,
        })
    }

    /// The request it is driven with.
    pub fn request(self) -> Request {
        match self {
            Variant::AcePolicy
            | Variant::AceRoute
            | Variant::AceHit
            | Variant::AceCheck
            | Variant::AceAddressed
            | Variant::AceDynAddressed
            | Variant::AcePrefix
            | Variant::AceDynPrefix
            | Variant::AceDynPolicy
            | Variant::AceDynRoute
            | Variant::AceDynHit
            | Variant::AceDynCheck
            | Variant::ShippedPlain
            | Variant::Shipped
            | Variant::ShippedDyn
            | Variant::ShippedNoLog
            | Variant::ShippedDynNoLog
            | Variant::ShippedNoTables
            | Variant::ShippedDynNoTables => Request::Fleet,
            Variant::ShippedNoBody | Variant::ShippedDynNoBody => Request::FleetModelHeader,
            Variant::Plain
            | Variant::Noop
            | Variant::Minimal
            | Variant::Floor
            | Variant::DynFloor
            | Variant::Ace
            | Variant::AceDyn
            | Variant::AceControl
            | Variant::AceDynControl => Request::Bench,
        }
    }

    /// What `--help` says about it.
    pub fn about(self) -> &'static str {
        match self {
            Variant::Plain => "Envoy without a filter",
            Variant::Noop => "the SDK's no-op Wasm filter (benches/noop-filter)",
            Variant::Minimal => {
                "a no-op written against the ABI, exporting only the callbacks ACE uses \
                 (benches/minimal-filter)"
            }
            Variant::Floor => "that filter making exactly ACE's host calls, routed like ACE",
            Variant::DynFloor => {
                "the same host calls from an Envoy dynamic module (benches/dynamic-floor)"
            }
            Variant::Ace => "ACE's Wasm filter",
            Variant::AceDyn => "ACE as an Envoy dynamic module (ace-dynamic), configured as `ace`",
            Variant::AceControl => {
                "`ace` with the control service configured (it answers 304; one poll at start, \
                 then hourly): the request path's cost of control on requests that do not fetch"
            }
            Variant::AceDynControl => {
                "`acedyn` with the control service configured (its bootstrap poller, 304s, \
                 hourly)"
            }
            Variant::AcePolicy => {
                "ACE's Wasm filter with the example fleet and policies (`ace plugin-config \
                 policies/`) without model routing, sent a deterministic request for gpt-4o \
                 (the reference for the next three)"
            }
            Variant::AceRoute => {
                "`acepol` with the manifest's model routing: every request served by another \
                 model, its body rewritten"
            }
            Variant::AceHit => "`acepol` with the response cache: every request a hit",
            Variant::AceCheck => {
                "`acepol` with the response cache checking every hit: a lookup, the upstream, \
                 the comparison and a store per request (a miss's whole cost, and more)"
            }
            Variant::AceDynPolicy => "`acepol` as a dynamic module",
            Variant::AceDynRoute => "`aceroute` as a dynamic module",
            Variant::AceDynHit => "`acehit` as a dynamic module",
            Variant::AceDynCheck => "`acecheck` as a dynamic module",
            Variant::AceAddressed => {
                "`acepol` with an `upstream` on every destination: each model renamed, the \
                 path and the authority rewritten (the body, `:path` and `:authority` set per \
                 request)"
            }
            Variant::AceDynAddressed => "`aceaddr` as a dynamic module",
            Variant::AcePrefix => {
                "`acepol` with prefix locality (`\"locality\": {}`): the prompt fingerprinted, \
                 its boundaries looked up and the decision's destination recorded in the shared \
                 table, every request the same conversation's turn"
            }
            Variant::AceDynPrefix => "`aceprefix` as a dynamic module",
            Variant::ShippedPlain => {
                "`envoy/envoy.yaml` with ACE's filter taken out and its access log writing \
                 Envoy's own line per request (what the same listener costs without ACE)"
            }
            Variant::Shipped => {
                "`envoy/envoy.yaml` as shipped (body read, the event access log with its CEL \
                 filter, control polled), the example fleet's `ace plugin-config` in place of \
                 its three destinations; only listener, admin, clusters and log path rewritten"
            }
            Variant::ShippedDyn => "`envoy/envoy-dynamic.yaml`, likewise",
            Variant::ShippedNoLog => "`shipped` without its access log",
            Variant::ShippedDynNoLog => "`shippeddyn` without its access log",
            Variant::ShippedNoTables => {
                "`shipped-nolog` without policy tables (`allow_no_policy`, same destinations)"
            }
            Variant::ShippedDynNoTables => "`shippeddyn-nolog` without policy tables",
            Variant::ShippedNoBody => {
                "`shipped-notables` not reading the body (the model in `x-ace-model`), which \
                 tables deciding on the model forbid"
            }
            Variant::ShippedDynNoBody => "`shippeddyn-notables` not reading the body, likewise",
        }
    }
}

/// Which filter a shipped variant runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Build {
    /// None: the shipped Wasm bootstrap with the filter taken out.
    Plain,
    /// `envoy/envoy.yaml`.
    Wasm,
    /// `envoy/envoy-dynamic.yaml`.
    Dynamic,
}

/// What a shipped variant takes out, each step also taking out the ones
/// before it, so that the differences between neighbours price one phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Ablation {
    None,
    /// The access log (its CEL filter, the event's filter-state read, the write).
    Log,
    /// The policy tables (their lookup; `allow_no_policy` instead).
    Tables,
    /// Reading the body (holding the headers for it, the scan for `model`),
    /// which tables deciding on the model require.
    Body,
}

/// The request a variant is driven with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// A POST of [`BODY`](crate::load::BODY).
    Bench,
    /// The example fleet's request: [`FLEET_BODY`](crate::load::FLEET_BODY) with
    /// [`FLEET_HEADERS`](crate::load::FLEET_HEADERS).
    Fleet,
    /// The same with its model also in `x-ace-model`, for a filter that
    /// does not read the body.
    FleetModelHeader,
}

/// `--only` parses a variant by [`Variant::as_str`].
impl ValueEnum for Variant {
    fn value_variants<'a>() -> &'a [Self] {
        &Variant::ALL
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(PossibleValue::new(self.as_str()).help(self.about()))
    }
}

/// The row of the `ACE_BASELINE_WASM` build.
pub const ACE_BASELINE: &str = "ACE baseline";
