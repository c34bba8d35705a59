"""Advisory file locks (``flock``) that work between processes and between threads.

``flock`` belongs to an open file description, so two threads sharing one descriptor would
share the lock; every :class:`FileLock` therefore opens the file afresh. The kernel drops the
lock when its holder dies, however it dies: no stale lock can outlive a process killed with
SIGKILL, which is why the cache never uses lock *files* whose mere existence means "taken".

A lock file may be unlinked by its holder (the cache removes the lock of an evicted key). A
waiter that was blocked on the unlinked file would then hold a lock nobody else can see, so
:meth:`FileLock.acquire` checks after locking that the path still names the file it locked,
and starts over when it does not.

A fork copies every descriptor, and with it the lock of each open file description: a child
forked while another thread of its parent holds a lock (a ``multiprocessing`` pool started in
the middle of a download) would hold that lock until it exits, although the thread that was to
release it does not exist in the child. So every descriptor a :class:`FileLock` opens is noted
in ``_HELD``, and the child closes them all as soon as it is forked: a lock stays its parent's
alone. That needs a fork through :func:`os.fork` (``multiprocessing``'s "fork" start method
uses it); a ``fork()`` made in C code runs no such hook.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from pathlib import Path

__all__ = ["FileLock"]

# A waiter starts over only when a holder unlinked the file under it, which needs that many
# evictions of one key while it waits; reaching this bound means something is deeply wrong.
MAX_REOPENS = 1000

# The descriptors every FileLock of this process has open. _HELD_LOCK is held from open to
# noting, and from forgetting to close, and is taken before a fork: so no fork falls in between,
# and a child never inherits a lock's descriptor it does not know of, nor closes a number the
# parent has reused meanwhile for something else.
_HELD: set[int] = set()
_HELD_LOCK = threading.Lock()


def _close_inherited() -> None:
    """In a forked child: drop the copies of the parent's lock descriptors. Closing a copy
    leaves the lock with the parent, whose descriptor still refers to the locked file."""
    for fd in _HELD:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()
    _HELD_LOCK.release()


os.register_at_fork(before=_HELD_LOCK.acquire, after_in_parent=_HELD_LOCK.release, after_in_child=_close_inherited)


class FileLock:
    """One acquisition of the exclusive ``flock`` on ``path`` (created when missing).

    ``with FileLock(path):`` waits as long as it takes; ``acquire(blocking=False)`` tries once.
    A child forked while this is held does not hold it (see above); releasing it there only
    forgets it.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._pid = 0
        """The process that opened ``_fd``: in any other (a forked child) it is closed already."""

    def acquire(self, *, blocking: bool = True) -> bool:
        """Take the lock; without ``blocking``, return False at once when another holds it."""
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already locked by this FileLock")
        operation = fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB)
        for _ in range(MAX_REOPENS):
            with _HELD_LOCK:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
                _HELD.add(fd)
            try:
                fcntl.flock(fd, operation)
            except BlockingIOError:
                _close(fd)
                return False
            except BaseException:
                _close(fd)
                raise
            if _same_file(fd, self.path):
                self._fd, self._pid = fd, os.getpid()
                return True
            _close(fd)  # the holder before us unlinked it: lock the file now at the path
        raise RuntimeError(f"could not lock {self.path}: it was replaced {MAX_REOPENS} times")

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None and self._pid == os.getpid():
            _close(fd)  # closing the last descriptor drops the flock
        # else: a forked child, which closed its copy when forked; the number may be another
        # file's by now

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


def _close(fd: int) -> None:
    with _HELD_LOCK:
        _HELD.discard(fd)
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (on_disk.st_dev, on_disk.st_ino)
