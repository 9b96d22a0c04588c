//! Model routing: a request for one model served by another that may
//! stand in for it, when that is cheaper and the policy allows it.
//!
//! Why it lives in the feasibility step and not after it: a substitute is
//! a different request as far as policy goes (another model, which other
//! destinations serve, and which a tenant or a data class may refuse).
//! So each candidate model is looked up in the compiled tables on its own,
//! with the request's other attributes, its `model` set to the candidate
//! and the computed Bool attribute `substituted` set to whether it is
//! another model than the one asked for. The destinations a request may
//! reach are the union of those masks, each destination paired with the
//! cheapest model it may serve it with; nothing outside the tables can
//! add a pair, and a tenant whose policy forbids `substituted` only ever
//! gets the model it named.
//!
//! What may stand in for what is the operator's equivalence classes
//! (`model_routing.classes`): a request naming a class member may be
//! served by any member, a request naming the class itself by any member
//! (that is not a substitution: it asked for the class). What a model
//! costs on a destination, relative to the destination's configured token
//! prices, is `model_routing.cost_factors` (default 1): the merit order
//! prices each pair at its factor ([`ace_core::dispatch::decide_scaled`]).
//!
//! When the model served differs from the one named, the body's `model`
//! is rewritten ([`rewrite_model`]) before the request leaves, since the
//! upstream serves the model its body names.

use ace_config::{ConfigError, Warmth};
use ace_core::tables::Tables;

pub use ace_config::{RoutingSettings, SUBSTITUTED};

/// One model of some class.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    /// Its name (the body's `model`).
    pub name: String,
    /// Its value index in the tables' `model` attribute.
    pub value: u32,
    /// Its class.
    pub class: usize,
}

/// Model routing, validated against the tables.
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    /// Every class member, class by class, each class in its order.
    pub members: Vec<Member>,
    /// Per class: its name and the range of its members in `members`.
    classes: Vec<(String, std::ops::Range<usize>)>,
    /// Every class and member name, sorted: the class, and the member
    /// when the name is one.
    names: Vec<(String, usize, Option<usize>)>,
    /// `factors[member * destinations + d]`: the member's price factor on
    /// destination `d`.
    factors: Vec<f64>,
    destinations: usize,
    /// Positions of `model` and `substituted` in the tables' attributes.
    model_attribute: usize,
    substituted_attribute: usize,
    /// Value indices of `false` and `true` for `substituted`.
    no: u32,
    yes: u32,
}

/// What a request named, as routing sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asked {
    /// The class of the name.
    pub class: usize,
    /// The member named, or `None` when the request named the class.
    pub member: Option<usize>,
}

/// No member assigned to a destination.
pub const NONE: u16 = u16::MAX;

fn err(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        message: message.into(),
    }
}

