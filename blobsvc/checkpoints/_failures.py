"""Tolerable failures: Flink's ``CheckpointFailureManager``, counting checkpoints that failed in a row.

What counts: a checkpoint aborted by a decline or its timeout (Flink's ``CHECKPOINT_DECLINED``,
``CHECKPOINT_EXPIRED``), a completion that failed (``FINALIZE_CHECKPOINT_FAILURE``), a trigger
that could not reach the server, which is the checkpoints' storage (``IO_EXCEPTION``: Flink
counts it, with no checkpoint id), and, unlike recent Flink, an exception in the checkpoint's
block or a task missing (that is how a task's failed snapshot shows). What does not: a
checkpoint older than the last completed one (Flink ignores past checkpoints), a checkpoint
subsumed (``CHECKPOINT_SUBSUMED``), and a trigger the server refused for another reason, such
as a coordinator replaced (``CHECKPOINT_COORDINATOR_SUSPEND``).

A completed checkpoint resets the count. Once it passes ``tolerable`` (None: never),
:meth:`check` raises :class:`CheckpointFailuresExceeded`, naming the failure that passed it:
the coordinator calls it before each trigger and when a checkpoint's abort is reported. The
pipeline is meant to stop, since it can no longer bound what a restart would replay. (A
failure may be counted on a timer's thread, which must not raise: hence the separate check.)
"""

from __future__ import annotations

import threading

from .._exceptions import CheckpointFailuresExceeded

__all__ = ["CheckpointFailureManager"]


class CheckpointFailureManager:
    def __init__(self, tolerable: int | None) -> None:
        if tolerable is not None and tolerable < 0:
            raise ValueError("tolerable_failures is None or at least 0")
        self.tolerable = tolerable
        self.in_a_row = 0
        self.last_completed = 0
        """The highest checkpoint id completed: failures of older ones are not counted."""
        self._exceeded: CheckpointFailuresExceeded | None = None
        self._lock = threading.Lock()

    def completed(self, checkpoint_id: int) -> None:
        with self._lock:
            self.in_a_row, self._exceeded = 0, None
            self.last_completed = max(self.last_completed, checkpoint_id)

    def failed(self, pipeline: str, checkpoint_id: int | None, reason: str) -> None:
        """Count a failed checkpoint (``None``: a trigger that got no id), unless it is older
        than the last completed one."""
        with self._lock:
            if checkpoint_id is not None and checkpoint_id < self.last_completed:
                return
            self.in_a_row += 1
            if self.tolerable is not None and self.in_a_row > self.tolerable and self._exceeded is None:
                which = "a trigger" if checkpoint_id is None else str(checkpoint_id)
                self._exceeded = CheckpointFailuresExceeded(
                    f"pipeline {pipeline}: {self.in_a_row} checkpoints failed in a row, more than the "
                    f"{self.tolerable} tolerated (the last, {which}: {reason})"
                )

    def check(self) -> None:
        """:class:`CheckpointFailuresExceeded` once more failed in a row than tolerated."""
        if self._exceeded is not None:
            raise self._exceeded
