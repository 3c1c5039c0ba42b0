"""``mgprof diff``: what changed between two runs, how sure that is, and where the time went."""
