"""What a pipeline's checkpoint history costs: the ``history`` action beside ``list`` and STATUS.

Run from the repository root::

    .venv/bin/python -m benchmarks.bench_checkpoint_history            # 100 checkpoints, 200 requests each
    .venv/bin/python -m benchmarks.bench_checkpoint_history --quick    # a smoke test: 5 checkpoints, 5 requests

A real ``blobsvc serve`` process. One pipeline completes ``--checkpoints`` checkpoints of 4
tasks each (``retain=None``: every one kept, so the history and the records are as long as
they get by default). Then, one request after the other, ``--requests`` each of STATUS (the
baseline, the cheapest request with an answer), ``list`` (the records, every metadata read
before) and ``history`` (limit 100), timed at the client. Then the server is restarted on the
same data directory and the first ``history`` is timed: it rebuilds the completed entries from
the records and every metadata blob, once.

One JSON object per line: one per request kind with its p50 and p99 in milliseconds, then
``{"rebuild_ms": ...}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._serve import serve
from blobsvc import BlobClient
from blobsvc.checkpoints import CheckpointStore

PIPELINE = "bench-history"


def timed(call: Callable[[], Any], requests: int) -> dict[str, float]:
    seconds = []
    for _ in range(requests):
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    seconds.sort()
    return {
        "p50_ms": round(statistics.median(seconds) * 1000, 3),
        "p99_ms": round(seconds[min(len(seconds) - 1, int(len(seconds) * 0.99))] * 1000, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=int, default=100)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="5 checkpoints, 5 requests each")
    args = parser.parse_args()
    checkpoints, requests = (5, 5) if args.quick else (args.checkpoints, args.requests)
    with tempfile.TemporaryDirectory(prefix="blobsvc-bench-") as scratch:
        data = Path(scratch, "data")
        with serve(data_dir=data) as address, CheckpointStore(address, PIPELINE, retain=None) as store:
            for n in range(checkpoints):
                tasks = [str(t) for t in range(4)]
                with store.begin(tasks, properties={"n": n}) as pending:
                    for task in tasks:
                        pending.acknowledge(task, store.snapshot(task, b"state %d of task %s" % (n, task.encode())))
            client = store.client
            kinds: dict[str, Callable[[], Any]] = {
                "status": client.status,
                "list": lambda: client.checkpoints({"action": "list", "pipeline": PIPELINE}),
                "history": lambda: client.checkpoints({"action": "history", "pipeline": PIPELINE}),
            }
            for kind, call in kinds.items():
                call()  # the first: connections made, the history built
                print(json.dumps({"request": kind, "checkpoints": checkpoints, **timed(call, requests)}), flush=True)
        with serve(data_dir=data) as address, BlobClient(address) as client:
            client.status()
            start = time.perf_counter()
            history = client.checkpoints({"action": "history", "pipeline": PIPELINE})["history"]
            rebuild = time.perf_counter() - start
            assert len(history) == min(checkpoints, 100), len(history)
            print(json.dumps({"rebuild_ms": round(rebuild * 1000, 3), "entries": len(history)}), flush=True)


if __name__ == "__main__":
    main()
