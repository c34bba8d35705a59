"""What this leader recorded in the HA store: a name linked again costs the store no request.

A checkpoint LINKs every unchanged state file each time, and its completion checks every file
its metadata names; on an object store each of those is a few round trips. The leader
remembers, for each name whose record it wrote (or found) under its own epoch with the
object and ref in place, the key and size that record gives, and answers from memory.

Why memory is enough: only the leader writes name records and refs (tasks write objects
only, :mod:`blobsvc.ha.writes`), every deletion of a name goes through it and forgets the
name here first, an object goes only with its last ref, and a damaged copy moved aside
forgets every name of its key. What it cannot see (a hand in the store, a deposed leader's
late write, which orders below ours anyway) is what readers' verification is for. An
entry is used only under the epoch it was recorded in: once another leader has led, this
one asks the store again. The memory holds :data:`RECORDED_NAMES` names, the least recently
used forgotten first.
"""

from __future__ import annotations

import collections
import threading
from typing import NamedTuple

__all__ = ["RECORDED_NAMES", "Recorded", "RecordedNames"]

# ~150 bytes a name: 200,000 names (a few thousand tasks' state files) in ~30 MiB.
RECORDED_NAMES = 200_000


class Recorded(NamedTuple):
    key: bytes
    size: int
    epoch: int


class RecordedNames:
    """(job, name hash) → :class:`Recorded`, least recently used forgotten first."""

    def __init__(self, capacity: int = RECORDED_NAMES) -> None:
        self._capacity = capacity
        self._names: collections.OrderedDict[tuple[bytes, str], Recorded] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, job: bytes, name_hash: str) -> Recorded | None:
        with self._lock:
            found = self._names.get((job, name_hash))
            if found is not None:
                self._names.move_to_end((job, name_hash))
            return found

    def remember(self, job: bytes, name_hash: str, recorded: Recorded) -> None:
        with self._lock:
            self._names[(job, name_hash)] = recorded
            self._names.move_to_end((job, name_hash))
            if len(self._names) > self._capacity:
                self._names.popitem(last=False)

    def forget(self, job: bytes, name_hash: str | None = None) -> None:
        """Forget a name, or (``name_hash`` None) every name of ``job``."""
        with self._lock:
            if name_hash is not None:
                self._names.pop((job, name_hash), None)
                return
            for name in [name for name in self._names if name[0] == job]:
                del self._names[name]

    def forget_key(self, key: bytes) -> None:
        """Forget every name of ``key`` (its copy was moved aside)."""
        with self._lock:
            for name in [name for name, recorded in self._names.items() if recorded.key == key]:
                del self._names[name]
