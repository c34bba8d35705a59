"""``blobsvc bench``: what a server does for its users, beside what the machine allows.

A matrix of PUTs and GETs by blob size and by the number of connections, plus eight
processes asking one host cache for one blob, each measured beside baselines taken in the
same run on the same machine, so that the ratios mean something on a loaded machine too:

* small blobs (up to 1 MiB): ops/s and p50/p99 latency from a lean load generator speaking
  the raw protocol over N connections (one request in flight on each, so it measures the
  server rather than a client); every PUT stores a new blob. Baseline for PUTs: the same
  number of threads making the system calls of publishing small blobs one by one
  (``baseline_publish``).
* large blobs: MB/s through :class:`AsyncBlobClient`, N transfers at once (PUTs of a file,
  GETs into memory, and one ``get_file`` to disk). Baselines: a child process
  ``os.sendfile``-s the file into a loopback socket, received into memory (``sendfile``, the
  ceiling of a GET) or written and fsynced (``write_fsync``, the ceiling of a PUT); and how
  fast this machine hands out fresh zeroed memory (``fresh_memory``), which a GET into memory
  pays for every byte and the ``sendfile`` baseline, receiving into one reused buffer, does not.
* fan-out: seconds for 8 processes to get one blob through one :class:`BlobCache`, against one
  process alone, and how many GETs the server saw.

Cells whose bytes in flight (size times connections) exceed ``max_cell_bytes`` are reported as
skipped rather than run: 32 GETs of 512 MiB into memory would want 16 GiB.

Output: one JSON object per measurement (:func:`run` hands them to a callback), a summary
table (:func:`table`), and optionally a plot (:func:`plot`, with matplotlib: the ``bench``
extra).

The part ``blobsvc/bench/``: this module (the command's runs and report) and ``_measure``,
the engine the benchmarks in ``benchmarks/`` share (load generators, baselines, child
servers). May import the client, the cache and what lies below them; never the server (a
child process runs it).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .._exceptions import NotFound
from ..client import AsyncBlobClient
from ..config import Settings
from ..wire._tls import client_context_for
from . import _measure as m

__all__ = ["Plan", "plot", "run", "steps", "table"]

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
SMALL_LIMIT = MiB  # blobs up to this size are measured in ops/s by the raw load generator
MIN_SIZE = 8  # the load generator numbers each small blob in its first 8 bytes


@dataclass
class Plan:
    """What one run measures."""

    sizes: tuple[int, ...] = (4 * KiB, MiB, 64 * MiB, 512 * MiB)
    connections: tuple[int, ...] = (1, 8, 32)
    small_seconds: float = 2.0  # per small-blob cell
    repeat: int = 3  # runs of each large cell and of its baselines, interleaved; the best counts
    max_cell_bytes: int = 2 * GiB
    fan_out_size: int = 256 * MiB
    fan_out_processes: int = 8
    fan_out_rounds: int = 5  # one download's time varies by a third from run to run here
    tmp_dir: str | None = None

    @classmethod
    def quick(cls, tmp_dir: str | None = None) -> Plan:
        """Tiny sizes and counts: proves the bench works, measures nothing worth keeping."""
        return cls(
            sizes=(4 * KiB, 4 * MiB),
            connections=(1, 4),
            small_seconds=0.3,
            repeat=1,
            fan_out_size=4 * MiB,
            fan_out_processes=2,
            fan_out_rounds=1,
            tmp_dir=tmp_dir,
        )

    def only(self, sizes: Sequence[int] = (), connections: Sequence[int] = ()) -> Plan:
        """This plan cut down to ``sizes`` and ``connections`` (each: all of the plan's when
        empty), to measure a few cells without the whole matrix. A cut-down plan leaves out
        the fan-out, which is no cell of the matrix."""
        if not sizes and not connections:
            return self
        return replace(
            self,
            sizes=tuple(sorted(set(sizes))) or self.sizes,
            connections=tuple(sorted(set(connections))) or self.connections,
            fan_out_processes=0,
        )


@dataclass
class _Context:
    plan: Plan
    work: Path
    server: m.Server
    emit: Callable[[dict[str, Any]], None]
    sources: dict[int, tuple[Path, bytes]] = field(default_factory=dict)  # large size -> file, key
    small_keys: list[bytes] = field(default_factory=list)  # every small blob PUT, for cleanup

    @property
    def address(self) -> str:
        return f"{self.server.host}:{self.server.port}"

    def client(self, **options: Any) -> AsyncBlobClient:
        """A client of the server under test, with its secret and TLS files."""
        access = self.server.access
        return AsyncBlobClient(self.address, secret=access.secret(), tls=client_context_for(access), **options)

    def source(self, size: int) -> tuple[Path, bytes]:
        if size not in self.sources:
            path = self.work / f"source-{size}.bin"
            self.sources[size] = path, m.make_source(path, size)
        return self.sources[size]


Step = tuple[str, Callable[[_Context], None]]


def steps(plan: Plan) -> list[Step]:
    """The measurements of ``plan``, in order, each with a label for the progress bar."""
    found: list[Step] = []
    for size in plan.sizes:
        label = m.size_label(size)
        if size <= SMALL_LIMIT:
            for connections in plan.connections:
                found.append((f"PUT/GET {label} x{connections}", _small_cell(size, connections)))
        else:
            found.append((f"baselines {label}", _large_baselines(size)))
            for connections in plan.connections:
                found.append((f"PUT/GET {label} x{connections}", _large_cell(size, connections)))
    if plan.fan_out_processes > 1:
        found.append((f"fan-out x{plan.fan_out_processes}", _fan_out))
    return found


@contextlib.contextmanager
def _server(address: str | None, work: Path, plan: Plan, access: Settings) -> Iterator[m.Server]:
    if address is not None:
        host, _, port = address.rpartition(":")
        yield m.RemoteServer(host.strip("[]") or "127.0.0.1", int(port), access)
        return
    with m.running_server(work / "data", work / "server.log") as server:
        yield server


def run(
    plan: Plan,
    emit: Callable[[dict[str, Any]], None],
    *,
    address: str | None = None,
    access: Settings | None = None,
    progress: Callable[[str], None] = lambda label: None,
) -> None:
    """Run ``plan`` against the server at ``address`` (``host:port``), or against a fresh
    local ``blobsvc serve`` it starts and stops itself; every measurement goes to ``emit``.
    ``access``: the settings (``secret_file``, ``tls_*``) that let a client into the server at
    ``address``. ``progress`` is called with each step's label as it ends."""
    parent = m.choose_tmp_parent(plan.tmp_dir, Path.cwd() / "blobsvc-bench")
    work = Path(tempfile.mkdtemp(prefix="blobsvc-bench-", dir=parent))
    try:
        mount, fs_type = m.filesystem_of(work)
        emit({"bench": "setup", **m.machine(), "server": address or "local", "filesystem": fs_type, "mount": mount})
        with _server(address, work, plan, access or Settings()) as server:
            context = _Context(plan, work, server, emit)
            try:
                for label, step in steps(plan):
                    step(context)
                    progress(label)
            finally:
                if address is not None:
                    m.run_async(_delete(context))
    finally:
        shutil.rmtree(work, ignore_errors=True)


