"""What recording metrics costs the small-request path: 4 KiB GET ops/s of a server with
metrics off and of one with metrics on, measured in the same run, turn and turn about.

Run from the repository root::

    .venv/bin/python -m benchmarks.bench_metrics            # about a minute
    .venv/bin/python -m benchmarks.bench_metrics --quick    # a smoke test (a few seconds)

Two ``blobsvc serve`` child processes share one data directory of 4 KiB blobs (stored by the
first before the second starts): ``off`` without metrics, ``on`` with ``--metrics-port``.
Each round measures both with the load of ``bench_server`` (8 connections, one GET in flight
on each, raw asyncio protocols), the order alternating from round to round so that a busy
moment of the machine hits both sides alike. Every measurement is one JSON line; the last
line is ``{"summary": …}`` with each round's on/off ratio and their median. The ``on`` server
is scraped at the end, and its ``blobsvc_requests_total{op="GET",outcome="ok"}`` must count
at least the GETs it answered, proving the metrics were recorded.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import sys
import tempfile
import urllib.request
from pathlib import Path

from benchmarks.bench_server import (
    SMALL_MAX_OPS,
    SMALL_MAX_SECONDS,
    SMALL_SIZE,
    BenchError,
    choose_tmp_parent,
    emit,
    machine,
    running_server,
    small_gets,
    small_puts,
)

KEYS = 1024
ROUND_SECONDS = 3.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape_get_count(port: int) -> float:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        for line in response.read().decode().splitlines():
            if line.startswith('blobsvc_requests_total{op="GET",outcome="ok"}'):
                return float(line.rsplit(" ", 1)[1])
    raise BenchError("the server with metrics on counted no GET")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=None, help="Rounds of off/on measurements (default 6).")
    parser.add_argument("--seconds", type=float, default=ROUND_SECONDS, help="Seconds of each measurement.")
    parser.add_argument("--quick", action="store_true", help="Tiny counts: a smoke test, not a measurement.")
    parser.add_argument("--tmp-dir", help="Parent of the temporary data directory.")
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 6)
    max_ops, seconds, warmup = (200, SMALL_MAX_SECONDS, 20) if args.quick else (SMALL_MAX_OPS, args.seconds, 500)
    work = Path(tempfile.mkdtemp(prefix="blobsvc-bench-metrics-", dir=choose_tmp_parent(args.tmp_dir)))
    data_dir = work / "data"
    emit({"bench": "setup", **machine(), "data_dir": str(data_dir), "rounds": rounds, "seconds": seconds})
    metrics_port = free_port()
    try:
        with running_server(data_dir, work / "off.log") as off:
            _, keys = small_puts(off, SMALL_SIZE, min(KEYS, max_ops), SMALL_MAX_SECONDS, 0)
            with running_server(data_dir, work / "on.log", extra_args=["--metrics-port", str(metrics_port)]) as on:
                ratios: list[float] = []
                answered = 0
                for number in range(rounds):
                    order = [("off", off), ("on", on)] if number % 2 == 0 else [("on", on), ("off", off)]
                    ops_s: dict[str, float] = {}
                    for label, server in order:
                        result = small_gets(server, keys, SMALL_SIZE, max_ops, seconds, warmup)
                        ops_s[label] = result.ops / result.seconds
                        if label == "on":
                            answered += result.ops + warmup
                        emit(result.record(f"get_4KiB_metrics_{label}", round=number))
                    ratios.append(ops_s["on"] / ops_s["off"])
                    emit({"bench": "ratio", "round": number, "on_over_off": round(ratios[-1], 3)})
                counted = scrape_get_count(metrics_port)
                if counted < answered:
                    raise BenchError(f"metrics counted {counted} GETs of the {answered} answered")
        emit(
            {
                "summary": {
                    "on_over_off_per_round": [round(r, 3) for r in ratios],
                    "median_on_over_off": round(statistics.median(ratios), 3),
                    "gets_counted_by_metrics": counted,
                }
            }
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
