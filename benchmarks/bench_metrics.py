"""What recording metrics costs the small-request path: 4 KiB GET ops/s of a server with
metrics off and of one with metrics on, measured in the same run, turn and turn about.

Run from the repository root::

    .venv/bin/python -m benchmarks.bench_metrics            # about a minute
    .venv/bin/python -m benchmarks.bench_metrics --quick    # a smoke test (a few seconds)

Two ``blobsvc serve`` child processes share one data directory of 4 KiB blobs (stored by the
first before the second starts): ``off`` without metrics, ``on`` with ``--metrics-port``.
Each round measures both with the load of ``bench_server`` (8 connections, one GET in flight
on each, raw asyncio protocols), the order alternating from round to round so that a busy
moment of the machine hits both sides alike. Two figures per round: the ratio of ops/s
(on/off), and the ratio of the server's CPU time per GET (on/off), which a loaded machine
disturbs far less than throughput. Besides, ``observe_ns`` times the recording itself
(:meth:`ServerMetrics.observe`) in this process. Every measurement is one JSON line; the last
line is ``{"summary": …}`` with each round's ratios and their medians. The ``on`` server
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
import time
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
from blobsvc import BlobServer, Settings
from blobsvc.server.metrics import ServerMetrics
from blobsvc.wire._protocol import ContentKey, GetRequest

KEYS = 1024
ROUND_SECONDS = 1.0
OBSERVE_CALLS = 200_000


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


def observe_ns(work: Path) -> float:
    """Nanoseconds one recorded request costs :class:`ServerMetrics` (best of 5)."""
    server = BlobServer(Settings(data_dir=work / "observe"))
    metrics = ServerMetrics(server)
    request, observe = GetRequest(ContentKey(bytes(32))), metrics.observe
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter_ns()
        for _ in range(OBSERVE_CALLS):
            observe(request, 0, 4096, 0.0001, None)  # type: ignore[arg-type]  # the stream is unused
        best = min(best, (time.perf_counter_ns() - start) / OBSERVE_CALLS)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=None, help="Rounds of off/on measurements (default 30).")
    parser.add_argument("--seconds", type=float, default=ROUND_SECONDS, help="Seconds of each measurement.")
    parser.add_argument("--quick", action="store_true", help="Tiny counts: a smoke test, not a measurement.")
    parser.add_argument("--tmp-dir", help="Parent of the temporary data directory.")
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 30)
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
                cpu_ratios: list[float] = []
                answered = 0
                for number in range(rounds):
                    order = [("off", off), ("on", on)] if number % 2 == 0 else [("on", on), ("off", off)]
                    ops_s: dict[str, float] = {}
                    cpu_us: dict[str, float] = {}
                    for label, server in order:
                        result = small_gets(server, keys, SMALL_SIZE, max_ops, seconds, warmup)
                        ops_s[label] = result.ops / result.seconds
                        cpu_us[label] = (result.server_cpu or 0.0) * result.seconds / result.ops * 1e6
                        if label == "on":
                            answered += result.ops + warmup
                        emit(
                            result.record(
                                f"get_4KiB_metrics_{label}", round=number, server_cpu_us_per_op=round(cpu_us[label], 1)
                            )
                        )
                    ratios.append(ops_s["on"] / ops_s["off"])
                    cpu_ratios.append(cpu_us["on"] / cpu_us["off"])
                    emit(
                        {
                            "bench": "ratio",
                            "round": number,
                            "ops_on_over_off": round(ratios[-1], 3),
                            "cpu_per_op_on_over_off": round(cpu_ratios[-1], 3),
                        }
                    )
                counted = scrape_get_count(metrics_port)
                if counted < answered:
                    raise BenchError(f"metrics counted {counted} GETs of the {answered} answered")
        emit(
            {
                "summary": {
                    "ops_on_over_off_per_round": [round(r, 3) for r in ratios],
                    "median_ops_on_over_off": round(statistics.median(ratios), 3),
                    "cpu_per_op_on_over_off_per_round": [round(r, 3) for r in cpu_ratios],
                    "median_cpu_per_op_on_over_off": round(statistics.median(cpu_ratios), 3),
                    "observe_ns": round(observe_ns(work), 1),
                    "gets_counted_by_metrics": counted,
                }
            }
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
