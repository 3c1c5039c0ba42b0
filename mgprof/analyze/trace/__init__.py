"""The figures of a rank's trace and of a job's traces: breakdown, comm, kernels, operators."""
