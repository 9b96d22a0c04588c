//! ace-harness
