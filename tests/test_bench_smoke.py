"""The throughput benchmark runs end to end with ``--quick`` and prints well-formed JSON lines.

Speed is not asserted: this only proves the benchmark still works against the current server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent

THROUGHPUT_FIELDS = {"bench", "bytes", "MB_s", "median_MB_s", "runs_MB_s", "seconds", "sender_cpu", "receiver_cpu"}
RATIO_FIELDS = {"baseline", "ratio", "median_ratio", "target_ratio", "target_met"}
SMALL_FIELDS = {
    "bench",
    "size",
    "connections",
    "ops",
    "seconds",
    "ops_s",
    "MB_s",
    "p50_ms",
    "p99_ms",
    "client_cpu",
    "server_cpu",
}
EXPECTED = {
    "setup": {"bench", "cpus", "python", "data_dir", "filesystem", "size", "repeat", "connections"},
    "baseline_sendfile": THROUGHPUT_FIELDS,
    "baseline_write_fsync": THROUGHPUT_FIELDS,
    "baseline_read_send": THROUGHPUT_FIELDS | RATIO_FIELDS,
    "put_8MiB": THROUGHPUT_FIELDS | RATIO_FIELDS,
    "get_8MiB": THROUGHPUT_FIELDS | RATIO_FIELDS | {"path"},
    "get_8MiB_copy": THROUGHPUT_FIELDS | RATIO_FIELDS | {"path"},
    "client_put_8MiB": THROUGHPUT_FIELDS | RATIO_FIELDS,
    "client_get_8MiB": THROUGHPUT_FIELDS | RATIO_FIELDS,
    "baseline_publish_4KiB": SMALL_FIELDS - {"server_cpu"},
    "put_4KiB": SMALL_FIELDS | {"baseline", "ratio"},
    "get_4KiB": SMALL_FIELDS | {"path", "target_ops_s", "target_met"},
    "get_4KiB_sendfile": SMALL_FIELDS | {"path"},
    "get_64KiB_sendfile": SMALL_FIELDS | {"path"},
    "get_64KiB_copy": SMALL_FIELDS | {"path"},
    "get_1MiB_sendfile": SMALL_FIELDS | {"path"},
    "get_1MiB_copy": SMALL_FIELDS | {"path"},
}


def run_quick(module: str, *args: str, timeout: float = 90) -> list[dict[str, Any]]:
    """The JSON lines of ``python -m MODULE --quick ARGS``, which must exit 0."""
    completed = subprocess.run(
        [sys.executable, "-m", module, "--quick", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert completed.returncode == 0, completed.stderr
    return [json.loads(line) for line in completed.stdout.splitlines()]


def test_quick_benchmark_prints_one_json_object_per_measurement(tmp_path: Path) -> None:
    records = run_quick("benchmarks.bench_server", "--tmp-dir", str(tmp_path))
    assert all(isinstance(record, dict) for record in records)

    *measurements, summary = records
    seen = {record["bench"]: record for record in measurements}
    assert len(seen) == len(measurements), "each measurement is printed once"
    assert set(seen) == set(EXPECTED)
    for name, fields in EXPECTED.items():
        assert fields <= set(seen[name]), f"{name} lacks {fields - set(seen[name])}"
    for name, record in seen.items():
        for key, value in record.items():
            if key.endswith(("MB_s", "ops_s", "_ms", "_cpu", "ratio")) and not isinstance(value, list):
                assert isinstance(value, int | float) and value >= 0, (name, key, value)
    assert seen["get_4KiB"]["ops"] > 0 and seen["put_4KiB"]["ops"] > 0

    assert set(summary) == {"summary", "targets_met"}
    assert set(summary["targets_met"]) == {"get_8MiB", "put_8MiB", "get_4KiB"}
    assert all(isinstance(met, bool) for met in summary["targets_met"].values())
    assert summary["summary"]["get_8MiB_MB_s"] == seen["get_8MiB"]["MB_s"]
    # The data directory is removed afterwards.
    assert list(tmp_path.iterdir()) == []


def test_quick_metrics_benchmark_measures_both_servers_and_a_ratio(tmp_path: Path) -> None:
    records = run_quick("benchmarks.bench_metrics", "--tmp-dir", str(tmp_path))
    benches = [record.get("bench") for record in records]
    assert benches[0] == "setup" and {"get_4KiB_metrics_off", "get_4KiB_metrics_on", "ratio"} <= set(benches)
    summary = records[-1]["summary"]
    assert summary["median_ops_on_over_off"] > 0 and summary["median_cpu_per_op_on_over_off"] > 0
    assert summary["observe_ns"] > 0 and summary["gets_counted_by_metrics"] >= 200
    assert list(tmp_path.iterdir()) == []


def test_quick_ha_benchmark_times_failovers_and_compares_both_modes(tmp_path: Path) -> None:
    records = run_quick("benchmarks.bench_ha", "--tmp-dir", str(tmp_path))
    failovers = [record for record in records if record.get("bench") == "failover"]
    assert len(failovers) == 2 and all(record["seconds"] > 0 for record in failovers)
    summary = records[-1]["summary"]
    assert summary["failover_rounds"] == 2 and summary["failover_worst_s"] >= summary["failover_median_s"]
    assert summary["put_4KiB_ratio"] > 0 and summary["put_8MiB_ratio"] > 0
    assert isinstance(records[-1]["targets_met"]["failover_worst_under_3s"], bool)
    assert list(tmp_path.iterdir()) == []


def test_quick_put_ab_benchmark_measures_both_trees_in_the_same_seconds(tmp_path: Path) -> None:
    records = run_quick("benchmarks.experiments.bench_put_ab", "--tmp-dir", str(tmp_path), str(REPO), str(REPO))
    puts = [record for record in records if record.get("bench") == "put_4KiB"]
    assert len(puts) == 2 and all(record["ops"] > 0 and record["cpu_us"] > 0 for record in puts)
    # The process's and its loop thread's times are read one after the other in 10 ms ticks,
    # so the thread's share may exceed the whole by a tick at each end.
    assert all(0 <= record["loop_user_us"] <= record["user_us"] + 20_000_000 / record["ops"] for record in puts)
    assert records[-1]["summary"]["median_cpu_us_per_put"][f"{REPO} x2"] > 0
    assert list(tmp_path.iterdir()) == []


def test_quick_fsync_benchmark_times_each_way_of_making_files_durable(tmp_path: Path) -> None:
    records = run_quick("benchmarks.experiments.bench_fsync", "--tmp-dir", str(tmp_path))
    ways = {record["bench"]: record for record in records if "files_per_s" in record}
    assert set(ways) == {"sequential", "threads_4", "syncfs"}  # --quick: 4 files, so threads_4 is one per file
    assert all(record["median_ms"] > 0 and record["files_per_s"] > 0 for record in ways.values())
    assert records[-1]["summary"]["files_per_s"] == {name: record["files_per_s"] for name, record in ways.items()}
    assert list(tmp_path.iterdir()) == []


def test_quick_transfer_ab_benchmark_measures_both_trees_in_turn(tmp_path: Path) -> None:
    records = run_quick("benchmarks.experiments.bench_transfer_ab", "--tmp-dir", str(tmp_path), str(REPO), str(REPO))
    transfers = [record for record in records if record.get("bench") in {"put", "get", "get_file"}]
    assert len(transfers) == 6 and all(record["MB_s"] > 0 and record["client_cpu_ms"] > 0 for record in transfers)
    assert records[-1]["summary"]["median_ratio_to_baseline"][f"put {REPO}"] > 0
    assert list(tmp_path.iterdir()) == []


def test_quick_startup_benchmark_times_each_command_against_the_bare_interpreter() -> None:
    records = run_quick("benchmarks.bench_startup")
    assert {record["command"] for record in records} >= {"floor", "blobsvc --version", "blobsvc stat KEY"}
    assert all(record["median_s"] > 0 and record["tree"] == "this" for record in records)


def test_quick_pages_benchmark_times_recycled_and_idle_pages_of_each_kind(tmp_path: Path) -> None:
    records = run_quick("benchmarks.experiments.bench_pages", "--tmp-dir", str(tmp_path))
    kinds = {record["bench"]: record for record in records if "median_MB_s" in record}
    targets = ("file_8MiB", "file_256KiB", "memory")
    assert set(kinds) == {f"{target}_{state}" for target in targets for state in ("recycled", "idle")}
    assert all(record["median_MB_s"] > 0 and record["cpu_ns_per_byte"] > 0 for record in kinds.values())
    assert set(records[-1]["summary"]) == {f"{target}_idle_over_recycled" for target in targets}
    assert list(tmp_path.iterdir()) == []


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(600)  # seven Spark applications; on a busy machine each can take half a minute
def test_quick_agent_benchmark_times_each_application_and_the_agents_http_face(tmp_path: Path) -> None:
    env_dir = tmp_path / "env"  # the quick environment is made from a local wheel: no network
    records = run_quick("benchmarks.bench_agent", "--tmp-dir", str(tmp_path), "--env-dir", str(env_dir), timeout=540)
    setup, *measurements, last = records
    assert setup["bench"] == "setup" and setup["quick"] and setup["archive_bytes"] > 0
    apps = [(r["variant"], r["app"]) for r in measurements if r["bench"] == "application"]
    assert apps == [("baseline", 0), *[(variant, app) for app in (1, 2) for variant in ("spark", "agent", "host")]]
    agent = {r["app"]: r for r in measurements if r.get("variant") == "agent"}
    assert agent[1]["agent_bytes_fetched"] == setup["archive_bytes"] and agent[1]["server_gets"] == 1
    assert agent[2]["agent_bytes_fetched"] == 0 and agent[2]["server_gets"] == 0, "app 2: the host's copy"
    host = {r["app"]: r for r in measurements if r.get("variant") == "host"}
    assert (host[1]["agent_unpacks"], host[2]["agent_unpacks"]) == (1, 0), "unpacked once for the host"
    assert host[2]["agent_bytes_fetched"] == 0
    http = {r["bench"]: r for r in measurements if r["bench"] in {"agent_http_cold", "agent_http", "baseline_sendfile"}}
    assert len(http) == 3 and all(r["median_MB_s"] > 0 for r in http.values())
    summary = last["summary"]
    assert summary["agent_app2"]["server_bytes_sent"] == [0] and summary["http"]["median_ratio"] > 0
    assert summary["host_app2"]["agent_unpacks"] == [0]
    assert set(last["targets_met"]) == {"app2_overhead_at_most_a_tenth_of_spark", "agent_http_at_least_0.8_of_sendfile"}
    assert all(isinstance(met, bool) for met in last["targets_met"].values())
    assert list(tmp_path.iterdir()) == [env_dir], "the working directory is removed afterwards"


def test_quick_unpack_benchmark_times_mains_unpacker_and_this_one(tmp_path: Path) -> None:
    records = run_quick("benchmarks.bench_unpack", "--dir", str(tmp_path))
    assert sorted(record["unpacker"] for record in records[:-1]) == ["base", "this"]
    assert records[-1]["summary"] and records[-1]["ratio"] > 0 and records[-1]["cpu_ratio"] > 0
    assert list(tmp_path.iterdir()) == []
