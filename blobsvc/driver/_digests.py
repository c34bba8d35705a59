"""The driver's memory of file digests, so that publishing an unchanged file does not read it.

Publishing (``blobsvc.spark.publish``, ``environment``, ``blobsvc spark-conf``) hashes each
file to ask the server whether it holds the bytes (LINK, STAT); for a model or an environment
of a few GiB that read is most of what a re-run costs. So each digest is kept beside the
file's stamp in ``<cache dir>/digests/``, and reused while the stamp is unchanged; when a
stamp may be trusted is :mod:`blobsvc.files._stamps`' rule (ctime, and git's "racily clean").
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import blake3

from ..files._stamps import save_record, settled, stamp
from ..wire._ids import hash_file

__all__ = ["file_digest"]


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
        if saved["stamp"] == stamp(before):
            return bytes.fromhex(saved["key"])
    key = hash_file(path)
    after = os.stat(path)
    if stamp(after) == stamp(before) and settled(after):
        save_record(record, {"path": str(path), "stamp": stamp(after), "key": key.hex()})
    return key
