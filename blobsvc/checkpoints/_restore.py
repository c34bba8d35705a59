"""Restore: a task's state from its handle back into files, verified, whole or not at all.

Each file is read by its name in the pipeline's job, ``state/<key>``, and its bytes are checked
against the key: through a :class:`~blobsvc.cache.BlobCache` (fetched once per host, then
hashed while it is copied out of the cache; the next restore on that host costs no
transfer), else straight from the server with :meth:`BlobClient.get_file`. The cache checks
a copy cheaply (size, mtime, inode), so rot that keeps all three would pass it: the hash taken
while copying catches it, and the rotten copy is dropped from the cache and fetched again.
Everything is written under a temporary name beside ``dest`` and renamed into place at the
end, so a failed restore leaves nothing at ``dest``. Files are read-only (0444) unless
``writable``; directories stay writable so that the state can be removed.

``dest`` must not exist (an empty directory is accepted for a directory's state): a restore
never mixes its files with others. Every handle is checked as one read from JSON is
(:meth:`TaskHandle.from_json`: no absolute path, no ``..``, no empty name), a handle object
built in code included, so nothing is written outside ``dest``. Directories are made and
removed with loops, not recursion: a path thousands of levels deep is no RecursionError.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

import blake3

from .._exceptions import CheckpointError, DigestMismatch, InvalidArgument, InvalidArgumentType
from ..cache import BlobCache, JobBlobs
from ..client import BlobClient
from ..wire._checkpoints import FileEntry, TaskHandle, pipeline_job, state_name

__all__ = ["remove_tree", "restore"]

_CHUNK = 1 << 20


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
    handle = _checked(handle)
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
                made: set[str] = set()
                for entry in handle.files:
                    _make_parents(temp, entry.path, made)
                    _fetch(entry, temp.joinpath(*entry.path.split("/")), job, client, cache, blobs, writable)
            else:
                _fetch(handle.files[0], temp, job, client, cache, blobs, writable)
        if replaces_empty_dir:
            dest.rmdir()
        os.rename(temp, dest)
    except BaseException as exc:
        remove_tree(temp)
        if isinstance(exc, OSError):  # name what the user gave, not the temporary file
            raise CheckpointError(f"cannot restore to {dest}: {exc.strerror or exc}") from exc
        raise
    return dest


def _checked(handle: object) -> TaskHandle:
    """``handle`` checked as its JSON form would be: a handle object built in code gets no
    trust that a parsed one would not."""
    files = getattr(handle, "files", None)
    if not isinstance(handle, TaskHandle) or not isinstance(files, tuple | list):
        raise InvalidArgumentType(f"a restore takes a TaskHandle, not {type(handle).__name__}")
    if not all(isinstance(entry, FileEntry) for entry in files):
        raise InvalidArgumentType(f"task {handle.task}: a handle's files are FileEntry objects")
    return TaskHandle.from_json(handle.to_json())


def _make_parents(root: Path, relative: str, made: set[str]) -> None:
    """The directories under ``root`` that file ``relative`` needs, one level at a time."""
    parts = relative.split("/")[:-1]
    for depth in range(1, len(parts) + 1):
        directory = "/".join(parts[:depth])
        if directory not in made:
            with contextlib.suppress(FileExistsError):
                os.mkdir(root / directory)
            made.add(directory)


def remove_tree(path: Path) -> None:
    """Remove ``path`` (a file, or a directory and everything under it) if it is there: a
    stack, not recursion, however deep the tree."""
    try:
        if not stat.S_ISDIR(path.lstat().st_mode):
            path.unlink()
            return
    except FileNotFoundError:
        return
    stack = [str(path)]
    while stack:
        directory = stack[-1]
        subdirectories = []
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    subdirectories.append(entry.path)
                else:
                    os.unlink(entry.path)
        if subdirectories:
            stack.extend(subdirectories)  # this directory comes up again once they are gone
        else:
            os.rmdir(stack.pop())


def _fetch(
    entry: FileEntry,
    target: Path,
    job: bytes,
    client: BlobClient,
    cache: BlobCache | None,
    blobs: JobBlobs | None,
    writable: bool,
) -> None:
    name = state_name(bytes.fromhex(entry.key))
    if cache is not None and blobs is not None:
        key = _copy_hashing(blobs.path(name), target)
        if key != entry.key:  # the cached copy rotted under an unchanged stamp: drop it, once more
            with cache.store.key_lock(entry.key):
                cache.store.verify(entry.key, rehash=True)
            key = _copy_hashing(blobs.path(name), target)
    else:
        key = client.get_file(target, job=job, name=name).key
    if key != entry.key:
        raise DigestMismatch(f"{entry.path or 'the state'}: the server's {name} holds other bytes ({key})")
    os.chmod(target, 0o644 if writable else 0o444)


def _copy_hashing(source: Path, target: Path) -> str:
    """Copy ``source`` to ``target`` (made anew) and return the BLAKE3 of what was copied."""
    hasher = blake3.blake3()
    with open(source, "rb") as reader, open(target, "wb") as writer:
        while chunk := reader.read(_CHUNK):
            hasher.update(chunk)
            writer.write(chunk)
    return hasher.hexdigest()
