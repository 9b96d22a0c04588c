//! ace-planner: The slow loop: GPU allocator, commitment sizing, valley filling. (being built; see the issue that owns it).
