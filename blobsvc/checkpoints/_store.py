"""CheckpointStore: one pipeline's checkpoints, as a user sees them.

Flink's ``CompletedCheckpointStore`` seen from the job: the completed checkpoints (kept by the
server, :mod:`blobsvc.server.checkpoints`), the latest one to restore, and the way to take new
ones (:meth:`CheckpointStore.begin`, through the pipeline's :class:`CheckpointCoordinator`,
made at the first ``begin``: that is when this store takes the pipeline over from any older
driver). Executors use a store too, for :meth:`CheckpointStore.snapshot` and restores only:
that takes nothing over.

Recovery never falls back silently: a checkpoint whose metadata is missing or damaged is
logged at WARNING (and counted by the server) and :meth:`CheckpointStore.latest` takes the
previous one.
"""

from __future__ import annotations

import builtins
import logging
import math
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from .._exceptions import CheckpointError, InvalidArgument, InvalidArgumentType, NotFound
from ..cache import BlobCache
from ..client import BlobClient
from ..wire._checkpoints import Task, TaskHandle, check_pipeline
from ._completed import DEFAULT_HOLD_SECONDS, CompletedCheckpoint, holding, load_checkpoint
from ._coordinator import CheckpointCoordinator, CheckpointOptions
from ._pending import PendingCheckpoint
from ._restore import restore
from ._snapshot import StateSource, snapshot

__all__ = ["CheckpointStore"]

log = logging.getLogger("blobsvc.checkpoints")


