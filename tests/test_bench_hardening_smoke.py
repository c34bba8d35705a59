"""The TLS and slow-client benchmarks run end to end with ``--quick`` and print JSON lines.

Speed is not asserted: this only proves the benchmarks still work against the current code.
"""

from __future__ import annotations

import pytest

from .test_bench_smoke import run_quick


@pytest.mark.slow
def test_quick_tls_benchmark_reports_both_paths() -> None:
    records = {r["bench"]: r for r in run_quick("benchmarks.bench_tls")}
    assert set(records) == {"setup", "put_plain", "put_tls", "get_plain", "get_tls"}
    assert records["get_tls"]["median_MB_s"] > 0
    assert "ratio_to_plain" in records["put_tls"]


@pytest.mark.slow
def test_quick_slow_client_benchmark_reports_the_wait() -> None:
    records = {r["bench"]: r for r in run_quick("benchmarks.bench_slow_clients")}
    lockout = records["slow_client_lockout"]
    assert lockout["probes"] == 1
    assert lockout["target_met"] is True
