"""A task's memory of its state files' stamps, so that a snapshot reads only what changed.

For each file of the state it records the stamp (device, inode, size, mtime, ctime) and the
key the file hashed to; a later snapshot takes the key of a file whose stamp is unchanged
without reading it. When a stamp may be trusted is :mod:`blobsvc.files._stamps`' rule: a
file changed within ``RACY_SECONDS`` of being hashed is not remembered, so a rewrite in the
same clock tick, an mtime set back or an inode reused is read again.

The memory is one JSON file *beside* the state, ``.<name>.blobsvc-stamps`` next to the
directory or file snapshotted: outside the tree a snapshot walks (it is never state itself),
on the same file system, and where a task restarted on the same host finds it. It holds the
files of the last snapshot only; one that cannot be read or written costs only reading the
state again. Two snapshots of the same state at once may each write it: every entry either
writes is true, so whichever stays is.

Files whose name matches one of ``immutable`` (RocksDB's ``*.sst``) are never changed once
written: their key is trusted while device, inode and size are the same, and remembered even
when just written.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from ..files._stamps import save_record, settled, stamp

__all__ = ["MEMORY_SUFFIX", "StampMemory"]

MEMORY_SUFFIX = ".blobsvc-stamps"
_FORMAT = 1
_KEY = re.compile(r"[0-9a-f]{64}")


class StampMemory:
    """The stamps of the files of a state (a directory, or a file whose path is ``""`` and
    whose name is ``name``), kept at ``path``: :meth:`known` while snapshotting (from any
    thread), :meth:`remember` what was hashed, then :meth:`save`."""

    def __init__(self, path: Path, name: str, immutable: Sequence[str] = ()) -> None:
        self.path = path
        self.name = name
        self.immutable = tuple(immutable)
        self._recorded = _load(self.path)
        self._kept: dict[str, tuple[list[int], str]] = {}
        self._lock = threading.Lock()

    @classmethod
    def beside(cls, source: Path, immutable: Sequence[str] = ()) -> StampMemory | None:
        """The memory of the state at ``source``, kept in its parent directory (``..`` and
        links resolved first, so that it is never under ``source``); None for ``/``, which
        has no beside."""
        resolved = source.resolve()
        if resolved == resolved.parent:
            return None
        return cls(resolved.parent / f".{resolved.name}{MEMORY_SUFFIX}", resolved.name, immutable)

    def known(self, relative: str, st: os.stat_result) -> bytes | None:
        """The key of the file at ``relative`` when its stamp ``st`` is the recorded one."""
        entry = self._recorded.get(relative)
        if entry is None:
            return None
        recorded, key = entry
        current = stamp(st)
        if recorded != current and not (self._is_immutable(relative) and recorded[:3] == current[:3]):
            return None
        with self._lock:
            self._kept[relative] = entry
        return bytes.fromhex(key)

    def remember(self, relative: str, st: os.stat_result, key: bytes) -> None:
        """Record that the file at ``relative``, stamped ``st`` before and after it was read,
        hashed to ``key``; unless it changed too recently for the stamp to tell."""
        if settled(st) or self._is_immutable(relative):
            with self._lock:
                self._kept[relative] = (stamp(st), key.hex())

    def save(self) -> None:
        """Write what this snapshot knows, replacing the last snapshot's memory."""
        with self._lock:
            files = {relative: [recorded, key] for relative, (recorded, key) in sorted(self._kept.items())}
        save_record(self.path, {"format": _FORMAT, "files": files})

    def _is_immutable(self, relative: str) -> bool:
        name = PurePosixPath(relative).name if relative else self.name
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.immutable)


def _load(path: Path) -> dict[str, tuple[list[int], str]]:
    """The entries of the memory at ``path`` that are well formed; none when it cannot be read."""
    with contextlib.suppress(OSError, ValueError):
        document = json.loads(path.read_text())
        if isinstance(document, dict) and document.get("format") == _FORMAT and isinstance(document["files"], dict):
            return {
                relative: (entry[0], entry[1])
                for relative, entry in document["files"].items()
                if isinstance(entry, list)
                and len(entry) == 2
                and isinstance(entry[0], list)
                and len(entry[0]) == 5
                and all(isinstance(n, int) for n in entry[0])
                and isinstance(entry[1], str)
                and _KEY.fullmatch(entry[1])
            }
    return {}
