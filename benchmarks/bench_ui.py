"""What the operator's page costs the server, against its goals (issue 34):

* ``endpoint_<name>``: each JSON endpoint of ``/ui/api/`` answered by an in-process server
  holding 10,000 hosts and 1,000 pipelines (goal: < 1 ms each). Called straight on the
  page's :class:`~blobsvc.ui._api.PageData` on the server's loop, ``--calls`` times:
  wall time per call and CPU time per call of the whole process (``ms_per_call``: answers
  within a snapshot's second, as all but one a second are), and ``cold_ms``, the first
  answer of a fresh page, which reads its snapshot (the status, the 10,000 hosts in their
  order) in a worker thread.
* ``page_load``: the bytes one page load moves over HTTP from that server (headers and
  bodies of the HTML, script, style sheet, icon and one round of the page's JSON requests;
  goal: < 500 KB).
* ``get_4KiB_page_{closed,open}``: 4 KiB GET ops/s of a ``blobsvc serve`` child (holding
  10,000 hosts and 1,000 pipelines too), with the load of ``bench_server`` (8 connections,
  one GET in flight on each), in rounds that alternate between no page open and a page open
  (a child process making the page's requests every ``--refresh`` seconds: 1 by default, five
  times as often as the page itself). Goal: open within 5% of closed, medians of the same run.
  The server's CPU time per GET is given beside ops/s, as bench_metrics does.

Run from the repository root::

    .venv/bin/python -m benchmarks.bench_ui            # about a minute
    .venv/bin/python -m benchmarks.bench_ui --quick    # a smoke test (a few seconds)

Every measurement is one JSON line; the last is ``{"summary": …}``. Talks to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_server import (
    SMALL_MAX_OPS,
    SMALL_MAX_SECONDS,
    SMALL_SIZE,
    choose_tmp_parent,
    emit,
    machine,
    running_server,
    small_gets,
    small_puts,
)
from blobsvc import BlobClient, BlobServer, Settings
from blobsvc.server.hosts import HostReport
from blobsvc.ui._api import PageData

HOSTS = 10_000
PIPELINES = 1_000
CALLS = 200
ROUND_SECONDS = 1.0
REFRESH = 1.0
# What the page asks for on each refresh (blobsvc/ui/static/app.js).
PAGE_FILES = ("/ui/", "/ui/app.js", "/ui/app.css", "/ui/icon.svg")
PAGE_DATA = (
    "/ui/api/overview",
    "/ui/api/hosts?offset=0&limit=50",
    "/ui/api/jobs?offset=0&limit=50",
    "/ui/api/pipelines?offset=0&limit=50",
    "/ui/api/pipelines/pipeline-0000",
)
# The open page in the GET rounds: a child process, so that it takes no GIL from the load.
POLLER = """
import http.client, sys, time
port, refresh, paths = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
while True:
    began = time.monotonic()
    for path in paths:
        connection.request("GET", path)
        connection.getresponse().read()
    time.sleep(max(0.0, refresh - (time.monotonic() - began)))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fill(client: BlobClient, hosts: int, pipelines: int) -> None:
    """Hosts by heartbeat; pipelines with a checkpoint in progress each (a history), the first
    with 20."""
    for number in range(hosts):
        client.heartbeat({"agent": f"exec-{number:05d}.example.org:6140", "host": f"exec-{number:05d}",
                          "cache_bytes": number, "cache_max_bytes": 10 << 30})  # fmt: skip
    for number in range(pipelines):
        pipeline = f"pipeline-{number:04d}"
        epoch = client.checkpoints({"action": "register", "pipeline": pipeline})["epoch"]
        for _ in range(20 if number == 0 else 1):
            client.checkpoints({"action": "trigger", "pipeline": pipeline, "epoch": epoch, "timeout": 3600})


