"""The batch-size sweep: its trials, which size to try next, and what the trials say."""
