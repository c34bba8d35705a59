"""The driver's memory of file digests, so that publishing an unchanged file does not read it.

Publishing (``blobsvc.spark.publish``, ``environment``, ``blobsvc spark-conf``) hashes each
file to ask the server whether it holds the bytes (LINK, STAT); for a model or an environment
of a few GiB that read is most of what a re-run costs. So each digest is kept beside the
file's stamp (device, inode, size, mtime and ctime in nanoseconds) in
``<cache dir>/digests/``, and reused while the stamp is unchanged. ctime cannot be set from
user space, and moves on every write, rename over, ``utime`` or ``chmod``, so a changed file
is rehashed however its mtime was set. A file modified within ``RACY_SECONDS`` of hashing is
not remembered (git's "racy clean" rule): a write in the same clock tick would leave the
stamp as it was.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import blake3

from ..wire._ids import hash_file

__all__ = ["RACY_SECONDS", "file_digest", "save_record"]

RACY_SECONDS = 2.0


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def file_digest(path: Path, memory: Path | None) -> bytes:
    """BLAKE3 of the file at ``path``, read from ``memory`` (a directory) when the file is
    as it was when last hashed, else computed and remembered there."""
    if memory is None:
        return hash_file(path)
    path = path.resolve()
    record = memory / blake3.blake3(os.fsencode(path)).hexdigest()
    before = os.stat(path)
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        saved = json.loads(record.read_text())
        if saved["stamp"] == _stamp(before):
            return bytes.fromhex(saved["key"])
    key = hash_file(path)
    after = os.stat(path)
    if _stamp(after) == _stamp(before) and time.time() - max(after.st_mtime, after.st_ctime) > RACY_SECONDS:
        save_record(record, {"path": str(path), "stamp": _stamp(after), "key": key.hex()})
    return key


def save_record(record: Path, document: dict[str, Any]) -> None:
    """``document`` as JSON at ``record`` (a file of a memory directory), whole or not at all:
    written beside it, then renamed over it. A memory that cannot be written only costs the
    work it saves again."""
    with contextlib.suppress(OSError):
        record.parent.mkdir(parents=True, exist_ok=True)
        temp = record.parent / f".{record.name}.{uuid.uuid4().hex}"
        temp.write_text(json.dumps(document))
        os.replace(temp, record)
