"""Store reads: an executor host copies a blob's bytes straight from the HA store.

:Status: Production for local directories and shared mounts; tested on ``s3://`` (s3fs
against moto's S3 server); other fsspec URLs as their backend allows.

A server in recovery mode zookeeper names its store in STATUS (``store``); a BlobCache that
misses opens a :class:`StoreReader` on that location and copies the content object of the
key the server's STAT answered, so that the server sends names and sizes, and the store
(built for many readers: S3, GCS, HDFS, a shared mount) sends the bytes, as Flink's
BlobCaches read its HA blob store directly (FLINK-5129). The layout is the store's own
(:func:`blobsvc.ha.store.object_path`); a reader reads only ``objects/``, never a name
record, and never writes, moves or deletes anything in the store.

Rules, and what happens on failure:

* **Every byte is verified.** The file's bytes held before the read and those read are
  hashed together; the copy is good only when the whole hashes to the key. A copy of the
  wrong size, a short one, or one that does not hash to its key raises
  :class:`StoreCopyRefused` (a :class:`DigestMismatch`): the caller must not keep it. The
  store's copy is left where it is: only the leader moves a damaged copy aside.
* **Any other failure** (no object under the key, the store unreachable, credentials
  refused, fsspec or the URL's backend not installed, a directory not mounted on this host)
  raises :class:`StoreUnreadable` naming the store and the cause. Bytes already appended
  stay in the file, as a broken download's do, for the next attempt to resume from.
* **Reads resume.** A read starts at the bytes the file holds already (a download a dead
  process left), reading the object from that offset.
* Credentials and endpoints are the store's own (``AWS_*`` variables, ``~/.aws``, and so on
  for s3fs): nothing of blobsvc's.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Generator
from typing import Any

import blake3

from .._exceptions import DigestMismatch
from .store import failure, object_path, open_files

__all__ = ["StoreCopyRefused", "StoreReader", "StoreUnreadable"]


class StoreUnreadable(OSError):
    """The store could not be read: no such object, no such store here, no backend, no access."""


class StoreCopyRefused(DigestMismatch):
    """The store's copy is not the blob it is filed under: never to be kept or served."""


class StoreReader:
    """Reads content objects of the HA store at ``location`` (a directory or an fsspec URL),
    connecting within ``connect_timeout`` (on ``s3://``; other backends keep their own)."""

    def __init__(self, location: str, *, connect_timeout: float | None = None) -> None:
        self.location = location
        try:
            # One try, bounded: a cache whose store read fails has the server to fall back on.
            self._files: Any = open_files(location, connect_timeout=connect_timeout, attempts=1)
        except ImportError as exc:  # fsspec, or the backend of the URL's scheme (s3fs, gcsfs…)
            raise StoreUnreadable(f"cannot open the store {location}: {exc}") from None
        except (OSError, ValueError) as exc:
            raise StoreUnreadable(f"cannot open the store {location}: {exc}") from None

    def read_into(
        self,
        key: str,
        size: int,
        partial: str | os.PathLike[str],
        *,
        fsync: bool = False,
        received: Callable[[int], object] = lambda n: None,
    ) -> None:
        """Append the object of ``key`` (``size`` bytes) to ``partial`` after the bytes it
        holds, and verify the whole file against ``key``; with ``fsync``, flush it. Each
        chunk's length goes to ``received`` once it is written."""
        path = object_path(key)
        try:
            stored = self._files.size(path)
        except Exception as exc:  # a backend's own errors (botocore's, say) are not OSErrors
            raise StoreUnreadable(f"cannot reach the store {self.location}: {failure(exc)}") from None
        if stored is None:
            raise StoreUnreadable(f"the store {self.location} has no copy of {key}")
        if stored != size:
            raise StoreCopyRefused(f"the store {self.location} holds {stored} bytes under {key}, which has {size}")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            self._append(fd, partial, key, size, path, received)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def _append(
        self,
        fd: int,
        partial: str | os.PathLike[str],
        key: str,
        size: int,
        path: str,
        received: Callable[[int], object],
    ) -> None:
        held = os.fstat(fd).st_size
        hasher = blake3.blake3()
        if held > size:  # not this blob's beginning, whatever it is: start over
            os.ftruncate(fd, 0)
            held = 0
        if held:
            hasher.update_mmap(os.fspath(partial))
        os.lseek(fd, held, os.SEEK_SET)
        missing = size - held
        chunks: Generator[bytes, None, None] = self._files.chunks(path, held)  # opens nothing until read
        with contextlib.closing(chunks):  # its file closes now, not when it is collected
            while missing:
                # Only the store's side is caught here: writing to the local file fails with
                # its own OSError (a full disk), which is the caller's to see.
                try:
                    chunk = next(chunks, b"")
                except FileNotFoundError:
                    raise StoreUnreadable(f"the store {self.location} has no copy of {key}") from None
                except Exception as exc:  # OSError, or a backend's own (botocore's are not OSErrors)
                    raise StoreUnreadable(f"reading {key} from {self.location} failed: {failure(exc)}") from None
                if not chunk:
                    break
                chunk = chunk[:missing]  # never past the room reserved for the blob
                hasher.update(chunk)
                _write_all(fd, chunk)
                received(len(chunk))
                missing -= len(chunk)
        if missing:
            raise StoreCopyRefused(f"the store {self.location} sent {size - missing} of the {size} bytes of {key}")
        if hasher.digest().hex() != key:
            raise StoreCopyRefused(f"the copy of {key} in the store {self.location} does not hash to its key")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
