"""Store reads: eight hosts fill one blob from the server, or straight from the HA store.

Run from the repository root (needs ZooKeeper, ``scripts/zookeeper install``, and moto's S3
server, ``moto[server]``, from the test extra)::

    .venv/bin/python -m benchmarks.bench_store_reads            # 256 MiB, 8 hosts, 3 rounds
    .venv/bin/python -m benchmarks.bench_store_reads --quick    # a smoke test: 8 MiB, 2 hosts

One run holds a real ZooKeeper, moto's S3 server on 127.0.0.1 (s3fs reaches it through
``AWS_ENDPOINT_URL`` and fake keys, as benchmarks/harness/s3.py sets them) and two leader
``blobsvc serve --recovery-mode zookeeper`` children: one whose HA store is a directory
(a shared mount, as every host would see it), one whose HA store is ``s3://``. The same blob
is uploaded to both. Each round, ``--hosts`` cache processes, each with its own cache
directory (one host each), open their caches, meet at a barrier and fetch the blob at once,
three ways, in an order that turns from round to round so that drift hits all alike:

* ``server``: ``BlobCache(store_reads=False)`` against the directory-store leader: every
  byte comes from the server;
* ``directory``: store reads from the shared directory (the server answers STATUS and STAT);
* ``s3``: store reads from moto's S3.

Per way and round: the wall time from the barrier to the last host holding its verified
path, the server's body bytes sent (``blobsvc_sent_bytes_total`` on its /metrics) and GETs,
the server process's CPU seconds, the bytes the caches copied from the store
(``bytes_from_store``), the caches' own CPU, and moto's CPU. Every copy is hashed again
after the clock stops. One JSON object per line, then ``{"summary": ...}`` with the medians.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import re
import secrets
import shutil
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import blake3

from benchmarks.bench_cache import upload
from benchmarks.harness.s3 import MotoServer, s3
from benchmarks.harness.zk import HaServer, ZooKeeper, wait_for_leader
from blobsvc import BlobCache, BlobClient
from blobsvc.bench._measure import emit, machine, process_cpu_seconds

WAYS = ("server", "directory", "s3")
FILL_TIMEOUT = 600.0  # one round's fill, on a loaded 2-core machine with moto's S3 at ~100 MB/s
CLOCK_TICK = os.sysconf("SC_CLK_TCK")


def _fill(server: str, cache_dir: Path, key: str, store_reads: bool, barrier: Any, results: Any) -> None:
    """One host: open its own cache, wait for the others, fetch the blob, report, then hash
    the copy (outside the clock) so the parent knows every host holds the blob's bytes."""
    with BlobCache(server, cache_dir, timeout=120, max_bytes=1 << 40, store_reads=store_reads) as cache:
        barrier.wait(120)
        started, cpu = time.monotonic(), time.process_time()
        path = cache.path(key)
        ended, cpu = time.monotonic(), time.process_time() - cpu
        stats = cache.stats()
        digest = blake3.blake3()
        digest.update_mmap(str(path))
        results.put(
            {
                "started": started,
                "ended": ended,
                "cpu": cpu,
                "verified": digest.hexdigest() == key,
                "bytes_from_store": stats.bytes_from_store,
                "bytes_fetched": stats.bytes_fetched,
                "store_fallbacks": stats.store_fallbacks,
                "store_refused": stats.store_refused,
            }
        )


def fill_hosts(context: Any, server: str, key: str, hosts: int, work: Path, store_reads: bool) -> list[dict[str, Any]]:
    """``hosts`` cache processes, each with its own fresh cache directory, fill ``key`` at once."""
    barrier, results = context.Barrier(hosts), context.Queue()
    dirs = [work / f"host-{i}" for i in range(hosts)]
    children = [
        context.Process(target=_fill, args=(server, d, key, store_reads, barrier, results), daemon=True) for d in dirs
    ]
    for child in children:
        child.start()
    answers: list[dict[str, Any]] = []
    deadline = time.monotonic() + FILL_TIMEOUT
    try:
        while len(answers) < hosts:
            try:
                answers.append(results.get(timeout=1.0))
            except queue.Empty:
                # A host that died (a full disk, say) never answers: say so now, not at the deadline.
                failed = [child.exitcode for child in children if child.exitcode not in (None, 0)]
                if failed:
                    raise RuntimeError(f"{len(failed)} of {hosts} hosts failed (exit codes {failed})") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{hosts - len(answers)} of {hosts} hosts still filling after {FILL_TIMEOUT}s"
                    ) from None
    finally:
        for child in children:
            child.join(30)
            if child.is_alive():
                child.kill()  # by its Process handle: only the children started here
        for d in dirs:  # their dirty pages must not slow the next way's writes
            shutil.rmtree(d, ignore_errors=True)
    return answers


