"""Benchmarks: `make bench`, or one script with `python -m benchmarks.NAME`."""