async def _delete(context: _Context) -> None:
    """Remove what the bench stored on a server it did not start."""
    async with context.client(timeout=m.IO_TIMEOUT) as client:
        keys = [key.hex() for key in context.small_keys] + [key.hex() for _, key in context.sources.values()]
        for start in range(0, len(keys), 64):
            await asyncio.gather(*(client.delete(key) for key in keys[start : start + 64]))
        await client.delete_job(_JOB)


_JOB = "b1b5bec4b1b5bec4b1b5bec4b1b5bec4"  # the job the large PUTs store their names under


def _small_cell(size: int, connections: int) -> Callable[[_Context], None]:
    def cell(context: _Context) -> None:
        plan = context.plan
        seconds, warmup = plan.small_seconds, max(20, connections * 4)
        put, keys = m.small_puts(context.server, size, 10**8, seconds, warmup, connections, keep_keys=True)
        context.small_keys.extend(keys)
        # The baseline's files stay until the bench ends: deleting thousands of files just
        # before the next cell made journal-less ext4 skip the inodes it had just freed, at a
        # cost of 35-50 % of that cell's CPU per PUT (benchmarks/RESULTS.md), which is the
        # bench's doing, not the server's.
        publish = m.baseline_publish(context.work / f"publish-{size}-{connections}", size, 10**8, seconds, connections)
        publish_ops = publish.ops / publish.seconds
        context.emit(publish.record(f"baseline_publish_{m.size_label(size)}"))
        context.emit(
            put.record(
                "put",
                baseline=f"baseline_publish_{m.size_label(size)}",
                ratio=round(put.ops / put.seconds / publish_ops, 3),
            )
        )
        get = m.small_gets(context.server, keys[: m.GET_KEYS], size, 10**8, seconds, warmup, connections)
        context.emit(get.record("get"))

    return cell