class CheckpointStore:
    """The checkpoints of ``pipeline`` (a name that outlives applications) on ``server``.

    ``server`` is ``"host:port"``, a ``zk://`` URL, or a :class:`BlobClient` (for a secret,
    TLS, timeouts). ``retain`` completed checkpoints are kept (savepoints besides; None keeps
    every one): the newest, or with ``score`` the best by that numeric property (``score_order``
    ``"max"``: higher is better, ``"min"``: lower is) and the latest besides. A checkpoint
    without the property, or with a non-number, is refused at :meth:`begin`. The server applies
    the policy of the pipeline's newest completion. The other options are
    :class:`CheckpointOptions`'. With a ``cache``, restores go through it:
    verified, fetched once per host.
    """

    def __init__(
        self,
        server: str | BlobClient,
        pipeline: str,
        retain: int | None = 1,
        *,
        score: str | None = None,
        score_order: str = "max",
        timeout: float = 600.0,
        max_concurrent: int = 1,
        min_pause: float = 0.0,
        tolerable_failures: int | None = None,
        hold_seconds: float = DEFAULT_HOLD_SECONDS,
        cache: BlobCache | None = None,
    ) -> None:
        if not isinstance(server, str | BlobClient):
            raise InvalidArgumentType(
                f"a checkpoint store's server is 'host:port', a zk:// URL or a BlobClient, not {type(server).__name__}"
            )
        self.pipeline = check_pipeline(pipeline)
        self.options = CheckpointOptions(
            timeout, max_concurrent, min_pause, tolerable_failures, retain, hold_seconds, score, score_order
        )
        self._owns_client = isinstance(server, str)
        self.client = BlobClient(server) if isinstance(server, str) else server
        self.cache = cache
        self._coordinator: CheckpointCoordinator | None = None
        self._coordinator_lock = threading.Lock()

    @property
    def coordinator(self) -> CheckpointCoordinator:
        """This store's coordinator, registered (fencing every older one) at first use: one
        however many threads use the store at once (a second would fence the first)."""
        with self._coordinator_lock:
            if self._coordinator is None:
                self._coordinator = CheckpointCoordinator(self.client, self.pipeline, self.options, self.cache)
            return self._coordinator

    def begin(
        self,
        tasks: Iterable[Task],
        properties: Mapping[str, Any] | None = None,
        *,
        savepoint: bool = False,
        timeout: float | None = None,
    ) -> PendingCheckpoint:
        """Trigger a checkpoint awaiting ``tasks``: a :class:`PendingCheckpoint` with a fresh id.
        Use it as a context manager: leaving the block completes it (every task acknowledged)
        or aborts it (an exception, a task missing). A savepoint is never subsumed; ``timeout``
        overrides the store's for this checkpoint."""
        score = self.options.score
        if score is not None and not savepoint:
            value = (properties or {}).get(score)
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
                raise InvalidArgument(
                    f"pipeline {self.pipeline} keeps its best checkpoints by {score!r}: "
                    f"give begin(properties={{{score!r}: <a number>}}), not {value!r}"
                )
        return self.coordinator.trigger(tasks, properties, savepoint=savepoint, timeout=timeout)

    def snapshot(
        self,
        task: Task,
        source: StateSource,
        *,
        immutable: Sequence[str] = (),
        stamps: bool = True,
        store_writes: bool = True,
    ) -> TaskHandle:
        """Store ``task``'s state (a directory, a file, or bytes) and return its handle, for
        ``pending.acknowledge(task, handle)``. Unchanged files send no bytes and, with
        ``stamps`` (a memory of the files' stamps kept beside the state), are not read;
        files whose names match a pattern of ``immutable`` (``"*.sst"``) never change once
        written. With ``store_writes``, a new file's bytes go straight to the HA store of a
        server in recovery mode zookeeper (the store caches read from; the server then
        receives only its name), falling back to the server when the store cannot be
        written."""
        return snapshot(
            self.client, self.pipeline, task, source, immutable=immutable, stamps=stamps, store_writes=store_writes
        )

    def records(self) -> list[dict[str, Any]]:
        """The server's records of the completed checkpoints, oldest first; one whose
        metadata cannot be read has a ``problem``."""
        records: list[dict[str, Any]] = self.client.checkpoints({"action": "list", "pipeline": self.pipeline})[
            "checkpoints"
        ]
        return records

    def list(self) -> list[CompletedCheckpoint]:
        """The completed checkpoints that can be restored, oldest first (the others are logged)."""
        found = []
        for record in self.records():
            try:
                found.append(self.load(record))
            except CheckpointError as exc:
                log.warning("%s", exc)
        return found

    def best(self) -> CompletedCheckpoint | None:
        """The completed checkpoint (not savepoint) with the best ``score`` (the newest of
        equals); None when there is none. Only for a store with a ``score``."""
        score = self.options.score
        if score is None:
            raise InvalidArgument("best() ranks by a score: make the store with score='<property>'")
        sign = -1.0 if self.options.score_order == "max" else 1.0
        ranked = []
        for checkpoint in self.list():
            value = checkpoint.properties.get(score)
            if not checkpoint.savepoint and isinstance(value, int | float) and not isinstance(value, bool):
                ranked.append((sign * value, -checkpoint.id, checkpoint))
        return min(ranked, key=lambda entry: entry[:2])[2] if ranked else None

    def latest(self) -> CompletedCheckpoint | None:
        """The newest completed checkpoint that can be restored; None when there is none. One
        that cannot (its metadata missing or damaged) is logged at WARNING, and the previous
        one taken."""
        skipped: list[str] = []
        for record in reversed(self.records()):
            try:
                checkpoint = self.load(record)
            except CheckpointError as exc:
                log.warning("%s", exc)
                skipped.append(str(record["id"]))
                continue
            if skipped:
                log.warning(
                    "pipeline %s: falling back to checkpoint %d: %s cannot be restored",
                    self.pipeline,
                    checkpoint.id,
                    ", ".join(skipped),
                )
            return checkpoint
        if skipped:
            log.warning("pipeline %s: no checkpoint can be restored (%s cannot)", self.pipeline, ", ".join(skipped))
        return None

    def get(self, checkpoint_id: int) -> CompletedCheckpoint:
        """Completed checkpoint ``checkpoint_id``: :class:`NotFound` when there is none,
        :class:`CheckpointError` when it cannot be restored."""
        for record in self.records():
            if record["id"] == checkpoint_id:
                return self.load(record)
        raise NotFound(f"pipeline {self.pipeline} has no completed checkpoint {checkpoint_id}")

    def restore(
        self,
        checkpoint_id: int,
        handle: TaskHandle | Mapping[str, Any],
        dest: str | os.PathLike[str],
        *,
        writable: bool = False,
    ) -> Path:
        """Write the state ``handle`` names (a task's, in completed checkpoint
        ``checkpoint_id``) at ``dest``, verified, as :meth:`CompletedCheckpoint.restore` does:
        what a task does with the handle its driver sent it (a handle pickles; a
        :class:`CompletedCheckpoint` holds a client and stays with the driver). The checkpoint
        is held on the server meanwhile. A handle object is checked as its JSON form would be
        (no absolute, empty or ``..`` path): :class:`InvalidArgument` before anything is written."""
        if not isinstance(handle, TaskHandle):
            handle = TaskHandle.from_json(dict(handle))
        with holding(self.client, self.pipeline, checkpoint_id, self.options.hold_seconds):
            return restore(self.pipeline, handle, dest, client=self.client, cache=self.cache, writable=writable)

    def history(self, limit: int = 100) -> builtins.list[dict[str, Any]]:
        """The server's statistics of the pipeline's last ``limit`` checkpoints, newest first,
        as Flink's checkpoint history: ``id``, ``kind``, ``status`` (``in_progress``,
        ``completed``, ``aborted`` with its ``reason``, ``subsumed``), ``trigger_time``,
        ``duration``, ``acknowledged`` of ``expected`` tasks, ``state_bytes``, ``bytes_sent``,
        ``bytes_reused``. The completed ones outlive a server restart; the others do not."""
        reply = self.client.checkpoints({"action": "history", "pipeline": self.pipeline, "limit": limit})
        history: builtins.list[dict[str, Any]] = reply["history"]
        return history

    def keep(self, checkpoint_id: int) -> None:
        """Make completed checkpoint ``checkpoint_id`` a savepoint: never subsumed by any
        retention policy, kept until :meth:`delete`. :class:`NotFound` when there is none."""
        self.client.checkpoints({"action": "keep", "pipeline": self.pipeline, "id": checkpoint_id})

    def delete(self, checkpoint_id: int) -> int:
        """Delete a completed checkpoint (a savepoint too); its state goes unless another
        retained checkpoint, or a restore under way, references it. Returns how many blobs
        were discarded."""
        reply = self.client.checkpoints({"action": "delete", "pipeline": self.pipeline, "id": checkpoint_id})
        discarded: int = reply["discarded"]
        return discarded

    def load(self, record: Mapping[str, Any]) -> CompletedCheckpoint:
        """The checkpoint of one of :meth:`records`, its metadata read and verified:
        :class:`CheckpointError` when it cannot be restored."""
        return load_checkpoint(self.client, self.pipeline, record, self.cache, self.options.hold_seconds)

    def close(self) -> None:
        """Abort the checkpoints still pending; close the client if this store made it."""
        if self._coordinator is not None:
            for pending in self._coordinator.pending:
                pending.abort("the checkpoint store was closed")
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> CheckpointStore:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