impl Routing {
    /// Validate `s` against `tables` and the destination names.
    pub fn build(
        s: &RoutingSettings,
        tables: Option<&Tables<'_>>,
        destinations: &[&str],
    ) -> Result<Routing, ConfigError> {
        let Some(tables) = tables else {
            return Err(err(
                "model_routing",
                "needs compiled policy tables (tables_base64): who may be served another model \
                 than the one asked for is a policy decision",
            ));
        };
        let Some(model_attribute) = tables.attribute_index("model") else {
            return Err(err(
                "model_routing",
                "the tables do not read `model`: without it they cannot say which destinations \
                 serve a substitute; read `context.model` in a policy (model_capability.cedar)",
            ));
        };
        let Some(substituted_attribute) = tables.attribute_index(SUBSTITUTED) else {
            return Err(err(
                "model_routing",
                "the tables have no `substituted` attribute: declare `substituted: Bool` in the \
                 context of `dispatch` (ace.cedarschema) so that Cedar decides who may be served \
                 another model, and recompile",
            ));
        };
        let (no, yes) = (
            tables.value_index(substituted_attribute, "false"),
            tables.value_index(substituted_attribute, "true"),
        );
        if no == ace_core::tables::UNKNOWN || yes == ace_core::tables::UNKNOWN {
            return Err(err(
                "model_routing",
                "the tables' `substituted` attribute is not a Bool (values false, true); \
                 declare it `substituted: Bool`",
            ));
        }
        if s.classes.is_empty() {
            return Err(err(
                "model_routing.classes",
                "is empty; list at least one class, e.g. {\"chat\": [\"gpt-4o\", \"llama-3.1-70b\"]}",
            ));
        }
        let n = destinations.len();
        let mut members = Vec::new();
        let mut classes = Vec::new();
        let mut names: Vec<(String, usize, Option<usize>)> = Vec::new();
        for (c, (class, models)) in s.classes.iter().enumerate() {
            let field = format!("model_routing.classes.{class}");
            if class.trim().is_empty() {
                return Err(err(field, "a class needs a name"));
            }
            if models.len() < 2 {
                return Err(err(
                    field,
                    "needs at least two models (a class of one has nothing to substitute)",
                ));
            }
            if tables.value_index(model_attribute, class) != ace_core::tables::UNKNOWN {
                return Err(err(
                    field,
                    format!("{class:?} is a model of the catalogue; name the class otherwise"),
                ));
            }
            let start = members.len();
            names.push((class.clone(), c, None));
            for (i, m) in models.iter().enumerate() {
                let value = tables.value_index(model_attribute, m);
                if value == ace_core::tables::UNKNOWN {
                    return Err(err(
                        format!("{field}[{i}]"),
                        format!("{m:?} is not a model the tables know; list catalogue models"),
                    ));
                }
                names.push((m.clone(), c, Some(members.len())));
                members.push(Member {
                    name: m.clone(),
                    value,
                    class: c,
                });
            }
            classes.push((class.clone(), start..members.len()));
        }
        names.sort_by(|a, b| a.0.cmp(&b.0));
        let twice = names
            .iter()
            .zip(names.iter().skip(1))
            .find(|(a, b)| a.0 == b.0);
        if let Some((a, _)) = twice {
            return Err(err(
                "model_routing.classes",
                format!(
                    "{:?} is named twice (a model may be in one class only, and a class name \
                     may not be a member's)",
                    a.0
                ),
            ));
        }
        let mut factors = vec![1.0; members.len() * n];
        for (dest, by_model) in &s.cost_factors {
            let Some(d) = destinations.iter().position(|x| x == dest) else {
                return Err(err(
                    format!("model_routing.cost_factors.{dest}"),
                    "names no destination of this configuration",
                ));
            };
            for (model, f) in by_model {
                let field = format!("model_routing.cost_factors.{dest}.{model}");
                if !(f.is_finite() && *f > 0.0 && *f <= 1e6) {
                    return Err(err(field, "must be a number in (0, 1e6]"));
                }
                let mut any = false;
                for (k, m) in members.iter().enumerate() {
                    if &m.name == model {
                        any = true;
                        if let Some(slot) = factors.get_mut(k * n + d) {
                            *slot = *f;
                        }
                    }
                }
                if !any {
                    return Err(err(field, "names no model of any class"));
                }
            }
        }
        Ok(Routing {
            members,
            classes,
            names,
            factors,
            destinations: n,
            model_attribute: model_attribute as usize,
            substituted_attribute: substituted_attribute as usize,
            no,
            yes,
        })
    }

    /// What `name` is to routing: a class, a member, or nothing.
    pub fn asked(&self, name: &str) -> Option<Asked> {
        let name = name.trim();
        let i = self
            .names
            .binary_search_by(|(n, _, _)| n.as_str().cmp(name))
            .ok()?;
        self.names.get(i).map(|(_, class, member)| Asked {
            class: *class,
            member: *member,
        })
    }

    /// The model a request naming `asked` is priced against when it is
    /// not substituted: the member named, or the class's reference model.
    pub fn reference(&self, asked: Asked) -> Option<&Member> {
        match asked.member {
            Some(m) => self.members.get(m),
            None => self
                .classes
                .get(asked.class)
                .and_then(|(_, r)| self.members.get(r.start)),
        }
    }

    /// The reference model of `name` ([`Routing::reference`]), when routing
    /// knows the name.
    pub fn reference_of(&self, name: &str) -> Option<&str> {
        self.reference(self.asked(name)?).map(|m| m.name.as_str())
    }

    /// Member `m`'s price factor on destination `d`.
    pub fn factor(&self, m: usize, d: usize) -> f64 {
        self.factors
            .get(m * self.destinations + d)
            .copied()
            .unwrap_or(1.0)
    }

    /// The position of `substituted` among the tables' attributes.
    pub fn substituted_attribute(&self) -> usize {
        self.substituted_attribute
    }

    /// The value index of `substituted` = `on`.
    pub fn substituted_value(&self, on: bool) -> u32 {
        if on {
            self.yes
        } else {
            self.no
        }
    }

