"""Where per-rank trace work runs (this process, local workers, Dask) and its summary cache."""
