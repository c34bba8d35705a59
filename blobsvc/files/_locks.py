"""Directories and names shared between threads: :func:`make_dirs` creates a directory durably,
and a :class:`LockTable` holds one lock per name (a key, a job) for the server's storage and the
HA store, where publications and deletions of one name must not interleave."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Hashable, Iterator
from pathlib import Path

from ._writeback import fsync_dir

__all__ = ["LockTable", "make_dirs"]


def make_dirs(directory: Path) -> None:
    """``mkdir -p`` that also fsyncs each parent, so the new directories survive a crash."""
    if directory.is_dir():
        return
    make_dirs(directory.parent)
    with contextlib.suppress(FileExistsError):
        directory.mkdir()
    fsync_dir(directory.parent)


class LockTable:
    """One lock per key, created on demand and dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[Hashable, tuple[threading.Lock, list[int]]] = {}

    @contextlib.contextmanager
    def hold(self, key: Hashable) -> Iterator[None]:
        with self._guard:
            lock, users = self._locks.setdefault(key, (threading.Lock(), [0]))
            users[0] += 1
        try:
            with lock:
                yield
        finally:
            with self._guard:
                users[0] -= 1
                if not users[0]:
                    del self._locks[key]
