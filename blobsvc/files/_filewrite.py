"""Writing a large file whose size is known before its first byte, as the server's uploads and
the client's downloads are: :func:`preallocate` its blocks, then :func:`pwrite_all` its bytes
in pieces of :data:`WRITE_PIECE`.

``fallocate(FALLOC_FL_KEEP_SIZE)`` gives the file its blocks in one call and leaves its
size as it is, so that a partial download still tells by its size how much it holds. A disk
that cannot hold the file says so (ENOSPC, EDQUOT) before any byte is moved, not hundreds of
megabytes later; and each write finds its blocks allocated (on ext4, 256 MiB into a new
file's page cache: 26-33 ms of CPU against 45-52 ms). ``posix_fallocate`` is not used: where
the file system cannot preallocate, glibc emulates it by writing a zero into every block, and
it makes the file as large as the space asked for. Where the call is missing (not Linux) or
the file system refuses it (EOPNOTSUPP: some network file systems), nothing is reserved and
the writes allocate as they go, as before.

Why pieces: the kernel sizes the page-cache folios of a write by the write's length, up to
2 MiB. On a VM whose kernel hands free memory back to its hypervisor (free page reporting,
which works on blocks of 2 MiB and up), 2 MiB folios come from blocks given away when they
lay free for a few seconds, and each such block faults in the hypervisor on first write.
Writing 256 MiB into a new file 8 MiB a call ran at 549 MB/s (median) after 5 s of rest
against 4,330 MB/s right after as much was freed; 256 KiB a call, at 4,269 against 4,212,
as fast as 8 MiB a call where nothing is handed back (``benchmarks/experiments/bench_pages.py``; issue 9,
benchmarks/RESULTS.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
from collections.abc import Callable

__all__ = ["WRITE_PIECE", "preallocate", "pwrite_all"]

WRITE_PIECE = 256 << 10

_FALLOC_FL_KEEP_SIZE = 1
# The file system or the file cannot preallocate; nothing is lost by writing without it.
_UNSUPPORTED = {errno.EOPNOTSUPP, errno.ENOSYS, errno.ENODEV, errno.ESPIPE, errno.EINVAL}


def _fallocate() -> Callable[[int, int, int], None]:
    with contextlib.suppress(OSError, AttributeError):
        fallocate = ctypes.CDLL(None, use_errno=True).fallocate
        fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]

        def reserve(fd: int, offset: int, count: int) -> None:
            if count > 0 and fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, count) != 0:
                code = ctypes.get_errno()
                if code not in _UNSUPPORTED:
                    raise OSError(code, os.strerror(code))

        return reserve
    return lambda fd, offset, count: None


preallocate = _fallocate()
"""``preallocate(fd, offset, count)``: give the open file ``fd`` disk blocks for ``count``
bytes at ``offset``, keeping its size. Raises :class:`OSError` (ENOSPC, EDQUOT, EFBIG) when
the disk cannot hold them; does nothing where preallocation is not supported."""


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset`` of ``fd``, at most :data:`WRITE_PIECE` bytes a call."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view[:WRITE_PIECE], offset)
        view, offset = view[written:], offset + written
