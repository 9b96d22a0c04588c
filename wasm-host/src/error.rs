//! Errors: everything that can go wrong is a value, never a host panic.
//!
//! A misbehaving guest (a trap, a bad export, an import we lack) is what
//! this crate exists to catch, so each case names what the guest did.

use std::fmt;

/// What went wrong loading or running a filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The module imports functions this host does not provide, named as
    /// `module.name` (e.g. `env.proxy_foo`). Envoy would refuse it too.
    MissingImports(Vec<String>),
    /// The bytes are not a valid Wasm (or WAT) module.
    Compile(String),
    /// Linking or instantiation failed (e.g. an import with the wrong type).
    Instantiate(String),
    /// The module exports no `proxy_abi_version_0_2_x` marker.
    UnsupportedAbi(String),
    /// An export has an unexpected type.
    BadExport {
        /// The export's name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The guest trapped (an SDK panic is a trap). Envoy marks the VM failed.
    Trap {
        /// The callback (export) that trapped.
        callback: String,
        /// Wasmtime's description, with the guest's last critical log line.
        message: String,
    },
    /// `on_vm_start` or `on_configure` returned false: Envoy rejects the
    /// configuration.
    Rejected {
        /// `proxy_on_vm_start` or `proxy_on_configure`.
        callback: String,
    },
    /// The VM trapped earlier and can no longer be used.
    Failed(String),
    /// No stream or callout with this id.
    Unknown(String),
    /// Reading the module file failed.
    Io(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::MissingImports(names) => write!(
                f,
                "the module imports host functions this host does not provide: {}",
                names.join(", ")
            ),
            Error::Compile(m) => write!(f, "cannot compile the module: {m}"),
            Error::Instantiate(m) => write!(f, "cannot instantiate the module: {m}"),
            Error::UnsupportedAbi(m) => write!(f, "unsupported proxy-wasm ABI: {m}"),
            Error::BadExport { name, reason } => write!(f, "export `{name}`: {reason}"),
            Error::Trap { callback, message } => {
                write!(f, "the guest trapped in {callback}: {message}")
            }
            Error::Rejected { callback } => {
                write!(
                    f,
                    "{callback} returned false: the configuration is rejected"
                )
            }
            Error::Failed(m) => write!(f, "the VM failed earlier and cannot run: {m}"),
            Error::Unknown(m) => write!(f, "unknown {m}"),
            Error::Io(m) => write!(f, "cannot read the module: {m}"),
        }
    }
}

impl std::error::Error for Error {}
