//! Red team round 3 (issue 50): placeholder, filled in by its owner.
