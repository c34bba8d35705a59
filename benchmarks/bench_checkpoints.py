"""Checkpoints: tasks' state checkpointed through blobsvc, against copying it by hand.

Run from the repository root (needs ZooKeeper, ``scripts/zookeeper install``, and moto's S3
server, ``moto[server]``, from the test extra)::

    .venv/bin/python -m benchmarks.bench_checkpoints            # 8 tasks x 64 MiB in 16 files, 5 checkpoints
    .venv/bin/python -m benchmarks.bench_checkpoints --quick    # a smoke test: 2 tasks x 4 MiB, 3 checkpoints

Each task's state is a directory of files of random bytes; before each checkpoint after the
first, ``--changed`` of all the files (10%, chosen at random) are rewritten. ``--tasks``
processes (one per task, as executors would be) take every checkpoint six ways, one after the
other on the same state, the order turning from checkpoint to checkpoint:

* ``standalone``: each task snapshots its directory (``CheckpointStore.snapshot``) against a
  standalone ``blobsvc serve``; the driver acknowledges the handles and completes it;
* ``zookeeper``: the same against a zookeeper-mode leader (a real ZooKeeper from
  ``scripts/zookeeper``, its HA store a directory, which the tasks write new files into);
* ``zookeeper-s3``: the same against a second zookeeper-mode leader whose HA store is the S3
  bucket: the tasks write their new files into the bucket themselves (store writes), the
  server gets names;
* ``directory``: each task copies its whole directory through fsspec to a shared directory
  (``checkpoint-<n>/task-<i>``), the driver writes a ``_COMPLETED`` marker and removes the
  previous checkpoint: what pipelines do by hand today;
* ``s3``: the same to moto's S3 server on 127.0.0.1, through s3fs;
* ``s3-changed``: each task puts only the files changed since the last checkpoint (all of them
  the first time) to the bucket through s3fs, nothing else: the floor for a checkpoint to S3.

Between two ways, ``os.sync()`` (outside every clock) writes back what the last one left in
the page cache: the copies by hand do not fsync, and their dirty pages would otherwise slow the
next way's fsyncs. Per way and checkpoint: the seconds from trigger to completed, the bytes
changed since the last checkpoint, the bytes the tasks sent (by the handles, and the server's
``blobsvc_received_bytes`` on its /metrics), and for blobsvc the completion latency: from the
last acknowledgement to ``complete()`` returning, which the server answers once the record is
durable (visible to every ``latest()`` from then on) and the oldest checkpoint subsumed; the
state nothing references is discarded after the answer. Then one task's state
is restored from the latest standalone checkpoint, against ``get_file`` of the same files (9
times each, taking turns to go first; medians).

Then, against the standalone server, one task's ``--incremental-mib`` (1 GiB) in
``--incremental-files`` (64) files, written long enough before (``RACY_SECONDS``) for their
stamps to count, as a running pipeline's state is: its first full checkpoint, then one after
``--incremental-changed`` (1%, at least one file) of the files were rewritten, then the same
again with ``stamps=False`` (every file read and hashed, as before the stamp memory).

One JSON object per line, then ``{"summary": ...}`` with the ratios the goals are stated in.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import random
import re
import secrets
import shutil
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec

from benchmarks._serve import serve
from benchmarks.harness.s3 import MotoServer
from benchmarks.harness.zk import ZooKeeper
from blobsvc import BlobClient
from blobsvc.bench._measure import emit, machine
from blobsvc.checkpoints import CheckpointStore, TaskHandle
from blobsvc.files._stamps import RACY_SECONDS
from blobsvc.wire._checkpoints import pipeline_job, state_name

WAYS = ("standalone", "zookeeper", "zookeeper-s3", "directory", "s3", "s3-changed")
START_TIMEOUT = 60.0  # a JVM or moto starting on a loaded 2-core machine
PIPELINE = "bench"


# --- the tasks (each in a process of the pool) -----------------------------------------------


def snapshot_task(address: str, task: int, state: str) -> dict[str, Any]:
    with CheckpointStore(address, PIPELINE) as store:
        return store.snapshot(str(task), state).to_json()


def copy_task(url: str, task: int, state: str) -> None:
    """Copy the task's directory whole to ``url/task-<i>`` through fsspec."""
    filesystem, root = fsspec.core.url_to_fs(url)
    filesystem.put(f"{state}/", f"{root}/task-{task}", recursive=True)


