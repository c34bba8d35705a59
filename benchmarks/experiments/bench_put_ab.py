"""Small PUTs of two blobsvc source trees, A/B in the same seconds: what a change to the
PUT path costs or saves per request, on a machine too busy for runs one after the other.

Run from the repository root, with the tree to compare checked out elsewhere::

    git worktree add /tmp/blobsvc-main main
    .venv/bin/python -m benchmarks.experiments.bench_put_ab /tmp/blobsvc-main .     # about a minute
    .venv/bin/python -m benchmarks.experiments.bench_put_ab --quick /tmp/blobsvc-main .

Each tree's ``blobsvc serve`` runs as a child process on its own data directory, started from
a neutral directory with ``PYTHONPATH`` set to the tree (``python -m`` from inside a checkout
would import that checkout instead). For each connection count and round, one process per tree
loads its server with new 4 KiB blobs (the raw-protocol load of ``bench_server``, one PUT in
flight per connection); the loads start together behind a barrier and last the same seconds,
so a busy moment of the machine hits both alike. Each line gives ops/s and the server's CPU
per PUT: all of it (``cpu_us``, from the scheduler) and, from ``/proc/PID/stat``, its user
and kernel parts (``user_us``, ``sys_us``; 10 ms ticks, so only the sums over seconds mean
anything), and those of the event loop's thread alone (``loop_user_us``, ``loop_sys_us``,
from ``/proc/PID/task/PID/stat``): the rest is the publishing and flushing threads'. The
last line is ``{"summary": …}``: each tree's median CPU per PUT by connections.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from blobsvc.bench import _measure as m

SIZE = 4096
WARMUP_OPS = 300  # before the timed load: the server's worker threads exist by then


def _user_sys_seconds(stat: str) -> tuple[float, float]:
    """User and kernel CPU seconds from a ``/proc`` stat file: a process's or one thread's."""
    fields = Path(stat).read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / ticks, int(fields[12]) / ticks


def _load(tree: str, connections: int, seconds: float, work: str, start: Any, results: Any) -> None:
    """One tree's server under ``connections`` PUT streams for ``seconds``; runs in a child."""
    os.environ["PYTHONPATH"] = tree
    os.chdir(work)
    data = Path(tempfile.mkdtemp(prefix="data-", dir=work))
    with m.running_server(data, data.with_suffix(".log")) as server:
        m.small_puts(server, SIZE, WARMUP_OPS, seconds, 0, connections)
        start.wait()
        # The whole process, then its main thread, where the event loop runs.
        stats = (f"/proc/{server.pid}/stat", f"/proc/{server.pid}/task/{server.pid}/stat")
        before = [_user_sys_seconds(stat) for stat in stats]
        result, _ = m.small_puts(server, SIZE, 10**8, seconds, 0, connections)
        after = [_user_sys_seconds(stat) for stat in stats]
    record = result.record("put_4KiB", tree=tree)
    assert result.server_cpu is not None
    record["cpu_us"] = round(result.server_cpu * result.seconds / result.ops * 1e6)
    for prefix, (user, system), (user_after, system_after) in zip(("", "loop_"), before, after, strict=True):
        record[f"{prefix}user_us"] = round((user_after - user) / result.ops * 1e6)
        record[f"{prefix}sys_us"] = round((system_after - system) / result.ops * 1e6)
    results.put(record)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.experiments.bench_put_ab", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("trees", nargs=2, help="Two source trees (directories holding blobsvc/).")
    parser.add_argument("--connections", type=int, nargs="+", default=[8, 32], help="Default: 8 32.")
    parser.add_argument("--seconds", type=float, default=5.0, help="Each timed load (default 5).")
    parser.add_argument("--rounds", type=int, default=3, help="Rounds of each connection count (default 3).")
    parser.add_argument("--quick", action="store_true", help="One short round at 2 connections: a smoke test.")
    parser.add_argument("--tmp-dir", help="Parent of the data directories (default: $TMPDIR or /tmp unless tmpfs).")
    args = parser.parse_args(argv)
    trees = m.source_trees(parser, args.trees)
    if args.quick:
        args.connections, args.seconds, args.rounds = [2], 0.5, 1
    work = tempfile.mkdtemp(prefix="blobsvc-put-ab-", dir=m.choose_tmp_parent(args.tmp_dir))
    context = multiprocessing.get_context("spawn")
    cpu: dict[tuple[str, int], list[int]] = {}
    try:
        for _ in range(args.rounds):
            for connections in args.connections:
                start, results = context.Barrier(len(trees)), context.Queue()
                loads = [
                    context.Process(target=_load, args=(tree, connections, args.seconds, work, start, results))
                    for tree in trees
                ]
                for load in loads:
                    load.start()
                records = [results.get(timeout=args.seconds * 4 + 2 * m.IO_TIMEOUT) for _ in loads]
                for load in loads:
                    load.join()
                for record in sorted(records, key=lambda record: trees.index(record["tree"])):
                    m.emit(record)
                    cpu.setdefault((record["tree"], connections), []).append(record["cpu_us"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = {f"{tree} x{conns}": statistics.median(values) for (tree, conns), values in cpu.items()}
    m.emit({"summary": {"median_cpu_us_per_put": summary}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