    /// Fill `pairs` with the (destination, model) pairs a request naming
    /// `asked` may be served by: `values` are the request's attribute value
    /// indices (its `model` and `substituted` are set per candidate and
    /// left at the reference model, not substituted). Each destination
    /// gets the cheapest member it may serve (ties to the one named, then
    /// class order). A lookup that fails allows nothing: fail closed.
    pub fn expand(&self, tables: &Tables<'_>, values: &mut [u32], asked: Asked, pairs: &mut Pairs) {
        self.expand_without(tables, values, asked, None, pairs);
    }

    /// [`Routing::expand`] with member `skip` never a candidate (a soft
    /// budget that allows substitutes only leaves out the model named):
    /// each destination gets the cheapest of the other members it may
    /// serve, and one that may serve only `skip` is not in the mask.
    pub fn expand_without(
        &self,
        tables: &Tables<'_>,
        values: &mut [u32],
        asked: Asked,
        skip: Option<usize>,
        pairs: &mut Pairs,
    ) {
        pairs.fit(self.destinations);
        pairs.mask.fill(0);
        pairs.assigned.fill(NONE);
        pairs.scale.fill(1.0);
        let Some((_, range)) = self.classes.get(asked.class) else {
            return;
        };
        // The member named first, so that a tie keeps it.
        let order = asked
            .member
            .into_iter()
            .chain(range.clone().filter(|m| Some(*m) != asked.member))
            .filter(|m| Some(*m) != skip);
        for m in order {
            let Some(member) = self.members.get(m) else {
                continue;
            };
            let substituted = asked.member.is_some_and(|a| a != m);
            if let Some(v) = values.get_mut(self.model_attribute) {
                *v = member.value;
            }
            if let Some(v) = values.get_mut(self.substituted_attribute) {
                *v = self.substituted_value(substituted);
            }
            if tables.feasible(values, &mut pairs.one).is_err() {
                continue;
            }
            for (w, word) in pairs.one.iter().enumerate() {
                let mut bits = *word;
                while bits != 0 {
                    let b = bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    let d = w * 64 + b;
                    let f = self.factor(m, d);
                    let (Some(slot), Some(scale)) =
                        (pairs.assigned.get_mut(d), pairs.scale.get_mut(d))
                    else {
                        continue;
                    };
                    if *slot == NONE || f < *scale {
                        *slot = m as u16;
                        *scale = f;
                    }
                }
                if let Some(x) = pairs.mask.get_mut(w) {
                    *x |= word;
                }
            }
        }
        if let Some(r) = self.reference(asked) {
            if let Some(v) = values.get_mut(self.model_attribute) {
                *v = r.value;
            }
        }
        if let Some(v) = values.get_mut(self.substituted_attribute) {
            *v = self.no;
        }
    }
}

/// Per-worker buffers for the pairs of one request, reused.
#[derive(Debug, Clone, Default)]
pub struct Pairs {
    /// Destinations that may serve the request with some member.
    pub mask: Vec<u64>,
    /// Per destination, the member it serves the request with ([`NONE`]).
    pub assigned: Vec<u16>,
    /// Per destination, that member's price factor there.
    pub scale: Vec<f64>,
    /// Per destination, whether the member it serves is resident.
    pub warm: Vec<u64>,
    /// Scratch mask.
    one: Vec<u64>,
}

impl Pairs {
    fn fit(&mut self, n: usize) {
        let words = n.div_ceil(64);
        self.mask.resize(words, 0);
        self.one.resize(words, 0);
        self.warm.resize(words, 0);
        self.assigned.resize(n, NONE);
        self.scale.resize(n, 1.0);
    }

    /// The member destination `d` serves the request with.
    pub fn member(&self, d: usize) -> Option<usize> {
        self.assigned
            .get(d)
            .filter(|m| **m != NONE)
            .map(|m| usize::from(*m))
    }
}

/// The pairs of one request as a host decides among them
/// ([`crate::fleet::FleetOp::ClaimRouted`]).
#[derive(Debug)]
pub struct Routed<'a> {
    pairs: &'a mut Pairs,
    routing: &'a Routing,
}

