"""The checkpoint-requests benchmark runs end to end with ``--quick`` (2 + 2 complete requests
of small metadata against a real server) and prints its records.

Speed is not asserted: this only proves the benchmark still works against the current code.
"""

from __future__ import annotations

from pathlib import Path

from .test_bench_smoke import run_quick


def test_quick_checkpoint_requests_benchmark_measures_status_under_abuse(tmp_path: Path) -> None:
    setup, baseline, abuse, summary = run_quick("benchmarks.bench_checkpoint_requests", "--tmp-dir", str(tmp_path))
    assert setup["bench"] == "setup" and [m["files"] for m in setup["metadata"]] == [1_000, 1_000]
    assert baseline["bench"] == "baseline" and baseline["statuses"] == 50
    assert abuse["bench"] == "abuse" and abuse["completes"] == 4 and abuse["abuser_exit"] == 0
    assert abuse["statuses"] > 0 and abuse["rss_peak_MiB"] >= abuse["rss_before_MiB"]
    assert set(summary["summary"]) >= {"baseline_p99_ms", "abuse_p99_ms", "rss_growth_MiB", "goals_met"}
