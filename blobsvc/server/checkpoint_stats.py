"""Each pipeline's checkpoint history: Flink's ``CheckpointStatsTracker``, as the server keeps it.

Per pipeline, the statistics of the last ``limit`` checkpoints (the ``checkpoint_history``
setting): in progress, completed, aborted (with why) and subsumed. The server writes what it
saw itself (trigger and completion times, the bytes the metadata names); what only the
coordinator knows (tasks acknowledged of expected) it takes bounded and checked, and never
for anything but display.

The history lives in memory. A completed checkpoint's statistics are also written into its
record (``duration``, ``acknowledged``, ``expected``), so that after a restart or a failover the
completed ones come back from the records and their metadata (:meth:`CheckpointStats.rebuild`);
the aborted and subsumed ones of before are gone, as Flink's are.
"""

from __future__ import annotations

import collections
from typing import Any

__all__ = ["DEFAULT_HISTORY", "DURATION_BUCKETS", "MAX_HISTORY", "CheckpointStats", "Entry"]

DEFAULT_HISTORY = 100
MAX_HISTORY = 10_000
MAX_TASKS = 1 << 20  # acknowledged/expected as a coordinator reports them: more is a lie
MAX_PIPELINES = 10_000  # pipelines with a history in memory: the least recently used go first
MAX_REASON = 500  # characters of an abort's reason
# Seconds from trigger to completion, the histogram's upper bounds: Flink's checkpoints take
# from well under a second to the default 10-minute timeout.
DURATION_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0)

Entry = dict[str, Any]


def new_entry(checkpoint_id: int, *, savepoint: bool, trigger_time: float, expected: int | None) -> Entry:
    return {
        "id": checkpoint_id,
        "kind": "savepoint" if savepoint else "checkpoint",
        "status": "in_progress",
        "reason": None,
        "trigger_time": trigger_time,
        "duration": None,
        "acknowledged": None,
        "expected": expected,
        "state_bytes": None,
        "bytes_sent": None,
        "bytes_reused": None,
    }


def task_count(value: object) -> int | None:
    """A task count a coordinator reported, or None when it is not a plausible one."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TASKS:
        return value
    return None


class CheckpointStats:
    """The history of every pipeline this server has seen checkpoints of since it started (or
    rebuilt from records); at most ``limit`` entries per pipeline, newest kept."""

    def __init__(self, limit: int = DEFAULT_HISTORY) -> None:
        self.limit = limit
        self._history: collections.OrderedDict[str, collections.OrderedDict[int, Entry]] = collections.OrderedDict()
        self.rebuilt: set[str] = set()
        self.known: set[str] = set()  # pipelines with records, as last listed
        # Completions this server saw, for the metrics: per bucket (and +Inf), the sum, the last.
        self.durations = [0] * (len(DURATION_BUCKETS) + 1)
        self.duration_sum = 0.0
        self.last: Entry | None = None

    def pipelines(self) -> list[str]:
        return sorted(self.known.union(self._history))

    def _of(self, pipeline: str) -> collections.OrderedDict[int, Entry]:
        entries = self._history.setdefault(pipeline, collections.OrderedDict())
        self._history.move_to_end(pipeline)
        while len(self._history) > MAX_PIPELINES:
            forgotten, _ = self._history.popitem(last=False)
            self.rebuilt.discard(forgotten)
        return entries

    def _put(self, pipeline: str, entry: Entry) -> None:
        entries = self._of(pipeline)
        entries[entry["id"]] = entry
        # Ids grow: keep the newest ``limit`` by id, whatever order they were learnt in.
        while len(entries) > self.limit:
            del entries[min(entries)]

    def triggered(
        self, pipeline: str, checkpoint_id: int, trigger_time: float, *, savepoint: bool, expected: object
    ) -> None:
        self._put(
            pipeline,
            new_entry(checkpoint_id, savepoint=savepoint, trigger_time=trigger_time, expected=task_count(expected)),
        )

    def mark_rebuilt(self, pipeline: str) -> None:
        """Its completed checkpoints are in; a pipeline with none is not remembered (a name a
        client makes up costs nothing here), so asking again lists its records again."""
        if pipeline in self._history:
            self.rebuilt.add(pipeline)

    def get(self, pipeline: str, checkpoint_id: int) -> Entry | None:
        entries = self._history.get(pipeline)
        return None if entries is None else entries.get(checkpoint_id)

    def completed(
        self, pipeline: str, record: dict[str, Any], *, state_bytes: int, bytes_sent: int, tasks: int
    ) -> Entry:
        """A completion: ``record`` is the checkpoint's record (with its statistics)."""
        entry = self.get(pipeline, record["id"]) or new_entry(
            record["id"], savepoint=bool(record.get("savepoint")), trigger_time=record["timestamp"], expected=None
        )
        entry.update(
            trigger_time=record.get("trigger_time", record["timestamp"]),
            kind="savepoint" if record.get("savepoint") else "checkpoint",
            status="completed",
            duration=record.get("duration"),
            acknowledged=tasks,
            expected=record.get("expected", tasks),
            state_bytes=state_bytes,
            bytes_sent=bytes_sent,
            bytes_reused=state_bytes - bytes_sent,
        )
        self._put(pipeline, entry)
        return entry

    def observe(self, entry: Entry) -> None:
        """Count a completion this server made (not one rebuilt from records) in the metrics."""
        duration = entry["duration"] or 0.0
        self.durations[next((i for i, b in enumerate(DURATION_BUCKETS) if duration <= b), len(DURATION_BUCKETS))] += 1
        self.duration_sum += duration
        self.last = dict(entry)

    def aborted(self, pipeline: str, checkpoint_id: int, reason: str, now: float) -> None:
        entry = self.get(pipeline, checkpoint_id)
        if entry is None or entry["status"] != "in_progress":
            return  # an id this server never saw triggered, or one already ended: nothing to say
        entry.update(status="aborted", reason=reason[:MAX_REASON], duration=max(0.0, now - entry["trigger_time"]))

    def subsumed(self, pipeline: str, checkpoint_ids: list[int]) -> None:
        for checkpoint_id in checkpoint_ids:
            entry = self.get(pipeline, checkpoint_id)
            if entry is not None and entry["status"] == "completed":
                entry["status"] = "subsumed"

    def kept(self, pipeline: str, checkpoint_id: int) -> None:
        entry = self.get(pipeline, checkpoint_id)
        if entry is not None:
            entry["kind"] = "savepoint"

    def forget(self, pipeline: str, checkpoint_id: int) -> None:
        entries = self._history.get(pipeline)
        if entries is not None:
            entries.pop(checkpoint_id, None)

    def history(self, pipeline: str, limit: int) -> list[Entry]:
        """Newest first, at most ``limit``; copies (a caller's edits change nothing here)."""
        entries: dict[int, Entry] = self._history.get(pipeline) or {}
        return [dict(entries[i]) for i in sorted(entries, reverse=True)[:limit]]
