"""Benchmarks that print ratios measured side by side in one run (`python -m bench`, docs/benchmarks.md)."""
