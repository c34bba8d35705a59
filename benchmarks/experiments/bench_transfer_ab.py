"""Large transfers of two blobsvc source trees, A/B in the same seconds: what a change to the
upload or download path (server or client) costs or saves, on a machine too busy for runs one
after the other.

Run from the repository root, with the tree to compare checked out elsewhere::

    git worktree add /tmp/blobsvc-main main
    .venv/bin/python -m benchmarks.experiments.bench_transfer_ab /tmp/blobsvc-main . --size-mib 64 --rounds 8
    .venv/bin/python -m benchmarks.experiments.bench_transfer_ab --quick /tmp/blobsvc-main .

Each tree gets a worker process that runs this file with ``PYTHONPATH`` set to the tree, so
that its ``blobsvc serve`` and its ``AsyncBlobClient`` are both that tree's; each worker has
its own server and data directory, and both read one source file. The workers take turns, one
operation each (the order swapped every round), each after an ``os.sync()``: ``put`` is
``AsyncBlobClient.put(path, job=, name=)`` of a blob the server no longer holds, ``get`` a
download into memory, ``get_file`` one to a file. Between rounds the baselines are taken: a
``sendfile`` received into memory (for ``get``), received into a new file (for ``get_file``,
which leaves its bytes to the page cache too), and received, written and fsynced (for ``put``).
A line per tree and operation gives MB/s (10^6 B/s; best, median, every run) and the median
CPU milliseconds of server and client per operation; the last line is ``{"summary": …}``,
each median over its baseline's median.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from blobsvc.bench import _measure as m

OPS = ("put", "get", "get_file")
BASELINE = {"put": "baseline_write_fsync", "get": "baseline_sendfile", "get_file": "baseline_write"}
JOB = "ab00ab00ab00ab00ab00ab00ab00ab00"


def _process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # threads that have ended count too
    return usage.ru_utime + usage.ru_stime


async def _serve_commands(server: m.ServerProcess, source: Path, size: int, work: Path) -> None:
    """The worker's loop: one operation per line of stdin, one JSON line on stdout for each."""
    from blobsvc import AsyncBlobClient, NotFound  # the tree's client, as PYTHONPATH says

    download = work / "download.bin"
    async with AsyncBlobClient(f"{server.host}:{server.port}", timeout=m.IO_TIMEOUT, retries=0) as client:
        key = await client.put(source)
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            op = line.strip()
            if op == "put":
                await client.delete(job=JOB, name="ab")
                await client.delete(key)  # every PUT stores a new object
            else:
                try:
                    await client.stat(key)
                except NotFound:  # a PUT deleted it (its job name alone does not serve the key)
                    await client.put(source)
            os.sync()
            server_cpu, client_cpu, started = server.cpu_seconds(), _process_cpu(), time.perf_counter()
            if op == "put":
                ok = await client.put(source, job=JOB, name="ab") == key
            elif op == "get":
                ok = len(await client.get(key)) == size
            else:
                ok = (await client.get_file(download, key)).key == key
            seconds = time.perf_counter() - started
            server_cpu, client_cpu = server.cpu_seconds() - server_cpu, _process_cpu() - client_cpu
            download.unlink(missing_ok=True)
            if not ok:
                raise m.BenchError(f"{op} went wrong")
            print(json.dumps({"seconds": seconds, "server_cpu": server_cpu, "client_cpu": client_cpu}), flush=True)


def worker(source: Path, work: Path) -> None:
    """One tree's side: its server, its client, the operations its parent asks for."""
    with m.running_server(work / "data", work / "server.log") as server:
        asyncio.run(_serve_commands(server, source, source.stat().st_size, work))