def page_bytes(port: int) -> int:
    """Header and body bytes of one page load, as received."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    moved = 0
    for path in (*PAGE_FILES, *PAGE_DATA):
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read()
        assert response.status == 200, (path, response.status, body[:200])
        head = f"HTTP/1.1 {response.status} {response.reason}\r\n" + "".join(
            f"{name}: {value}\r\n" for name, value in response.getheaders()
        )
        moved += len(head) + 2 + len(body)
    return moved


async def endpoint_costs(work: Path, hosts: int, pipelines: int, calls: int) -> dict[str, Any]:
    settings = Settings(host="127.0.0.1", port="0", http_port="0", data_dir=work / "cost")
    async with BlobServer(settings) as server:
        started = time.perf_counter()
        for number in range(hosts):
            server.hosts.record(HostReport.parse({"agent": f"exec-{number:05d}.example.org:6140", "cache_bytes": 1}))
        await asyncio.to_thread(_fill_pipelines, server.address, pipelines)
        emit({"bench": "setup_cost_server", "hosts": hosts, "pipelines": pipelines,
              "seconds": round(time.perf_counter() - started, 1)})  # fmt: skip
        costs: dict[str, Any] = {}
        for path in PAGE_DATA:
            what, _, query = path.removeprefix("/ui/api/").partition("?")
            params = dict(part.split("=") for part in query.split("&")) if query else {}
            # Cold: a fresh page's first answer reads its snapshots (the status, the hosts)
            # anew, as the first request after each SNAPSHOT_SECONDS does.
            cold = []
            for _ in range(max(3, calls // 20)):
                fresh = PageData(server)
                began = time.perf_counter()
                await fresh.answer(what, params)
                cold.append((time.perf_counter() - began) * 1e3)
            await server.page.data.answer(what, params)  # warm
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(calls):
                body = await server.page.data.answer(what, params)
            wall_ms = (time.perf_counter() - wall) / calls * 1e3
            cpu_ms = (time.process_time() - cpu) / calls * 1e3
            name = what.split("/")[0] + ("_history" if "/" in what else "")
            emit({"bench": f"endpoint_{name}", "path": path, "calls": calls, "ms_per_call": round(wall_ms, 3),
                  "cpu_ms_per_call": round(cpu_ms, 3), "cold_ms": round(statistics.median(cold), 3),
                  "bytes": len(body)})  # fmt: skip
            costs[name] = round(wall_ms, 3)
            costs[f"{name}_cold"] = round(statistics.median(cold), 3)
        address = server.http_address
        assert address is not None
        costs["page_load_bytes"] = await asyncio.to_thread(page_bytes, address[1])
        emit({"bench": "page_load", "bytes": costs["page_load_bytes"]})
        return costs


def _fill_pipelines(address: tuple[str, int], pipelines: int) -> None:
    with BlobClient(f"{address[0]}:{address[1]}", timeout=60) as client:
        fill(client, 0, pipelines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=None, help="Rounds of closed/open GET measurements (default 20).")
    parser.add_argument("--seconds", type=float, default=ROUND_SECONDS, help="Seconds of each GET measurement.")
    parser.add_argument("--refresh", type=float, default=REFRESH, help="Seconds between the open page's refreshes.")
    parser.add_argument("--calls", type=int, default=CALLS, help="Calls of each endpoint timed.")
    parser.add_argument("--quick", action="store_true", help="Tiny counts: a smoke test, not a measurement.")
    parser.add_argument("--tmp-dir", help="Parent of the temporary data directory.")
    args = parser.parse_args(argv)
    quick = args.quick
    rounds = args.rounds or (1 if quick else 20)
    hosts, pipelines = (100, 10) if quick else (HOSTS, PIPELINES)
    max_ops, seconds, warmup = (200, SMALL_MAX_SECONDS, 20) if quick else (SMALL_MAX_OPS, args.seconds, 500)
    work = Path(tempfile.mkdtemp(prefix="blobsvc-bench-ui-", dir=choose_tmp_parent(args.tmp_dir)))
    emit({"bench": "setup", **machine(), "rounds": rounds, "seconds": seconds, "refresh": args.refresh})
    try:
        costs = asyncio.run(endpoint_costs(work, hosts, pipelines, 5 if quick else args.calls))
        http_port = free_port()
        with running_server(work / "data", work / "server.log", extra_args=["--http-port", str(http_port)]) as server:
            _, keys = small_puts(server, SMALL_SIZE, min(1024, max_ops), SMALL_MAX_SECONDS, 0)
            with BlobClient(f"127.0.0.1:{server.port}", timeout=60) as client:
                fill(client, hosts, pipelines)
            ratios, cpu_ratios = [], []
            for number in range(rounds):
                order = ("closed", "open") if number % 2 == 0 else ("open", "closed")
                ops_s: dict[str, float] = {}
                cpu_us: dict[str, float] = {}
                for label in order:
                    poller = None
                    if label == "open":
                        poller = subprocess.Popen(
                            [sys.executable, "-c", POLLER, str(http_port), str(args.refresh), *PAGE_DATA]
                        )
                        time.sleep(0.3)  # it has started and made its first round
                    try:
                        result = small_gets(server, keys, SMALL_SIZE, max_ops, seconds, warmup)
                    finally:
                        if poller is not None:
                            poller.kill()
                            poller.wait(10)
                    ops_s[label] = result.ops / result.seconds
                    cpu_us[label] = (result.server_cpu or 0.0) * result.seconds / result.ops * 1e6
                    emit(result.record(f"get_4KiB_page_{label}", round=number,
                                       server_cpu_us_per_op=round(cpu_us[label], 1)))  # fmt: skip
                ratios.append(ops_s["open"] / ops_s["closed"])
                cpu_ratios.append(cpu_us["open"] / cpu_us["closed"])
        emit(
            {
                "summary": {
                    "endpoint_ms": {k: v for k, v in costs.items() if k != "page_load_bytes"},
                    "page_load_bytes": costs["page_load_bytes"],
                    "ops_open_over_closed_per_round": [round(r, 3) for r in ratios],
                    "median_ops_open_over_closed": round(statistics.median(ratios), 3),
                    "median_cpu_per_op_open_over_closed": round(statistics.median(cpu_ratios), 3),
                }
            }
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
