//! The event's fields, defined once.
//!
//! [`event_fields!`](crate::event_fields) is the one list of the fields of
//! the event line (`ace.event/*`): each field's name, the Rust type the
//! flow fills in, its JSON kind, whether every line carries it, and its
//! documentation. Everything else is derived from it:
//!
//! - the flow's `Event` struct and its writer (`ace_flow::event`: field
//!   names and order; the writer stays hand-rolled and allocation-free:
//!   one constant key per field, written with the value);
//! - the ledger's reader (`ace_ledger::event::Event`), its stored row, the
//!   store's columns and the migration that adds a new column;
//! - [`FIELDS`], the table the documentation points to.
//!
//! Adding a field is one entry here plus the line in the flow that fills
//! it in. A field added after `ace.event/1` is `Added`: older lines lack
//! it and the ledger reads it as absent (null, `false`), so adding one
//! needs no new event schema version.
//!
//! The list is a callback macro: `event_fields!(m)` expands to `m! { ...
//! entries ... }`, and each user (the flow, the ledger) writes its own
//! `m`. An entry is
//!
//! ```text
//! /// doc
//! name: FlowType [, via getter] => Kind, Presence;
//! ```
//!
//! where `FlowType` is the type of the flow's `Event` field (a path the
//! user's `m` resolves, or ignores: `Text` and `Price` are the flow's),
//! `Kind` is one of the [`Kind`] variants (the JSON type and what the
//! ledger checks), `Presence` is `Always` (every line of every schema the
//! ledger reads has it) or `Added` (older lines may lack it), and `via
//! getter` names an `Event` method the flow's writer takes the value from
//! instead of the field.

/// Version of the event's fields, the value of every line's `schema`;
/// bump on any incompatible change (a field removed, renamed or retyped).
pub const SCHEMA: &str = "ace.event/2";

/// The event's fields: `event_fields!(m)` expands to `m! { entries }`
/// (see [`schema`](crate::schema)). The order is the line's order.
#[macro_export]
macro_rules! event_fields {
    ($then:ident) => {
        $then! {
            /// The version of these fields (`ace.event/2`).
            schema: &'static str => Str, Always;
            /// ACE's own id for the request, unique: 32 lowercase hex
            /// digits (a client's `x-request-id` may repeat). Older lines
            /// have none; the ledger keys those by a hash of the line.
            event_id: [u8; 32] => Id, Added;
            /// The configuration the request was decided under: the first
            /// 16 hex digits of the SHA-256 of the plugin configuration.
            config: ::std::sync::Arc<str> => Id, Added;
            /// Envoy's `x-request-id`.
            request_id: Option<Text> => StrOrNull, Always;
            /// When the decision was made, ms since the Unix epoch.
            time_ms: u64 => EpochMs, Always;
            /// `x-ace-tenant`.
            tenant: Option<Text> => StrOrNull, Always;
            /// `x-ace-data-class`.
            data_class: Option<Text> => StrOrNull, Always;
            /// `x-ace-latency-class`.
            latency_class: Option<Text> => StrOrNull, Always;
            /// The model the client asked for (`x-ace-model`, else the
            /// body's `model`): a model, or a class of models under model
            /// routing.
            model_requested: Option<Text> => StrOrNull, Always;
            /// The model that served it: another than the one asked for
            /// when model routing chose it, else `model_requested`.
            model_served: Option<Text>, via served => StrOrNull, Always;
            /// The API the client's path asks for (`chat_completions`,
            /// `completions`, `embeddings`, `responses`); null for another
            /// path. Only destinations serving it were feasible.
            api: Option<&'static str> => StrOrNull, Added;
            /// The name the upstream was sent the model served under, when
            /// it knows it by another than the catalogue's (the
            /// destination's `upstream.models`); else null.
            upstream_model: Option<Text> => StrOrNull, Added;
            /// The destination chosen (null when refused).
            destination: Option<::std::sync::Arc<str>> => StrOrNull, Always;
            /// Its tier.
            tier: Option<&'static str> => StrOrNull, Always;
            /// Input tokens (estimated until the upstream reports usage).
            tokens_in: u32 => U32, Always;
            /// Output tokens.
            tokens_out: u32 => U32, Always;
            /// Of `tokens_in`, those the provider read from its prompt
            /// cache (booked at the destination's `cached_input_factor`).
            tokens_cache_read: u32 => U32, Added;
            /// Of `tokens_in`, those written to its prompt cache (booked at
            /// `cache_write_factor`).
            tokens_cache_write: u32 => U32, Added;
            /// Of `tokens_in`, those the destination chosen was expected
            /// to hold already (prefix locality: its prompt cache or its
            /// engine's prefix cache); 0 when none or locality is off.
            tokens_prefix_held: u32 => U32, Added;
            /// Whether the token counts are estimates (true until usage
            /// parsing).
            tokens_estimated: bool => Bool, Always;
            /// Response status sent to the client (0 when none).
            status: u32 => U32, Always;
            /// Time to response headers, ms, from when the upstream had the
            /// whole request.
            latency_ms: u64 => Ms, Always;
            /// The destination's SLO, ms.
            slo_ms: Option<u64> => MsOrNull, Always;
            /// Whether the SLO held (null when there is no SLO).
            slo_met: Option<bool> => BoolOrNull, Always;
            /// True marginal cost, USD (0 when refused; bias and derate
            /// never touch it). The ledger checks it, never books it.
            marginal_usd: f64 => Usd, Always;
            /// What the cheapest feasible pay-as-you-go destination would
            /// have charged, USD.
            counterfactual_usd: Option<f64> => Usd, Always;
            /// Decision reason or refusal code.
            reason: &'static str => Str, Always;
            /// Whether the model was resident on the destination (null
            /// when none was chosen).
            warm: Option<bool> => BoolOrNull, Added;
            /// Whether a reserved destination served past its commitment,
            /// at its overage price.
            overage: bool => Bool, Added;
            /// Whether the upstream reported more tokens than the request
            /// allowed (the counts are capped; the excess is not booked).
            usage_capped: bool => Bool, Added;
            /// Whether the answer came from ACE's cache.
            cached: bool => Bool, Added;
            /// A hit checked against the upstream (reason `cache_check`)
            /// whose fresh answer said something else than the cached one.
            cache_false_hit: bool => Bool, Added;
            /// The upstream's own time for the request, ms, as Envoy's
            /// router reports it (`x-envoy-upstream-service-time`):
            /// `latency_ms` less this is time spent outside the upstream
            /// (queues, the network, an upload). Null when no upstream
            /// answered (refused, from the cache, a failed connection).
            upstream_ms: Option<u64> => MsOrNull, Added;
            /// The destination's price per input token, USD, as the
            /// control service had set it when the request was decided
            /// (the ledger books it in place of the configuration's);
            /// absent when the configuration's held.
            live_usd_per_input_token: Price => Rate, Added;
            /// The same per output token.
            live_usd_per_output_token: Price => Rate, Added;
            /// The hourly price of the destination's GPUs, USD, as the
            /// control service had set it (spot and on-demand); absent
            /// when the configuration's held.
            live_usd_per_hour: Price => Rate, Added;
            /// The tenant budget that limited the request, by name: the
            /// strictest of its tenant's budgets when one was soft,
            /// exhausted or out of tokens for the minute; else null.
            budget: Option<::std::sync::Arc<str>> => StrOrNull, Added;
            /// What that budget did: `soft` (served only on the rungs it
            /// allows, or refused with 429 when none of them could),
            /// `exhausted` or `tokens_per_minute` (refused with 429);
            /// null when no budget limited the request.
            budget_state: Option<&'static str> => StrOrNull, Added;
        }
    };
}

