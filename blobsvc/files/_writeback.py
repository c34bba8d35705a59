"""Getting written bytes and names to disk, for the server's storage and HA store and the
client's durable downloads: :func:`fsync_dir` for names, and :func:`start_writeback`
(``sync_file_range(SYNC_FILE_RANGE_WRITE)``) to start a file's bytes early.

``sync_file_range`` asks the kernel to start writing a range to disk and returns without
waiting, so the ``fsync`` that must follow (it alone makes anything durable) finds the bytes
already on their way. A client download starts each written piece while it receives the next; the
server's batch flush starts every file of the batch before it waits on the first, so that
the disk gets them together. Linux's libc has it; elsewhere it does nothing, and the fsyncs
do all the work as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["fsync_dir", "start_writeback"]

_SYNC_FILE_RANGE_WRITE = 2


def _writeback_starter() -> Callable[[int, int, int], None]:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        sync_file_range = libc.sync_file_range
        sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        return lambda fd, offset, count: sync_file_range(fd, offset, count, _SYNC_FILE_RANGE_WRITE) and None
    return lambda fd, offset, count: None


start_writeback = _writeback_starter()
"""``start_writeback(fd, offset, count)``: start writing ``count`` bytes at ``offset`` (0:
to the end of the file) to disk, without waiting. Never raises."""


def fsync_dir(path: Path) -> None:
    """Make the names in directory ``path`` (new, renamed, removed) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
