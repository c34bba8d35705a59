"""How long header tricklers keep a well-formed client from a GET: the issue's target case.

A ``blobsvc serve --idle-timeout 3 --io-timeout 3`` child (default connection limit, 256)
faces ``--tricklers`` connections (default 500) from 127.0.0.1 that send a byte a second:
half trickle the preamble, half send the preamble at once and trickle a PUT header. Each
trickler reconnects as soon as it is cut off, so the pressure never lets up. After the
tricklers have filled every slot, a well-formed :class:`blobsvc.AsyncBlobClient` (default
retries and back-off) asks for a blob ``--probes`` times, and the time to each successful
GET is recorded. The target: never more than 10 s.

    .venv/bin/python -m benchmarks.bench_slow_clients            # about a minute
    .venv/bin/python -m benchmarks.bench_slow_clients --quick    # a smoke run

One JSON object per line on stdout; everything stops by itself within the run's bound.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from typing import Any

from blobsvc import AsyncBlobClient, BlobError

from ._serve import serve

PREAMBLE = b"BLOB\x01\x00"
PUT_HEADER = b"\x00\x00" + (1 << 20).to_bytes(8, "little")
TARGET_SECONDS = 10.0


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


class Pressure:
    """Tricklers that reconnect whenever they are cut off, counting what happens to them."""

    def __init__(self, host: str, port: int, count: int, interval: float) -> None:
        self.host, self.port, self.count, self.interval = host, port, count, interval
        self.connections = 0
        self.stop = asyncio.Event()

    async def _one(self, number: int) -> None:
        while not self.stop.is_set():
            writer = None
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                reader, writer = await asyncio.open_connection(self.host, self.port)
                self.connections += 1
                trickled = PREAMBLE
                if number % 2:
                    writer.write(PREAMBLE)
                    trickled = PUT_HEADER
                for byte in trickled:
                    writer.write(bytes([byte]))
                    await writer.drain()
                    # Stop trickling once the server has answered or closed.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self.interval):
                            if not await reader.read(1 << 10):
                                break
            if writer is not None:
                writer.close()
            await asyncio.sleep(0.05)

    async def run(self) -> None:
        await asyncio.gather(*(self._one(n) for n in range(self.count)))


async def probe(server: str, key: str, bound: float) -> float:
    """Seconds until a default client's GET succeeds (``bound`` when it never does)."""
    started = time.monotonic()
    async with AsyncBlobClient(server, timeout=10.0) as client:
        while time.monotonic() - started < bound:
            try:
                await client.get(key)
                return time.monotonic() - started
            except BlobError:
                continue
    return bound


async def measure(server: str, args: argparse.Namespace) -> dict[str, Any]:
    host, _, port = server.rpartition(":")
    async with AsyncBlobClient(server) as setup:
        key = await setup.put(b"a jar every executor needs")
    pressure = Pressure(host, int(port), args.tricklers, args.interval)
    running = asyncio.ensure_future(pressure.run())
    try:
        await asyncio.sleep(args.warmup)
        waits = []
        for _ in range(args.probes):
            waits.append(await probe(server, key, 3 * TARGET_SECONDS))
            await asyncio.sleep(args.pause)
    finally:
        pressure.stop.set()
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
    return {
        "bench": "slow_client_lockout",
        "tricklers": args.tricklers,
        "trickle_interval_s": args.interval,
        "trickler_connections": pressure.connections,
        "probes": len(waits),
        "wait_s": [round(w, 3) for w in waits],
        "median_wait_s": round(statistics.median(waits), 3),
        "max_wait_s": round(max(waits), 3),
        "target_s": TARGET_SECONDS,
        "target_met": max(waits) < TARGET_SECONDS,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tricklers", type=int, default=500)
    parser.add_argument("--interval", type=float, default=1.0, help="Seconds between a trickler's bytes.")
    parser.add_argument("--probes", type=int, default=5)
    parser.add_argument("--warmup", type=float, default=8.0, help="Seconds of pressure before the first probe.")
    parser.add_argument("--pause", type=float, default=2.0, help="Seconds between probes.")
    parser.add_argument("--quick", action="store_true", help="A smoke run: 40 tricklers, 1 probe.")
    args = parser.parse_args(argv)
    if args.quick:
        args.tricklers, args.probes, args.warmup, args.pause = 40, 1, 2.0, 0.0
    with serve("--idle-timeout", "3", "--io-timeout", "3") as server:
        emit({"bench": "setup", "server": server, "io_timeout": 3, "idle_timeout": 3, "max_connections": 256})
        record = asyncio.run(measure(server, args))
    emit(record)
    return 0 if record["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
