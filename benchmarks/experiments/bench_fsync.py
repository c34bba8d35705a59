"""How many small files per second this disk can make durable, one fsync each: what bounds
durable small PUTs for a server that keeps one file per blob.

Each round writes ``--files`` new 4 KiB files in the data directory's file system and makes
them durable four ways, in the same seconds: one thread fsyncing them in turn, ``--threads``
threads sharing them (as blobsvc's group commit does), one thread per file, and one
``syncfs`` for all (which also writes whatever else is dirty on that file system). The
threads are started before any round, as the server's flush threads are, so only waiting on
the disk is timed. Every fsync of a new file ends with a flush of the disk's write cache; how
much faster the threaded ways are than the sequential one says how many of those flushes the
disk takes at once. The ``--threads`` line is what a server with a file per blob and that many
flush threads can reach at most, however little CPU each PUT costs.

    .venv/bin/python -m benchmarks.experiments.bench_fsync               # 16 files, 20 rounds
    .venv/bin/python -m benchmarks.experiments.bench_fsync --quick       # a smoke run

One JSON object per line on stdout: per way, the median milliseconds for the batch and the
files per second that makes; the last line is ``{"summary": …}``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from blobsvc.bench import _measure as m

SIZE = 4096


def _fsync_each(fds: Sequence[int]) -> None:
    for fd in fds:
        os.fsync(fd)


def _shared(pool: concurrent.futures.ThreadPoolExecutor, ways: int) -> Callable[[Sequence[int]], None]:
    """``ways`` threads of ``pool``, started before any round as the server's flush threads
    are, sharing the files: only the waiting is timed, not starting threads."""

    def run(fds: Sequence[int]) -> None:
        for done in [pool.submit(_fsync_each, fds[way::ways]) for way in range(ways)]:
            done.result()

    return run


def _syncfs() -> Callable[[Sequence[int]], None]:
    libc = ctypes.CDLL(None, use_errno=True)

    def run(fds: Sequence[int]) -> None:
        if libc.syncfs(fds[0]) != 0:
            raise OSError(ctypes.get_errno(), "syncfs failed")

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.experiments.bench_fsync", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--files", type=int, default=16, help="Files per batch (default 16).")
    parser.add_argument("--threads", type=int, default=4, help="Threads sharing a batch (default 4).")
    parser.add_argument("--rounds", type=int, default=20, help="Batches of each way (default 20).")
    parser.add_argument("--quick", action="store_true", help="Two rounds of 4 files: a smoke test.")
    parser.add_argument("--tmp-dir", help="Where to write (default: $TMPDIR or /tmp unless tmpfs).")
    args = parser.parse_args(argv)
    if args.quick:
        args.files, args.rounds = 4, 2
    threads = max(args.threads, args.files)
    pool = concurrent.futures.ThreadPoolExecutor(threads)
    for warming in [pool.submit(time.sleep, 0.01) for _ in range(threads)]:
        warming.result()  # every thread exists before the first round
    ways: dict[str, Callable[[Sequence[int]], None]] = {
        "sequential": _fsync_each,
        f"threads_{args.threads}": _shared(pool, args.threads),
        f"threads_{args.files}": _shared(pool, args.files),
        "syncfs": _syncfs(),
    }
    work = tempfile.mkdtemp(prefix="blobsvc-fsync-", dir=m.choose_tmp_parent(args.tmp_dir))
    data = os.urandom(SIZE)
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    try:
        filesystem = m.filesystem_of(Path(work))
        m.emit({"bench": "setup", "files": args.files, "rounds": args.rounds, "filesystem": filesystem})
        for number in range(args.rounds):
            for name, durable in ways.items():  # alternating, so drift in the disk's load hits all alike
                fds = []
                try:
                    for i in range(args.files):
                        fd = os.open(os.path.join(work, f"{name}-{number}-{i}"), os.O_WRONLY | os.O_CREAT, 0o644)
                        fds.append(fd)
                        os.write(fd, data)
                    started = time.perf_counter()
                    durable(fds)
                    seconds[name].append(time.perf_counter() - started)
                finally:
                    for fd in fds:
                        os.close(fd)
    finally:
        pool.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    summary = {}
    for name, took in seconds.items():
        median = statistics.median(took)
        summary[name] = round(args.files / median)
        m.emit({"bench": name, "files": args.files, "median_ms": round(median * 1e3, 3), "files_per_s": summary[name]})
    m.emit({"summary": {"files_per_s": summary}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