def _large_baselines(size: int) -> Callable[[_Context], None]:
    def cell(context: _Context) -> None:
        source, _ = context.source(size)
        buffer = bytearray(size)
        view = memoryview(buffer)
        sink = context.work / "baseline.bin"
        sendfile, write_fsync, fresh = [], [], []
        for _ in range(context.plan.repeat):
            started = time.perf_counter()
            block = bytearray(size)  # fresh zeroed pages, as a GET into memory receives into
            fresh.append(time.perf_counter() - started)
            del block
            os.sync()
            sendfile.append(m.baseline_transfer("sendfile", source, size, lambda s: m.recv_into_all(s, view))[0])
            sink.unlink(missing_ok=True)
            os.sync()
            write_fsync.append(
                m.baseline_transfer("sendfile", source, size, lambda s: m.receive_write_fsync(s, sink, size))[0]
            )
            sink.unlink(missing_ok=True)
        for name, seconds in (
            ("baseline_sendfile", sendfile),
            ("baseline_write_fsync", write_fsync),
            ("baseline_fresh_memory", fresh),
        ):
            context.emit(_rate_record(name, size, 1, seconds))

    return cell


def _large_cell(size: int, connections: int) -> Callable[[_Context], None]:
    def cell(context: _Context) -> None:
        label = m.size_label(size)
        if size * connections > context.plan.max_cell_bytes:
            for op in ("put", "get"):
                context.emit({"bench": op, "size": size, "connections": connections, "skipped": "over max_cell_bytes"})
            return
        source, key = context.source(size)
        ops = ("put", "get", "get_file") if connections == 1 else ("put", "get")
        seconds: dict[str, list[float]] = {op: [] for op in ops}
        cpu: dict[str, list[float | None]] = {op: [] for op in ops}
        for _ in range(context.plan.repeat):
            for op in ops:
                os.sync()
                before = context.server.cpu_seconds()
                took = m.run_async(_transfer(context, op, source, key, size, connections))
                after = context.server.cpu_seconds()
                seconds[op].append(took)
                cpu[op].append(None if before is None or after is None else (after - before) / took)
        for op in ops:
            best = seconds[op].index(min(seconds[op]))
            baseline = "baseline_write_fsync" if op == "put" else "baseline_sendfile"
            record = _rate_record(op, size, connections, seconds[op], baseline=f"{baseline}")
            if cpu[op][best] is not None:
                record["server_cpu"] = round(cpu[op][best] or 0.0, 2)
            record["label"] = f"{op} {label} x{connections}"
            context.emit(record)

    return cell


async def _transfer(context: _Context, op: str, source: Path, key: bytes, size: int, connections: int) -> float:
    async with context.client(timeout=m.IO_TIMEOUT, retries=0) as client:
        if op == "put":
            await asyncio.gather(*(client.delete(job=_JOB, name=f"w{i}") for i in range(connections)))
            await client.delete(key.hex())  # every PUT stores a new object
        else:
            try:
                await client.stat(key.hex())
            except NotFound:  # a PUT cell deleted it
                await client.put(source)

        async def one(i: int) -> None:
            if op == "put":
                stored = await client.put(source, job=_JOB, name=f"w{i}")
                ok = stored == key.hex()
            elif op == "get":
                ok = len(await client.get(key.hex())) == size
            else:
                ok = (await client.get_file(context.work / "download.bin", key.hex())).size == size
            if not ok:
                raise m.BenchError(f"{op} of a {size}-byte blob went wrong")

        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(connections)))
        took = time.perf_counter() - started
    with contextlib.suppress(FileNotFoundError):
        (context.work / "download.bin").unlink()
    return took


def _rate_record(name: str, size: int, connections: int, seconds: list[float], **extra: Any) -> dict[str, Any]:
    rates = [size * connections / s / m.MB for s in seconds]
    return {
        "bench": name,
        "size": size,
        "connections": connections,
        "MB_s": round(max(rates), 1),
        "median_MB_s": round(statistics.median(rates), 1),
        "runs_MB_s": [round(rate, 1) for rate in rates],
        **extra,
    }


def _fan_out(context: _Context) -> None:
    plan = context.plan
    source, key = context.source(plan.fan_out_size)
    m.run_async(_upload(context, source))
    process_context = multiprocessing.get_context("forkserver")
    process_context.set_forkserver_preload(["blobsvc.cache"])
    times: dict[int, list[float]] = {1: [], plan.fan_out_processes: []}
    gets: dict[int, list[int]] = {1: [], plan.fan_out_processes: []}
    for round_ in range(plan.fan_out_rounds):
        for processes in times:
            cache_dir = context.work / f"cache-{round_}-{processes}"
            before = m.run_async(_server_gets(context))
            times[processes].append(
                m.fan_out_seconds(
                    process_context, context.address, key.hex(), processes, cache_dir, context.server.access
                )
            )
            gets[processes].append(m.run_async(_server_gets(context)) - before)
            shutil.rmtree(cache_dir, ignore_errors=True)
    many_times = times[plan.fan_out_processes]
    # Each round's two figures are taken one right after the other, so the machine's drift
    # hits both; a ratio of medians would pair a round's one process with another's eight.
    ratios = [many / one for one, many in zip(times[1], many_times, strict=True)]
    context.emit(
        {
            "bench": "fan_out",
            "size": plan.fan_out_size,
            "processes": plan.fan_out_processes,
            "one_process_s": round(statistics.median(times[1]), 4),
            "many_processes_s": round(statistics.median(many_times), 4),
            "runs_one_s": [round(t, 4) for t in times[1]],
            "runs_many_s": [round(t, 4) for t in many_times],
            "runs_ratio": [round(r, 3) for r in ratios],
            "ratio": round(statistics.median(ratios), 3),
            "server_gets_one": gets[1],
            "server_gets_many": gets[plan.fan_out_processes],
        }
    )


