"""The figures of one saved run: steps, throughput, utilisation, comm, memory, precision, noise."""
