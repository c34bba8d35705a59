"""CheckpointCoordinator: triggers a pipeline's checkpoints and completes or aborts them.

Flink's ``CheckpointCoordinator``, one per running pipeline (the driver). Made, it registers
with the server and gets the pipeline's newest *writer epoch*: from then on every older
coordinator of the pipeline (a driver that was replaced but still runs, a zombie) is fenced,
its triggers and completions refused with :class:`Fenced`, and its pending checkpoints can
never complete. The new one does not wait for them.

Its :class:`CheckpointOptions`, Flink's ``CheckpointConfig``:

* ``timeout``: a checkpoint not completed within it is aborted (default 600 s);
* ``max_concurrent``: at most this many checkpoints pending at once (default 1):
  :meth:`trigger` beyond it raises :class:`CheckpointError`, as Flink skips such a trigger;
* ``min_pause``: :meth:`trigger` first waits until this long after the last completion;
* ``tolerable_failures``: checkpoints that may fail in a row before the next trigger raises
  :class:`CheckpointFailuresExceeded` (default None: any number; what counts:
  :mod:`._failures`);
* ``retain``: completed checkpoints the server keeps (default 1; None: every one); the others
  are subsumed once a newer one is durable. With ``score`` (a property's name) and
  ``score_order`` (``"max"`` or ``"min"``), the ``retain`` best by it and the latest are kept
  (:mod:`blobsvc.server.checkpoint_retention`). Savepoints are never subsumed.

A savepoint is neither refused by ``max_concurrent`` nor delayed by ``min_pause`` (Flink's
forced savepoints start at once), though once pending it takes a place like any other.
Completing checkpoint N aborts every older pending checkpoint but savepoints (N subsumes
them, as in Flink): each frees its place among the ``max_concurrent`` and can never complete.

Completing a checkpoint writes its metadata as the blob ``meta/<id>`` of the pipeline's job,
then asks the server to add the record, which checks that blob and every state file it
names (:mod:`blobsvc.server.checkpoints`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .._exceptions import BlobError, CheckpointError, InvalidArgument, TransportError
from ..cache import BlobCache
from ..client import BlobClient
from ..wire._checkpoints import Metadata, Task, check_task, metadata_name, pipeline_job
from ._completed import DEFAULT_HOLD_SECONDS, CompletedCheckpoint, load_checkpoint
from ._failures import CheckpointFailureManager
from ._pending import CheckpointState, PendingCheckpoint

__all__ = ["CheckpointCoordinator", "CheckpointOptions"]

log = logging.getLogger("blobsvc.checkpoints")

MAX_TIMEOUT = 7 * 86400.0  # the server's bound too: a week is beyond any checkpoint or restore


@dataclass(frozen=True)
class CheckpointOptions:
    timeout: float = 600.0
    max_concurrent: int = 1
    min_pause: float = 0.0
    tolerable_failures: int | None = None
    retain: int | None = 1
    hold_seconds: float = DEFAULT_HOLD_SECONDS
    """How long a restore keeps its checkpoint's state from being discarded, at most."""
    score: str | None = None
    score_order: str = "max"

    def __post_init__(self) -> None:
        if not 0 < self.timeout <= MAX_TIMEOUT or not 0 < self.hold_seconds <= MAX_TIMEOUT:
            raise InvalidArgument("timeout and hold_seconds are seconds, more than 0 and at most a week")
        if self.max_concurrent < 1 or self.min_pause < 0 or not (self.retain is None or 1 <= self.retain <= 10_000):
            raise InvalidArgument("max_concurrent is at least 1, min_pause at least 0, retain None or from 1 to 10,000")
        if self.score_order not in ("max", "min") or (self.score is not None and not isinstance(self.score, str)):
            raise InvalidArgument('score is a property\'s name or None; score_order "max" (higher is better) or "min"')
        if self.tolerable_failures is not None and self.tolerable_failures < 0:
            raise InvalidArgument("tolerable_failures is None or at least 0")


