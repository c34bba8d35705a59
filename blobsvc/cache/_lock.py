"""Advisory file locks (``flock``) that work between processes and between threads.

``flock`` belongs to an open file description, so two threads sharing one descriptor would
share the lock; every :class:`FileLock` therefore opens the file afresh. The kernel drops the
lock when its holder dies, however it dies: no stale lock can outlive a process killed with
SIGKILL, which is why the cache never uses lock *files* whose mere existence means "taken".

A lock file may be unlinked by its holder (the cache removes the lock of an evicted key). A
waiter that was blocked on the unlinked file would then hold a lock nobody else can see, so
:meth:`FileLock.acquire` checks after locking that the path still names the file it locked,
and starts over when it does not.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

__all__ = ["FileLock"]

# A waiter starts over only when a holder unlinked the file under it, which needs that many
# evictions of one key while it waits; reaching this bound means something is deeply wrong.
MAX_REOPENS = 1000


class FileLock:
    """One acquisition of the exclusive ``flock`` on ``path`` (created when missing).

    ``with FileLock(path):`` waits as long as it takes; ``acquire(blocking=False)`` tries once.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, *, blocking: bool = True) -> bool:
        """Take the lock; without ``blocking``, return False at once when another holds it."""
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already locked by this FileLock")
        operation = fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB)
        for _ in range(MAX_REOPENS):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, operation)
            except BlockingIOError:
                os.close(fd)
                return False
            except BaseException:
                os.close(fd)
                raise
            if _same_file(fd, self.path):
                self._fd = fd
                return True
            os.close(fd)  # the holder before us unlinked it: lock the file now at the path
        raise RuntimeError(f"could not lock {self.path}: it was replaced {MAX_REOPENS} times")

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None

    def unlink(self) -> None:
        """Remove the lock file while holding it, so it does not outlive what it guards."""
        assert self._fd is not None, "unlink a lock only while holding it"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _same_file(fd: int, path: Path) -> bool:
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (on_disk.st_dev, on_disk.st_ino)
