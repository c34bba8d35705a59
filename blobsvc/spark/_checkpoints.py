"""Checkpoints through Spark: the driver begins and completes them, each task restores and
snapshots its own partition's state and returns its handle to the driver.

```python
ckpt = checkpoints(spark, "clicks", retain=2)   # the pipeline's store, from the Spark conf
latest = ckpt.latest()                          # None, or where a restarted driver resumes
tasks = ckpt.tasks(latest)                      # picklable: what tasks restore from

def step(partition, rows):
    state = tasks.restore(partition, workdir)   # that partition's state at `latest` (or None)
    ...                                         # update it with the batch's rows
    yield tasks.snapshot(partition, state)      # a TaskHandle, to the driver

with ckpt.begin(partitions=8, properties={"batch": 3}) as pending:
    for handle in rdd.mapPartitionsWithIndex(step).collect():
        pending.acknowledge(handle.task, handle)
```

A partition's task is named by its index (``"0"``, ``"1"``...). The driver's side is a
:class:`~blobsvc.checkpoints.CheckpointStore` (its first ``begin`` takes the pipeline over from
any older driver). The task's side, :class:`TaskCheckpoints`, carries what ``publish``'s handle
carries (the server's address and the conf's blobsvc settings, never a secret's bytes) and the
checkpoint to restore from; in a task it reaches the server with the executor's own settings
and restores through the host's :class:`~blobsvc.cache.BlobCache`: each state file fetched
once per host, verified, and kept there while the task runs.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from .._exceptions import CheckpointError
from ..checkpoints import CheckpointStore, CompletedCheckpoint, PendingCheckpoint, TaskHandle
from ..checkpoints._completed import DEFAULT_HOLD_SECONDS
from ..checkpoints._snapshot import StateSource
from ..client import BlobClient
from ..config import Settings
from ..wire._checkpoints import check_pipeline, pipeline_job
from ._local import CacheOptions, hold
from ._publish import spark_settings

__all__ = ["SparkCheckpoints", "TaskCheckpoints", "checkpoints"]


def checkpoints(
    spark: Any,
    pipeline: str,
    retain: int | None = 1,
    *,
    score: str | None = None,
    score_order: str = "max",
    server: str | None = None,
    timeout: float = 600.0,
    min_pause: float = 0.0,
    tolerable_failures: int | None = None,
    hold_seconds: float = DEFAULT_HOLD_SECONDS,
) -> SparkCheckpoints:
    """The checkpoints of ``pipeline`` on the server ``spark``'s conf names
    (``spark.blobsvc.server``, ``spark.blobsvc.secretFile``, TLS, ``spark.blobsvc.cacheDir``:
    the keys ``publish`` reads). The options are :class:`~blobsvc.checkpoints.CheckpointStore`'s."""
    settings, options = spark_settings(spark, server=server)
    client = BlobClient.from_settings(settings)
    store = CheckpointStore(
        client,
        pipeline,
        retain,
        score=score,
        score_order=score_order,
        timeout=timeout,
        min_pause=min_pause,
        tolerable_failures=tolerable_failures,
        hold_seconds=hold_seconds,
    )
    return SparkCheckpoints(store, options)


