"""Large-blob PUT and GET throughput over TLS against plain TCP, in the same run.

Two ``blobsvc serve`` children on 127.0.0.1, one plain and one with a trustme certificate
(TLS 1.3, the default minimum), each on its own data directory on the same disk. For each
repetition one :class:`blobsvc.AsyncBlobClient` per server PUTs a ``--size`` blob from
memory (deleted again after, so every PUT stores new bytes) and GETs it back into memory,
verified; plain and TLS alternate so that drift in the machine's load hits both alike. The
client's own work (BLAKE3 of every byte, verification) is the same on both sides, so the
ratio is what TLS costs end to end. Under TLS the server cannot use ``sendfile``: it reads
the file in 1 MiB pieces in a worker thread and encrypts in user space.

    .venv/bin/python -m benchmarks.bench_tls            # 256 MiB, 3 repetitions
    .venv/bin/python -m benchmarks.bench_tls --quick    # a smoke run

One JSON object per line on stdout (MB = 10**6 bytes); needs trustme (the ``test`` extra).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trustme

from blobsvc import AsyncBlobClient, client_tls_context

from ._serve import serve


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


async def transfer(server: str, tls: ssl.SSLContext | None, data: bytes) -> tuple[float, float]:
    """Seconds for one PUT and one GET of ``data``."""
    async with AsyncBlobClient(server, tls=tls, timeout=120.0) as client:
        started = time.perf_counter()
        key = await client.put(data)
        put_seconds = time.perf_counter() - started
        started = time.perf_counter()
        got = await client.get(key)
        get_seconds = time.perf_counter() - started
        assert len(got) == len(data)
        await client.delete(key)
    return put_seconds, get_seconds


def record(name: str, size: int, seconds: list[float], baseline: list[float] | None = None) -> dict[str, Any]:
    rates = [size / s / 1e6 for s in seconds]
    out: dict[str, Any] = {
        "bench": name,
        "bytes": size,
        "runs_MB_s": [round(r, 1) for r in rates],
        "median_MB_s": round(statistics.median(rates), 1),
    }
    if baseline is not None:
        plain = statistics.median(size / s / 1e6 for s in baseline)
        out["ratio_to_plain"] = round(out["median_MB_s"] / plain, 3)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=256 << 20, help="Bytes per blob.")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="8 MiB, once: a smoke run.")
    args = parser.parse_args(argv)
    if args.quick:
        args.size, args.repeat = 8 << 20, 1
    data = os.urandom(args.size)
    with tempfile.TemporaryDirectory(prefix="blobsvc-bench-tls-") as scratch:
        ca = trustme.CA()
        ca.cert_pem.write_to_path(str(Path(scratch, "ca.pem")))
        ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(Path(scratch, "server.pem")))
        context = client_tls_context(Path(scratch, "ca.pem"))
        with serve() as plain, serve("--tls-cert", str(Path(scratch, "server.pem"))) as secured:
            emit({"bench": "setup", "bytes": args.size, "repeat": args.repeat, "cpus": os.cpu_count()})
            times: dict[str, list[float]] = {"put": [], "get": [], "put_tls": [], "get_tls": []}
            for _ in range(args.repeat):
                for suffix, server, tls in (("", plain, None), ("_tls", secured, context)):
                    put_seconds, get_seconds = asyncio.run(transfer(server, tls, data))
                    times["put" + suffix].append(put_seconds)
                    times["get" + suffix].append(get_seconds)
    for op in ("put", "get"):
        emit(record(f"{op}_plain", args.size, times[op]))
        emit(record(f"{op}_tls", args.size, times[f"{op}_tls"], times[op]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
