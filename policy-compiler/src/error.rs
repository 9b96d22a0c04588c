//! Compile errors that point at the input: file, line, column, a message
//! and a hint saying what to change.
//!
//! Why one type for everything: an operator fixing a policy directory wants
//! every problem in one pass, each in the same `file:line:column` shape that
//! editors and terminals turn into links, whether it came from Cedar's
//! parser, Cedar's validator, the manifest or our own factorisation.
//!
//! [`VerifyError`] is the other kind: why `verify` could not run at all
//! (the oracle could not read the directory, the tables did not load). It
//! lives here, with no other dependency, so that the oracle and `verify`
//! both use it and neither needs the other for it.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// One problem in one input file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// The input file.
    pub file: PathBuf,
    /// 1-based line; 0 when the problem is the file as a whole.
    pub line: usize,
    /// 1-based column (in characters).
    pub column: usize,
    /// What is wrong, lowercase, with user input in backticks.
    pub message: String,
    /// What to do about it.
    pub hint: String,
}

impl Diagnostic {
    /// A problem at byte `offset` of `text`, the contents of `file`.
    pub fn at(file: &Path, text: &str, offset: usize, message: String, hint: String) -> Self {
        let (line, column) = line_col(text, offset);
        Diagnostic {
            file: file.to_path_buf(),
            line,
            column,
            message,
            hint,
        }
    }

    /// A problem with `file` as a whole (missing, unreadable).
    pub fn file(file: &Path, message: String, hint: String) -> Self {
        Diagnostic {
            file: file.to_path_buf(),
            line: 0,
            column: 0,
            message,
            hint,
        }
    }

    /// A problem at the start of `span` in `text`.
    pub fn span(
        file: &Path,
        text: &str,
        span: Range<usize>,
        message: String,
        hint: String,
    ) -> Self {
        Self::at(file, text, span.start, message, hint)
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file.display(), self.message)?;
        } else {
            write!(
                f,
                "{}:{}:{}: {}",
                self.file.display(),
                self.line,
                self.column,
                self.message
            )?;
        }
        if !self.hint.is_empty() {
            write!(f, "\n  hint: {}", self.hint)?;
        }
        Ok(())
    }
}

/// 1-based line and column of byte `offset` in `text` (clamped to the end).
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = text.get(..offset).unwrap_or("");
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before.get(line_start..).map_or(0, |s| s.chars().count()) + 1;
    (line, column)
}

/// Everything that stopped a compile: one or more diagnostics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// The problems, in input order.
    pub diagnostics: Vec<Diagnostic>,
}

impl Error {
    /// An error with one diagnostic.
    pub fn one(d: Diagnostic) -> Self {
        Error {
            diagnostics: vec![d],
        }
    }
}

impl From<Diagnostic> for Error {
    fn from(d: Diagnostic) -> Self {
        Error::one(d)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.diagnostics.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

/// Turns a Cedar diagnostic (parse or validation error) on `text` into ours,
/// at its first labelled span, with Cedar's help as the hint.
pub fn from_cedar(file: &Path, text: &str, d: &dyn miette::Diagnostic, hint: &str) -> Diagnostic {
    let offset = d
        .labels()
        .and_then(|mut labels| labels.next())
        .map_or(0, |l| l.offset());
    let help = d.help().map(|h| h.to_string());
    let mut message = d.to_string();
    if let Some(source) = std::error::Error::source(d) {
        message = format!("{message}: {source}");
    }
    Diagnostic::at(
        file,
        text,
        offset,
        message,
        help.unwrap_or_else(|| hint.to_string()),
    )
}

/// Why verification could not run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyError(pub String);

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for VerifyError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_column_are_one_based() {
        let t = "ab\ncd\n";
        assert_eq!(line_col(t, 0), (1, 1));
        assert_eq!(line_col(t, 4), (2, 2));
        assert_eq!(line_col(t, 99), (3, 1));
    }
}