class _Worker:
    def __init__(self, tree: str, source: Path, work: Path) -> None:
        work.mkdir()
        env = {name: value for name, value in os.environ.items() if not name.startswith("BLOBSVC_")}
        env["PYTHONPATH"] = tree
        command = [sys.executable, __file__, "--worker", str(source), str(work)]
        # From a neutral directory: a checkout in the working directory would be imported first.
        self.process = subprocess.Popen(command, env=env, cwd=work, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.tree = tree
        self._read()  # ready

    def _read(self) -> dict[str, Any]:
        stdout: IO[bytes] | None = self.process.stdout
        assert stdout is not None
        line = stdout.readline()
        if not line:
            raise m.BenchError(f"the worker of {self.tree} exited with {self.process.wait(m.IO_TIMEOUT)}")
        record: dict[str, Any] = json.loads(line)
        return record

    def run(self, op: str) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{op}\n".encode())
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(m.IO_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(m.IO_TIMEOUT)


def _baselines(source: Path, size: int, work: Path, view: memoryview) -> dict[str, m.Timing]:
    """Each baseline's seconds, receiver CPU seconds and sender CPU seconds."""
    sink = work / "baseline.bin"
    os.sync()
    write_fsync = m.baseline_transfer("sendfile", source, size, lambda s: m.receive_write_fsync(s, sink, size))
    sink.unlink()
    os.sync()
    sendfile = m.baseline_transfer("sendfile", source, size, lambda s: m.recv_into_all(s, view))
    os.sync()
    unsynced = functools.partial(m.receive_write_fsync, path=sink, count=size, fsync=False)
    write = m.baseline_transfer("sendfile", source, size, unsynced)
    sink.unlink()
    return {"baseline_write_fsync": write_fsync, "baseline_sendfile": sendfile, "baseline_write": write}


def _rates(size: int, seconds: list[float]) -> dict[str, Any]:
    rates = [size / s / m.MB for s in seconds]
    return {
        "MB_s": round(max(rates), 1),
        "median_MB_s": round(statistics.median(rates), 1),
        "runs_MB_s": [round(rate, 1) for rate in rates],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.experiments.bench_transfer_ab", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("trees", nargs=2, help="Two source trees (directories holding blobsvc/).")
    parser.add_argument("--size-mib", type=int, default=64, help="Blob size (default 64).")
    parser.add_argument("--rounds", type=int, default=8, help="Rounds (default 8).")
    parser.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS), help="Default: all three.")
    parser.add_argument("--quick", action="store_true", help="One round of 4 MiB: a smoke test.")
    parser.add_argument("--tmp-dir", help="Parent of the work directory (default: $TMPDIR or /tmp unless tmpfs).")
    args = parser.parse_args(argv)
    trees = m.source_trees(parser, args.trees)
    if args.quick:
        args.size_mib, args.rounds = 4, 1
    size = args.size_mib << 20
    work = Path(tempfile.mkdtemp(prefix="blobsvc-transfer-ab-", dir=m.choose_tmp_parent(args.tmp_dir)))
    workers: list[_Worker] = []
    try:
        source = work / "source.bin"
        m.make_source(source, size)
        workers = [_Worker(tree, source, work / f"tree-{i}") for i, tree in enumerate(trees)]
        runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
        baselines: dict[str, list[m.Timing]] = {}
        view = memoryview(bytearray(size))
        for round_ in range(args.rounds):
            for op in args.ops:
                for i in range(2) if round_ % 2 == 0 else (1, 0):
                    runs.setdefault((op, i), []).append(workers[i].run(op))
            for name, timing in _baselines(source, size, work, view).items():
                baselines.setdefault(name, []).append(timing)
        medians = {name: statistics.median(size / t[0] / m.MB for t in timings) for name, timings in baselines.items()}
        for name, timings in baselines.items():
            record = {"bench": name, "size": size, **_rates(size, [t[0] for t in timings])}
            # The sender stands for the server, the receiver for the client.
            record["server_cpu_ms"] = round(statistics.median(t[2] or 0.0 for t in timings) * 1e3, 1)
            record["client_cpu_ms"] = round(statistics.median(t[1] for t in timings) * 1e3, 1)
            m.emit(record)
        summary: dict[str, float] = {}
        for (op, i), records in runs.items():
            record = {"bench": op, "size": size, "tree": trees[i], **_rates(size, [r["seconds"] for r in records])}
            record["server_cpu_ms"] = round(statistics.median(r["server_cpu"] for r in records) * 1e3, 1)
            record["client_cpu_ms"] = round(statistics.median(r["client_cpu"] for r in records) * 1e3, 1)
            m.emit(record)
            summary[f"{op} {trees[i]}"] = round(record["median_MB_s"] / medians[BASELINE[op]], 3)
        m.emit({"summary": {"median_ratio_to_baseline": summary}})
    finally:
        for each in workers:
            each.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        raise SystemExit(main())