impl<'a> Routed<'a> {
    /// The pairs in `pairs`, of `routing`'s members.
    pub fn new(pairs: &'a mut Pairs, routing: &'a Routing) -> Routed<'a> {
        Routed { pairs, routing }
    }

    /// The destinations that may serve the request, which of them have
    /// their pair's model resident under `warmth`, and each one's price
    /// factor: what [`ace_core::fleet::FleetState::decide_scaled`] takes.
    pub fn parts(&mut self, warmth: &Warmth) -> (&[u64], &[u64], &[f64]) {
        let p = &mut *self.pairs;
        p.warm.fill(0);
        for (k, member) in self.routing.members.iter().enumerate() {
            let resident = warmth.mask(Some(&member.name));
            for (d, m) in p.assigned.iter().enumerate() {
                if usize::from(*m) == k && ace_core::dispatch::bit(resident, d) {
                    if let Some(w) = p.warm.get_mut(d / 64) {
                        *w |= 1 << (d % 64);
                    }
                }
            }
        }
        (&p.mask, &p.warm, &p.scale)
    }

    /// The destinations that may serve the request (any model).
    pub fn feasible(&self) -> &[u64] {
        &self.pairs.mask
    }
}

/// `body` with its top-level `model` string replaced by `model`, or
/// `None` when the body has no top-level `model` string (nothing is
/// guessed: the caller then serves the model named). The rest of the body
/// is kept byte for byte.
pub fn rewrite_model(body: &[u8], model: &str) -> Option<Vec<u8>> {
    let span = model_span(body)?;
    let mut out = Vec::with_capacity(body.len() + model.len());
    out.extend_from_slice(body.get(..span.start)?);
    crate::event::string(&mut out, model.as_bytes());
    out.extend_from_slice(body.get(span.end..)?);
    Some(out)
}

/// The byte range of the top-level `model` value (a JSON string, quotes
/// included), found by a scan that tracks strings and nesting; keys are
/// compared after unescaping, as a JSON parser reads them.
fn model_span(body: &[u8]) -> Option<std::ops::Range<usize>> {
    let mut depth = 0usize;
    let mut i = 0usize;
    // At depth 1, whether the next string is a key.
    let mut expect_key = false;
    let mut found: Option<std::ops::Range<usize>> = None;
    while let Some(&c) = body.get(i) {
        match c {
            b'{' => {
                depth += 1;
                expect_key = depth == 1;
                i += 1;
            }
            b'[' => {
                depth += 1;
                i += 1;
            }
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                i += 1;
            }
            b',' => {
                expect_key = depth == 1;
                i += 1;
            }
            b'"' => {
                let end = string_end(body, i)?;
                if depth == 1 && expect_key {
                    expect_key = false;
                    let key = body.get(i..end)?;
                    let is_model = key == b"\"model\""
                        || (key.contains(&b'\\')
                            && serde_json::from_slice::<String>(key).is_ok_and(|k| k == "model"));
                    if is_model {
                        // The value: after the colon and whitespace.
                        let mut j = end;
                        while body
                            .get(j)
                            .is_some_and(|b| b.is_ascii_whitespace() || *b == b':')
                        {
                            j += 1;
                        }
                        if body.get(j) != Some(&b'"') {
                            return None;
                        }
                        let value_end = string_end(body, j)?;
                        if found.is_some() {
                            return None; // the key twice: ambiguous
                        }
                        found = Some(j..value_end);
                        i = value_end;
                        continue;
                    }
                }
                i = end;
            }
            _ => i += 1,
        }
    }
    found
}