class SparkCheckpoints:
    """A pipeline's checkpoints on the driver: :meth:`latest`, :meth:`begin`, and
    :meth:`tasks` for its tasks. ``store`` is the whole
    :class:`~blobsvc.checkpoints.CheckpointStore` (``list``, ``get``, ``delete``...)."""

    def __init__(self, store: CheckpointStore, options: CacheOptions) -> None:
        self.store = store
        self.options = options

    @property
    def pipeline(self) -> str:
        return self.store.pipeline

    def latest(self) -> CompletedCheckpoint | None:
        """The newest completed checkpoint that can be restored, or None."""
        return self.store.latest()

    def begin(
        self,
        partitions: int,
        properties: dict[str, Any] | None = None,
        *,
        savepoint: bool = False,
        timeout: float | None = None,
    ) -> PendingCheckpoint:
        """Trigger a checkpoint awaiting the tasks of ``partitions`` partitions, ``"0"`` to
        ``str(partitions - 1)``; use it as ``with``, as ``CheckpointStore.begin``'s, and run
        the job that snapshots inside the block."""
        tasks = [str(p) for p in range(partitions)]
        return self.store.begin(tasks, properties, savepoint=savepoint, timeout=timeout)

    def tasks(
        self, restore_from: CompletedCheckpoint | None = None, *, partitions: int | None = None
    ) -> TaskCheckpoints:
        """What tasks use to snapshot their state and to restore it from ``restore_from``
        (None: nothing to restore, :meth:`TaskCheckpoints.restore` returns None). With
        ``partitions``, a checkpoint whose tasks are not this job's partitions is refused here,
        before any task runs (:class:`CheckpointError`, saying how to go on)."""
        if restore_from is not None and partitions is not None:
            wanted = {str(p) for p in range(partitions)}
            if set(restore_from.tasks) != wanted:
                raise CheckpointError(
                    f"checkpoint {restore_from.id} of {self.pipeline} has {len(restore_from.tasks)} tasks, not this "
                    f"job's {partitions} partitions: use another pipeline name, or restore_all(dir) and re-partition"
                )
        source = None if restore_from is None else (restore_from.id, restore_from.metadata_key)
        return TaskCheckpoints(self.options, self.pipeline, source, self.store.options.hold_seconds)

    def close(self) -> None:
        """Abort the checkpoints still pending and close the client."""
        self.store.close()
        self.store.client.close()

    def __enter__(self) -> SparkCheckpoints:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


@dataclass(frozen=True)
class TaskCheckpoints:
    """A task's side of a pipeline's checkpoints: small and picklable (no secret, no
    connection); in each process it opens one client and the host's cache, shared by tasks."""

    options: CacheOptions
    pipeline: str
    restore_from: tuple[int, str] | None
    """The checkpoint :meth:`restore` reads: its id and its metadata blob's key."""
    hold_seconds: float = DEFAULT_HOLD_SECONDS

    def __post_init__(self) -> None:
        check_pipeline(self.pipeline)

    def snapshot(self, task: int | str, source: StateSource, *, immutable: Sequence[str] = ()) -> TaskHandle:
        """Store ``task``'s state (a directory, a file, or bytes; files unchanged since an
        earlier checkpoint are neither read, known by the stamps remembered beside the state,
        nor sent) and return the handle for the driver to acknowledge. Files whose names match
        a pattern of ``immutable`` (``"*.sst"``) never change once written."""
        store_writes = _settings(self.options).store_writes  # spark.blobsvc.storeWrites
        return self._store(cached=False).snapshot(str(task), source, immutable=immutable, store_writes=store_writes)

    def restore(self, task: int | str, dest: str | os.PathLike[str], *, writable: bool = False) -> Path | None:
        """Write ``task``'s state at ``restore_from`` at ``dest`` (which must not exist, or be
        an empty directory), through the host's cache, every byte verified; None when there
        is no checkpoint to restore from."""
        if self.restore_from is None:
            return None
        checkpoint_id, metadata_key = self.restore_from
        checkpoint = self._store(cached=True).load({"id": checkpoint_id, "metadata": metadata_key})
        return checkpoint.restore(str(task), dest, writable=writable)

    def _store(self, *, cached: bool) -> CheckpointStore:
        """This process's store of the pipeline; with ``cached``, the pipeline's files in the
        host's cache are held for the running task."""
        cache = hold(self.options, pipeline_job(self.pipeline).hex()) if cached else None
        client = _client(self.options)
        return CheckpointStore(client, self.pipeline, hold_seconds=self.hold_seconds, cache=cache)


_lock = threading.Lock()
_clients: dict[CacheOptions, BlobClient] = {}


def _settings(options: CacheOptions) -> Settings:
    """The executor's settings under the driver's conf."""
    return Settings.load({**dict(options.conf), "server": options.server})


def _client(options: CacheOptions) -> BlobClient:
    """One client per process and server."""
    with _lock:
        client = _clients.get(options)
        if client is None:
            client = _clients[options] = BlobClient.from_settings(_settings(options))
        return client
