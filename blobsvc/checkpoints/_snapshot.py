"""Snapshot: a task's state (a directory, a file or bytes) stored as content blobs.

Each file is hashed here and LINKed as ``state/<key>`` of the pipeline's job; only when the
server lacks the content are its bytes sent, PUT straight under that name (no
content-addressed copy outlives it: once the name is discarded, the server frees the bytes).
A file unchanged since an earlier checkpoint therefore costs a hash and a LINK, 0 bytes
sent: checkpoints are incremental without tracking what changed. The handle returned lists
every file with its key and size, and whether its bytes were sent (the server's
``checkpoints_state_bytes_sent``).

Symbolic links, devices and sockets in a directory are refused (a restore could not make
them faithfully, and a link could lead out of the state); empty directories are not kept.
The state must not change while it is snapshotted: a file that changes between its hash
and its upload is refused by the server's digest check.
"""

from __future__ import annotations

import concurrent.futures
import os
import stat
from pathlib import Path

import blake3

from .._exceptions import InvalidArgument, NotFound
from ..client import BlobClient
from ..wire._checkpoints import MAX_FILES, FileEntry, Task, TaskHandle, check_task, pipeline_job, state_name
from ..wire._ids import hash_file

__all__ = ["SNAPSHOT_THREADS", "snapshot"]

# Files linked or uploaded at once: the server does each LINK in well under a millisecond, so
# a few in flight hide the round trips; more would only queue.
SNAPSHOT_THREADS = 8

StateSource = str | os.PathLike[str] | bytes | bytearray | memoryview


def snapshot(client: BlobClient, pipeline: str, task: Task, source: StateSource) -> TaskHandle:
    """Store ``source`` as ``task``'s state for a checkpoint of ``pipeline``; the handle to
    acknowledge it with."""
    task = check_task(task)
    job = pipeline_job(pipeline)
    if isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
        key = blake3.blake3(data).digest()
        return TaskHandle(task, "bytes", (FileEntry("", len(data), key.hex(), _store(client, job, key, data)),))
    path = Path(source)
    info = _lstat(path)
    if stat.S_ISREG(info.st_mode):
        return TaskHandle(task, "file", (_store_file(client, job, path, ""),))
    if not stat.S_ISDIR(info.st_mode):
        raise InvalidArgument(f"{path} is neither a directory nor a regular file: it cannot be snapshotted")
    files = _files_under(path)
    with concurrent.futures.ThreadPoolExecutor(SNAPSHOT_THREADS, thread_name_prefix="blobsvc-snapshot") as pool:
        entries = list(pool.map(lambda relative: _store_file(client, job, path / relative, relative), files))
    return TaskHandle(task, "directory", tuple(entries))


def _lstat(path: Path) -> os.stat_result:
    try:
        return path.lstat()
    except FileNotFoundError:
        raise InvalidArgument(f"{path} does not exist: nothing to snapshot") from None


def _files_under(root: Path) -> list[str]:
    """The regular files under ``root``, as sorted POSIX paths relative to it: walked with a
    stack, not recursion (nor ``os.walk``, which recurses), however deep the tree."""
    found: list[str] = []
    stack = [""]
    while stack:
        relative = stack.pop()
        with os.scandir(root / relative if relative else root) as entries:
            for entry in entries:
                path = f"{relative}/{entry.name}" if relative else entry.name
                if entry.is_dir(follow_symlinks=False):
                    stack.append(path)
                    continue
                if not entry.is_file(follow_symlinks=False):
                    raise InvalidArgument(f"{entry.path} is not a regular file: state holds files and directories only")
                found.append(path)
                if len(found) > MAX_FILES:
                    raise InvalidArgument(f"{root} holds more than {MAX_FILES} files: too many for one task's state")
    return sorted(found)


def _store_file(client: BlobClient, job: bytes, path: Path, relative: str) -> FileEntry:
    size = path.stat().st_size
    key = hash_file(path)
    return FileEntry(relative, size, key.hex(), _store(client, job, key, path))


def _store(client: BlobClient, job: bytes, key: bytes, source: bytes | Path) -> bool:
    """``source`` as ``state/<key>``: LINKed when the server holds the content, else PUT
    (its bytes checked against ``key`` by the server). Whether its bytes were sent."""
    name = state_name(key)
    try:
        client.link(key, job=job, name=name)
        return False
    except NotFound:
        client.put(source, job=job, name=name, key=key)
        return True