/// The index just past the JSON string starting at `start` (a quote).
fn string_end(body: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    loop {
        match body.get(i)? {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::setup::Setup;
    use ace_core::tables::{
        encode, AttributeSpec, DestinationSpec, FactorKind, FactorSpec, TableSpec,
    };
    use base64::Engine;

    /// Two destinations serving models `a` and `b`; `computed` names the
    /// Bool attributes the tables have besides `model`.
    fn config(computed: &[&str], extra: &str) -> Result<Setup, ace_config::ConfigError> {
        let bools: Vec<(&str, &[&str])> = computed
            .iter()
            .map(|c| (*c, &["false", "true"][..]))
            .collect();
        config_with(&bools, extra)
    }

    /// [`config`] with each extra attribute's values given.
    fn config_with(
        computed: &[(&str, &[&str])],
        extra: &str,
    ) -> Result<Setup, ace_config::ConfigError> {
        let mut attributes = vec![AttributeSpec::new("model", &["a", "b"])];
        for (c, values) in computed {
            attributes.push(AttributeSpec {
                name: c.to_string(),
                values: values.iter().map(|v| v.to_string()).collect(),
            });
        }
        let spec = TableSpec {
            destinations: vec![
                DestinationSpec::new("d0", "c0"),
                DestinationSpec::new("d1", "c1"),
            ],
            attributes,
            factors: vec![FactorSpec {
                kind: FactorKind::Permit,
                attributes: vec![0],
                rows: vec![0, 0b01, 0b10],
            }],
        };
        let b64 = base64::engine::general_purpose::STANDARD
            .encode(encode(&spec).unwrap_or_else(|e| panic!("{e}")));
        Setup::parse(
            format!(
                r#"{{"destinations":[{{"name":"d0","cluster":"c0"}},{{"name":"d1","cluster":"c1"}}],
                    "tables_base64":"{b64}","body":{{"read":true}}{extra}}}"#
            )
            .as_bytes(),
        )
    }

    fn refused(computed: &[&str], extra: &str) -> (String, String) {
        match config(computed, extra) {
            Ok(_) => ("accepted".into(), String::new()),
            Err(e) => (e.field, e.message),
        }
    }

    #[test]
    fn configurations_that_cannot_route_or_cache_safely_are_refused_naming_the_fix() {
        let classes = r#","model_routing":{"classes":{"c":["a","b"]}}"#;
        assert!(config(&["substituted"], classes).is_ok());
        let (field, message) = refused(&[], classes);
        assert_eq!(field, "model_routing");
        assert!(message.contains("substituted: Bool"), "{message}");
        let unknown = r#","model_routing":{"classes":{"c":["a","zz"]}}"#;
        assert_eq!(
            refused(&["substituted"], unknown).0,
            "model_routing.classes.c[1]"
        );
        let twice = r#","model_routing":{"classes":{"c":["a","b"],"e":["b","a"]}}"#;
        assert_eq!(refused(&["substituted"], twice).0, "model_routing.classes");
        let named_like_a_model = r#","model_routing":{"classes":{"a":["a","b"]}}"#;
        assert_eq!(
            refused(&["substituted"], named_like_a_model).0,
            "model_routing.classes.a"
        );
        let factor =
            r#","model_routing":{"classes":{"c":["a","b"]},"cost_factors":{"nope":{"a":0.5}}}"#;
        assert_eq!(
            refused(&["substituted"], factor).0,
            "model_routing.cost_factors.nope"
        );
        let zero = r#","model_routing":{"classes":{"c":["a","b"]},"cost_factors":{"d0":{"a":0}}}"#;
        assert_eq!(
            refused(&["substituted"], zero).0,
            "model_routing.cost_factors.d0.a"
        );
        let (field, message) = refused(&[], r#","cache":{}"#);
        assert_eq!(field, "cache");
        assert!(message.contains("cached: Bool"), "{message}");
        assert!(config(&["cached"], r#","cache":{}"#).is_ok());
        // A `cached` that is not a Bool could never be set true: refused
        // with the tables, not a cache that silently never answers.
        let not_bool = config_with(&[("cached", &["no", "yes"])], r#","cache":{}"#);
        let e = not_bool.err().unwrap_or_else(|| panic!("accepted"));
        assert_eq!(e.field, "tables_base64", "{}", e.message);
        assert!(
            e.message.contains("`cached` attribute is not a Bool"),
            "{}",
            e.message
        );
        assert_eq!(
            refused(&["cached"], r#","cache":{"check_fraction":2}"#).0,
            "cache.check_fraction"
        );
    }

    #[test]
    fn a_client_cannot_set_what_ace_computes() {
        let cfg = config(&["substituted", "cached"], "").unwrap_or_else(|e| panic!("{e}"));
        let (tables, policy) = (cfg.tables.unwrap(), cfg.config.policy.as_ref().unwrap());
        let sent: [(&[u8], &[u8]); 4] = [
            (b"x-ace-model", b"a"),
            (b"x-ace-substituted", b"true"),
            (b"x-ace-substituted", b"false"),
            (b"x-ace-cached", b"true"),
        ];
        let headers = crate::headers::Pairs::encode(sent);
        let mut values = vec![0u32; 3];
        let resolved = crate::attributes::resolve(
            &tables,
            policy,
            &headers,
            None,
            crate::attributes::no_trusted,
            &mut values,
        );
        assert!(
            resolved.is_ok(),
            "never a conflict: the headers are not read"
        );
        assert_eq!(values[1], policy.computed_default(1).unwrap());
        assert_eq!(values[2], policy.computed_default(2).unwrap());
    }

    #[test]
    fn pairs_pick_the_cheapest_model_each_destination_may_serve() {
        let cfg = config(
            &["substituted"],
            r#","model_routing":{"classes":{"c":["a","b"]},"cost_factors":{"d1":{"b":0.5}}}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let (tables, routing) = (cfg.tables.unwrap(), cfg.routing.as_ref().unwrap());
        let mut values = vec![0u32; 2];
        let mut pairs = Pairs::default();
        // Named `a`: d0 serves a, d1 serves the substitute b at half price.
        routing.expand(
            &tables,
            &mut values,
            routing.asked("a").unwrap(),
            &mut pairs,
        );
        assert_eq!(pairs.mask, [0b11]);
        assert_eq!((pairs.member(0), pairs.member(1)), (Some(0), Some(1)));
        assert_eq!(pairs.scale, [1.0, 0.5]);
        assert_eq!(
            values,
            [routing.members[0].value, routing.substituted_value(false)]
        );
        // Substitutes only: d0 may serve nothing but `a`, so it leaves.
        routing.expand_without(
            &tables,
            &mut values,
            routing.asked("a").unwrap(),
            Some(0),
            &mut pairs,
        );
        assert_eq!(pairs.mask, [0b10]);
        assert_eq!(pairs.member(1), Some(1));
        // The class: the same pairs, none a substitution.
        routing.expand(
            &tables,
            &mut values,
            routing.asked("c").unwrap(),
            &mut pairs,
        );
        assert_eq!(pairs.mask, [0b11]);
        assert_eq!(routing.asked("zz"), None);
    }

    /// Substitutes only: a destination where the model named is the
    /// cheapest still serves a substitute it may serve, rather than
    /// leaving the merit order.
    #[test]
    fn substitutes_only_leaves_out_the_model_named_not_its_destinations() {
        let spec = TableSpec {
            destinations: ["d0", "d1"]
                .map(|d| DestinationSpec {
                    name: d.into(),
                    cluster: d.into(),
                })
                .to_vec(),
            attributes: vec![
                AttributeSpec::new("model", &["a", "b"]),
                AttributeSpec::new("substituted", &["false", "true"]),
            ],
            factors: vec![FactorSpec {
                kind: FactorKind::Permit,
                attributes: vec![0],
                rows: vec![0, 0b11, 0b11],
            }],
        };
        let b64 = base64::engine::general_purpose::STANDARD
            .encode(encode(&spec).unwrap_or_else(|e| panic!("{e}")));
        let cfg = Setup::parse(
            format!(
                r#"{{"destinations":[{{"name":"d0","cluster":"d0"}},{{"name":"d1","cluster":"d1"}}],
                    "tables_base64":"{b64}","body":{{"read":true}},
                    "model_routing":{{"classes":{{"c":["a","b"]}},
                                      "cost_factors":{{"d0":{{"b":2.0}},"d1":{{"b":0.5}}}}}}}}"#
            )
            .as_bytes(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let (tables, routing) = (cfg.tables.unwrap(), cfg.routing.as_ref().unwrap());
        let mut values = vec![0u32; 2];
        let mut pairs = Pairs::default();
        let asked = routing.asked("a").unwrap();
        routing.expand(&tables, &mut values, asked, &mut pairs);
        assert_eq!((pairs.member(0), pairs.member(1)), (Some(0), Some(1)));
        routing.expand_without(&tables, &mut values, asked, Some(0), &mut pairs);
        assert_eq!(pairs.mask, [0b11], "d0 stays, serving the substitute");
        assert_eq!((pairs.member(0), pairs.member(1)), (Some(1), Some(1)));
        assert_eq!(pairs.scale, [2.0, 0.5]);
    }

    #[test]
    fn the_model_is_rewritten_and_nothing_else() {
        let body = br#"{"messages":[{"role":"user","content":"say \"model\": x","model":"no"}],"model" : "gpt-4o","temperature":0}"#;
        let out = rewrite_model(body, "llama-3.1-70b").unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"messages":[{"role":"user","content":"say \"model\": x","model":"no"}],"model" : "llama-3.1-70b","temperature":0}"#
        );
        let escaped = br#"{"mod\u0065l":"a"}"#;
        assert_eq!(
            rewrite_model(escaped, "b").unwrap(),
            br#"{"mod\u0065l":"b"}"#.to_vec()
        );
        for bad in [
            &br#"{"model":7}"#[..],
            br#"{"x":{"model":"a"}}"#,
            br#"{"model":"a","model":"b"}"#,
            br#"{"model":"a"#,
            b"",
            b"}}",
        ] {
            assert_eq!(
                rewrite_model(bad, "m"),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