/// The JSON kinds a field may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A string, never null.
    Str,
    /// A string of lowercase hex digits (an id), absent from older lines.
    Id,
    /// A string or null.
    StrOrNull,
    /// A non-negative integer below 2^32.
    U32,
    /// ms since the Unix epoch (the ledger books 2000 to 2100).
    EpochMs,
    /// A duration in ms (the ledger books up to one day).
    Ms,
    /// A duration in ms, or null.
    MsOrNull,
    /// `true` or `false`.
    Bool,
    /// `true`, `false` or null.
    BoolOrNull,
    /// A dollar amount (fixed-point to the picodollar), or null when not
    /// finite.
    Usd,
    /// A price (USD per token or per hour, fixed-point to the
    /// picodollar), absent (or null) when there is none; priced with, so
    /// its range is checked.
    Rate,
}

impl Kind {
    /// The JSON type, as the documentation writes it.
    pub const fn json(self) -> &'static str {
        match self {
            Kind::Str => "string",
            Kind::Id => "string (hex)",
            Kind::StrOrNull => "string | null",
            Kind::U32 => "integer (u32)",
            Kind::EpochMs => "integer (ms since the epoch)",
            Kind::Ms => "integer (ms)",
            Kind::MsOrNull => "integer (ms) | null",
            Kind::Bool => "boolean",
            Kind::BoolOrNull => "boolean | null",
            Kind::Usd => "number (USD) | null",
            Kind::Rate => "number (USD per token or hour) | absent",
        }
    }
}

/// Whether every line has a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// Every line of every schema the ledger reads has it.
    Always,
    /// Added later: older lines lack it, and read as null or `false`.
    Added,
}

/// One field of the line, as documented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    /// Its key.
    pub name: &'static str,
    /// Its JSON kind.
    pub kind: Kind,
    /// Whether every line has it.
    pub presence: Presence,
    /// What it means.
    pub doc: &'static str,
}

macro_rules! field_table {
    ($( $(#[doc = $doc:literal])* $name:ident : $fty:ty $(, via $via:ident)? => $kind:ident, $presence:ident; )*) => {
        /// Every field of the line, in order (derived from
        /// [`event_fields!`](crate::event_fields)).
        pub const FIELDS: &[Field] = &[$(
            Field {
                name: stringify!($name),
                kind: Kind::$kind,
                presence: Presence::$presence,
                doc: concat!($($doc),*),
            },
        )*];
    };
}
crate::event_fields!(field_table);

/// [`FIELDS`] as a Markdown table (for documentation).
pub fn markdown() -> String {
    let mut out = String::from("| field | JSON | in every line | meaning |\n|---|---|---|---|\n");
    for f in FIELDS {
        let doc: Vec<&str> = f.doc.split_whitespace().collect();
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            f.name,
            f.kind.json(),
            if f.presence == Presence::Always {
                "yes"
            } else {
                "no (added later)"
            },
            doc.join(" ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_follows_the_definition() {
        let names: Vec<&str> = FIELDS.iter().map(|f| f.name).collect();
        assert_eq!(names.first(), Some(&"schema"));
        assert!(names.contains(&"cache_false_hit"));
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len(), "no field twice");
        assert!(
            FIELDS.iter().all(|f| !f.doc.is_empty()),
            "every field documented"
        );
        assert!(markdown().contains("| `time_ms` | integer (ms since the epoch) | yes |"));
    }
}
