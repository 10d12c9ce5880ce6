"""Static memory planning: request traces, offline DSA solvers, the caching-allocator model."""
