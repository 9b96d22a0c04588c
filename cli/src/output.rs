//! Standard output that does not panic when the reader goes away.
//!
//! Rust's `println!` panics when stdout is a closed pipe (`ace policy dump
//! DIR | head -1`), because Rust ignores SIGPIPE. Every subcommand prints
//! through [`outln!`](crate::outln) and [`out!`](crate::out) instead: a
//! closed pipe ends the output quietly, any other write error is reported
//! once on stderr, and the command still finishes its work (files it
//! writes are written whatever happens to its report).

use std::io::ErrorKind;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once a write has failed: later output is dropped without retrying.
static CLOSED: AtomicBool = AtomicBool::new(false);

/// Handle the result of one write to stdout (used by the macros).
#[doc(hidden)]
pub fn emit(r: std::io::Result<()>) {
    if let Err(e) = r {
        if !CLOSED.swap(true, Ordering::Relaxed) && e.kind() != ErrorKind::BrokenPipe {
            eprintln!("error: cannot write output: {e}");
        }
    }
}

/// Whether stdout is still being written (false after a failed write).
#[doc(hidden)]
pub fn open() -> bool {
    !CLOSED.load(Ordering::Relaxed)
}

/// A command's exit: its own code, or on an error `error: ...` and each
/// cause on stderr, and failure (the `ace` command's and the demo's).
pub fn exit_code(result: anyhow::Result<ExitCode>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::FAILURE
        }
    }
}

/// `println!` that never panics: see the [module docs](crate::output).
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if $crate::output::open() {
            $crate::output::emit(writeln!(std::io::stdout().lock(), $($arg)*));
        }
    }};
}

/// `print!` that never panics: see the [module docs](crate::output).
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if $crate::output::open() {
            $crate::output::emit(write!(std::io::stdout().lock(), $($arg)*));
        }
    }};
}
