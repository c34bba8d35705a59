"""A server holding many small blobs: how long it takes to start (without rehashing) and how
much memory it holds, in total and per blob.

The blobs are laid out on disk directly, as the server's storage lays them out (an object
and a content-addressed link each, no fsync: this measures the server, not how fast blobs
can be made), then ``blobsvc serve --no-verify-on-start`` starts on the directory. Start
time runs from the process's launch to its "listening on" line; memory is the server's
resident set (VmRSS) once listening and again after GETs of a sample of the blobs. The same
is measured on an empty data directory in the same run, so that the per-blob figures are
what the blobs add.

    .venv/bin/python -m benchmarks.bench_scale                 # 1,000,000 blobs of 64 bytes
    .venv/bin/python -m benchmarks.bench_scale --quick         # 2,000
    .venv/bin/python -m benchmarks.bench_scale --blobs 200000 --keep-dir /var/tmp/scale

Making a million blobs takes minutes and about 4 GB of disk (a block each); ``--keep-dir``
keeps them for the next run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import blake3

from blobsvc import AsyncBlobClient
from blobsvc.bench._measure import ServerProcess, choose_tmp_parent, emit, machine, run_async
from blobsvc.files._layout import Layout

REPO = Path(__file__).resolve().parent.parent
SAMPLE_GETS = 2000


def lay_out(data_dir: Path, count: int, size: int) -> list[bytes]:
    """``count`` distinct blobs of ``size`` bytes in ``data_dir`` (adding to those there);
    returns a sample of their keys."""
    layout = Layout(data_dir)
    for directory in (layout.incoming, layout.objects, layout.cache):
        directory.mkdir(parents=True, exist_ok=True)
    have = sum(1 for _ in os.scandir(layout.objects))
    sample: list[bytes] = []
    body = bytearray(os.urandom(size))
    for number in range(have, count):
        body[:8] = number.to_bytes(8, "little")
        key = blake3.blake3(body).digest()
        name = key.hex()
        fd = os.open(layout.objects / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, body)
        finally:
            os.close(fd)
        os.link(layout.objects / name, layout.cache / name)
        if number % max(1, count // SAMPLE_GETS) == 0:
            sample.append(key)
    if not sample:  # all were there: sample what is on disk
        names = [entry.name for _, entry in zip(range(50 * SAMPLE_GETS), os.scandir(layout.cache), strict=False)]
        sample = [bytes.fromhex(name) for name in random.sample(names, min(SAMPLE_GETS, len(names)))]
    os.sync()
    return sample


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


async def get_sample(port: int, keys: list[bytes]) -> float:
    async with AsyncBlobClient(("127.0.0.1", port), timeout=60) as client:
        started = time.perf_counter()
        for start in range(0, len(keys), 16):
            await asyncio.gather(*(client.get(key.hex()) for key in keys[start : start + 16]))
        return time.perf_counter() - started


def measure_start(data_dir: Path, work: Path, keys: list[bytes], label: str) -> dict[str, float]:
    started = time.perf_counter()
    server = ServerProcess(data_dir, work / f"server-{label}.log")
    try:
        start_s = time.perf_counter() - started
        rss_start = rss_bytes(server.pid)
        gets_s = run_async(get_sample(server.port, keys)) if keys else 0.0
        rss_after = rss_bytes(server.pid)
    finally:
        server.stop()
    return {"start_s": start_s, "rss_start": rss_start, "rss_after_gets": rss_after, "gets_s": gets_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_scale", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--blobs", type=int, default=None, help="Blobs to hold (default 1,000,000; 2,000 with --quick)."
    )
    parser.add_argument("--size", type=int, default=64, help="Bytes per blob (default 64).")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tmp-dir", help="Parent of the temporary data directory.")
    parser.add_argument("--keep-dir", type=Path, help="Use (and keep) this data directory.")
    args = parser.parse_args(argv)
    count = args.blobs if args.blobs is not None else (2000 if args.quick else 1_000_000)
    work = Path(
        tempfile.mkdtemp(prefix="blobsvc-scale-", dir=choose_tmp_parent(args.tmp_dir, REPO / "benchmarks" / "out"))
    )
    try:
        emit({"bench": "setup", **machine(), "blobs": count, "size": args.size})
        empty = measure_start(work / "empty", work, [], "empty")
        emit({"bench": "start_empty", **{k: round(v, 3) for k, v in empty.items()}})
        data_dir = args.keep_dir or work / "data"
        began = time.perf_counter()
        keys = lay_out(data_dir, count, args.size)
        emit({"bench": "lay_out", "blobs": count, "seconds": round(time.perf_counter() - began, 1)})
        full = measure_start(data_dir, work, keys, "full")
        emit(
            {
                "bench": "start_full",
                "blobs": count,
                "start_s": round(full["start_s"], 3),
                "rss_start_MB": round(full["rss_start"] / 1e6, 1),
                "rss_after_gets_MB": round(full["rss_after_gets"] / 1e6, 1),
                "sample_gets": len(keys),
                "sample_gets_s": round(full["gets_s"], 3),
                "start_us_per_blob": round((full["start_s"] - empty["start_s"]) / count * 1e6, 2),
                "rss_bytes_per_blob": round((full["rss_start"] - empty["rss_start"]) / count, 1),
                "target_start_s": 10.0,
                "target_rss_MB": 300.0,
            }
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
