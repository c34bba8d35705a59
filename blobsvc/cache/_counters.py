"""Counters of a cache directory, shared by every process of the host: hits, misses,
downloads, bytes fetched from the server and from the HA store, evictions, store reads refused.

Many processes count at once, on every ``path()`` call, so counting must cost next to nothing
and never wait for another process. Each process therefore counts in a file of its own,
``stats/<pid>-<start time>-<n>`` (named like a lease: ``_leases``), of fixed little-endian
8-byte slots that it maps into memory shared with the page cache. Counting is a store to
memory, with no system call and no lock between processes, and a reader that reads the file
sees the count at once, since it reads the same pages. A thread lock orders the threads of one
process; a forked child gets a new lock and, at its first count, a file of its own.

When a process dies its file stays, counts and all; the next collection (which holds the
directory lock) folds the files of dead processes into ``stats/retired``, written whole and
renamed into place, and removes them. ``retired`` also names the files it has folded until
they are gone, so a collection interrupted between the two steps never counts one twice.
Totals are ``retired`` plus every live file, read under the directory lock so that no fold
runs meanwhile.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import mmap
import os
import struct
import threading
import uuid
import weakref
from pathlib import Path

from ._leases import current_holder, name_alive, parse_holder

__all__ = ["FIELDS", "Counters"]

FIELDS = (
    "hits",
    "misses",
    "downloads",
    "bytes_fetched",
    "evictions",
    "evicted_bytes",
    # Store reads (blobsvc.ha.reads): bytes copied from the HA store, copies of it that did not
    # verify and were refused, and reads that failed and went to the server instead.
    "bytes_from_store",
    "store_refused",
    "store_fallbacks",
)
_SLOT = struct.Struct("<Q")
_SIZE = _SLOT.size * len(FIELDS)
_OFFSET = {name: i * _SLOT.size for i, name in enumerate(FIELDS)}
_RETIRED = "retired"
_numbers = itertools.count(1)
_EVERY: weakref.WeakSet[Counters] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for counters in list(_EVERY):
        counters._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Counters:
    """The counters of the cache whose ``stats/`` directory is ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self._map: mmap.mmap | None = None
        _EVERY.add(self)

    def add(self, field: str, amount: int = 1) -> None:
        """Count ``amount`` more of ``field`` for this process."""
        offset = _OFFSET[field]
        with self._lock:
            if self._map is None:  # the first count of this process
                self._map = self._open_own()
            (value,) = _SLOT.unpack_from(self._map, offset)
            _SLOT.pack_into(self._map, offset, value + amount)

    def own(self) -> dict[str, int]:
        """This process's counts alone (an agent's, say, apart from its host's other users)."""
        with self._lock:
            if self._map is None:
                return dict.fromkeys(FIELDS, 0)
            return {field: _SLOT.unpack_from(self._map, offset)[0] for field, offset in _OFFSET.items()}

    def _forked(self) -> None:
        # The child's counts go to a file of its own, and a lock another thread of the parent
        # held at the fork would never be released here.
        self._lock, self._map = threading.Lock(), None

    def _open_own(self) -> mmap.mmap:
        holder = current_holder()
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{holder.pid}-{holder.start}-{next(_numbers)}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.ftruncate(fd, _SIZE)
            return mmap.mmap(fd, _SIZE)
        finally:
            os.close(fd)  # the map keeps the file

    def totals(self) -> dict[str, int]:
        """Every process's counts, the dead ones' included. Hold the directory lock."""
        totals, folded = self._read_retired()
        for name in self._process_files():
            if name not in folded:
                _add(totals, self._read(name))
        return totals

    def fold_dead(self) -> None:
        """Move the counts of dead processes into ``retired``. Hold the directory lock."""
        totals, remembered = self._read_retired()
        names = set(self._process_files())
        folded = remembered & names  # those gone since the last fold need no remembering
        dead = {name for name in names - folded if not name_alive(name)}
        for name in dead:
            _add(totals, self._read(name))
        if dead or folded != remembered:
            self._write_retired(totals, folded | dead)
        for name in folded | dead:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.directory / name)

    def _process_files(self) -> list[str]:
        try:
            return [name for name in os.listdir(self.directory) if parse_holder(name) is not None]
        except FileNotFoundError:
            return []

    def _read(self, name: str) -> dict[str, int]:
        try:
            raw = (self.directory / name).read_bytes()
        except FileNotFoundError:
            return {}
        raw = raw[:_SIZE].ljust(_SIZE, b"\0")  # a file being created reads short
        return {field: _SLOT.unpack_from(raw, offset)[0] for field, offset in _OFFSET.items()}

    def _read_retired(self) -> tuple[dict[str, int], set[str]]:
        try:
            data = json.loads((self.directory / _RETIRED).read_bytes())
            totals = {field: int(data["totals"].get(field, 0)) for field in FIELDS}
            return totals, {str(name) for name in data["folded"]}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return dict.fromkeys(FIELDS, 0), set()

    def _write_retired(self, totals: dict[str, int], folded: set[str]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        temp = self.directory / f".{_RETIRED}.{uuid.uuid4().hex}"
        temp.write_text(json.dumps({"totals": totals, "folded": sorted(folded)}))
        os.replace(temp, self.directory / _RETIRED)


def _add(totals: dict[str, int], counts: dict[str, int]) -> None:
    for field, value in counts.items():
        totals[field] = totals.get(field, 0) + value
