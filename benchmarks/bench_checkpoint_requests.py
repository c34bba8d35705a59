"""Checkpoint requests at their maximum cost: does one client's abuse stall another's STATUS?

Run from the repository root::

    .venv/bin/python -m benchmarks.bench_checkpoint_requests            # 20 + 20 requests
    .venv/bin/python -m benchmarks.bench_checkpoint_requests --quick    # a smoke test: 2 + 2, small

A real ``blobsvc serve`` process. One client registers a coordinator, triggers two checkpoints
and puts their metadata blobs: one of :data:`MAX_METADATA_BYTES` (100,000 files whose paths
fill the cap) and one of 10,000 files 300 directories deep. Then, in a child process, it sends
``--requests`` ``complete`` requests for each, with the right epoch and id, so that the server
does all a completion costs: reading, hashing and parsing the metadata, checking every path,
looking for every state file (none is there: each is refused, NOT_FOUND, and the checkpoint
stays pending for the next). Meanwhile another client sends STATUS requests one after the
other and times each. The baseline is the same STATUS loop for the same number of requests
before the abuse starts, in the same run. The server's resident set (VmRSS) is read before
the abuse and after each STATUS answer.

One JSON object per line: ``setup``, ``baseline``, ``abuse``, then ``{"summary": ...}`` with
the goals: STATUS p99 under abuse < 50 ms, RSS growth < 100 MiB.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import shutil
import statistics
import tempfile
import time
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

from benchmarks.bench_scale import rss_bytes
from blobsvc import AsyncBlobClient, BlobClient
from blobsvc._exceptions import NotFound
from blobsvc.bench._measure import ServerProcess, choose_tmp_parent, emit, machine, run_async
from blobsvc.wire._checkpoints import MAX_METADATA_BYTES, metadata_name, pipeline_job

REPO = Path(__file__).resolve().parent.parent
PIPELINE = "abused"
GOAL_P99_MS = 50.0
GOAL_RSS_GROWTH_MIB = 100.0


def metadata(checkpoint_id: int, files: int, depth: int, size: int | None) -> bytes:
    """A valid metadata document of ``files`` files in one task: paths ``depth`` directories
    deep, or (``size``) long enough that the document is about ``size`` bytes."""

    def document(path_of: Any) -> bytes:
        entries = [{"path": path_of(i), "size": 1, "key": f"{i:064x}", "sent": False} for i in range(files)]
        task = {"task": "0", "kind": "directory", "files": entries}
        head = {"format": 1, "pipeline": PIPELINE, "id": checkpoint_id, "timestamp": 1.0, "savepoint": False}
        return json.dumps({**head, "properties": {}, "tasks": [task]}, separators=(",", ":")).encode()

    if size is None:
        return document(lambda i: "d/" * depth + f"f{i}")
    bare = len(document(lambda i: f"f{i:06d}"))
    pad = "p" * max(0, (size - bare - 1024) // files)
    return document(lambda i: f"{pad}{i:06d}")


def abuse(address: str, epoch: int, work: list[tuple[int, str]], requests: int, go: Event) -> None:
    """``requests`` completions of each checkpoint of ``work``, taking turns (a child process)."""
    go.wait()
    with BlobClient(address, timeout=300, retries=0) as client:
        for _ in range(requests):
            for checkpoint_id, key in work:
                request = {"action": "complete", "pipeline": PIPELINE, "epoch": epoch, "id": checkpoint_id}
                with contextlib.suppress(NotFound):  # no state file is there: refused after every check ran
                    client.checkpoints({**request, "metadata": key, "retain": 1})


async def probe(address: str, pid: int, until: Any, count: int | None = None) -> tuple[list[float], int]:
    """STATUS latencies (ms), ``count`` of them or until ``until()``; the largest RSS seen."""
    latencies: list[float] = []
    peak = rss_bytes(pid)
    async with AsyncBlobClient(address, timeout=120) as client:
        while (count is None and not until()) or (count is not None and len(latencies) < count):
            began = time.perf_counter()
            await client.status()
            latencies.append((time.perf_counter() - began) * 1000)
            peak = max(peak, rss_bytes(pid))
            await asyncio.sleep(0.005)
    return latencies, peak


def percentiles(latencies: list[float]) -> dict[str, float]:
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return {"p50_ms": round(cuts[49], 2), "p99_ms": round(cuts[98], 2), "max_ms": round(max(latencies), 2)}


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_checkpoint_requests", description=__doc__)
    parser.add_argument("--requests", type=int, default=None, help="complete requests of each kind (default 20)")
    parser.add_argument("--quick", action="store_true", help="2 requests of each kind, small metadata")
    parser.add_argument("--tmp-dir", help="Parent of the temporary data directory.")
    args = parser.parse_args(argv)
    requests = args.requests or (2 if args.quick else 20)
    big_files, big_size = (1_000, 1 << 20) if args.quick else (100_000, MAX_METADATA_BYTES)
    deep_files, depth = (1_000, 30) if args.quick else (10_000, 300)
    parent = choose_tmp_parent(args.tmp_dir, REPO / "benchmarks" / "out")
    work = Path(tempfile.mkdtemp(prefix="blobsvc-ckreq-", dir=parent))
    server = ServerProcess(work / "data", work / "server.log")
    try:
        address = f"127.0.0.1:{server.port}"
        with BlobClient(address, timeout=300) as client:
            epoch = client.checkpoints({"action": "register", "pipeline": PIPELINE})["epoch"]
            trigger = {"action": "trigger", "pipeline": PIPELINE, "epoch": epoch, "timeout": 3600}
            blobs = []
            for files, deep, size in ((big_files, 0, big_size), (deep_files, depth, None)):
                checkpoint_id = client.checkpoints(trigger)["id"]
                raw = metadata(checkpoint_id, files, deep, size)
                assert len(raw) <= MAX_METADATA_BYTES
                key = client.put(raw, job=pipeline_job(PIPELINE), name=metadata_name(checkpoint_id))
                blobs.append((checkpoint_id, key, len(raw), files))
        emit(
            {
                "bench": "setup",
                **machine(),
                "loadavg": loadavg(),
                "requests_each": requests,
                "metadata": [{"id": i, "bytes": n, "files": f} for i, _, n, f in blobs],
                "depth": depth,
            }
        )
        baseline, _ = run_async(probe(address, server.pid, None, count=200 if not args.quick else 50))
        emit({"bench": "baseline", "statuses": len(baseline), **percentiles(baseline), "loadavg": loadavg()})
        rss_before = rss_bytes(server.pid)
        go = multiprocessing.get_context("spawn").Event()
        abuser = multiprocessing.get_context("spawn").Process(
            target=abuse, args=(address, epoch, [(i, k) for i, k, _, _ in blobs], requests, go)
        )
        abuser.start()
        began = time.perf_counter()
        go.set()
        try:
            loaded, peak = run_async(probe(address, server.pid, lambda: not abuser.is_alive()))
        finally:
            abuser.join(600)
        seconds = time.perf_counter() - began
        rss_after = rss_bytes(server.pid)
        abused = {
            "bench": "abuse",
            "statuses": len(loaded),
            **percentiles(loaded),
            "completes": 2 * requests,
            "abuse_s": round(seconds, 2),
            "abuser_exit": abuser.exitcode,
            "rss_before_MiB": round(rss_before / 2**20, 1),
            "rss_peak_MiB": round(peak / 2**20, 1),
            "rss_after_MiB": round(rss_after / 2**20, 1),
            "loadavg": loadavg(),
        }
        emit(abused)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    growth = (peak - rss_before) / 2**20
    goals = {f"status_p99_ms<{GOAL_P99_MS:g}": abused["p99_ms"] < GOAL_P99_MS}
    goals[f"rss_growth_MiB<{GOAL_RSS_GROWTH_MIB:g}"] = growth < GOAL_RSS_GROWTH_MIB
    summary = {
        "baseline_p99_ms": percentiles(baseline)["p99_ms"],
        "abuse_p99_ms": abused["p99_ms"],
        "rss_growth_MiB": round(growth, 1),
        "goals_met": [goal for goal, met in goals.items() if met],
        "goals_missed": [goal for goal, met in goals.items() if not met],
    }
    emit({"summary": summary})
    return 0 if abuser.exitcode == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
