//! ace-control: the out-of-band control service and the ledger.
//!
//! Nothing lives here yet: the control service is a later issue. The crate
//! exists so the workspace has the shape the rest of the code grows into.
