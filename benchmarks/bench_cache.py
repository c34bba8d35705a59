"""Eight processes on one host fetch the same blob through one BlobCache directory.

Target: the eight together take at most 1.3 times as long as one process alone, because the
blob crosses the network once and the other seven wait for it instead of fetching it too.
Both figures come from the same run, against the same server and the same blob, each into a
fresh cache directory, alternating so that drift hits both alike. Every child opens its
cache (and pays its start-up) before a barrier; the time runs from the barrier to the last
child holding its path, on the host's monotonic clock, which all processes share.

Prints one JSON object per measurement and a summary with the ratio; exits 1 when the median
ratio is over ``--max-ratio``.

    .venv/bin/python benchmarks/bench_cache.py [--size-mib 256] [--processes 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import threading
from pathlib import Path

from blobsvc import BlobClient, BlobServer, Settings
from blobsvc.bench._measure import fan_out_seconds

CHUNK = 16 << 20


def upload(address: str, size: int) -> str:
    """A random blob of ``size`` bytes, written to a file first so memory stays small."""
    with tempfile.NamedTemporaryFile() as source:
        for left in range(size, 0, -CHUNK):
            source.write(os.urandom(min(CHUNK, left)))
        source.flush()
        with BlobClient(address, timeout=120) as client:
            return client.put(Path(source.name))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--max-ratio", type=float, default=1.3)
    parser.add_argument("--dir", type=Path, default=None, help="Where the server data and caches go.")
    args = parser.parse_args()
    size = args.size_mib << 20
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["blobsvc.cache"])
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-cache-") as work:
        root = Path(work)
        settings = Settings(host="127.0.0.1", port="0", data_dir=root / "server", max_blob_size=size)
        loop = asyncio.new_event_loop()
        server = BlobServer(settings)
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        asyncio.run_coroutine_threadsafe(server.start(), loop).result(60)
        address = "{}:{}".format(*server.address)
        try:
            key = upload(address, size)
            times: dict[int, list[float]] = {1: [], args.processes: []}
            for round_ in range(args.repeat):
                for processes in times:
                    gets = server.requests["GET"]
                    cache_dir = root / f"cache-{round_}-{processes}"
                    seconds = fan_out_seconds(context, address, key, processes, cache_dir)
                    shutil.rmtree(cache_dir)  # its dirty pages must not slow the next round's fsync
                    times[processes].append(seconds)
                    record = {
                        "bench": "cache",
                        "processes": processes,
                        "size": size,
                        "round": round_,
                        "seconds": round(seconds, 4),
                        "server_gets": server.requests["GET"] - gets,
                        "mib_per_second": round(size / seconds / (1 << 20), 1),
                    }
                    print(json.dumps(record), flush=True)
        finally:
            asyncio.run_coroutine_threadsafe(server.shutdown(5.0), loop).result(30)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
    one, many = statistics.median(times[1]), statistics.median(times[args.processes])
    ratio = many / one
    summary = {
        "bench": "cache",
        "summary": True,
        "size": size,
        "processes": args.processes,
        "one_process_seconds": round(one, 4),
        "many_processes_seconds": round(many, 4),
        "ratio": round(ratio, 3),
        "max_ratio": args.max_ratio,
        "cpus": os.cpu_count(),
    }
    print(json.dumps(summary), flush=True)
    return 0 if ratio <= args.max_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
