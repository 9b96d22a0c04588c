//! Simulator speed: requests simulated per second, per policy.
fn main() {}
