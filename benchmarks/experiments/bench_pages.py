"""What a page of memory costs the first time it is written, depending on how long it lay
free: the term that decides whether a download into a new file or new memory keeps up with a
loopback ``sendfile``, which receives into one reused buffer and never pays it.

A VM whose kernel reports free pages to its hypervisor (virtio-balloon's free page
reporting) gives back what lies free for a moment; the next first write of such a page
faults in the hypervisor before the guest can use it. Each round writes ``--size-mib`` into
a new file (the page cache, as ``get_file`` and the server's uploads do), 8 MiB a call
(``file_8MiB``) and :data:`~blobsvc.files._filewrite.WRITE_PIECE` a call as blobsvc does
(``file_256KiB``: the kernel sizes page-cache folios by the write), and into a new
``bytearray`` (``memory``, as ``get()`` does), twice each: right after the same amount was
freed (``recycled``: the pages come straight back) and after ``--idle`` seconds of rest
(``idle``: they may have been given away meanwhile). CPU seconds are the writing thread's:
a fault in the hypervisor counts as the guest's time. Where the kernel says how much it
reported (``/sys/module/page_reporting/parameters/reported_kib``), each line gives how many
MiB went to the hypervisor during the rest.

    .venv/bin/python -m benchmarks.experiments.bench_pages               # 256 MiB, 5 rounds, 5 s of rest
    .venv/bin/python -m benchmarks.experiments.bench_pages --quick       # a smoke run

One JSON object per line on stdout: per kind, MB/s (10^6 B/s) of every run, the median, and
the median CPU nanoseconds per byte; the last line is ``{"summary": …}`` with, per target,
the median MB/s of idle pages over that of recycled ones.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from blobsvc.bench import _measure as m
from blobsvc.files._filewrite import WRITE_PIECE, pwrite_all

MiB = 1 << 20
PIECE = 8 * MiB  # as a download's buffers
REPORTED = Path("/sys/module/page_reporting/parameters/reported_kib")


def _reported_mib() -> float | None:
    try:
        return int(REPORTED.read_text()) / 1024
    except (OSError, ValueError):
        return None


def _into_file(
    directory: str, size: int, piece: bytes, write_piece: Callable[[int, bytes, int], object]
) -> Callable[[], None]:
    """Writes ``size`` bytes into a new file, ``piece`` by ``piece`` with ``write_piece(fd,
    piece, offset)``, then drops the file, whose pages are then free."""
    path = os.path.join(directory, "pages.bin")

    def write() -> None:
        with open(path, "wb", buffering=0) as out:
            for offset in range(0, size, len(piece)):
                write_piece(out.fileno(), piece, offset)
        os.unlink(path)

    return write


def _into_memory(size: int, piece: bytes) -> Callable[[], None]:
    def write() -> None:
        block = bytearray(size)  # calloc: fresh pages from the kernel, first written below
        view = memoryview(block)
        for offset in range(0, size, len(piece)):
            view[offset : offset + len(piece)] = piece
        view.release()
        del block

    return write


def _timed(write: Callable[[], None]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.thread_time()
    write()
    return time.perf_counter() - wall, time.thread_time() - cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.experiments.bench_pages", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--size-mib", type=int, default=256, help="MiB written per run (default 256).")
    parser.add_argument("--rounds", type=int, default=5, help="Runs of each kind (default 5).")
    parser.add_argument("--idle", type=float, default=5.0, help="Seconds of rest before an idle run (default 5).")
    parser.add_argument("--quick", action="store_true", help="16 MiB, one round, 0.1 s of rest: a smoke test.")
    parser.add_argument("--tmp-dir", help="Where the file goes (default: $TMPDIR or /tmp unless tmpfs).")
    args = parser.parse_args(argv)
    if args.quick:
        args.size_mib, args.rounds, args.idle = 16, 1, 0.1
    if args.size_mib < 1 or args.rounds < 1 or args.idle < 0:
        parser.error("--size-mib and --rounds must be positive, --idle not negative")
    size = args.size_mib * MiB
    piece = os.urandom(min(PIECE, size))
    size -= size % len(piece)
    work = tempfile.mkdtemp(prefix="blobsvc-pages-", dir=m.choose_tmp_parent(args.tmp_dir))
    targets = {
        "file_8MiB": _into_file(work, size, piece, os.pwrite),
        f"file_{WRITE_PIECE >> 10}KiB": _into_file(work, size, piece, pwrite_all),  # blobsvc's own writes
        "memory": _into_memory(size, piece),
    }
    runs: dict[str, list[tuple[float, float, float | None]]] = {
        f"{target}_{state}": [] for target in targets for state in ("recycled", "idle")
    }
    try:
        m.emit({"bench": "setup", **m.machine(), "filesystem": m.filesystem_of(Path(work))[1], "size": size})
        for _ in range(args.rounds):
            for target, write in targets.items():
                write()  # untimed: frees `size` bytes of pages just before the recycled run
                runs[f"{target}_recycled"].append((*_timed(write), None))
                before = _reported_mib()
                time.sleep(args.idle)
                after = _reported_mib()
                given = None if before is None or after is None else after - before
                runs[f"{target}_idle"].append((*_timed(write), given))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    medians: dict[str, float] = {}
    for name, taken in runs.items():
        rates = [size / wall / m.MB for wall, _, _ in taken]
        medians[name] = statistics.median(rates)
        record = {
            "bench": name,
            "size": size,
            "runs_MB_s": [round(rate, 1) for rate in rates],
            "median_MB_s": round(medians[name], 1),
            "cpu_ns_per_byte": round(statistics.median(cpu for _, cpu, _ in taken) / size * 1e9, 3),
        }
        if name.endswith("_idle") and all(given is not None for _, _, given in taken):
            record["reported_mib_during_rest"] = [round(given or 0.0) for _, _, given in taken]
        m.emit(record)
    m.emit(
        {
            "summary": {
                f"{target}_idle_over_recycled": round(medians[f"{target}_idle"] / medians[f"{target}_recycled"], 3)
                for target in targets
            }
        }
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
