"""The store-reads benchmark runs end to end with ``--quick`` (8 MiB, 2 hosts, one round:
ZooKeeper, moto's S3 and the servers all on 127.0.0.1) and its records add up.

Speed is not asserted: this only proves the benchmark still works against the current code.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .test_bench_smoke import run_quick


@pytest.mark.slow
@pytest.mark.timeout(300)  # a ZooKeeper JVM, moto and two servers start on a busy 2-core machine
def test_quick_store_reads_benchmark_fills_every_host_each_way(tmp_path: Path) -> None:
    setup, upload, *measurements, summary = run_quick(
        "benchmarks.bench_store_reads", "--tmp-dir", str(tmp_path), timeout=240
    )
    assert setup["bench"] == "setup" and upload["bench"] == "upload"
    assert upload["stores"]["s3"].startswith("s3://")
    size, hosts = setup["size"], setup["hosts"]
    ways = {record["way"]: record for record in measurements}
    assert sorted(ways) == ["directory", "s3", "server"] and len(measurements) == 3
    for way, record in ways.items():
        assert record["verified"] == hosts
        assert (record["store_fallbacks"], record["store_refused"]) == (0, 0)
        if way == "server":  # every byte from the server, once per host
            assert (record["server_sent_bytes"], record["store_bytes"]) == (hosts * size, 0)
        else:  # names and sizes only from the server, the bytes from the store
            assert (record["server_sent_bytes"], record["server_gets"], record["store_bytes"]) == (0, 0, hosts * size)
    assert set(summary["summary"]) >= {"server_seconds", "directory_seconds", "s3_seconds", "s3_moto_cpu_s"}
