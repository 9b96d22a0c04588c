//! ACE's real-Envoy integration tests, one module per subject, built as one
//! test binary: each file here used to be a binary of its own, and linking
//! twenty-two binaries against the harness, the CLI, the simulator and the
//! ledger was a good part of `make test`'s build. Run one subject with
//! `cargo test -p ace-tests --test envoy hostile::` (the module's name).

mod bills;
mod body;
mod budget_edges;
mod budgets;
mod compliance_props;
mod configs;
mod control_dynamic;
mod control_service;
mod crate_graph;
mod docs;
mod dynamic_module;
mod events;
mod example_fleet;
mod fail_closed;
mod feasibility;
mod headroom_edges;
mod hostile;
mod hostile_load;
mod istio;
mod latency;
mod ledger_stream;
mod lints;
mod prefix;
mod providers;
mod reload;
mod rerun;
mod retry;
mod routing;
mod routing_props;
mod sim_replay;
mod spill;
mod trusted;
mod usage_shapes;
mod walking_skeleton;
mod workspace;
