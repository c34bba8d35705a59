"""The agent against Spark's own delivery of a packed Python environment, and its HTTP face
against loopback ``sendfile``, in the same run on ``local-cluster[2,1,1024]``.

**Environment.** A venv (``python -m venv``) with real packages from the index
(``--env-packages``, numpy, pandas, pyarrow and scipy by default: 150 MB and more once packed),
packed with venv-pack into ``env.tar.gz``. The archive is kept in ``--env-dir`` under a name
that depends on the packages and the Python, so reruns do not build it again.

**Spark.** Applications one after the other, each a new SparkContext (the driver's JVM is
this process's py4j gateway, started once by an untimed warm-up application and reused, as
every variant's is), timed from ``getOrCreate()`` to the result of the first job: ``--tasks``
tasks (2, one per executor) that import ``--env-import`` and return ``sys.executable``.

* ``baseline``: no archive at all, the workers run this Python (the plain session start and
  first job);
* ``spark``: ``spark.archives=/path/env.tar.gz#environment``: Spark's driver copies and
  unpacks the file for itself and serves it to each executor, which unpacks it in its work
  directory;
* ``agent``: ``blobsvc.spark.environment(builder, env.tar.gz, unpack="spark")`` through a
  real ``blobsvc agent`` process: the driver and both executors fetch ``spark.archives`` from
  the agent, which fetches it from the server once (app 1, a cold host cache) or not at all
  (app 2), and each unpacks it as in ``spark``;
* ``host``: ``blobsvc.spark.environment(builder, env.tar.gz)`` (``unpack="host"``): the
  agent unpacks the archive once for the host (app 1, after fetching it, unless ``agent`` of
  the same round went first) and the driver and executors fetch only a launcher script
  through ``spark.files``; app 2 fetches and unpacks nothing.

Each round runs app 1 and 2 of each of ``spark``, ``agent`` and ``host``, interleaved, the
variant that goes first changing from round to round, after a baseline; one more baseline
closes the run. A new agent with an empty cache starts each round. *Overhead* is an application's time
minus the median baseline. Both executors of local-cluster run on this one machine: each
unpacks the archive into its own work directory, and the agent's cache is shared by both, as
on one real host. What one unpack costs alone (``gzip -dc | tar -xf -``, which is what
Hadoop's ``FileUtil.unTar`` runs for Spark on Unix) is measured each round too.

**HTTP.** A ``--blob-mib`` blob (1 GiB) in the agent's cache, fetched over loopback by a raw
socket client into one reused buffer, ``--repeat`` times, each run beside a child process's
``os.sendfile`` of the same cached file into the same buffer (``blobsvc.bench._measure``'s
baseline); MB/s medians (MB = 10**6 bytes), the ratio of medians, and the agent's CPU.

Targets: the second application's environment overhead through the agent (``host``, the
default way) at most a tenth of Spark's; the agent serving a cached blob at 0.8 or more of ``sendfile``. Prints one JSON
object per measurement, then a ``{"summary": ..., "targets_met": ...}`` line.

    .venv/bin/python -m benchmarks.bench_agent            # 10-20 minutes by the load (and the first build)
    .venv/bin/python -m benchmarks.bench_agent --quick    # a smoke run: no download, small blob
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness.agent import AgentProcess, run_agent, start_agent
from benchmarks.harness.processes import ServerThread
from benchmarks.harness.spark import MASTER, start_session
from blobsvc import BlobClient, Settings
from blobsvc.bench._measure import (
    MB,
    BenchError,
    MiB,
    Stopwatch,
    Throughput,
    Timing,
    baseline_transfer,
    choose_tmp_parent,
    connect,
    emit,
    filesystem_of,
    machine,
    make_source,
    measure,
    process_cpu_seconds,
    recv_into_all,
)
from blobsvc.driver._spark_conf import DEFAULT_ALIAS

DEFAULT_PACKAGES = "numpy pandas pyarrow scipy"
MIN_ENV_BYTES = 150 * MB  # the "at least 150 MB", of the packed archive
QUICK_PADDING = 4 * MiB  # random bytes in the quick environment, so that there is something to move
PYTHON_IN_ENV = f"./{DEFAULT_ALIAS}/bin/python"
TARGET_OVERHEAD_RATIO = 0.1
TARGET_HTTP_RATIO = 0.8
APP_TIMEOUT = 600  # seconds: any one application's first job, and any one unpack
VARIANTS = ("spark", "agent", "host")
THROUGH_AGENT = {"agent": "spark", "host": "host"}  # variant -> environment()'s unpack=
UNPACKED_BY_SPARK = ("spark", "agent")
HEADER_LIMIT = 64 * 1024  # an HTTP answer's header larger than this is not the agent's


# --- the environment -----------------------------------------------------------------------


def environment_archive(env_dir: Path, packages: Sequence[str], quick: bool) -> tuple[Path, dict[str, Any]]:
    """The packed environment of ``packages`` (or the quick one: a probe package and
    padding, nothing downloaded), built unless ``env_dir`` holds it; and what it holds."""
    what = ["quick"] if quick else sorted(packages)
    tag = hashlib.sha256(json.dumps([sys.version, sys.base_prefix, *what]).encode()).hexdigest()[:12]
    archive, about = env_dir / f"env-{tag}.tar.gz", env_dir / f"env-{tag}.json"
    if archive.is_file() and about.is_file():
        info: dict[str, Any] = json.loads(about.read_text())
        return archive, {**info, "built_now": False}
    env_dir.mkdir(parents=True, exist_ok=True)
    venv = env_dir / f"build-{tag}"
    shutil.rmtree(venv, ignore_errors=True)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "--disable-pip-version-check"]
    if quick:
        from benchmarks.harness.spark import probe_wheel

        wheel = probe_wheel(env_dir)
        subprocess.run([*pip, "install", "--quiet", "--no-index", "--no-deps", str(wheel)], check=True, timeout=120)
        wheel.unlink()
        (site_packages(venv) / "padding.bin").write_bytes(os.urandom(QUICK_PADDING))
    else:
        install = [*pip, "install", "--quiet", "--only-binary=:all:", *packages]
        subprocess.run(install, check=True, timeout=1800)
    import venv_pack

    partial = env_dir / f"partial-{tag}.tar.gz"  # venv-pack picks the format by the name
    venv_pack.pack(prefix=str(venv), output=str(partial), force=True)
    installed = sorted(path.name.removesuffix(".dist-info") for path in site_packages(venv).glob("*.dist-info"))
    info = {
        "packages": what,
        "installed": installed,
        "archive_bytes": partial.stat().st_size,
        "unpacked_bytes": sum(p.stat().st_size for p in venv.rglob("*") if p.is_file() and not p.is_symlink()),
        "build_s": round(time.perf_counter() - started, 1),
    }
    shutil.rmtree(venv)
    about.write_text(json.dumps(info))
    partial.rename(archive)  # last: an archive without its description is built again
    return archive, {**info, "built_now": True}


def site_packages(venv: Path) -> Path:
    (found,) = venv.glob("lib/python*/site-packages")
    return found


def unpack_seconds(archive: Path, scratch: Path) -> tuple[float, float]:
    """Seconds for one unpack of ``archive`` the way Spark's executors do it on Unix
    (Hadoop's ``FileUtil.unTar``: ``gzip -dc | tar -xf -`` in a shell): to tar's exit, and
    with its dirty pages written out too (an executor does not wait for them, but the
    machine does that work while the application starts)."""
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    os.sync()
    started = time.perf_counter()
    command = f"gzip -dc '{archive}' | (cd '{scratch}' && tar -xf -)"
    subprocess.run(["bash", "-o", "pipefail", "-c", command], check=True, timeout=APP_TIMEOUT)
    unpacked = time.perf_counter() - started
    os.sync()
    synced = time.perf_counter() - started
    shutil.rmtree(scratch)
    return unpacked, synced


# --- Spark applications --------------------------------------------------------------------


@dataclass
class Bench:
    root: Path
    server: ServerThread
    archive: Path
    module: str  # what the first job's tasks import from the environment
    tasks: int
    master: str
    records: list[dict[str, Any]] = field(default_factory=list)

    def conf(self) -> dict[str, str]:
        return {"spark.blobsvc.server": self.server.address, "spark.blobsvc.cacheDir": str(self.root / "driver-cache")}


Row = tuple[str, str, str, float, float]


def first_job(spark: Any, module: str | None, tasks: int) -> list[Row]:
    """One row per task: its executor, its Python, where ``module`` came from, the seconds
    the import took (no import, for the baseline), and when the executor's unpacking of the
    environment ended (wall clock; 0 without one)."""

    def probe(_: Iterator[int]) -> Iterator[Row]:
        import importlib

        started = time.perf_counter()
        origin = str(importlib.import_module(module).__file__) if module else ""
        imported = time.perf_counter() - started
        # tar restores each directory's times once its members are out, so the latest
        # change among the tree's top entries is about when the unpacking ended.
        unpacked = 0.0
        if os.path.isdir(DEFAULT_ALIAS):
            unpacked = max(e.stat(follow_symlinks=False).st_ctime for e in os.scandir(DEFAULT_ALIAS))
        yield os.path.basename(os.getcwd()), sys.executable, origin, imported, unpacked

    rows: list[Row] = spark.sparkContext.parallelize(range(tasks), tasks).mapPartitions(probe).collect()
    return rows


def application(bench: Bench, variant: str, app: int, round_: int, agent: AgentProcess | None) -> dict[str, Any]:
    """One application of ``variant`` (baseline, spark, agent): the seconds from
    ``getOrCreate()`` to its first job's result, checked to have run where it should."""
    marks: dict[str, float] = {}

    def prepare(builder: Any) -> Any:
        builder = builder.master(bench.master)
        if variant == "spark":
            builder = builder.config("spark.archives", f"{bench.archive}#{DEFAULT_ALIAS}")
            builder = builder.config("spark.pyspark.python", PYTHON_IN_ENV)
            os.environ["PYSPARK_PYTHON"] = PYTHON_IN_ENV  # what a plain Python driver gives executors
        elif variant in THROUGH_AGENT:
            from blobsvc.spark import environment

            assert agent is not None
            started = time.perf_counter()
            builder = environment(builder, bench.archive, agent=agent.url, unpack=THROUGH_AGENT[variant])
            marks["environment"] = time.perf_counter() - started
        marks["start"], marks["wall"] = time.perf_counter(), time.time()
        return builder

    server = bench.server.server
    before = dict(server.requests)
    agent_before = agent_counts(agent)
    spark = start_session(bench.root / "work", bench.conf(), name=f"bench-{variant}-{app}", prepare=prepare)
    # A job that hangs (an executor that never comes) is cancelled, and the run fails.
    watchdog = threading.Timer(APP_TIMEOUT, spark.sparkContext.cancelAllJobs)
    watchdog.start()
    try:
        rows = first_job(spark, None if variant == "baseline" else bench.module, bench.tasks)
        seconds = time.perf_counter() - marks["start"]
    finally:
        watchdog.cancel()
        spark.stop()
        os.environ["PYSPARK_PYTHON"] = sys.executable
    for _, executable, origin, _, _ in rows:
        if variant == "baseline":
            ok = executable == sys.executable
        elif variant == "host":  # the agent's tree: <cache>/unpacked/<key>.env
            tree = f"{agent.cache_dir if agent else ''}/unpacked/"
            ok = executable.startswith(tree) and executable.endswith(".env/bin/python") and origin.startswith(tree)
        else:
            ok = executable.endswith(f"/{DEFAULT_ALIAS}/bin/python") and f"/{DEFAULT_ALIAS}/" in origin
        if not ok:
            raise BenchError(f"{variant} app {app}: a task ran {executable} with {bench.module} from {origin!r}")
    agent_after = agent_counts(agent)
    record = {
        "bench": "application",
        "variant": variant,
        "app": app,
        "round": round_,
        "seconds": round(seconds, 3),
        "load": round(os.getloadavg()[0], 2),  # others' work on the same two cores shows here
        "executors": sorted({row[0] for row in rows}),
        "import_s": round(max(row[3] for row in rows), 3),
        # From getOrCreate() to the end of the last executor's unpacking of the environment.
        "unpacked_s": round(max(row[4] for row in rows) - marks["wall"], 3) if variant in UNPACKED_BY_SPARK else None,
        "environment_s": round(marks["environment"], 3) if "environment" in marks else None,
        "server_puts": server.requests["PUT"] - before.get("PUT", 0),
        "server_gets": server.requests["GET"] - before.get("GET", 0),
        **{f"agent_{name}": agent_after[name] - agent_before[name] for name in agent_after},
    }
    bench.records.append(record)
    emit(record)
    # Not timed: the next application must not inherit this one's trees nor its dirty pages.
    shutil.rmtree(bench.root / "work", ignore_errors=True)
    os.sync()
    return record


AGENT_METRICS = {
    "bytes_fetched": "blobsvc_agent_bytes_fetched_total",  # from the server
    "bytes_served": "blobsvc_agent_bytes_served_total",  # to Spark's fetchers
    "hits": "blobsvc_agent_hits_total",
    "misses": "blobsvc_agent_misses_total",
    "unpacks": "blobsvc_agent_unpacks_total",  # environments the agent unpacked for the host
}


def agent_counts(agent: AgentProcess | None) -> dict[str, int]:
    if agent is None:
        return {}
    return {name: int(agent.metric(metric)) for name, metric in AGENT_METRICS.items()}


def spark_rounds(bench: Bench, rounds: int, quick: bool) -> list[float]:
    """Every application of every round; returns the seconds of each one-unpack reference.
    ``quick``: no warm-up and no closing baseline."""
    if not quick:  # starts the py4j gateway's JVM, which every later application reuses
        start_session(bench.root / "work", bench.conf(), name="bench-warm-up").stop()
        shutil.rmtree(bench.root / "work", ignore_errors=True)
    unpacks = []
    for round_ in range(rounds):
        unpacked, synced = unpack_seconds(bench.archive, bench.root / "unpack")
        unpacks.append(unpacked)
        emit({"bench": "unpack", "round": round_, "seconds": round(unpacked, 3), "synced_s": round(synced, 3)})
        application(bench, "baseline", 0, round_, None)
        cache = bench.root / f"agent-cache-{round_}"  # cold for each round's app 1
        agent = start_agent(bench.server.address, cache)
        try:
            order = VARIANTS[round_ % 3 :] + VARIANTS[: round_ % 3]
            for app in (1, 2):
                for variant in order:
                    application(bench, variant, app, round_, agent if variant in THROUGH_AGENT else None)
        finally:
            agent.kill()
            shutil.rmtree(cache, ignore_errors=True)
    if not quick:
        application(bench, "baseline", 0, rounds, None)
    return unpacks


# --- HTTP: the agent's face against sendfile -------------------------------------------------


def agent_get(agent: AgentProcess, path: str, view: memoryview) -> Timing:
    """Seconds for one GET of ``path`` from the agent into ``view``, from the request to the
    last byte, with this process's and the agent's CPU seconds."""
    agent_cpu = process_cpu_seconds(agent.process.pid)
    with connect(agent.port) as sock:
        watch = Stopwatch()
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        head = read_header(sock)
        header, _, early = head.partition(b"\r\n\r\n")
        status, *fields = header.decode("latin-1").split("\r\n")
        lengths = [f.split(":", 1)[1].strip() for f in fields if f.lower().startswith("content-length:")]
        if status.split()[1] != "200" or lengths != [str(len(view))]:
            raise BenchError(f"the agent answered {header!r}")
        view[: len(early)] = early
        recv_into_all(sock, view[len(early) :])
        return watch.stop(process_cpu_seconds(agent.process.pid) - agent_cpu)


def read_header(sock: socket.socket) -> bytes:
    """The answer's header and whatever part of the body came with it."""
    head = b""
    while b"\r\n\r\n" not in head:
        data = sock.recv(HEADER_LIMIT)
        if not data or len(head) > HEADER_LIMIT:
            raise BenchError(f"no answer's header in {head[:200]!r}")
        head += data
    return head


def http_throughput(root: Path, server: ServerThread, size: int, repeat: int) -> dict[str, Any]:
    """A blob of ``size`` bytes through the agent, cold once, then from its cache ``repeat``
    times, each beside the ``sendfile`` baseline of the same cached file."""
    source = root / "blob.bin"
    make_source(source, size)
    with BlobClient(server.address, timeout=600) as client:
        key = client.put(source)
    source.unlink()
    view = memoryview(bytearray(size))  # reused by every run, both ways: no page faults in the timing
    with run_agent(server.address, root / "http-cache", "--timeout", "600") as agent:
        path = f"/blobs/{key}"
        cold = Throughput("agent_http_cold", size, local_sends=False)
        measure(cold, functools.partial(agent_get, agent, path, view))
        emit(cold.record(server_gets=1))
        cached = root / "http-cache" / "content" / key  # the cache's layout: content/<key>
        if cached.stat().st_size != size:
            raise BenchError(f"{cached} is not the cached blob")
        served = Throughput("agent_http", size)
        sendfile = Throughput("baseline_sendfile", size)
        for _ in range(repeat):  # in turn, so that a busy moment of the machine hits both
            measure(served, functools.partial(agent_get, agent, path, view))
            receive = functools.partial(recv_into_all, view=view)
            measure(sendfile, functools.partial(baseline_transfer, "sendfile", cached, size, receive))
    agent_cpu = [cores * seconds for cores, seconds in zip(served.peer_cpu, served.seconds, strict=True)]
    median = {t.name: statistics.median(size / s / MB for s in t.seconds) for t in (served, sendfile)}
    ratio = median["agent_http"] / median["baseline_sendfile"]
    emit(sendfile.record())
    emit(served.record(baseline="baseline_sendfile", median_ratio=round(ratio, 3), target_ratio=TARGET_HTTP_RATIO))
    return {
        "blob_bytes": size,
        "agent_median_MB_s": round(median["agent_http"], 1),
        "sendfile_median_MB_s": round(median["baseline_sendfile"], 1),
        "median_ratio": round(ratio, 3),
        "agent_cpu_cores": round(statistics.median(served.peer_cpu), 2),
        "agent_cpu_s_per_GB": round(statistics.median(agent_cpu) * 1e9 / size, 3),
        "cold_MB_s": round(cold.best, 1),
    }


# --- the summary -----------------------------------------------------------------------------


def summarize(records: list[dict[str, Any]], unpacks: list[float], archive_bytes: int) -> dict[str, Any]:
    baseline = statistics.median(r["seconds"] for r in records if r["variant"] == "baseline")
    apps: dict[str, Any] = {"baseline_s": round(baseline, 3)}
    for variant in VARIANTS:
        for app in (1, 2):
            runs = [r for r in records if r["variant"] == variant and r["app"] == app]
            seconds = statistics.median(r["seconds"] for r in runs)
            apps[f"{variant}_app{app}"] = {
                "runs_s": [r["seconds"] for r in runs],
                "median_s": round(seconds, 3),
                "overhead_s": round(seconds - baseline, 3),
                "import_s": round(statistics.median(r["import_s"] for r in runs), 3),
            }
            if variant in UNPACKED_BY_SPARK:
                apps[f"{variant}_app{app}"]["unpacked_s"] = round(statistics.median(r["unpacked_s"] for r in runs), 3)
            if variant in THROUGH_AGENT:
                apps[f"{variant}_app{app}"] |= {
                    "server_bytes_sent": [r["agent_bytes_fetched"] for r in runs],
                    "server_gets": [r["server_gets"] for r in runs],
                    "agent_bytes_served": [r["agent_bytes_served"] for r in runs],
                    "agent_unpacks": [r["agent_unpacks"] for r in runs],
                }
    spark2 = apps["spark_app2"]["overhead_s"]
    for variant in THROUGH_AGENT:
        ratio = round(apps[f"{variant}_app2"]["overhead_s"] / spark2, 3) if spark2 > 0 else None
        apps[f"app2_overhead_{variant}_over_spark"] = ratio
    apps["archive_bytes"] = archive_bytes
    apps["one_unpack_s"] = round(statistics.median(unpacks), 3)
    return apps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-dir", type=Path, default=Path.home() / ".cache" / "blobsvc-bench" / "agent-env")
    parser.add_argument("--env-packages", default=DEFAULT_PACKAGES, help="What the environment holds (pip names).")
    parser.add_argument("--env-import", default="numpy", help="The module the first job's tasks import.")
    parser.add_argument("--rounds", type=int, default=3, help="Rounds of the six applications.")
    parser.add_argument("--tasks", type=int, default=2, help="Tasks of the first job.")
    parser.add_argument("--blob-mib", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=5, help="Runs of each HTTP measurement.")
    parser.add_argument("--quick", action="store_true", help="A smoke run: tiny environment, small blob, one round.")
    parser.add_argument("--tmp-dir", default=None, help="Where the server's data, caches and work go.")
    parser.add_argument("--keep", action="store_true", help="Leave the working directory.")
    args = parser.parse_args(argv)
    master = MASTER
    if args.quick:  # one executor: the smoke test starts seven applications
        args.rounds, args.blob_mib, args.repeat, args.env_import = 1, 8, 2, "blobsvc_envprobe"
        master, args.tasks = "local-cluster[1,1,1024]", 1
    packages = args.env_packages.split()
    archive, env_info = environment_archive(args.env_dir, packages, args.quick)
    if not args.quick and env_info["archive_bytes"] < MIN_ENV_BYTES:
        parser.error(f"{args.env_packages!r} packs into {env_info['archive_bytes']} bytes, under {MIN_ENV_BYTES}")
    work = Path(tempfile.mkdtemp(prefix="blobsvc-bench-agent-", dir=choose_tmp_parent(args.tmp_dir)))
    emit(
        {
            "bench": "setup",
            **machine(),
            "master": master,
            "spark": spark_version(),
            "filesystem": filesystem_of(work)[1],
            "archive": str(archive),
            **env_info,
            "rounds": args.rounds,
            "tasks": args.tasks,
            "import": args.env_import,
            "quick": args.quick,
        }
    )
    server = ServerThread(
        Settings(host="127.0.0.1", port="0", data_dir=work / "server", max_blob_size=1 << 40, log_level="warning")
    ).start()
    try:
        bench = Bench(work, server, archive, args.env_import, args.tasks, master)
        unpacks = spark_rounds(bench, args.rounds, args.quick)
        http = http_throughput(work, server, args.blob_mib * MiB, args.repeat)
    finally:
        server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    summary = {**summarize(bench.records, unpacks, env_info["archive_bytes"]), "http": http}
    ratio = summary["app2_overhead_host_over_spark"]
    targets = {
        "app2_overhead_at_most_a_tenth_of_spark": ratio is not None and ratio <= TARGET_OVERHEAD_RATIO,
        "agent_http_at_least_0.8_of_sendfile": http["median_ratio"] >= TARGET_HTTP_RATIO,
    }
    emit({"summary": summary, "targets_met": targets})
    return 0


def spark_version() -> str:
    import pyspark

    return f"{pyspark.__version__} (Python {platform.python_version()})"


if __name__ == "__main__":
    sys.exit(main())
