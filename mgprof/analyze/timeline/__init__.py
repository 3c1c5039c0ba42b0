"""``mgprof timeline``: every rank of a job in one Chrome/Perfetto trace, on one clock."""
