"""Each pipeline's checkpoints as the page shows them, from what the server keeps.

A server whose checkpoints keep statistics (``Checkpoints.history`` and ``pipelines``: every
checkpoint triggered, with its status, abort reason, duration and sizes) is read as it is.
Without them, the page shows what the checkpoint records hold, which is less: the completed
checkpoints retained (id, kind, trigger time) and the ids in progress; aborted ones left no
record. Its answers then say ``"statistics": false`` and the page says the history is partial.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ..ha.checkpoints import FileCheckpointRecords, ZooKeeperCheckpointRecords
from ..wire._checkpoints import check_pipeline

if TYPE_CHECKING:
    from ..ha.checkpoints import CheckpointRecords

__all__ = ["HistorySource", "RecordsOnly", "history_source"]


class HistorySource(Protocol):
    def pipelines(self) -> list[str]: ...

    async def history(self, pipeline: str, limit: int = 100) -> list[dict[str, Any]]: ...


class CheckpointLister(Protocol):
    """What :class:`RecordsOnly` needs of the server's checkpoints (``Checkpoints`` is one)."""

    @property
    def records(self) -> CheckpointRecords: ...

    async def handle(self, request: dict[str, Any]) -> dict[str, Any]: ...


class RecordsOnly:
    """The history as the checkpoint records tell it (no statistics kept)."""

    def __init__(self, checkpoints: CheckpointLister) -> None:
        self.checkpoints = checkpoints

    def pipelines(self) -> list[str]:
        """The pipelines with records: directories in standalone, nodes in zookeeper mode
        (blocking: the page reads it in a worker thread)."""
        records = self.checkpoints.records
        if isinstance(records, FileCheckpointRecords):
            names = [path.name for path in records.root.iterdir() if path.is_dir()] if records.root.is_dir() else []
        elif isinstance(records, ZooKeeperCheckpointRecords):
            names = records.client.get_children(f"{records.paths.root}/checkpoints") if records.client.exists(
                f"{records.paths.root}/checkpoints"
            ) else []  # fmt: skip
        else:
            names = []
        return [name for name in names if _is_pipeline(name)]

    async def history(self, pipeline: str, limit: int = 100) -> list[dict[str, Any]]:
        listed = await self.checkpoints.handle({"action": "list", "pipeline": pipeline})
        rows = [_row(checkpoint_id, "in_progress", None, None) for checkpoint_id in listed["pending"]]
        for record in listed["checkpoints"]:
            kind = "savepoint" if record.get("savepoint") else "checkpoint"
            rows.append(_row(record["id"], "completed", kind, record.get("timestamp"), record.get("problem")))
        rows.sort(key=lambda row: -row["id"])
        return rows[:limit]


def history_source(checkpoints: CheckpointLister) -> tuple[HistorySource, bool]:
    """The server's checkpoints when they keep statistics, else :class:`RecordsOnly` over them;
    and whether they do."""
    if callable(getattr(checkpoints, "history", None)):
        return checkpoints, True  # type: ignore[return-value]
    return RecordsOnly(checkpoints), False


def _row(
    checkpoint_id: int, status: str, kind: str | None, trigger_time: float | None, reason: str | None = None
) -> dict[str, Any]:
    empty = dict.fromkeys(("duration", "acknowledged", "expected", "state_bytes", "bytes_sent", "bytes_reused"))
    return {"id": checkpoint_id, "kind": kind or "checkpoint", "status": status, "reason": reason,
            "trigger_time": trigger_time, **empty}  # fmt: skip


def _is_pipeline(name: str) -> bool:
    try:
        check_pipeline(name)
    except ValueError:
        return False
    return True
