//! Tenant budgets' spend for `ace control serve --ledger-store`: the
//! ledger's store ([`ace_ledger::spend::Reader`]) as the control service's
//! [`Spend`]. It lives here, where both are linked, so that the service
//! does not link the ledger.

use ace_config::Budgets;
use ace_control::{Error, Spend};
use ace_ledger::spend::Reader;
use ace_snapshot::Budget;

/// The ledger's store, read for budget spend.
#[derive(Debug)]
pub struct LedgerSpend(Reader);

impl LedgerSpend {
    /// The store at `url` (`--ledger-store`: a SQLite file or a
    /// `postgres://` URL); nothing is opened yet. An empty URL, or one of
    /// another scheme, is an error naming the flag (never a password).
    pub fn new(url: &str) -> Result<LedgerSpend, Error> {
        Reader::new(url)
            .map(LedgerSpend)
            .map_err(|e| Error(format!("--ledger-store {}", ace_control::logged(&e))))
    }
}

impl Spend for LedgerSpend {
    fn shown(&self) -> &str {
        self.0.shown()
    }

    fn readings(&mut self, budgets: &Budgets, now_ms: u64) -> Result<Vec<Budget>, String> {
        self.0.read(budgets, now_ms)
    }

    fn fresh(&self) -> Box<dyn Spend> {
        Box::new(LedgerSpend(self.0.fresh()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_url_of_another_kind_is_refused_without_its_password() {
        let e = LedgerSpend::new("mysql://root:hunter2@db/ledger")
            .unwrap_err()
            .0;
        assert!(
            e.starts_with(
                "--ledger-store `mysql://root:***@db/ledger` is neither a postgres:// URL"
            ),
            "{e}"
        );
        assert!(!e.contains("hunter2"), "{e}");
        let e = LedgerSpend::new(" ").unwrap_err().0;
        assert!(e.starts_with("--ledger-store is empty: "), "{e}");
    }
}
