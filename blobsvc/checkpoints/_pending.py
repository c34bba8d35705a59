"""PendingCheckpoint: a triggered checkpoint awaiting its tasks' acknowledgements.

Flink's ``PendingCheckpoint``: it knows the tasks it expects, collects each one's handle,
and is complete only when fully acknowledged (:attr:`PendingCheckpoint.fully_acknowledged`).
It ends exactly once, completed or aborted:

* **complete** (:meth:`complete`, or leaving its ``with`` block normally): only when every
  expected task acknowledged; otherwise it is aborted instead, naming the tasks missing.
* **abort**: a task declines (:meth:`decline`), its timeout passes (a timer aborts it even if
  nobody calls anything), :meth:`abort`, its ``with`` block ends with an exception (which
  goes on as it was), or a newer checkpoint completes first (:meth:`subsume`; savepoints
  are never subsumed). An aborted checkpoint is never visible; its state is discarded.

Leaving a ``with`` block normally whose checkpoint did not complete raises
:class:`CheckpointAborted`, so that it never goes unnoticed. Thread-safe: tasks' handles may
arrive from several threads.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Protocol

from .._exceptions import CheckpointAborted, InvalidArgument
from ..wire._checkpoints import Task, TaskHandle, check_task
from ._completed import CompletedCheckpoint

__all__ = ["CheckpointState", "PendingCheckpoint"]


class CheckpointState(enum.Enum):
    PENDING = "pending"
    COMPLETED = "completed"
    ABORTED = "aborted"


class _Finisher(Protocol):
    """What ends a pending checkpoint: its coordinator."""

    def finish(self, pending: PendingCheckpoint) -> CompletedCheckpoint: ...

    def forget(self, pending: PendingCheckpoint, reason: str, *, subsumed: bool = False) -> None: ...

    def check_failures(self) -> None: ...


class PendingCheckpoint:
    """Checkpoint ``id`` of ``pipeline``, awaiting ``tasks``; made by ``CheckpointStore.begin``."""

    def __init__(
        self,
        coordinator: _Finisher,
        pipeline: str,
        checkpoint_id: int,
        tasks: tuple[str, ...],
        properties: Mapping[str, Any],
        *,
        savepoint: bool,
        timeout: float,
    ) -> None:
        self.pipeline = pipeline
        self.id = checkpoint_id
        self.tasks = tasks
        self.properties = dict(properties)
        self.savepoint = savepoint
        self.timestamp = time.time()
        self.timeout = timeout
        self.acknowledged: dict[str, TaskHandle] = {}
        self.state = CheckpointState.PENDING
        self.reason: str | None = None
        """Why it was aborted."""
        self.completed: CompletedCheckpoint | None = None
        self._coordinator = coordinator
        self._lock = threading.RLock()
        self._timer = threading.Timer(timeout, self._time_out)
        self._timer.daemon = True
        self._timer.start()

    def __repr__(self) -> str:
        acknowledged = f"{len(self.acknowledged)}/{len(self.tasks)} acknowledged"
        return f"<PendingCheckpoint {self.pipeline}/{self.id} {self.state.value}, {acknowledged}>"

    @property
    def fully_acknowledged(self) -> bool:
        return len(self.acknowledged) == len(self.tasks)

    @property
    def missing(self) -> list[str]:
        """The tasks that have not acknowledged."""
        return [task for task in self.tasks if task not in self.acknowledged]

    def acknowledge(self, task: Task, handle: TaskHandle | Mapping[str, Any]) -> None:
        """Record ``task``'s state (the handle its snapshot returned, or its JSON form).
        :class:`CheckpointAborted` when the checkpoint was aborted meanwhile."""
        task = check_task(task)
        if not isinstance(handle, TaskHandle):
            handle = TaskHandle.from_json(dict(handle))
        with self._lock:
            self._check_pending()
            if task not in self.tasks:
                raise InvalidArgument(f"checkpoint {self.id} does not expect task {task!r}")
            if handle.task != task:
                raise InvalidArgument(f"task {task!r} acknowledged with task {handle.task!r}'s handle")
            earlier = self.acknowledged.get(task)
            if earlier is not None and not earlier.same_state(handle):
                raise InvalidArgument(f"task {task!r} already acknowledged checkpoint {self.id} with other state")
            self.acknowledged[task] = handle

    def decline(self, task: Task, reason: str) -> None:
        """``task`` cannot take its part: the checkpoint is aborted."""
        self.abort(f"task {check_task(task)} declined: {reason}")

    def complete(self) -> CompletedCheckpoint:
        """Complete it: metadata written, then the server's record added (then the oldest
        subsumed). Aborts it instead, raising :class:`CheckpointAborted`, when a task has
        not acknowledged."""
        with self._lock:
            self._check_pending()
            if not self.fully_acknowledged:
                self._abort(f"tasks {', '.join(self.missing)} did not acknowledge")
                self._check_pending()
            try:
                self.completed = self._coordinator.finish(self)
            except BaseException as exc:
                self._abort(f"{type(exc).__name__}: {exc}")
                raise
            self.state = CheckpointState.COMPLETED
            self._timer.cancel()
            return self.completed

    def abort(self, reason: str) -> None:
        """Abort it, if still pending; its state is discarded."""
        with self._lock:
            self._abort(reason)

    def subsume(self, newer: int) -> None:
        """Checkpoint ``newer`` completed: this older one is aborted, never to complete (not a
        failure: the newer one holds a later state)."""
        with self._lock:
            self._abort(f"subsumed by checkpoint {newer}", subsumed=True)

    def _abort(self, reason: str, *, subsumed: bool = False) -> None:
        if self.state is not CheckpointState.PENDING:
            return
        self.state, self.reason = CheckpointState.ABORTED, reason
        self._timer.cancel()
        self._coordinator.forget(self, reason, subsumed=subsumed)

    def _check_pending(self) -> None:
        if self.state is CheckpointState.ABORTED:
            self._coordinator.check_failures()  # CheckpointFailuresExceeded says more
            raise CheckpointAborted(f"checkpoint {self.id} of {self.pipeline} was aborted: {self.reason}", self.id)
        if self.state is CheckpointState.COMPLETED:
            raise InvalidArgument(f"checkpoint {self.id} of {self.pipeline} is completed already")

    def _time_out(self) -> None:
        self.abort(f"timed out after {self.timeout:g} s")

    def __enter__(self) -> PendingCheckpoint:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if exc is not None:
            self.abort(f"{type(exc).__name__}: {exc}")
        elif self.state is not CheckpointState.COMPLETED:  # completed in the block: nothing left to do
            self.complete()