def cpu_seconds_with_exited_threads(pid: int) -> float:
    """utime + stime of ``pid`` from /proc/PID/stat, which counts threads that have exited:
    moto's server runs each connection on a thread of its own, gone by the time we look, so
    :func:`process_cpu_seconds` (live threads only) would miss most of its work."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICK


class Leader:
    """A zookeeper-mode leader with its HA store at ``ha_dir``, and its counters."""

    def __init__(self, zk: ZooKeeper, ha_dir: str | Path, data_dir: Path, cluster: str) -> None:
        self.server = HaServer(
            zk.hosts, ha_dir, data_dir, cluster_id=cluster, session_timeout=10.0, extra=("--metrics-port", "0")
        )
        try:
            if wait_for_leader(f"zk://{zk.hosts}/{cluster}", timeout=60) != self.server.address:
                raise RuntimeError(f"{self.server.address} does not lead {cluster}")
            with BlobClient(self.server.address, timeout=30) as client:
                status = client.status()
        except BaseException:
            self.server.kill()
            raise
        self.address: str = self.server.address
        self.store: str = status["store"]
        self.metrics = f"http://{status['metrics_address']}/metrics"

    def counters(self) -> tuple[float, int, float]:
        """Body bytes sent, GETs answered, CPU seconds: all so far."""
        with urllib.request.urlopen(self.metrics, timeout=30) as reply:
            text = reply.read().decode()
        match = re.search(r"^blobsvc_sent_bytes_total (\S+)$", text, re.M)
        if match is None:
            raise RuntimeError("no blobsvc_sent_bytes_total in the server's metrics")
        with BlobClient(self.address, timeout=30) as client:
            gets = int(client.status()["requests"].get("GET", 0))
        return float(match.group(1)), gets, process_cpu_seconds(self.server.process.pid)


def measure(
    context: Any, way: str, leader: Leader, moto: MotoServer, key: str, size: int, hosts: int, work: Path, round_: int
) -> dict[str, Any]:
    assert moto.process is not None
    sent, gets, cpu = leader.counters()
    moto_cpu = cpu_seconds_with_exited_threads(moto.process.pid)
    answers = fill_hosts(context, leader.address, key, hosts, work / f"{way}-{round_}", store_reads=way != "server")
    sent_after, gets_after, cpu_after = leader.counters()
    seconds = max(a["ended"] for a in answers) - min(a["started"] for a in answers)
    record = {
        "bench": "store_reads",
        "way": way,
        "round": round_,
        "hosts": hosts,
        "size": size,
        "seconds": round(seconds, 3),
        "aggregate_MB_s": round(hosts * size / seconds / 1e6, 1),
        "verified": sum(a["verified"] for a in answers),
        "server_sent_bytes": int(sent_after - sent),
        "server_gets": gets_after - gets,
        "server_cpu_s": round(cpu_after - cpu, 3),
        "store_bytes": sum(a["bytes_from_store"] for a in answers),
        "fetched_bytes": sum(a["bytes_fetched"] for a in answers),
        "store_fallbacks": sum(a["store_fallbacks"] for a in answers),
        "store_refused": sum(a["store_refused"] for a in answers),
        "caches_cpu_s": round(sum(a["cpu"] for a in answers), 3),
        "moto_cpu_s": round(cpu_seconds_with_exited_threads(moto.process.pid) - moto_cpu, 2),
        "loadavg": round(os.getloadavg()[0], 2),
    }
    emit(record)
    if record["verified"] != hosts:
        raise RuntimeError(f"{hosts - record['verified']} of {hosts} hosts hold a copy that is not the blob")
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke test: 8 MiB, 2 hosts, 1 round")
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--hosts", type=int, default=8, help="cache processes, each with its own cache directory")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of all three ways")
    parser.add_argument("--tmp-dir", help="where ZooKeeper, the stores, the servers' data and the caches go")
    args = parser.parse_args()
    size, hosts, rounds = (8 << 20, 2, 1) if args.quick else (args.size_mib << 20, args.hosts, args.rounds)
    emit({"bench": "setup", "size": size, "hosts": hosts, "rounds": rounds, **machine()})
    moto = MotoServer().start()
    records: list[dict[str, Any]] = []
    try:
        # Exported before any child starts: the servers and the forkserver (hence every cache
        # process) inherit the endpoint and keys, and s3fs reads them when it makes a filesystem.
        with moto.export(), tempfile.TemporaryDirectory(prefix="bench-store-reads-", dir=args.tmp_dir) as temp:
            work = Path(temp)
            bucket = f"bench-{secrets.token_hex(4)}"
            s3().mkdir(bucket)
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(["blobsvc.cache", "blobsvc.ha.reads", "s3fs"])
            zk = ZooKeeper(work / "zookeeper").start()
            leaders: dict[str, Leader] = {}
            try:
                leaders["directory"] = Leader(zk, work / "shared-mount", work / "data-directory", "directory")
                leaders["s3"] = Leader(zk, f"s3://{bucket}/ha", work / "data-s3", "s3")
                leaders["server"] = leaders["directory"]  # store reads off: its own disk serves
                started = time.monotonic()
                keys = {name: upload(leaders[name].address, size) for name in ("directory", "s3")}
                stores = {name: leaders[name].store for name in keys}
                emit({"bench": "upload", "seconds": round(time.monotonic() - started, 2), "stores": stores})
                for round_ in range(rounds):
                    for way in WAYS[round_ % 3 :] + WAYS[: round_ % 3]:
                        key = keys["s3" if way == "s3" else "directory"]
                        records.append(measure(context, way, leaders[way], moto, key, size, hosts, work, round_))
            finally:
                for leader in {id(x): x for x in leaders.values()}.values():
                    leader.server.kill()
                zk.stop()
    finally:
        moto.stop()
    summary: dict[str, Any] = {"size": size, "hosts": hosts, "rounds": rounds}
    for way in WAYS:
        mine = [r for r in records if r["way"] == way]
        for field in ("seconds", "aggregate_MB_s", "server_sent_bytes", "server_cpu_s", "store_bytes", "moto_cpu_s"):
            summary[f"{way}_{field}"] = statistics.median(r[field] for r in mine)
    emit({"summary": summary})


if __name__ == "__main__":
    main()
