"""blobsvc against Apache Flink's own BlobServer and BlobClient, in the same run on the same
machine, each through its own client library.

Run from the repository root (Flink's jars come with ``pip install 'blobsvc[flink-bench]'``,
and Java with a JDK 11 or later: ``java`` and ``javac`` on PATH or in ``$JAVA_HOME``)::

    .venv/bin/python -m benchmarks.bench_flink            # a few minutes
    .venv/bin/python -m benchmarks.bench_flink --quick    # a smoke run

The harness ``benchmarks/flink/BlobBench.java`` is compiled against the ``flink-dist`` jar (of
the installed ``apache-flink-libraries`` package, or of ``--flink-lib DIR``) into a temporary
directory. One JVM runs a Flink BlobServer (127.0.0.1, a temporary storage directory, no HA
store), another a Flink BlobClient; a ``blobsvc serve`` child process and blobsvc's
:class:`AsyncBlobClient` (in this process) are the other side. Both clients are driven in turn,
one operation at a time, so that a busy moment of the machine hits both:

* ``put``/``get`` of ``memory``: bytes in memory to the server, and back into new memory;
* ``put``/``get`` of ``file``: a file to the server, and back into a file (neither client
  fsyncs a download; blobsvc's server fsyncs each PUT, Flink's none);

for 4 KiB blobs (ops/s over one kept connection, p50/p99 latency) and for 64 MiB and 256 MiB
blobs (MB/s with MB = 10**6 bytes, best and median of ``--repeat`` runs after one untimed run).
Every PUT sends new content. CPU: ``client_cpu_s``/``server_cpu_s`` are CPU seconds per
operation (blobsvc's server: its live threads; a JVM: all its threads, counted by the JVM in
10 ms ticks, so a single figure is ±0.01 s). Between the turns of each large transfer the
machine's own ceiling for it is measured too (:class:`Ceiling`), so that the run tells whether
``2 x Flink`` is there to be had at all. Output: one JSON object per line, the ratios blobsvc /
Flink, and a last ``{"summary": …, "targets_met": …, "targets_within_ceiling": …}`` line
(issue 9 asks for 2 x Flink on large blobs).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import IO, Protocol, cast

from blobsvc.bench._measure import (
    IO_TIMEOUT,
    START_TIMEOUT,
    STOP_TIMEOUT,
    BenchError,
    ServerProcess,
    SmallResult,
    Stopwatch,
    Throughput,
    Timing,
    baseline_transfer,
    choose_tmp_parent,
    emit,
    filesystem_of,
    machine,
    make_source,
    measure,
    receive_write_fsync,
    recv_into_all,
    run_async,
    running_server,
    size_label,
)
from blobsvc.client import AsyncBlobClient

KiB, MiB = 1 << 10, 1 << 20
REPO = Path(__file__).resolve().parent.parent
HARNESS = Path(__file__).resolve().parent / "flink" / "BlobBench.java"
HARNESS_CLASS = "org.apache.flink.runtime.blob.BlobBench"
FLINK_PACKAGE = "apache-flink-libraries"
NEEDS = "it needs a JDK 11+ (java, javac) and Flink's jars: pip install 'blobsvc[flink-bench]' (or --flink-lib DIR)"

SMALL_SIZE = 4 * KiB  # timed in ops/s over one kept connection; larger sizes in MB/s
OPERATIONS = (("put", "memory"), ("get", "memory"), ("put", "file"), ("get", "file"))
TARGET_RATIO = 2.0  # issue 9: large PUT and GET at least 2 x Flink's own client
SMALL_WARMUP_SECONDS = 0.5
COMPILE_TIMEOUT = 300.0


class Missing(BenchError):
    """Java or Flink's jars are not there: the user's setup, not a failure of the benchmark."""


# --- finding Java and Flink -------------------------------------------------------------------


def java_tools() -> tuple[str, str]:
    """``java`` and ``javac``, from ``$JAVA_HOME/bin`` before PATH."""
    path = os.environ.get("PATH", os.defpath)
    if java_home := os.environ.get("JAVA_HOME"):
        path = os.path.join(java_home, "bin") + os.pathsep + path
    java, javac = shutil.which("java", path=path), shutil.which("javac", path=path)
    if java is None or javac is None:
        raise Missing(f"no {'java' if java is None else 'javac'} on PATH or in $JAVA_HOME/bin; {NEEDS}")
    return java, javac


def flink_jars(lib: Path | None) -> tuple[list[Path], str]:
    """The class path for the harness (flink-dist and Log4j's jars) and Flink's version."""
    if lib is None:
        try:
            lib = Path(str(metadata.distribution(FLINK_PACKAGE).locate_file("pyflink/lib")))
        except metadata.PackageNotFoundError:
            raise Missing(f"{FLINK_PACKAGE} is not installed; {NEEDS}") from None
    dist = sorted(lib.glob("flink-dist*.jar"))
    if not dist:
        raise Missing(f"no flink-dist*.jar in {lib}; {NEEDS}")
    version = dist[-1].stem.removeprefix("flink-dist").lstrip("-_") or "?"
    return [dist[-1], *sorted(lib.glob("log4j-*.jar"))], version


def java_version(java: str) -> str:
    done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=IO_TIMEOUT)
    return (done.stderr.splitlines() or ["?"])[0]


def compile_harness(javac: str, jars: list[Path], out: Path) -> None:
    command = [javac, "-nowarn", "-d", str(out), "-cp", os.pathsep.join(map(str, jars)), str(HARNESS)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT)
    if done.returncode != 0:
        raise BenchError(f"javac failed on {HARNESS} (is this Flink 2.x?):\n{done.stderr[-2000:]}")


# --- the two JVMs -----------------------------------------------------------------------------


class JavaChild:
    """A JVM running the harness, asked one line at a time; its stderr goes to ``log_path``."""

    def __init__(self, command: list[str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, bufsize=1
        )
        self.pid = self.process.pid

    def read_line(self, timeout: float) -> str:
        stdout = cast(IO[str], self.process.stdout)
        with selectors.DefaultSelector() as selector:
            selector.register(stdout, selectors.EVENT_READ)
            line = stdout.readline() if selector.select(timeout) else ""
        if not line:
            raise BenchError(f"the JVM {self.pid} did not answer in {timeout:g} s; see {self.log_path}:\n{self.tail()}")
        return line.strip()

    def ask(self, command: str, timeout: float = IO_TIMEOUT) -> str:
        stdin = cast(IO[str], self.process.stdin)
        stdin.write(command + "\n")
        stdin.flush()
        return self.read_line(timeout)

    def tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-2000:]
        return ""

    def close(self) -> None:
        """End of stdin stops the harness; a JVM that does not stop is killed by its PID."""
        with contextlib.suppress(OSError):
            cast(IO[str], self.process.stdin).close()
        try:
            self.process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(STOP_TIMEOUT)
        cast(IO[str], self.process.stdout).close()
        self._log.close()


class FlinkServer(JavaChild):
    host = "127.0.0.1"

    def __init__(self, java: list[str], storage: Path, log_path: Path) -> None:
        super().__init__([*java, "-Xmx512m", HARNESS_CLASS, "serve", str(storage)], log_path)
        try:
            line = self.read_line(START_TIMEOUT)
            if not line.startswith("listening on "):
                raise BenchError(f"the Flink BlobServer did not start: {line!r}\n{self.tail()}")
            self.port = int(line.rsplit(":", 1)[1])
        except BaseException:
            self.close()
            raise

    def cpu_seconds(self) -> float:
        return int(self.ask("cpu")) / 1e9

    def clean(self) -> None:
        if (answer := self.ask("clean")) != "cleaned":
            raise BenchError(f"the Flink BlobServer could not delete its blobs: {answer!r}")


# --- the two sides ----------------------------------------------------------------------------


@dataclass
class Ops:
    """What one command did: operations, their own seconds summed, the client's CPU seconds."""

    ops: int
    seconds: float
    cpu: float
    latencies_ns: list[int]


class Side(Protocol):
    name: str

    def server_cpu(self) -> float: ...

    def run(self, op: str, mode: str, size: int, count: int, seconds: float) -> Ops:
        """Up to ``count`` operations, stopping after ``seconds`` (at least one runs)."""

    def clean(self) -> None:
        """Delete every blob stored so far."""


class FlinkSide:
    name = "flink"

    def __init__(self, server: FlinkServer, client: JavaChild) -> None:
        self.server, self.client = server, client

    def server_cpu(self) -> float:
        return self.server.cpu_seconds()

    def run(self, op: str, mode: str, size: int, count: int, seconds: float) -> Ops:
        line = self.client.ask(f"{op} {mode} {size} {count} {seconds}", seconds + IO_TIMEOUT)
        try:
            answer = json.loads(line)
        except ValueError:
            raise BenchError(f"Flink's client answered {line[:200]!r}; see {self.client.log_path}") from None
        if "error" in answer:
            raise BenchError(f"Flink's client failed: {answer['error']}; see {self.client.log_path}")
        return Ops(answer["ops"], answer["seconds"], answer["cpu"], answer["latencies_ns"])

    def clean(self) -> None:
        self.server.clean()


@dataclass
class BlobsvcSide:
    """blobsvc's :class:`AsyncBlobClient` in this process (a client per command: a new event
    loop each), against a ``blobsvc serve`` child process."""

    server: ServerProcess
    scratch: Path
    name: str = "blobsvc"
    stamp: int = 0
    sources: dict[int, bytearray] = field(default_factory=dict)
    stored: dict[tuple[str, int], str] = field(default_factory=dict)  # by mode and size

    def server_cpu(self) -> float:
        return self.server.cpu_seconds()

    def run(self, op: str, mode: str, size: int, count: int, seconds: float) -> Ops:
        return cast(Ops, run_async(self._run(op, mode, size, count, seconds)))

    def clean(self) -> None:
        async def delete_all() -> None:
            async with AsyncBlobClient((self.server.host, self.server.port), timeout=IO_TIMEOUT) as client:
                for key in set(self.stored.values()):
                    await client.delete(key)

        run_async(delete_all())
        self.stored.clear()

    async def _run(self, op: str, mode: str, size: int, count: int, seconds: float) -> Ops:
        result = Ops(0, 0.0, 0.0, [])
        deadline = time.perf_counter() + seconds
        async with AsyncBlobClient((self.server.host, self.server.port), timeout=IO_TIMEOUT, retries=0) as client:
            while result.ops < count and (not result.ops or time.perf_counter() < deadline):
                wall, cpu, _ = await self._one(client, op, mode, size)
                result.ops += 1
                result.seconds += wall
                result.cpu += cpu
                result.latencies_ns.append(int(wall * 1e9))
        return result

    async def _one(self, client: AsyncBlobClient, op: str, mode: str, size: int) -> Timing:
        if op == "put":
            source = self._new_content(mode, size)
            watch = Stopwatch()
            self.stored[mode, size] = await client.put(source)
            return watch.stop()
        key, download = self.stored[mode, size], self.scratch / f"download-{size}"
        if mode == "file":
            download.unlink(missing_ok=True)  # not timed: freeing the last copy's blocks
            watch = Stopwatch()
            await client.get_file(download, key)
            return watch.stop()
        watch = Stopwatch()
        got = len(await client.get(key))
        timing = watch.stop()
        if got != size:
            raise BenchError(f"blobsvc's client got {got} bytes of {size}")
        return timing

    def _new_content(self, mode: str, size: int) -> bytearray | Path:
        """The source of the next PUT, with a new counter in its first 8 bytes."""
        if size not in self.sources:
            self.sources[size] = bytearray(os.urandom(size))
        source = self.sources[size]
        self.stamp += 1
        source[:8] = self.stamp.to_bytes(8, "big")
        if mode == "memory":
            return source
        path = self.scratch / f"source-{size}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, source if os.fstat(fd).st_size != size else source[:8], 0)
        finally:
            os.close(fd)
        return path


# --- measuring ---------------------------------------------------------------------------------


def in_turn(sides: list[Side], turn: int) -> list[Side]:
    """Both sides, the first one changing every turn (neither always meets the other's dirty pages)."""
    return sides if turn % 2 == 0 else sides[::-1]


def timed(side: Side, op: str, mode: str, size: int) -> Timing:
    before = side.server_cpu()
    done = side.run(op, mode, size, 1, 0.0)
    return done.seconds, done.cpu, side.server_cpu() - before


class Ceiling:
    """What this machine allows the operation at all, measured between the two sides' runs:
    a child process ``sendfile``-s the bytes over loopback, received:

    * for a GET into memory, into one reused buffer: the wire alone (a client that returns new
      memory also pays its pages' first touch, which blobsvc's takes on a second thread);
    * for a GET into a file, into a new file, not fsynced (neither client fsyncs a download);
    * for a PUT, into a new file, fsynced (what a PUT acknowledged as durable needs), the
      files kept until the cell ends: both servers keep what they store, so their page cache
      grows by every upload, and the ceiling's does too.

    ``2 x Flink`` above it is out of reach of any client, not just of blobsvc's."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self._kept: list[Path] = []
        self._buffers: dict[int, memoryview] = {}

    def measure(self, result: Throughput, op: str, mode: str, size: int) -> None:
        source = self.work / f"ceiling-{size}.bin"
        if not source.exists():
            make_source(source, size)
        receive: Callable[[socket.socket], None]
        if op == "get" and mode == "memory":
            if size not in self._buffers:
                self._buffers[size] = memoryview(bytearray(size))
            receive = functools.partial(recv_into_all, view=self._buffers[size])
        elif op == "get":
            sink = self.work / "ceiling-sink.bin"
            sink.unlink(missing_ok=True)
            receive = functools.partial(receive_write_fsync, path=sink, count=size, fsync=False)
        else:
            sink = self.work / f"ceiling-kept-{len(self._kept)}.bin"
            self._kept.append(sink)
            receive = functools.partial(receive_write_fsync, path=sink, count=size)
        measure(result, functools.partial(baseline_transfer, "sendfile", source, size, receive))

    def end_cell(self) -> None:
        for path in self._kept:
            path.unlink(missing_ok=True)
        self._kept.clear()
        (self.work / "ceiling-sink.bin").unlink(missing_ok=True)

    @staticmethod
    def name(op: str, mode: str) -> str:
        if op == "put":
            return "baseline_write_fsync_kept"
        return "baseline_sendfile" if mode == "memory" else "baseline_sendfile_new_file"


def measure_large(
    sides: list[Side], ceiling: Ceiling, op: str, mode: str, size: int, repeat: int
) -> dict[str, Throughput]:
    """Both sides' runs in turn, the ceiling's between turns; keyed by side, and ``ceiling``."""
    label = size_label(size)
    results = {side.name: Throughput(f"{side.name}_{op}_{mode}_{label}", size, op == "put") for side in sides}
    results["ceiling"] = Throughput(f"{Ceiling.name(op, mode)}_{label}", size, op == "put")
    for side in sides:
        side.run(op, mode, size, 1, 0.0)  # untimed: the JIT, the page cache, the connection
    for turn in range(repeat):
        for side in in_turn(sides, turn):
            measure(results[side.name], functools.partial(timed, side, op, mode, size))
        ceiling.measure(results["ceiling"], op, mode, size)
    ceiling.end_cell()
    return results


def measure_small(sides: list[Side], op: str, mode: str, size: int, seconds: float) -> dict[str, SmallResult]:
    results = {}
    for side in sides:
        side.run(op, mode, size, 1_000_000, SMALL_WARMUP_SECONDS)
        before = side.server_cpu()
        done = side.run(op, mode, size, 1_000_000, seconds)
        server_cpu = side.server_cpu() - before
        results[side.name] = SmallResult(
            size, done.ops, done.seconds, done.latencies_ns, done.cpu / done.seconds, server_cpu / done.seconds, 1
        )
    return results


def ops_per_second(result: SmallResult) -> float:
    return result.ops / result.seconds


def cpu_per_op(result: Throughput) -> dict[str, float]:
    """Mean CPU seconds per operation over the runs, of the client and of the server."""
    client = [c * s for c, s in zip(result.local_cpu, result.seconds, strict=True)]
    server = [c * s for c, s in zip(result.peer_cpu, result.seconds, strict=True)]
    return {"client_cpu_s": round(statistics.mean(client), 4), "server_cpu_s": round(statistics.mean(server), 4)}


def compare(
    sides: list[Side], ceiling: Ceiling, sizes: list[int], repeat: int, small_seconds: float
) -> tuple[dict[str, float], dict[str, bool], dict[str, bool]]:
    """Measure every operation at every size on both sides; emit the records; return the
    ratios blobsvc / Flink, and for large blobs whether each meets the target and whether
    the target is within the machine's ceiling for that operation."""
    ratios: dict[str, float] = {}
    targets_met: dict[str, bool] = {}
    within_ceiling: dict[str, bool] = {}
    for size in sizes:
        label = size_label(size)
        for op, mode in OPERATIONS:
            extra = {"op": op, "mode": mode}
            name = f"{op}_{mode}_{label}"
            if size <= SMALL_SIZE:
                small = measure_small(sides, op, mode, size, small_seconds)
                for system, measured in small.items():
                    emit(measured.record(f"{system}_{name}", system=system, **extra))
                ratio = (small["blobsvc"].ops / small["blobsvc"].seconds) / (
                    small["flink"].ops / small["flink"].seconds
                )
                ratios[f"{name}_ops_ratio"] = round(ratio, 2)
                emit({"bench": f"ratio_{name}", "of": "ops_s", **extra, "size": size, "ratio": round(ratio, 2)})
                continue
            large = measure_large(sides, ceiling, op, mode, size, repeat)
            for system, result in large.items():
                emit(result.record(system=system, **extra, **cpu_per_op(result)))
            blobsvc, flink, most = large["blobsvc"], large["flink"], large["ceiling"]
            ratio = blobsvc.best / flink.best
            ratios[f"{name}_ratio"] = round(ratio, 3)
            targets_met[name] = ratio >= TARGET_RATIO
            within_ceiling[name] = TARGET_RATIO * flink.best <= most.best
            emit(
                {
                    "bench": f"ratio_{name}",
                    "of": "MB_s",
                    **extra,
                    "size": size,
                    "flink_MB_s": round(flink.best, 1),
                    "blobsvc_MB_s": round(blobsvc.best, 1),
                    "ratio": round(ratio, 3),
                    "median_ratio": round(statistics.median(flink.seconds) / statistics.median(blobsvc.seconds), 3),
                    "target_ratio": TARGET_RATIO,
                    "target_met": ratio >= TARGET_RATIO,
                    "ceiling": most.name,
                    "ceiling_MB_s": round(most.best, 1),
                    "flink_of_ceiling": round(flink.best / most.best, 3),
                    "blobsvc_of_ceiling": round(blobsvc.best / most.best, 3),
                    "target_within_ceiling": within_ceiling[name],
                }
            )
        for side in sides:
            side.clean()
    return ratios, targets_met, within_ceiling


@contextlib.contextmanager
def flink_running(java: list[str], work: Path) -> Iterator[FlinkSide]:
    (work / "flink-client").mkdir()
    server = FlinkServer(java, work / "flink-storage", work / "flink-server.log")
    try:
        client = JavaChild(
            [*java, "-Xmx3g", HARNESS_CLASS, "client", str(server.port), str(work / "flink-client")],
            work / "flink-client.log",
        )
        try:
            yield FlinkSide(server, client)
        finally:
            client.close()
    finally:
        server.close()


# --- the run -----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_flink", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument(
        "--flink-lib", type=Path, help=f"Directory of flink-dist-*.jar (default: pyflink/lib of {FLINK_PACKAGE})."
    )
    parser.add_argument(
        "--large-mib", type=int, nargs="+", help="Sizes of the large blobs in MiB (default 64 256; 8 with --quick)."
    )
    parser.add_argument("--repeat", type=int, help="Timed runs of each large transfer (default 5; 1 with --quick).")
    parser.add_argument(
        "--small-seconds", type=float, help="Seconds of each 4 KiB measurement (default 2; 0.5 with --quick)."
    )
    parser.add_argument("--quick", action="store_true", help="Small sizes and counts: a smoke run, not a measurement.")
    parser.add_argument(
        "--tmp-dir", help="Parent of the temporary directories (default: $TMPDIR or /tmp unless tmpfs)."
    )
    args = parser.parse_args(argv)
    args.large_mib = args.large_mib or ([8] if args.quick else [64, 256])
    args.repeat = args.repeat or (1 if args.quick else 5)
    args.small_seconds = args.small_seconds or (0.5 if args.quick else 2.0)
    if min(args.large_mib) < 1 or max(args.large_mib) > 1024 or args.repeat < 1 or args.small_seconds <= 0:
        parser.error("sizes (1 to 1024 MiB), counts and durations must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        java, javac = java_tools()
        jars, version = flink_jars(args.flink_lib)
    except Missing as exc:
        print(f"bench_flink: {exc}", file=sys.stderr)
        return 2
    work = Path(
        tempfile.mkdtemp(prefix="blobsvc-flink-", dir=choose_tmp_parent(args.tmp_dir, REPO / "benchmarks" / "out"))
    )
    try:
        classes = work / "classes"
        compile_harness(javac, jars, classes)
        class_path = os.pathsep.join(map(str, [classes, *jars]))
        jvm = [java, "-Dlog4j2.level=WARN", "-cp", class_path]
        sizes = [SMALL_SIZE, *(mib * MiB for mib in args.large_mib)]
        emit(
            {
                "bench": "setup",
                **machine(),
                "flink": version,
                "java": java_version(java),
                "filesystem": filesystem_of(work)[1],
                "sizes": sizes,
                "repeat": args.repeat,
                "small_seconds": args.small_seconds,
            }
        )
        (work / "blobsvc-client").mkdir()
        with (
            flink_running(jvm, work) as flink,
            running_server(work / "blobsvc-data", work / "blobsvc-server.log") as server,
        ):
            sides: list[Side] = [flink, BlobsvcSide(server, work / "blobsvc-client")]
            ratios, targets_met, within_ceiling = compare(sides, Ceiling(work), sizes, args.repeat, args.small_seconds)
        emit(
            {
                "summary": {"flink": version, **ratios, "target_ratio": TARGET_RATIO},
                "targets_met": targets_met,
                "targets_within_ceiling": within_ceiling,
            }
        )
    except BenchError as exc:
        print(f"bench_flink: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
