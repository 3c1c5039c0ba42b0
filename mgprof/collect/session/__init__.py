"""The profiling session: lifecycle, steps and regions, staging, and delivery to rank 0."""
