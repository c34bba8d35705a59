"""Where a handle's artifacts become local paths: the host's BlobCache, from any process.

One :class:`~blobsvc.cache.BlobCache` per process and cache directory, shared by every
handle that names it, so each artifact is downloaded once per host whatever the number of
executors, Python workers and tasks.

**Who holds a job, and until when.** A job's files are pinned on a host while some process
holds a reference (a lease) on it, and deleted ``cleanup_interval`` after the last one goes:

* A *task* takes a lease the first time it resolves one of the job's artifacts, and gives it
  back when the task ends. Python workers are reused across tasks, so the worker's lifetime
  is the wrong measure: a thread in each worker (the keeper) looks twice a second at the
  task the worker runs (PySpark resets its ``TaskContext`` as each task ends) and releases
  the leases of tasks that have finished.
* A worker that is killed (its task cancelled, an executor lost, the OOM killer) holds
  nothing from the moment it dies: the cache counts only leases whose process, by pid and
  start time, is alive.
* The *driver* holds one lease per handle it resolved paths of, until the handle is released.
"""

from __future__ import annotations

import importlib
import sys
import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path

from ..cache import BlobCache
from ..cache._archives import archive_kind, prune, unpack
from ..config import Settings
from ..wire._tls import client_context_for
from ._artifacts import Artifact, Kind

__all__ = ["CacheOptions", "current_task", "hold", "release_driver", "resolve", "add_py_files"]

# How often a worker's keeper looks whether the task holding leases has ended.
KEEPER_INTERVAL = 0.5
DRIVER = "driver"


@dataclass(frozen=True, slots=True)
class CacheOptions:
    """How a process reaches the server and finds its host's cache: the server's address and
    the blobsvc settings the driver's Spark conf set (``(field, value)`` pairs, values as
    written there: file *paths* for the secret and TLS material, never their contents). What
    the conf left unset comes from each process's own ``BLOBSVC_*`` environment, then the
    defaults."""

    server: str
    conf: tuple[tuple[str, str], ...] = ()

    def settings(self) -> Settings:
        return Settings.load(dict(self.conf))

    def open(self) -> BlobCache:
        settings = self.settings()
        return BlobCache(
            self.server,
            settings.cache_dir,
            max_bytes=settings.cache_max_bytes,
            cleanup_interval=settings.cleanup_interval,
            secret=settings.secret(),
            tls=client_context_for(settings),
            timeout=settings.timeout,
            connect_timeout=settings.connect_timeout,
            retries=settings.retries,
            store_reads=settings.store_reads,
        )


_lock = threading.Lock()
_caches: dict[CacheOptions, BlobCache] = {}
# (cache options, job) -> who holds its lease in this process: a task attempt id, or DRIVER.
_held: dict[tuple[CacheOptions, str], Hashable] = {}
_keeper: threading.Thread | None = None


def current_task() -> int | None:
    """The attempt id of the Spark task this process runs now; None outside a task."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return None if context is None else context.taskAttemptId()


def _cache(options: CacheOptions) -> BlobCache:
    with _lock:
        cache = _caches.get(options)
        if cache is None:
            cache = _caches[options] = options.open()
        return cache


def hold(options: CacheOptions, job: str) -> BlobCache:
    """The cache, with ``job`` registered for the current task (or the driver) until it ends."""
    global _keeper
    cache = _cache(options)
    task = current_task()
    holder: Hashable = DRIVER if task is None else task
    with _lock:
        if _held.get((options, job)) == holder:
            return cache
        previous = _held.pop((options, job), None)
    if previous is not None:  # a finished task's lease the keeper has not dropped yet
        cache.release_job(job)
    cache.register_job(job)
    with _lock:
        _held[(options, job)] = holder
        if task is not None and (_keeper is None or not _keeper.is_alive()):
            _keeper = threading.Thread(target=_keep, name="blobsvc-spark-leases", daemon=True)
            _keeper.start()
    return cache


def _release_finished() -> None:
    """Release the leases of tasks other than the one running now."""
    with _lock:
        # Read under the lock: a task's lease is recorded (under it) only after its context
        # is set, so a lease seen here belongs to the task seen here or to an earlier one.
        keep = (DRIVER, current_task())
        done = [entry for entry, holder in _held.items() if holder not in keep]
        for entry in done:
            del _held[entry]
    for options, job in done:
        _caches[options].release_job(job)


def _keep() -> None:
    """Release the leases of tasks that have ended; runs in each Python worker."""
    while True:
        time.sleep(KEEPER_INTERVAL)
        _release_finished()


def release_driver(options: CacheOptions, job: str) -> None:
    """Drop the driver's lease on ``job`` (if it took one)."""
    with _lock:
        held = _held.get((options, job)) == DRIVER
        if held:
            del _held[(options, job)]
    if held:
        _caches[options].release_job(job)


def resolve(options: CacheOptions, job: str, artifact: Artifact) -> Path:
    """The local path of one artifact: the verified file, or an archive's unpacked directory."""
    cache = hold(options, job)
    path = cache.path(job, artifact.name)
    if artifact.kind is Kind.ARCHIVE:
        trees = cache.store.unpacked_dir
        if not (trees / artifact.key).is_dir():
            prune(trees, cache.store.content_dir)
        kind = archive_kind(artifact.filename)
        return unpack(trees, artifact.key, path, kind, max_bytes=cache.max_bytes, store=cache.store)
    return path


def add_py_files(options: CacheOptions, job: str, artifacts: list[Artifact]) -> None:
    """Put the job's py_files on ``sys.path``: a ``.py`` file's directory, a zip or wheel
    itself (imported with zipimport, as ``addPyFile`` does)."""
    added = False
    for artifact in artifacts:
        path = resolve(options, job, artifact)
        entry = str(path.parent if artifact.name.endswith(".py") else path)
        if entry not in sys.path:
            sys.path.insert(1, entry)
            added = True
    if added:
        importlib.invalidate_caches()
