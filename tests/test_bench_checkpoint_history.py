"""The checkpoint-history benchmark runs end to end with ``--quick`` (5 checkpoints, 5 requests
of each kind, then a restart) and prints its records. Speed is not asserted."""

from __future__ import annotations

from .test_bench_smoke import run_quick


def test_quick_checkpoint_history_benchmark_times_history_list_status_and_a_rebuild() -> None:
    *requests, rebuild = run_quick("benchmarks.bench_checkpoint_history")
    assert [r["request"] for r in requests] == ["status", "list", "history"]
    assert all(r["p50_ms"] <= r["p99_ms"] for r in requests)
    assert rebuild["entries"] == 5 and rebuild["rebuild_ms"] > 0
