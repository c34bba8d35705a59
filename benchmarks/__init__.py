"""Benchmarks of blobsvc; run ``python -m benchmarks.bench_server --help``."""