def put_task(url: str, task: int, paths: list[str]) -> None:
    """Put the files ``paths`` of the task's state to ``url/task-<i>/`` through fsspec."""
    if not paths:  # this task's files all stayed as they were
        return
    filesystem, root = fsspec.core.url_to_fs(url)
    filesystem.put(paths, f"{root}/task-{task}/")


# --- where checkpoints go ----------------------------------------------------------------------


def wait_until(what: str, ready: Any) -> Any:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        with contextlib.suppress(OSError, KeyError):
            answer = ready()
            if answer:
                return answer
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready after {START_TIMEOUT:g} s")
        time.sleep(0.2)


@contextlib.contextmanager
def moto_s3() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1, this process's (and children's) AWS settings pointing at
    it for the block; yields a fresh bucket's name. Killed by PID."""
    moto = MotoServer().start()
    try:
        with moto.export():
            bucket = f"bench-{secrets.token_hex(4)}"
            fsspec.filesystem("s3", skip_instance_cache=True).mkdir(bucket)
            yield bucket
    finally:
        moto.stop()


@contextlib.contextmanager
def zookeeper(directory: Path) -> Iterator[str]:
    """A standalone ZooKeeper from ``scripts/zookeeper``; yields its HOST:PORT."""
    running = ZooKeeper(directory).start()
    try:
        yield running.hosts
    finally:
        running.stop()


def serve_leader(hosts: str, ha_dir: str, cluster: str, data_dir: Path) -> contextlib.AbstractContextManager[str]:
    """A zookeeper-mode server of its own cluster, with its HA store at ``ha_dir``."""
    options = ("--recovery-mode", "zookeeper", "--zookeeper", hosts, "--ha-dir", ha_dir, "--cluster-id", cluster)
    return serve("--metrics-port", "0", *options, data_dir=data_dir)


class Server:
    """A blob server's address and its received-bytes counter (on its /metrics)."""

    def __init__(self, address: str) -> None:
        self.address = address
        with BlobClient(address, timeout=30) as client:
            self.metrics = f"http://{client.status()['metrics_address']}/metrics"

    def received(self) -> int:
        with urllib.request.urlopen(self.metrics, timeout=30) as reply:
            match = re.search(r"^blobsvc_received_bytes_total (\S+)$", reply.read().decode(), re.M)
        if match is None:
            raise RuntimeError("no blobsvc_received_bytes_total in the server's metrics")
        return int(float(match.group(1)))


def leading(address: str) -> bool:
    with BlobClient(address, timeout=5) as client:
        return client.status().get("role") == "leader"


# --- the state and its changes -----------------------------------------------------------------


def make_state(root: Path, tasks: int, files: int, size: int) -> list[Path]:
    dirs = []
    for task in range(tasks):
        directory = root / f"task-{task}"
        directory.mkdir(parents=True)
        for index in range(files):
            (directory / f"{index:04d}.sst").write_bytes(os.urandom(size))
        dirs.append(directory)
    return dirs


def change_state(dirs: list[Path], files: int, fraction: float, rng: random.Random) -> tuple[int, list[list[str]]]:
    """Rewrite ``fraction`` of all the files with new bytes; the bytes changed, and each
    task's files that changed."""
    every = [(task, index) for task in range(len(dirs)) for index in range(files)]
    changed = 0
    paths: list[list[str]] = [[] for _ in dirs]
    for task, index in rng.sample(every, max(1, round(fraction * len(every)))):
        path = dirs[task] / f"{index:04d}.sst"
        size = path.stat().st_size
        path.write_bytes(os.urandom(size))
        changed += size
        paths[task].append(str(path))
    return changed, paths


# --- one checkpoint, each way ------------------------------------------------------------------


