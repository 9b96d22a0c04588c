//! ace-control: the out-of-band control service.
//!
//! Nothing lives here yet: the control service is a later issue. The crate
//! exists so the workspace has the shape the rest of the code grows into
//! (what each request cost is already in its own crate, `ace-ledger`).
#![forbid(unsafe_code)]
