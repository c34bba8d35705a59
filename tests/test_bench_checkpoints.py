"""The checkpoints benchmark runs end to end with ``--quick`` (2 tasks x 4 files x 1 MiB, 3
checkpoints; ZooKeeper, moto's S3 and two servers on 127.0.0.1) and its records add up.

Speed is not asserted: this only proves the benchmark still works against the current code.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .test_bench_smoke import run_quick


@pytest.mark.slow
@pytest.mark.timeout(300)  # a ZooKeeper JVM, moto and two servers start on a busy 2-core machine
def test_quick_checkpoints_benchmark_takes_every_checkpoint_each_way(tmp_path: Path) -> None:
    setup, *measurements, restore, incremental, summary = run_quick(
        "benchmarks.bench_checkpoints", "--tmp-dir", str(tmp_path), timeout=240
    )
    assert setup["bench"] == "setup" and restore["bench"] == "restore"
    state = setup["tasks"] * setup["files"] * setup["file_size"]
    assert sorted((r["way"], r["checkpoint"]) for r in measurements) == sorted(
        (way, n)
        for way in ("standalone", "zookeeper", "zookeeper-s3", "directory", "s3", "s3-changed")
        for n in range(setup["checkpoints"])
    )
    for record in measurements:
        if record["way"] == "s3-changed":  # the tasks' own puts of what changed, nothing else
            assert record["sent_bytes"] == record["state_bytes"] == record["changed_bytes"]
            continue
        assert record["state_bytes"] == state
        if record["way"] in ("directory", "s3"):  # a copy by hand sends everything, every time
            assert record["sent_bytes"] == state
        elif record["way"] == "standalone":  # blobsvc sends what changed, the server received that (and the metadata)
            assert record["sent_bytes"] == record["changed_bytes"]
            assert record["changed_bytes"] <= record["received_bytes"] <= record["changed_bytes"] + 64 * 1024
            assert record["completion_ms"] > 0
        else:  # zookeeper mode: the tasks wrote what changed into the HA store, the server got names
            assert record["sent_bytes"] == record["changed_bytes"]
            assert record["received_bytes"] <= 64 * 1024
            assert record["completion_ms"] > 0
    assert restore["bytes"] == setup["files"] * setup["file_size"] and restore["ratio"] > 0
    # The incremental checkpoint received the file that changed, the full one all the state.
    assert incremental["bench"] == "incremental"
    assert incremental["state_bytes"] <= incremental["full_received_bytes"] <= incremental["state_bytes"] + 64 * 1024
    changed = incremental["changed_bytes"]
    assert changed <= incremental["incremental_received_bytes"] <= changed + 64 * 1024
    assert set(summary["summary"]["goals_met"]) == {
        "sent_over_changed<=1.1",
        "time_over_directory_copy<=0.25",
        "standalone_completion_ms<=20",
        "zookeeper_completion_ms<=100",
        "restore_over_get_file>=0.8",
        "incremental_over_full<=0.1",
        "zookeeper_over_standalone<=1.2",
        "zookeeper_s3_received_bytes<1MiB",
        "zookeeper_s3_over_changed_put<=1.2",
    }