async def _server_gets(context: _Context) -> int:
    """GETs the server has answered so far (every client's: on a shared server, others' too)."""
    async with context.client(timeout=m.IO_TIMEOUT) as client:
        requests: dict[str, int] = (await client.status())["requests"]
    return requests.get("GET", 0)


async def _upload(context: _Context, source: Path) -> None:
    async with context.client(timeout=m.IO_TIMEOUT) as client:
        await client.put(source)


# --- output ---------------------------------------------------------------------------------


def table(records: list[dict[str, Any]]) -> str:
    """The measurements as a text table: blobsvc's figure, its baseline's, their ratio."""
    baselines = {
        (r["bench"], r["size"], r["connections"]): r for r in records if r.get("bench", "").startswith("baseline_")
    }
    rows = [("op", "size", "conns", "blobsvc", "baseline", "ratio", "p50 ms", "p99 ms")]
    for r in records:
        bench = r.get("bench")
        if bench in {"put", "get", "get_file"}:
            size, conns = m.size_label(r["size"]), str(r["connections"])
            if "skipped" in r:
                rows.append((bench, size, conns, "skipped", "", "", "", ""))
                continue
            if "ops_s" in r:
                figure = f"{r['ops_s']:,.0f} ops/s"
                base = baselines.get((r.get("baseline"), r["size"], r["connections"]))
                base_text = f"{base['ops_s']:,.0f} ops/s" if base else ""
                ratio = f"{r['ratio']:.2f}" if "ratio" in r else ""
                rows.append((bench, size, conns, figure, base_text, ratio, f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}"))
            else:
                base = baselines.get((r["baseline"], r["size"], 1))  # the machine's one-stream ceiling
                base_text = f"{base['MB_s']:,.0f} MB/s" if base else ""
                ratio = f"{r['MB_s'] / base['MB_s']:.2f}" if base else ""
                rows.append((bench, size, conns, f"{r['MB_s']:,.0f} MB/s", base_text, ratio, "", ""))
        elif bench == "fan_out":
            rows.append(
                (
                    f"fan-out x{r['processes']}",
                    m.size_label(r["size"]),
                    "",
                    f"{r['many_processes_s']:.3f} s, GETs {_per_round(r['server_gets_many'])}",
                    f"{r['one_process_s']:.3f} s (1 process), GETs {_per_round(r['server_gets_one'])}",
                    f"{r['ratio']:.2f}",
                    "",
                    "",
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            cell.rjust(width) if i >= 3 else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    return "\n".join(lines)


def _per_round(counts: list[int]) -> str:
    return "/".join(str(count) for count in counts)


def plot(records: list[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """Throughput by blob size (one connection, beside the baselines) and p50/p99 latency of
    small requests by connections, into a PNG at ``path``. Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    series: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        if r.get("connections") != 1 or "skipped" in r or r.get("bench") not in {
            "put", "get", "get_file", "baseline_sendfile", "baseline_write_fsync"
        }:  # fmt: skip
            continue
        series.setdefault(r["bench"], []).append((r["size"], r.get("MB_s", 0.0)))
    for name, points in sorted(series.items()):
        points.sort()
        left.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    left.set_xscale("log", base=2)
    left.set_yscale("log")
    left.set_xlabel("blob size (bytes)")
    left.set_ylabel("MB/s (one connection)")
    left.set_title("Throughput by blob size")
    left.legend()
    smallest = min((r["size"] for r in records if "p50_ms" in r), default=None)
    for op in ("get", "put"):
        latencies = sorted(
            (r["connections"], r["p50_ms"], r["p99_ms"])
            for r in records
            if r.get("bench") == op and r.get("size") == smallest and "p50_ms" in r
        )
        if latencies:
            conns = [p[0] for p in latencies]
            right.plot(conns, [p[1] for p in latencies], marker="o", label=f"{op} p50")
            right.plot(conns, [p[2] for p in latencies], marker="x", linestyle="--", label=f"{op} p99")
    right.set_xlabel("connections")
    right.set_ylabel("latency (ms)")
    right.set_title(f"Small requests ({m.size_label(smallest) if smallest else '-'})")
    right.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
