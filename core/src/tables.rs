//! Feasibility tables compiled from Cedar policies (being built).
