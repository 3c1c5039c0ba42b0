"""Where memory went: profiler memory events, allocator trace replay, allocator snapshots."""
