"""Restore: a task's state from its handle back into files, verified, whole or not at all.

Each file is read by its name in the pipeline's job, ``state/<key>``, and its bytes are checked
against the key: through a :class:`~blobsvc.cache.BlobCache` (fetched once per host, then
copied from the cache and hashed; the next restore on that host costs no transfer), else
straight from the server with :meth:`BlobClient.get_file`. Everything is
written under a temporary name beside ``dest`` and renamed into place at the end, so a
failed restore leaves nothing at ``dest``. Files are read-only (0444) unless ``writable``;
directories stay writable so that the state can be removed.

``dest`` must not exist (an empty directory is accepted for a directory's state): a restore
never mixes its files with others. The handle's paths were checked when it was parsed (no
absolute path, no ``..``), so nothing is written outside ``dest``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from pathlib import Path

from .._exceptions import CheckpointError, DigestMismatch, InvalidArgument
from ..cache import BlobCache, JobBlobs
from ..client import BlobClient
from ..wire._checkpoints import FileEntry, TaskHandle, pipeline_job, state_name
from ..wire._ids import hash_file

__all__ = ["discard", "restore"]


def restore(
    pipeline: str,
    handle: TaskHandle,
    dest: str | os.PathLike[str],
    *,
    client: BlobClient,
    cache: BlobCache | None = None,
    writable: bool = False,
) -> Path:
    """Write ``handle``'s state at ``dest`` (a directory for a directory's state, else a
    file); returns ``dest``."""
    dest = Path(dest)
    replaces_empty_dir = False
    if dest.is_dir() and not dest.is_symlink() and handle.kind == "directory" and not any(dest.iterdir()):
        replaces_empty_dir = True
    elif os.path.lexists(dest):
        raise InvalidArgument(f"{dest} exists: a restore writes a new file or directory")
    if not dest.parent.is_dir():
        raise InvalidArgument(f"{dest.parent} is not a directory: a restore writes into one that exists")
    temp = dest.parent / f".{dest.name}.restore-{secrets.token_hex(6)}"
    job = pipeline_job(pipeline)
    try:
        with cache.job(job) if cache is not None else contextlib.nullcontext() as blobs:
            if handle.kind == "directory":
                temp.mkdir()
                for entry in handle.files:
                    target = temp.joinpath(*entry.path.split("/"))
                    target.parent.mkdir(parents=True, exist_ok=True)
                    _fetch(entry, target, job, client, blobs, writable)
            else:
                _fetch(handle.files[0], temp, job, client, blobs, writable)
        if replaces_empty_dir:
            dest.rmdir()
        os.rename(temp, dest)
    except BaseException as exc:
        discard(temp)
        if isinstance(exc, OSError):  # name what the user gave, not the temporary file
            raise CheckpointError(f"cannot restore to {dest}: {exc.strerror or exc}") from exc
        raise
    return dest


def discard(temp: Path) -> None:
    """Remove a failed restore's temporary file or directory, whatever it holds."""
    if temp.is_dir() and not temp.is_symlink():
        shutil.rmtree(temp, ignore_errors=True)
    with contextlib.suppress(OSError):
        temp.unlink()


def _fetch(
    entry: FileEntry, target: Path, job: bytes, client: BlobClient, blobs: JobBlobs | None, writable: bool
) -> None:
    name = state_name(bytes.fromhex(entry.key))
    if blobs is not None:
        shutil.copyfile(blobs.path(name), target)
        key = hash_file(target).hex()
    else:
        key = client.get_file(target, job=job, name=name).key
    if key != entry.key:
        raise DigestMismatch(f"{entry.path or 'the state'}: the server's {name} holds other bytes ({key})")
    os.chmod(target, 0o644 if writable else 0o444)
