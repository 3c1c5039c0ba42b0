"""What mgprof puts around the script's model: wrap, auto-wrap, precision, no_sync, batch size."""
