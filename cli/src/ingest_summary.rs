//! What `ace ledger ingest` prints after an ingest, shared with the demo
//! (`ace-demo`), which books its own access log at the end.

use crate::outln;
use ace_ledger::ingest::Summary;
use ace_ledger::report::terminal;

/// Print what an ingest did; malformed lines with their numbers (the
/// first `MAX_SHOWN`).
pub fn print_summary(s: &Summary) {
    const MAX_SHOWN: usize = 20;
    outln!(
        "{}: {} lines, {} events booked, {} already in the ledger, {} malformed{}",
        terminal(&s.source),
        s.lines,
        s.new,
        s.already,
        s.rejected.len(),
        if s.disagreements > 0 {
            format!(", {} whose logged cost differs from the ledger's (booked at the ledger's; `ace ledger trace --flagged`)", s.disagreements)
        } else {
            String::new()
        }
    );
    for r in s.rejected.iter().take(MAX_SHOWN) {
        outln!(
            "  {}:{}: {}",
            terminal(&r.source),
            r.line,
            terminal(&r.error)
        );
    }
    for c in s.conflicts.iter().take(MAX_SHOWN) {
        outln!(
            "  {}:{}: event id {} was stored for a different event; booked apart as {} (`ace ledger trace --flagged`)",
            terminal(&c.source),
            c.line,
            c.event_id,
            c.booked_as
        );
    }
    if s.rejected.len() > MAX_SHOWN {
        outln!(
            "  ... and {} more malformed lines",
            s.rejected.len() - MAX_SHOWN
        );
    }
    if let Some(n) = s.incomplete {
        outln!(
            "  {}:{n}: incomplete last line (no newline yet), not booked; ingest again once it is complete",
            terminal(&s.source)
        );
    }
}