class CheckpointCoordinator:
    """The coordinator of ``pipeline``'s checkpoints; registering fences every older one."""

    def __init__(
        self, client: BlobClient, pipeline: str, options: CheckpointOptions, cache: BlobCache | None = None
    ) -> None:
        self.client = client
        self.pipeline = pipeline
        self.options = options
        self.cache = cache
        self.failures = CheckpointFailureManager(options.tolerable_failures)
        self.epoch: int = client.checkpoints({"action": "register", "pipeline": pipeline})["epoch"]
        self._pending: set[PendingCheckpoint] = set()
        self._last_completion = -float("inf")  # monotonic
        self._lock = threading.Lock()

    def trigger(
        self,
        tasks: Iterable[Task],
        properties: Mapping[str, Any] | None = None,
        *,
        savepoint: bool = False,
        timeout: float | None = None,
    ) -> PendingCheckpoint:
        """A new pending checkpoint (a fresh id from the server's counter) awaiting ``tasks``,
        aborted after ``timeout`` seconds (the options' by default)."""
        self.failures.check()
        expected = tuple(check_task(task) for task in tasks)
        if not expected or len(set(expected)) != len(expected):
            raise InvalidArgument("a checkpoint awaits one or more distinct tasks")
        timeout = self.options.timeout if timeout is None else timeout
        if not 0 < timeout <= MAX_TIMEOUT:
            raise InvalidArgument(f"a checkpoint's timeout is more than 0 and at most {MAX_TIMEOUT:g} seconds")
        properties = dict(properties or {})
        try:
            round_trip = json.loads(json.dumps(properties))
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"a checkpoint's properties must be plain JSON: {exc}") from None
        if round_trip != properties:  # keys that are not strings, tuples: a restore would see others
            raise InvalidArgument("a checkpoint's properties must come back from JSON as they are (string keys, lists)")
        if not savepoint:
            pause = self._last_completion + self.options.min_pause - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        with self._lock:
            if not savepoint and len(self._pending) >= self.options.max_concurrent:
                raise CheckpointError(
                    f"pipeline {self.pipeline}: {len(self._pending)} checkpoints pending, "
                    f"at most {self.options.max_concurrent} at once"
                )
            request = {
                "action": "trigger",
                "pipeline": self.pipeline,
                "epoch": self.epoch,
                "timeout": timeout,
                "savepoint": savepoint,  # the server keeps a pending savepoint apart
                "expected": len(expected),  # for the server's history only
            }
            try:
                reply = self.client.checkpoints(request)
            except TransportError as exc:  # the server, the checkpoints' storage, unreachable: it counts
                self.failures.failed(self.pipeline, None, f"the trigger failed: {exc}")
                raise
            pending = PendingCheckpoint(
                self,
                self.pipeline,
                reply["id"],
                expected,
                properties,
                savepoint=savepoint,
                timeout=timeout,
            )
            self._pending.add(pending)
        return pending

    def finish(self, pending: PendingCheckpoint) -> CompletedCheckpoint:
        """Complete a fully acknowledged checkpoint: its metadata blob, then the record."""
        metadata = Metadata(
            self.pipeline, pending.id, pending.timestamp, pending.savepoint, pending.properties, pending.acknowledged
        )
        key = self.client.put(metadata.encode(), job=pipeline_job(self.pipeline), name=metadata_name(pending.id))
        reply = self.client.checkpoints(
            {
                "action": "complete",
                "pipeline": self.pipeline,
                "epoch": self.epoch,
                "id": pending.id,
                "metadata": key,
                "retain": self.options.retain,
                "score": self.options.score,
                "score_order": self.options.score_order,
            }
        )
        with self._lock:
            self._pending.discard(pending)
            self._last_completion = time.monotonic()
            subsumed = [p for p in self._pending if p.id < pending.id and not p.savepoint]
        self.failures.completed(pending.id)
        for older in subsumed:
            older.subsume(pending.id)
        log.info("pipeline %s: checkpoint %d completed; subsumed %s", self.pipeline, pending.id, reply["subsumed"])
        return load_checkpoint(self.client, self.pipeline, reply["record"], self.cache, self.options.hold_seconds)

    def forget(self, pending: PendingCheckpoint, reason: str, *, subsumed: bool = False) -> None:
        """An aborted checkpoint: counted as a failure and the server told (so that its state
        is discarded; a server that cannot be told aborts it at its deadline). A subsumed one
        is neither: the server aborted it in the same step as the newer one's completion."""
        with self._lock:
            self._pending.discard(pending)
        log.warning("pipeline %s: checkpoint %d aborted: %s", self.pipeline, pending.id, reason)
        if subsumed:
            return
        self.failures.failed(self.pipeline, pending.id, reason)
        try:
            self.client.checkpoints(
                {"action": "abort", "pipeline": self.pipeline, "epoch": self.epoch, "id": pending.id, "reason": reason}
            )
        except BlobError as exc:
            log.warning(
                "pipeline %s: could not tell the server checkpoint %d aborted: %s", self.pipeline, pending.id, exc
            )

    def check_failures(self) -> None:
        self.failures.check()

    @property
    def pending(self) -> list[PendingCheckpoint]:
        """The checkpoints triggered and not yet completed or aborted."""
        with self._lock:
            return sorted((p for p in self._pending if p.state is CheckpointState.PENDING), key=lambda p: p.id)
