//! Text from the access log (a client's request id, tenant and model
//! names) made safe to print: the report, the trace and the bill
//! reconciliation write it through [`terminal`].

/// `s` for a terminal: each control character (C0, DEL, C1: escape
/// sequences start with them) written as its Rust escape (`\u{1b}`), so
/// text from the log prints as text.
pub fn terminal(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_string();
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}
