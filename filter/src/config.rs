//! The plugin configuration: parsed and validated once in `on_configure`,
//! then trusted on every request.
//!
//! Every error names the field that is wrong (a JSON path such as
//! `destinations[1].price_usd`) and says what would be accepted, because the
//! only place an operator sees it is one line of Envoy's log.

use ace_core::merit::Offer;
use serde::Deserialize;
use std::collections::HashSet;
use std::fmt;

/// The header the filter writes and Envoy's route reads (`cluster_header`).
pub const DEFAULT_DESTINATION_HEADER: &str = "x-ace-destination";

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Destinations in configuration order (the tie-break order).
    pub destinations: Vec<Destination>,
    /// The request header that carries the chosen Envoy cluster.
    pub destination_header: String,
    /// The offers table handed to the core, one entry per destination.
    pub offers: Vec<Offer>,
}

/// One place a request can be sent.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Destination {
    /// Operator-facing name, unique in the configuration.
    pub name: String,
    /// The Envoy cluster that serves this destination.
    pub cluster: String,
    /// Static price of one request in US dollars (finite, at least 0).
    pub price_usd: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    destinations: Vec<Destination>,
    #[serde(default)]
    destination_header: Option<String>,
}

/// A configuration that cannot be used, with the field at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// JSON path of the offending field, e.g. `destinations[2].cluster`.
    pub field: String,
    /// What is wrong and what would be accepted.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid ACE plugin configuration at `{}`: {}",
            self.field, self.message
        )
    }
}

impl std::error::Error for ConfigError {}

fn err(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        message: message.into(),
    }
}

impl Config {
    /// Parse and validate the plugin configuration bytes (JSON).
    pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(err(
                "<root>",
                "the configuration is empty; expected a JSON object with `destinations`",
            ));
        }
        let de = &mut serde_json::Deserializer::from_slice(bytes);
        let raw: RawConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let field = if path.is_empty() || path == "." || path == "?" {
                "<root>".to_string()
            } else {
                path
            };
            err(field, e.into_inner().to_string())
        })?;
        Self::validate(raw)
    }

    fn validate(raw: RawConfig) -> Result<Config, ConfigError> {
        if raw.destinations.is_empty() {
            return Err(err("destinations", "at least one destination is required"));
        }
        let mut names = HashSet::new();
        for (i, d) in raw.destinations.iter().enumerate() {
            if d.name.trim().is_empty() {
                return Err(err(format!("destinations[{i}].name"), "must not be empty"));
            }
            if !names.insert(d.name.as_str()) {
                return Err(err(
                    format!("destinations[{i}].name"),
                    format!(
                        "duplicate destination name {:?}; names must be unique",
                        d.name
                    ),
                ));
            }
            if !is_header_value_safe(&d.cluster) {
                return Err(err(
                    format!("destinations[{i}].cluster"),
                    "must be a non-empty Envoy cluster name of visible ASCII characters",
                ));
            }
            if !d.price_usd.is_finite() || d.price_usd < 0.0 {
                return Err(err(
                    format!("destinations[{i}].price_usd"),
                    format!("must be a finite number >= 0, got {}", d.price_usd),
                ));
            }
        }
        let destination_header = match raw.destination_header {
            None => DEFAULT_DESTINATION_HEADER.to_string(),
            Some(h) => {
                let lower = h.to_ascii_lowercase();
                let valid = !lower.is_empty()
                    && lower
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
                if !valid {
                    return Err(err(
                        "destination_header",
                        format!("{h:?} is not a valid header name (letters, digits, '-', '_')"),
                    ));
                }
                lower
            }
        };
        let offers = raw
            .destinations
            .iter()
            .map(|d| Offer {
                cost_usd: d.price_usd,
                available: true,
            })
            .collect();
        Ok(Config {
            destinations: raw.destinations,
            destination_header,
            offers,
        })
    }
}

fn is_header_value_safe(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(json: &str) -> String {
        match Config::parse(json.as_bytes()) {
            Ok(c) => format!("unexpectedly valid: {c:?}"),
            Err(e) => e.field,
        }
    }

    #[test]
    fn accepts_a_good_configuration() {
        let c = Config::parse(
            br#"{"destinations":[{"name":"a","cluster":"ca","price_usd":0.5},
                                 {"name":"b","cluster":"cb","price_usd":0}]}"#,
        );
        let c = c.map_err(|e| e.to_string());
        assert_eq!(c.as_ref().map(|c| c.destinations.len()), Ok(2));
        assert_eq!(
            c.as_ref().map(|c| c.destination_header.as_str()),
            Ok("x-ace-destination")
        );
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(field_of(""), "<root>");
        assert_eq!(field_of("{"), "<root>");
        assert_eq!(field_of(r#"{"destinations":[]}"#), "destinations");
        assert_eq!(
            field_of(r#"{"destinations":[{"name":"a","cluster":"c","price_usd":"x"}]}"#),
            "destinations[0].price_usd"
        );
        assert_eq!(
            field_of(r#"{"destinations":[{"name":"a","cluster":"c","price_usd":-1}]}"#),
            "destinations[0].price_usd"
        );
        assert_eq!(
            field_of(
                r#"{"destinations":[{"name":"a","cluster":"c","price_usd":1},{"name":"a","cluster":"d","price_usd":1}]}"#
            ),
            "destinations[1].name"
        );
        assert_eq!(
            field_of(r#"{"destinations":[{"name":"a","cluster":"","price_usd":1}]}"#),
            "destinations[0].cluster"
        );
        assert_eq!(
            field_of(r#"{"destinations":[{"name":"a","cluster":"c"}]}"#),
            "destinations[0]"
        );
        assert_eq!(
            field_of(
                r#"{"destinations":[{"name":"a","cluster":"c","price_usd":1}],"destination_header":"bad header"}"#
            ),
            "destination_header"
        );
    }

    #[test]
    fn missing_field_message_names_it() {
        let e = Config::parse(br#"{"destinations":[{"name":"a","cluster":"c"}]}"#)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("price_usd"), "{e}");
    }
}
