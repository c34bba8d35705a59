"""Store writes: a task puts a new state file's bytes straight into the HA store.

:Status: Production for local directories and shared mounts; tested on ``s3://`` (s3fs
against moto's S3 server); other fsspec URLs as their backend allows.

The other half of :mod:`blobsvc.ha.reads`, for checkpoint state: as Flink's TaskManagers write
their state to the checkpoint storage themselves and send the JobManager handles, a task writes
the content object of a file's key (:func:`blobsvc.ha.store.object_path`) and then LINKs its
name, which the leader records in the store without reading a byte
(:meth:`blobsvc.ha.store.FileSystemBlobStore.adopt`). A writer writes only ``objects/``, never
a name record or a ref, and never moves or deletes anything another wrote.

Rules:

* **What is written hashes to its key.** The bytes are hashed as they are written; when the
  whole does not hash to the key (the file changed since it was hashed), the copy never
  appears where the store can promise that (a directory: the temporary file is never renamed)
  and is removed at once where it cannot (S3), and :class:`StateChanged` is raised. A task
  could still write anything there: that is the trust model of docs/ha.md (every reader
  verifies every byte).
* **Every other failure** (the store unreachable, credentials refused, a full disk, no
  backend) raises :class:`StoreUnwritable`, naming the store and the cause: the caller sends
  the bytes to the server instead.
* Credentials and endpoints are the store's own, as for store reads.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import blake3

from .._exceptions import InvalidArgument
from .store import CHUNK, failure, object_path, open_files

__all__ = ["StateChanged", "StoreUnwritable", "StoreWriter"]

# Tries of each request to the store: a write that fails sends its bytes to the server, so
# retrying long only delays that; a few tries ride out an object store's passing 503s.
WRITE_ATTEMPTS = 3


class StoreUnwritable(OSError):
    """The store could not be written: unreachable, no access, full, no backend."""


class StateChanged(InvalidArgument):
    """The file's bytes no longer hash to the key it was written under: it changed."""


class StoreWriter:
    """Writes content objects into the HA store at ``location`` (a directory or an fsspec
    URL), connecting within ``connect_timeout`` (on ``s3://``)."""

    def __init__(self, location: str, *, connect_timeout: float | None = None) -> None:
        self.location = location
        try:
            self._files: Any = open_files(location, connect_timeout=connect_timeout, attempts=WRITE_ATTEMPTS)
        except ImportError as exc:  # fsspec, or the backend of the URL's scheme
            raise StoreUnwritable(f"cannot open the store {location}: {exc}") from None
        except (OSError, ValueError) as exc:
            raise StoreUnwritable(f"cannot open the store {location}: {exc}") from None

    def write(self, key: bytes, source: Path) -> None:
        """Write the bytes of ``source``, which hashed to ``key``, as the object of ``key``."""
        hasher = blake3.blake3()
        try:
            reading = open(source, "rb")  # noqa: SIM115  # read by the generator below, closed by its with
        except OSError as exc:
            raise StateChanged(f"{source} could not be read: {exc.strerror}") from None

        def chunks() -> Iterator[bytes]:
            while True:
                try:
                    chunk = reading.read(CHUNK)
                except OSError as exc:
                    raise StateChanged(f"{source} could not be read: {exc.strerror}") from None
                if not chunk:
                    return
                hasher.update(chunk)
                yield chunk

        def check() -> None:
            if hasher.digest() != key:
                raise StateChanged(f"{source} changed while it was written to the store: state must hold still")

        with reading:
            try:
                self._files.write_checked(object_path(key.hex()), chunks(), check, os.fstat(reading.fileno()).st_size)
            except StateChanged:
                raise
            except Exception as exc:  # OSError, or a backend's own (botocore's are not OSErrors)
                raise StoreUnwritable(
                    f"cannot write {key.hex()} to the store {self.location}: {failure(exc)}"
                ) from None