def blobsvc_checkpoint(
    pool: Any, store: CheckpointStore, server: Server, dirs: list[Path], number: int
) -> dict[str, Any]:
    received = server.received()
    started = time.perf_counter()
    pending = store.begin([str(task) for task in range(len(dirs))], {"checkpoint": number})
    args = [(server.address, task, str(d)) for task, d in enumerate(dirs)]
    handles = [TaskHandle.from_json(h) for h in pool.starmap(snapshot_task, args)]
    for handle in handles:
        pending.acknowledge(handle.task, handle)
    acked = time.perf_counter()
    completed = pending.complete()
    ended = time.perf_counter()
    latest = store.latest()
    if latest is None or latest.id != completed.id:
        raise RuntimeError(f"checkpoint {completed.id} completed but is not the latest")
    return {
        "seconds": ended - started,
        "completion_ms": round((ended - acked) * 1000, 2),
        "sent_bytes": sum(handle.bytes_sent for handle in handles),
        "received_bytes": server.received() - received,
        "state_bytes": completed.size,
    }


def copy_checkpoint(pool: Any, base: str, dirs: list[Path], number: int) -> dict[str, Any]:
    filesystem, root = fsspec.core.url_to_fs(base)
    started = time.perf_counter()
    url = f"{base}/checkpoint-{number}"
    pool.starmap(copy_task, [(url, task, str(d)) for task, d in enumerate(dirs)])
    filesystem.pipe_file(f"{root}/checkpoint-{number}/_COMPLETED", b"")
    if number > 0:
        filesystem.rm(f"{root}/checkpoint-{number - 1}", recursive=True)
    ended = time.perf_counter()
    state = sum(p.stat().st_size for d in dirs for p in d.iterdir())
    return {"seconds": ended - started, "sent_bytes": state, "state_bytes": state}


def put_changed_checkpoint(pool: Any, base: str, changed: list[list[str]], number: int) -> dict[str, Any]:
    started = time.perf_counter()
    pool.starmap(put_task, [(f"{base}/checkpoint-{number}", task, paths) for task, paths in enumerate(changed)])
    ended = time.perf_counter()
    sent = sum(Path(path).stat().st_size for paths in changed for path in paths)
    return {"seconds": ended - started, "sent_bytes": sent, "state_bytes": sent}


def restore_rates(store: CheckpointStore, server: str, work: Path, rounds: int) -> dict[str, Any]:
    """Task 0's state restored from the latest checkpoint, against ``get_file`` of its files
    one after the other (what the restore does, less the checks, the hold and the renames)."""
    latest = store.latest()
    assert latest is not None
    handle = latest.tasks["0"]
    job = pipeline_job(PIPELINE)
    restores, gets = [], []
    dest = work / "restored"

    def restore() -> None:
        started = time.perf_counter()
        latest.restore("0", dest)
        restores.append(time.perf_counter() - started)
        shutil.rmtree(dest)

    def get_files(client: BlobClient) -> None:
        dest.mkdir()
        started = time.perf_counter()
        for entry in handle.files:
            client.get_file(dest / entry.path, job=job, name=state_name(bytes.fromhex(entry.key)))
        gets.append(time.perf_counter() - started)
        shutil.rmtree(dest)

    with BlobClient(server, timeout=60) as client:
        for round_ in range(rounds):  # each first in turn: drift hits both alike
            if round_ % 2:
                get_files(client)
                restore()
            else:
                restore()
                get_files(client)
    restore_s, get_s = statistics.median(restores), statistics.median(gets)
    return {
        "bench": "restore",
        "bytes": handle.size,
        "files": len(handle.files),
        "restore_MB_s": round(handle.size / restore_s / 1e6, 1),
        "get_file_MB_s": round(handle.size / get_s / 1e6, 1),
        "ratio": round(get_s / restore_s, 3),
        "loadavg": round(os.getloadavg()[0], 2),
    }


