"""Snapshot: a task's state (a directory, a file or bytes) stored as content blobs.

Each file's key is found here and the file LINKed as ``state/<key>`` of the pipeline's job;
only when neither the server nor its HA store has the content are its bytes sent: written
straight into the HA store the server names (store writes, :mod:`._store_writes`) and LINKed
again, which the server records without reading a byte; or else PUT to the server under that
name (no content-addressed copy outlives it: once the name is discarded, the bytes go).
The key of a file whose stamp is the one the last snapshot recorded comes from the memory
beside the state (:mod:`._stamps`), unread; any other file is hashed (BLAKE3 on all cores).
A file unchanged since an earlier checkpoint therefore costs a ``stat`` and a LINK, 0 bytes
read or sent: a checkpoint's cost grows with what changed. The handle returned lists every
file with its key and size, and whether its bytes were sent, to the store or the server
(the server's ``checkpoints_state_bytes_sent``).

Symbolic links, devices and sockets in a directory are refused (a restore could not make
them faithfully, and a link could lead out of the state); empty directories are not kept.
The state must not change while it is snapshotted: a file whose stamp moved while it was
hashed is refused (:class:`InvalidArgument`), and one that changes between its hash and its
upload is refused by the server's digest check.
"""

from __future__ import annotations

import concurrent.futures
import os
import stat
from collections.abc import Sequence
from pathlib import Path

import blake3

from .._exceptions import InvalidArgument, NotFound
from ..client import BlobClient
from ..files._stamps import stamp
from ..wire._checkpoints import MAX_FILES, FileEntry, Task, TaskHandle, check_task, pipeline_job, state_name
from ..wire._ids import hash_file
from ._stamps import StampMemory
from ._store_writes import StoreWrites

__all__ = ["SNAPSHOT_THREADS", "snapshot"]

# Files linked or uploaded at once: the server does each LINK in well under a millisecond, so
# a few in flight hide the round trips; more would only queue.
SNAPSHOT_THREADS = 8

StateSource = str | os.PathLike[str] | bytes | bytearray | memoryview


def snapshot(
    client: BlobClient,
    pipeline: str,
    task: Task,
    source: StateSource,
    *,
    immutable: Sequence[str] = (),
    stamps: bool = True,
    store_writes: bool = True,
) -> TaskHandle:
    """Store ``source`` as ``task``'s state for a checkpoint of ``pipeline``; the handle to
    acknowledge it with. With ``stamps``, the files' stamps are remembered beside the state;
    files named by a pattern of ``immutable`` never change once written. With
    ``store_writes``, new files go straight to the server's HA store when it names one."""
    task = check_task(task)
    to = _Destination(client, pipeline_job(pipeline), StoreWrites(client) if store_writes else None)
    if isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
        key = blake3.blake3(data).digest()
        return TaskHandle(task, "bytes", (FileEntry("", len(data), key.hex(), to.store(key, data)),))
    path = Path(source)
    info = _lstat(path)
    if not stat.S_ISREG(info.st_mode) and not stat.S_ISDIR(info.st_mode):
        raise InvalidArgument(f"{path} is neither a directory nor a regular file: it cannot be snapshotted")
    memory = StampMemory.beside(path, immutable) if stamps else None
    if stat.S_ISREG(info.st_mode):
        handle = TaskHandle(task, "file", (_store_file(to, memory, path, ""),))
    else:
        files = _files_under(path)
        with concurrent.futures.ThreadPoolExecutor(SNAPSHOT_THREADS, thread_name_prefix="blobsvc-snapshot") as pool:
            entries = pool.map(lambda relative: _store_file(to, memory, path / relative, relative), files)
            handle = TaskHandle(task, "directory", tuple(entries))
    if memory is not None:
        memory.save()
    return handle


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


def _store_file(to: _Destination, memory: StampMemory | None, path: Path, relative: str) -> FileEntry:
    before = path.stat()
    key = memory.known(relative, before) if memory is not None else None
    if key is None:
        key = hash_file(path)
        if stamp(path.stat()) != stamp(before):
            raise InvalidArgument(f"{path} changed while it was snapshotted: state must hold still during a snapshot")
        if memory is not None:
            memory.remember(relative, before, key)
    return FileEntry(relative, before.st_size, key.hex(), to.store(key, path))


class _Destination:
    """Where one snapshot's state goes: ``job``'s names on the server, the bytes the server
    and its HA store lack written to the store by ``writes`` (None: to the server)."""

    def __init__(self, client: BlobClient, job: bytes, writes: StoreWrites | None) -> None:
        self.client = client
        self.job = job
        self.writes = writes

    def store(self, key: bytes, source: bytes | Path) -> bool:
        """``source`` as ``state/<key>``: LINKed when the server or its store holds the
        content, else written to the store and LINKed, else PUT (its bytes checked against
        ``key`` by the server). Whether its bytes were sent."""
        name = state_name(key)
        if self._link(key, name):
            return False
        written = self.writes is not None and isinstance(source, Path) and self.writes.write(key, source)
        # A written object gone from the store before its LINK (swept, or collected by a
        # delete racing it) leaves the bytes for the server to take.
        if written and self._link(key, name):
            return True
        self.client.put(source, job=self.job, name=name, key=key)
        return True

    def _link(self, key: bytes, name: str) -> bool:
        try:
            self.client.link(key, job=self.job, name=name)
        except NotFound:
            return False
        return True
