"""Experiments that explained one figure of benchmarks/RESULTS.md; see README.md here."""
