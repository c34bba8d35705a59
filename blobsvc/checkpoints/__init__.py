"""Checkpoints: Flink's completed-checkpoint store and coordinator for any Python pipeline.

A pipeline (a name that outlives applications) takes *checkpoints*: each is triggered with a
fresh id, every task it expects snapshots its state and acknowledges it, and only then is it
completed, its metadata durable on the server. A checkpoint that a task declines, that times
out, or whose driver dies is aborted and never visible. The server keeps the last ``retain``
completed ones (and every savepoint) and discards state no retained checkpoint references.
``docs/checkpoints.md`` states the guarantees. One concept per module, as in Flink:

* ``_store``: :class:`CheckpointStore`, a pipeline's checkpoints as a user sees them;
* ``_coordinator``: :class:`CheckpointCoordinator` (trigger, complete, abort; fenced by a
  writer epoch) and its :class:`CheckpointOptions`;
* ``_pending``: :class:`PendingCheckpoint`, awaiting acknowledgements;
* ``_completed``: :class:`CompletedCheckpoint`, what a restore reads;
* ``_failures``: :class:`CheckpointFailureManager`, tolerable failures in a row;
* ``_snapshot``: a task's state stored as content blobs, unchanged files sending no bytes;
* ``_stamps``: a task's memory of its files' stamps, so that unchanged files are not read;
* ``_restore``: a task's state written back, verified, whole or not at all.

State handles (:class:`TaskHandle`) and the metadata format are shared with the server
(:mod:`blobsvc.wire._checkpoints`). Needs no PySpark; :mod:`blobsvc.spark` builds on it.

May import the client, the cache, the wire, config and exceptions; never the server.
"""

from .._exceptions import CheckpointAborted, CheckpointError, CheckpointFailuresExceeded, Fenced
from ..wire._checkpoints import FileEntry, TaskHandle
from ._completed import CompletedCheckpoint
from ._coordinator import CheckpointCoordinator, CheckpointOptions
from ._failures import CheckpointFailureManager
from ._pending import CheckpointState, PendingCheckpoint
from ._store import CheckpointStore

__all__ = [
    "CheckpointAborted",
    "CheckpointCoordinator",
    "CheckpointError",
    "CheckpointFailureManager",
    "CheckpointFailuresExceeded",
    "CheckpointOptions",
    "CheckpointState",
    "CheckpointStore",
    "CompletedCheckpoint",
    "FileEntry",
    "Fenced",
    "PendingCheckpoint",
    "TaskHandle",
]
