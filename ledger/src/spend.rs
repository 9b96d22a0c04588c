//! Tenant budgets' spend read again and again from one store: what the
//! control service publishes (`ace control serve --ledger-store`, through
//! the `ace` command, which hands a [`Reader`] to the service).
//!
//! A [`Reader`] opens the store when it first reads, keeps it open
//! between reads, and closes it after a failure so that the next read
//! opens it again (a store that went down, or a file replaced). A SQLite
//! file must exist: opening would create an empty ledger, which reads
//! every budget as unspent. A password in a `postgres://` URL never
//! appears in what it shows or says ([`shown`]).

use crate::store::Store;
use ace_config::Budgets;
use ace_snapshot::Budget;
use std::path::PathBuf;

/// Whether `url` names a PostgreSQL store.
fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// `url` with any password replaced by `***` (`postgres://u:***@host/db`,
/// `?password=***`), for logs and errors. A file path is shown as given.
pub fn shown(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let auth_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(auth_end);
    let authority = match authority.rsplit_once('@') {
        Some((user, host)) => match user.split_once(':') {
            Some((name, _)) => format!("{name}:***@{host}"),
            None => authority.to_string(),
        },
        None => authority.to_string(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let q: Vec<String> = query
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                    _ => kv.to_string(),
                })
                .collect();
            format!("{path}?{}", q.join("&"))
        }
        None => tail.to_string(),
    };
    format!("{scheme}://{authority}{tail}")
}

/// Reads every budget's spend from one store, reconnecting after a failure.
pub struct Reader {
    url: String,
    /// `url` as logs show it.
    shown: String,
    store: Option<Box<dyn Store>>,
    /// A SQLite store's file and its identity when opened: a file deleted
    /// or replaced under an open connection is noticed, not read as it was.
    file: Option<(PathBuf, Option<(u64, u64)>)>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("store", &self.shown)
            .field("open", &self.store.is_some())
            .finish()
    }
}

/// PostgreSQL's synchronous client runs a runtime of its own to close
/// its connection, which panics on a thread that drives tokio's tasks
/// (the control service's, when it stops and drops the reader): the store
/// is closed on a thread of its own.
impl Drop for Reader {
    fn drop(&mut self) {
        self.close();
    }
}

/// A file's device and inode (Unix), to tell a replaced file from the one
/// opened.
fn identity(meta: &std::fs::Metadata) -> Option<(u64, u64)> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt as _;
        Some((meta.dev(), meta.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        None
    }
}

impl Reader {
    /// A reader of the store at `url` (a SQLite file path or a
    /// `postgres://` URL); nothing is opened yet. An empty `url`, or one
    /// of another scheme, is refused with a message that follows the name
    /// of the input it came from (`--ledger-store is empty: ...`).
    pub fn new(url: &str) -> Result<Reader, String> {
        let url = url.trim();
        if url.is_empty() {
            return Err("is empty: give the ledger's SQLite file or its postgres:// URL".into());
        }
        if url.contains("://") && !is_postgres(url) {
            return Err(format!(
                "`{}` is neither a postgres:// URL nor a file path: give the store `ace ledger \
                 ingest --store` writes",
                shown(url)
            ));
        }
        Ok(Reader {
            url: url.to_string(),
            shown: shown(url),
            store: None,
            file: None,
        })
    }

    /// The store as logs show it, its password left out.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// A reader of the same store with nothing open (after a read that
    /// did not come back).
    pub fn fresh(&self) -> Reader {
        Reader {
            url: self.url.clone(),
            shown: self.shown.clone(),
            store: None,
            file: None,
        }
    }

    /// Close the store, if open, on a thread of its own (see `Drop`).
    fn close(&mut self) {
        if let Some(store) = self.store.take() {
            let _ = std::thread::Builder::new()
                .name("ace-ledger-close".into())
                .spawn(move || drop(store));
        }
    }

    /// The store, opened if it is not: a SQLite file must exist (the
    /// opener would create an empty ledger, which reads every budget as
    /// unspent) and still be the file opened.
    fn store(&mut self) -> Result<&mut Box<dyn Store>, String> {
        if !is_postgres(&self.url) {
            let path = PathBuf::from(&self.url);
            let meta = std::fs::metadata(&path).map_err(|e| {
                format!(
                    "cannot read the ledger file ({e}); a missing file is not created, since an \
                     empty ledger would read every budget as unspent: give the file `ace ledger \
                     ingest --store` writes"
                )
            })?;
            if !meta.is_file() {
                return Err("is not a file: give the ledger's SQLite file".into());
            }
            let id = identity(&meta);
            if self.store.is_some() && self.file.as_ref().is_some_and(|(_, was)| *was != id) {
                // Replaced since it was opened: open the new one.
                self.close();
            }
            self.file = Some((path, id));
        }
        if self.store.is_none() {
            let s = crate::store::open(&self.url).map_err(|e| self.message(&e))?;
            self.store = Some(s);
        }
        self.store
            .as_mut()
            .ok_or_else(|| "the store did not open".to_string())
    }

    /// An error of the store's as one line, the password left out.
    fn message(&self, e: &anyhow::Error) -> String {
        let text = format!("{e:#}");
        if self.url == self.shown {
            text
        } else {
            text.replace(&self.url, &self.shown)
        }
    }

    /// Every budget's reading as of `now_ms` ([`crate::budget::readings`]:
    /// each `read_ms` is `now_ms`). Blocking: the control service runs it
    /// on its blocking pool. A failure closes the store, so the next read
    /// opens it again.
    pub fn read(&mut self, budgets: &Budgets, now_ms: u64) -> Result<Vec<Budget>, String> {
        let got = match self.store() {
            Ok(s) => crate::budget::readings(s.as_mut(), budgets, now_ms),
            Err(e) => {
                self.close();
                return Err(e);
            }
        };
        got.map_err(|e| {
            let msg = self.message(&e);
            self.close();
            msg
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        assert_eq!(
            shown("postgres://ace:s3cret@db.internal:5432/ledger?sslmode=require&password=x"),
            "postgres://ace:***@db.internal:5432/ledger?sslmode=require&password=***"
        );
        assert_eq!(
            shown("postgresql://ace@db/ledger"),
            "postgresql://ace@db/ledger"
        );
        assert_eq!(
            shown("/var/lib/ace/ledger.sqlite"),
            "/var/lib/ace/ledger.sqlite"
        );
        let e = Reader::new("mysql://root:pw@db/x").unwrap_err();
        assert!(e.contains("neither a postgres:// URL"), "{e}");
        assert!(!e.contains("pw@"), "{e}");
        assert!(Reader::new("  ").is_err());
    }

    #[test]
    fn a_missing_file_is_an_error_not_an_empty_ledger() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("nope.sqlite");
        let mut r = Reader::new(&path.display().to_string()).expect("reader");
        let b = Budgets::validate(&[ace_config::BudgetSettings {
            name: "a".into(),
            tenants: vec!["t".into()],
            usd: Some(1.0),
            ..Default::default()
        }])
        .expect("budgets");
        let e = r.read(&b, 1_796_607_000_000).unwrap_err();
        assert!(e.contains("a missing file is not created"), "{e}");
        assert!(!path.exists());
    }
}
