"""Tolerable failures: Flink's ``CheckpointFailureManager``, counting checkpoints that failed in a row.

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
        self._exceeded: CheckpointFailuresExceeded | None = None
        self._lock = threading.Lock()

    def completed(self) -> None:
        with self._lock:
            self.in_a_row, self._exceeded = 0, None

    def failed(self, pipeline: str, checkpoint_id: int, reason: str) -> None:
        """Count a failed checkpoint."""
        with self._lock:
            self.in_a_row += 1
            if self.tolerable is not None and self.in_a_row > self.tolerable and self._exceeded is None:
                self._exceeded = CheckpointFailuresExceeded(
                    f"pipeline {pipeline}: {self.in_a_row} checkpoints failed in a row, more than the "
                    f"{self.tolerable} tolerated (the last, {checkpoint_id}: {reason})"
                )

    def check(self) -> None:
        """:class:`CheckpointFailuresExceeded` once more failed in a row than tolerated."""
        if self._exceeded is not None:
            raise self._exceeded
