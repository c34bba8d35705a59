"""Disk blocks for a file before its bytes: :func:`preallocate`, for the server's large
uploads and the client's downloads, whose sizes are known before their first byte.

``fallocate(FALLOC_FL_KEEP_SIZE)`` gives the file its blocks in one call and leaves its
size as it is, so that a partial download still tells by its size how much it holds. Two
things follow:

* a disk that cannot hold the file says so (ENOSPC, EDQUOT) before any byte is moved, not
  hundreds of megabytes later;
* each write finds its blocks allocated: on ext4, writing 512 MiB into a new file's page
  cache took 50-54 ms of CPU this way against 87-116 ms with a block reservation per page
  (issue 9, benchmarks/RESULTS.md).

``posix_fallocate`` is not used: where the file system cannot preallocate, glibc emulates it
by writing a zero into every block, and it makes the file as large as the space asked for.
Where the call is missing (not Linux) or the file system refuses it (EOPNOTSUPP: some
network file systems), nothing is reserved and the writes allocate as they go, as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
from collections.abc import Callable

__all__ = ["preallocate"]

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
