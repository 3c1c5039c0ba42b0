"""The rows and verdict of ``mgprof compare``: strategies and precisions, measured."""
