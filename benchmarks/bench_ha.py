"""High availability: failover time, and what zookeeper mode costs a PUT against standalone.

Run from the repository root (needs Debian's zookeeper package: ``scripts/zookeeper install``)::

    .venv/bin/python -m benchmarks.bench_ha            # the full run (a minute or two)
    .venv/bin/python -m benchmarks.bench_ha --quick    # a smoke test

Every measurement is one JSON object per line on stdout, ending with ``{"summary": ...}``.

* ``failover``: two ``blobsvc serve --recovery-mode zookeeper`` children with 1 s ZooKeeper
  sessions (``tickTime=500``) and one real ZooKeeper. Each round SIGKILLs the leader and
  times from the kill to the first PUT acknowledged through the ``zk://`` URL, by a client
  that learns nothing but that URL; the killed server is then started again as a standby.
  Goal: under 3 s.
* ``put_<size>_<mode>``: PUTs of new blobs through :class:`blobsvc.AsyncBlobClient`, to a
  standalone server and to a zookeeper-mode leader whose HA store is a directory on the same
  disk, in the same run, taking turns three times; the summary has the medians. Large
  blobs one at a time (MB/s, MB = 10**6 bytes); 4 KiB blobs over 8 concurrent connections
  (PUTs per second).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.zk import HaServer, ZooKeeper, wait_for_leader
from blobsvc.client import AsyncBlobClient

FAILOVER_GOAL = 3.0


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


async def _put_until_acknowledged(url: str, data: bytes) -> None:
    async with AsyncBlobClient(url, retries=50, backoff=0.02, connect_timeout=30.0, timeout=10.0) as client:
        await client.put(data)


def bench_failover(zk: ZooKeeper, work: Path, rounds: int) -> list[float]:
    url = f"zk://{zk.hosts}/failover"
    servers = {
        name: HaServer(zk.hosts, work / "ha", work / name, cluster_id="failover", session_timeout=1.0)
        for name in ("a", "b")
    }
    times: list[float] = []
    try:
        for number in range(rounds):
            leader_address = wait_for_leader(url)
            asyncio.run(_put_until_acknowledged(url, secrets.token_bytes(4096)))  # the client path is warm
            (name,) = [n for n, s in servers.items() if s.address == leader_address]
            start = time.monotonic()
            os.kill(servers[name].process.pid, signal.SIGKILL)
            asyncio.run(_put_until_acknowledged(url, secrets.token_bytes(4096)))
            elapsed = time.monotonic() - start
            times.append(elapsed)
            emit({"bench": "failover", "round": number, "seconds": round(elapsed, 3)})
            servers[name].kill()
            servers[name] = HaServer(zk.hosts, work / "ha", work / name, cluster_id="failover", session_timeout=1.0)
    finally:
        for server in servers.values():
            server.kill()
    return times


def _standalone(data_dir: Path) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "blobsvc", "serve", "--host", "127.0.0.1", "--port", "0"),
            *("--data-dir", str(data_dir), "--log-level", "warning"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("listening on "):
        process.kill()
        raise RuntimeError(f"standalone server did not start: {line!r}")
    return process, line.split()[-1]


async def _put_large(server: str, size: int, count: int) -> float:
    blobs = [secrets.token_bytes(size) for _ in range(count)]
    async with AsyncBlobClient(server, timeout=60.0) as client:
        start = time.perf_counter()
        for blob in blobs:
            await client.put(blob)
        return size * count / (time.perf_counter() - start) / 1e6


async def _put_small(server: str, count: int, concurrency: int = 8) -> float:
    blobs = [secrets.token_bytes(4096) for _ in range(count)]
    async with AsyncBlobClient(server, timeout=60.0) as client:

        async def worker(share: list[bytes]) -> None:
            for blob in share:
                await client.put(blob)

        start = time.perf_counter()
        await asyncio.gather(*(worker(blobs[i::concurrency]) for i in range(concurrency)))
        return count / (time.perf_counter() - start)


def bench_throughput(zk: ZooKeeper, work: Path, quick: bool) -> dict[str, float]:
    """Both modes in turns, ``repeat`` times, so that a burst of load from elsewhere on the
    machine hits both alike; the medians are compared."""
    large, large_count, small_count, repeat = (8 << 20, 2, 200, 1) if quick else (64 << 20, 4, 1000, 3)
    label = f"{large >> 20}MiB"
    samples: dict[str, list[float]] = {}
    standalone, standalone_address = _standalone(work / "standalone")
    ha_server = HaServer(zk.hosts, work / "ha-tp", work / "zk-data", cluster_id="throughput", session_timeout=10.0)
    try:
        wait_for_leader(f"zk://{zk.hosts}/throughput")
        for _ in range(repeat):
            for mode, server in (("standalone", standalone_address), ("zookeeper", ha_server.address)):
                mbps = asyncio.run(_put_large(server, large, large_count))
                samples.setdefault(f"put_{label}_{mode}", []).append(mbps)
                emit({"bench": f"put_{label}", "mode": mode, "MB_per_s": round(mbps, 1)})
                rate = asyncio.run(_put_small(server, small_count))
                samples.setdefault(f"put_4KiB_{mode}", []).append(rate)
                emit({"bench": "put_4KiB", "mode": mode, "puts_per_s": round(rate, 1)})
    finally:
        standalone.kill()
        standalone.wait(10)
        ha_server.kill()
    results = {name: statistics.median(values) for name, values in samples.items()}
    for kind in (f"put_{label}", "put_4KiB"):
        results[f"{kind}_ratio"] = results[f"{kind}_zookeeper"] / results[f"{kind}_standalone"]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke test: few rounds, small blobs")
    parser.add_argument("--rounds", type=int, default=10, help="leader kills to time")
    parser.add_argument("--tmp-dir", help="where ZooKeeper, the HA store and the data directories go")
    args = parser.parse_args()
    rounds = 2 if args.quick else args.rounds
    with tempfile.TemporaryDirectory(prefix="bench-ha-", dir=args.tmp_dir) as temp:
        work = Path(temp)
        zk = ZooKeeper(work / "zookeeper").start()
        try:
            times = bench_failover(zk, work, rounds)
            throughput = bench_throughput(zk, work, args.quick)
        finally:
            zk.stop()
    summary = {
        "failover_median_s": round(statistics.median(times), 3),
        "failover_worst_s": round(max(times), 3),
        "failover_rounds": len(times),
        **{name: round(value, 3) for name, value in throughput.items()},
    }
    emit({"summary": summary, "targets_met": {"failover_worst_under_3s": max(times) < FAILOVER_GOAL}})


if __name__ == "__main__":
    main()
