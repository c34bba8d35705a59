"""Reads recorded in a blob's atime, coarsely, for retention's sweeps
(:mod:`blobsvc.server._retention`, rule 4): storage records each read, the server's
:class:`~blobsvc.server._retention.Retention` deletes by them."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["READ_GRANULARITY", "HotRead", "ReadClock"]

# A read is written to the atime only when the atime is this much older: a hot blob then costs
# one utime a minute, and a sweep's idea of the last read is at most this early (rule 4).
READ_GRANULARITY = 60.0


class HotRead(Protocol):
    """What :meth:`ReadClock.hit` uses of a blob served from memory (a
    :class:`~blobsvc.storage._hotblobs.HotBlob` is one, which knows its clock)."""

    read_at: float
    source: str


class ReadClock:
    """Records reads in the blob's atime, coarsely (rule 4). ``clock`` is wall time, and
    injectable so that tests need not wait."""

    def __init__(self, clock: Callable[[], float] = time.time, granularity: float = READ_GRANULARITY) -> None:
        self.clock = clock
        self.granularity = granularity

    def opened(self, fd: int, info: os.stat_result) -> float:
        """A read of the file open as ``fd`` (``info`` its ``fstat``): recorded if its atime is
        a granularity old; returns the read its atime now records."""
        now = self.clock()
        if now - info.st_atime < self.granularity:
            return info.st_atime
        _record(fd, now, info.st_mtime_ns)
        return now

    def hit(self, entry: HotRead) -> None:
        """A read of a hot blob, served from memory: one clock call, and a ``utime`` of its
        file when the read it last recorded is a granularity old."""
        now = self.clock()
        if now - entry.read_at < self.granularity:
            return
        entry.read_at = now
        self.touch(entry.source, now)

    def touch(self, name: str | os.PathLike[str], now: float | None = None, *, dir_fd: int | None = None) -> None:
        """Record ``now`` in the atime of ``name`` (relative to ``dir_fd``) whatever it holds:
        content stored by a PUT, or left by its last job name. Its mtime is kept."""
        now = self.clock() if now is None else now
        with contextlib.suppress(OSError):  # gone: deleted meanwhile, nothing to record
            _record(name, now, os.stat(name, dir_fd=dir_fd).st_mtime_ns, dir_fd)


def _record(file: int | str | os.PathLike[str], now: float, mtime_ns: int, dir_fd: int | None = None) -> None:
    with contextlib.suppress(OSError):  # a file system refusing utime loses a record, not a read
        os.utime(file, ns=(int(now * 1e9), mtime_ns), dir_fd=dir_fd)