def incremental_rates(server: Server, work: Path, total: int, files: int, changed: float) -> dict[str, Any]:
    """One task's state checkpointed whole, then with ``changed`` of its files rewritten
    (with the stamp memory, and without it)."""
    rng = random.Random(32)
    dirs = make_state(work / "incremental", 1, files, total // files)
    time.sleep(RACY_SECONDS + 0.5)  # a pipeline's state was written before its checkpoint

    def checkpoint(store: CheckpointStore, stamps: bool) -> tuple[float, int]:
        received = server.received()
        started = time.perf_counter()
        with store.begin(["0"]) as pending:
            pending.acknowledge("0", store.snapshot("0", dirs[0], stamps=stamps))
        return time.perf_counter() - started, server.received() - received

    with CheckpointStore(server.address, f"{PIPELINE}-incremental") as store:
        full_s, full_received = checkpoint(store, True)
        os.sync()
        changed_bytes, _ = change_state(dirs, files, changed, rng)
        incremental_s, incremental_received = checkpoint(store, True)
        os.sync()
        change_state(dirs, files, changed, rng)
        unstamped_s, _ = checkpoint(store, False)
    return {
        "bench": "incremental",
        "state_bytes": total,
        "files": files,
        "changed_bytes": changed_bytes,
        "full_seconds": round(full_s, 3),
        "full_received_bytes": full_received,
        "incremental_seconds": round(incremental_s, 3),
        "incremental_received_bytes": incremental_received,
        "unstamped_incremental_seconds": round(unstamped_s, 3),
        "ratio": round(incremental_s / full_s, 4),
        "loadavg": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke test: 2 tasks x 4 files x 1 MiB, 3 checkpoints")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--files", type=int, default=16, help="files per task")
    parser.add_argument("--file-mib", type=int, default=4)
    parser.add_argument("--checkpoints", type=int, default=5)
    parser.add_argument("--changed", type=float, default=0.1, help="fraction of the files changed per checkpoint")
    parser.add_argument(
        "--incremental-mib", type=int, default=1024, help="one task's state, for incremental against full"
    )
    parser.add_argument("--incremental-files", type=int, default=64)
    parser.add_argument("--incremental-changed", type=float, default=0.01)
    parser.add_argument("--tmp-dir", help="where the state, the servers' data, ZooKeeper and the copies go")
    args = parser.parse_args()
    if args.quick:
        tasks, files, size, checkpoints, changed = 2, 4, 1 << 20, 3, 0.25
        args.incremental_mib, args.incremental_files = 16, 16
    else:
        tasks, files, size = args.tasks, args.files, args.file_mib << 20
        checkpoints, changed = args.checkpoints, args.changed
    emit(
        {
            "bench": "setup",
            "tasks": tasks,
            "files": files,
            "file_size": size,
            "checkpoints": checkpoints,
            "changed": changed,
            **machine(),
        }
    )
    rng = random.Random(25)
    records: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-checkpoints-", dir=args.tmp_dir)))
        bucket = stack.enter_context(moto_s3())  # exported before the pool starts: s3fs reads it
        hosts = stack.enter_context(zookeeper(work / "zookeeper"))
        servers = {
            "standalone": Server(stack.enter_context(serve("--metrics-port", "0", data_dir=work / "data"))),
            "zookeeper": Server(stack.enter_context(serve_leader(hosts, str(work / "ha"), "bench", work / "data-zk"))),
            "zookeeper-s3": Server(
                stack.enter_context(serve_leader(hosts, f"s3://{bucket}/ha", "bench-s3", work / "data-zk-s3"))
            ),
        }
        for way in ("zookeeper", "zookeeper-s3"):
            wait_until(f"the {way} leader", lambda way=way: leading(servers[way].address))
        stores = {way: stack.enter_context(CheckpointStore(s.address, PIPELINE)) for way, s in servers.items()}
        copies = {"directory": f"file://{work / 'shared'}", "s3": f"s3://{bucket}/{PIPELINE}"}
        changed_puts = f"s3://{bucket}/{PIPELINE}-changed"
        (work / "shared").mkdir()
        dirs = make_state(work / "state", tasks, files, size)
        pool = stack.enter_context(multiprocessing.get_context("forkserver").Pool(tasks))
        for number in range(checkpoints):
            if number == 0:
                changed_bytes, changed_paths = (
                    tasks * files * size,
                    [[str(p) for p in sorted(d.iterdir())] for d in dirs],
                )
            else:
                changed_bytes, changed_paths = change_state(dirs, files, changed, rng)
            turn = number % len(WAYS)
            for way in WAYS[turn:] + WAYS[:turn]:
                if way in stores:
                    result = blobsvc_checkpoint(pool, stores[way], servers[way], dirs, number)
                elif way == "s3-changed":
                    result = put_changed_checkpoint(pool, changed_puts, changed_paths, number)
                else:
                    result = copy_checkpoint(pool, copies[way], dirs, number)
                record = {
                    "bench": "checkpoint",
                    "way": way,
                    "checkpoint": number,
                    "changed_bytes": changed_bytes,
                    **result,
                    "seconds": round(result["seconds"], 3),
                    "loadavg": round(os.getloadavg()[0], 2),
                }
                emit(record)
                records.append(record)
                os.sync()  # a way's dirty pages must not slow the next one's fsyncs
        restore = restore_rates(stores["standalone"], servers["standalone"].address, work, 3 if args.quick else 9)
        emit(restore)
        incremental = incremental_rates(
            servers["standalone"], work, args.incremental_mib << 20, args.incremental_files, args.incremental_changed
        )
        emit(incremental)
    emit({"summary": summarize(records, restore, incremental)})


def summarize(records: list[dict[str, Any]], restore: dict[str, Any], one_task: dict[str, Any]) -> dict[str, Any]:
    """Medians over the incremental checkpoints (every one but the first), and the goals' ratios."""

    def median(way: str, field: str) -> float:
        return float(statistics.median(r[field] for r in records if r["way"] == way and r["checkpoint"] > 0))

    incremental = [r for r in records if r["way"] == "standalone" and r["checkpoint"] > 0]
    summary: dict[str, Any] = {f"{way}_seconds": median(way, "seconds") for way in WAYS}
    summary["sent_over_changed"] = round(max(r["sent_bytes"] / r["changed_bytes"] for r in incremental), 3)
    summary["received_over_changed"] = round(max(r["received_bytes"] / r["changed_bytes"] for r in incremental), 3)
    summary["time_over_directory_copy"] = round(summary["standalone_seconds"] / summary["directory_seconds"], 3)
    summary["time_over_s3_copy"] = round(summary["standalone_seconds"] / summary["s3_seconds"], 3)
    summary["standalone_completion_ms"] = median("standalone", "completion_ms")
    summary["zookeeper_completion_ms"] = median("zookeeper", "completion_ms")
    summary["restore_over_get_file"] = restore["ratio"]
    summary["incremental_over_full"] = one_task["ratio"]
    summary["zookeeper_over_standalone"] = round(summary["zookeeper_seconds"] / summary["standalone_seconds"], 3)
    summary["zookeeper_s3_received_bytes"] = median("zookeeper-s3", "received_bytes")
    summary["zookeeper_s3_over_changed_put"] = round(summary["zookeeper-s3_seconds"] / summary["s3-changed_seconds"], 3)
    summary["goals_met"] = {
        "sent_over_changed<=1.1": summary["received_over_changed"] <= 1.1,
        "time_over_directory_copy<=0.25": summary["time_over_directory_copy"] <= 0.25,
        "standalone_completion_ms<=20": summary["standalone_completion_ms"] <= 20,
        "zookeeper_completion_ms<=100": summary["zookeeper_completion_ms"] <= 100,
        "restore_over_get_file>=0.8": restore["ratio"] >= 0.8,
        "incremental_over_full<=0.1": one_task["ratio"] <= 0.1,
        "zookeeper_over_standalone<=1.2": summary["zookeeper_over_standalone"] <= 1.2,
        "zookeeper_s3_received_bytes<1MiB": summary["zookeeper_s3_received_bytes"] < 1 << 20,
        "zookeeper_s3_over_changed_put<=1.2": summary["zookeeper_s3_over_changed_put"] <= 1.2,
    }
    return summary


if __name__ == "__main__":
    main()
