"""A file's stamp, and when a stamp may stand for the file's content.

A memory of digests (the driver's, :mod:`blobsvc.driver._digests`; a task's state,
:mod:`blobsvc.checkpoints._stamps`) skips reading a file whose stamp is the one it recorded:
device, inode, size, mtime and ctime in nanoseconds. ctime cannot be set from user space and
moves on every write, rename over, ``utime`` or ``chmod``, so a changed file is read again
however its mtime was set, and an inode reused by a new file has a new ctime.

A stamp taken within ``RACY_SECONDS`` of the file's last change (mtime or ctime) is never
recorded: git's "racily clean" rule. A write in the same tick of the file system's clock
(a jiffy on Linux, 2 s on FAT) leaves mtime and ctime as they were, so only a stamp older
than the coarsest tick tells the content.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

__all__ = ["RACY_SECONDS", "save_record", "settled", "stamp"]

RACY_SECONDS = 2.0  # FAT's mtime granularity, the coarsest of the file systems state lives on


def stamp(st: os.stat_result) -> list[int]:
    """What a memory compares: device, inode, size, mtime and ctime (ns)."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def settled(st: os.stat_result) -> bool:
    """Whether a stamp taken now of a file whose stat is ``st`` may be recorded: its last
    change is more than ``RACY_SECONDS`` ago."""
    return time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > RACY_SECONDS * 1e9


def save_record(record: Path, document: dict[str, Any]) -> None:
    """``document`` as JSON at ``record`` (a memory's file), whole or not at all: written
    beside it, then renamed over it. A memory that cannot be written only costs the work it
    saves again."""
    with contextlib.suppress(OSError):
        record.parent.mkdir(parents=True, exist_ok=True)
        temp = record.parent / f".{record.name}.{uuid.uuid4().hex}"
        try:
            temp.write_text(json.dumps(document))
            os.replace(temp, record)
        finally:
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()
