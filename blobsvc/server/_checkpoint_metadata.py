"""Reading and checking a checkpoint's metadata blob on the server, at a bounded cost.

* A metadata blob over :data:`MAX_METADATA_BYTES` is refused from its size, before a byte of it
  is read; reading, hashing and parsing run in worker threads, never on the event loop, and
  every check of the parse is linear in the blob's size (:func:`parse_metadata`).
* What a metadata blob references (its state keys, as bytes) is remembered only for records
  that exist (:meth:`MetadataReader.remember`, :meth:`MetadataReader.keys`): a refused
  completion leaves nothing behind.
* A record whose metadata was parsed intact once is only re-hashed by ``list``
  (:meth:`MetadataReader.verify`), never re-parsed: a list's cost does not grow with the depth
  of any checkpoint's paths.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import blake3

from .._exceptions import BadRequest, DigestMismatch, InvalidArgument, NotFound
from ..wire._checkpoints import (
    MAX_METADATA_BYTES,
    FileEntry,
    Metadata,
    metadata_name,
    parse_metadata,
    pipeline_job,
    state_name,
)
from ..wire._protocol import ContentKey, JobBlob

if TYPE_CHECKING:
    from ..ha import HighAvailability
    from ..ha.checkpoints import Record
    from ..storage import BlobStorage, OpenBlob

__all__ = ["MetadataReader"]

_T = TypeVar("_T")


class _Server(Protocol):
    @property
    def storage(self) -> BlobStorage: ...

    @property
    def ha(self) -> HighAvailability: ...

    async def open_blob(self, target: ContentKey | JobBlob) -> OpenBlob: ...


class MetadataReader:
    """The metadata blobs of every pipeline's checkpoints, as one server reads them."""

    def __init__(self, server: _Server) -> None:
        self.server = server
        # The state keys of records' metadata, by (pipeline, id, metadata key): a blob's content
        # never changes under its key, so what it references never does either.
        self._keys: dict[tuple[str, int, str], frozenset[bytes]] = {}
        # One thread of its own reads, parses and checks metadata, one blob at a time: what
        # parsing costs in memory is bounded by one maximum-size blob, however many clients
        # complete at once; and the memory a parse frees goes back to that thread's allocator
        # arena, where the next parse finds it, rather than to whichever of the default
        # pool's threads ran it (each would keep its own).
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="blobsvc-metadata")

    async def _open(self, pipeline: str, checkpoint_id: int, key: str, work: Callable[..., _T]) -> tuple[_T, int]:
        """``work(fd, size, key, checkpoint_id)`` on the blob ``meta/<id>`` in the metadata
        thread, and the blob's size, checked before a byte of it is read."""
        target = JobBlob(pipeline_job(pipeline), metadata_name(checkpoint_id))
        try:
            blob = await self.server.open_blob(target)
        except NotFound:
            raise NotFound(f"checkpoint {checkpoint_id}'s metadata blob is missing") from None
        with blob:
            if blob.size > MAX_METADATA_BYTES:
                raise BadRequest(
                    f"checkpoint {checkpoint_id}'s metadata is {blob.size} bytes, "
                    f"over the limit of {MAX_METADATA_BYTES}"
                )
            return await self._run(work, blob.fd, blob.size, key, checkpoint_id), blob.size

    async def read(self, pipeline: str, checkpoint_id: int, key: str) -> tuple[Metadata, int]:
        """The metadata and its size, checked and parsed in the metadata thread
        (:class:`BadRequest` when it is not valid)."""
        return await self._open(pipeline, checkpoint_id, key, _read_parsed)

    async def _run(self, work: Callable[..., _T], *args: Any) -> _T:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._thread, work, *args)
        except RuntimeError:  # closed: the server is stopping, and any thread does for what is left
            return await asyncio.to_thread(work, *args)

    def close(self) -> None:
        """Let the metadata thread end once its work is done."""
        self._thread.shutdown(wait=False)

    def remember(self, pipeline: str, record: Record, metadata: Metadata) -> None:
        """Keep what ``record``'s metadata references: call once the record is added."""
        self._keys[(pipeline, record["id"], record["metadata"])] = frozenset(metadata.keys())

    async def keys(self, pipeline: str, record: Record) -> frozenset[bytes]:
        """The state keys ``record``'s metadata references (read once, then remembered)."""
        cached = self._keys.get((pipeline, record["id"], record["metadata"]))
        if cached is None:
            metadata, _ = await self.read(pipeline, record["id"], record["metadata"])
            self.remember(pipeline, record, metadata)
            cached = self._keys[(pipeline, record["id"], record["metadata"])]
        return cached

    async def verify(self, pipeline: str, record: Record) -> None:
        """Check ``record``'s metadata blob is there and intact: re-hashed when it was parsed
        intact before, else read in full (:meth:`keys`)."""
        if (pipeline, record["id"], record["metadata"]) in self._keys:
            await self._open(pipeline, record["id"], record["metadata"], _read)
        else:
            await self.keys(pipeline, record)

    def forget(self, pipeline: str, keep_ids: set[int]) -> None:
        """Forget the pipeline's records but those of ``keep_ids``."""
        self._keys = {k: v for k, v in self._keys.items() if k[0] != pipeline or k[1] in keep_ids}

    async def check_state(self, pipeline: str, metadata: Metadata) -> None:
        """Every state file the metadata references is held under its name with that content:
        on local disk (hashed when it was received), or else in the HA store, by its record
        and its object's size, no byte read (a task wrote it there, or a new leader has not
        fetched it yet: whoever reads it verifies it)."""
        job = pipeline_job(pipeline)
        entries = [(task, entry) for task, handle in metadata.tasks.items() for entry in handle.files]
        # Every name stat-ed in one worker thread: a thread hop per file would cost more than the stat.
        missing = await self._run(self._check_local, job, entries, metadata.checkpoint_id)
        targets = [JobBlob(job, state_name(bytes.fromhex(entries[index][1].key))) for index in missing]
        for index, stored in zip(missing, await self.server.ha.stat_stored(targets), strict=True):
            task, entry = entries[index]
            if stored is None:
                raise NotFound(
                    f"checkpoint {metadata.checkpoint_id}: task {task}'s state {entry.path or entry.key} "
                    "is not on the server (discarded meanwhile?): not completed"
                )
            _check_entry(metadata.checkpoint_id, task, entry, *stored)

    def _check_local(self, job: bytes, entries: list[tuple[str, FileEntry]], checkpoint_id: int) -> list[int]:
        """Check each entry against the local disk; the indices of those it does not hold."""
        missing = []
        for index, (task, entry) in enumerate(entries):
            try:
                size, digest = self.server.storage.stat(JobBlob(job, state_name(bytes.fromhex(entry.key))))
            except NotFound:
                missing.append(index)
                continue
            _check_entry(checkpoint_id, task, entry, size, digest)
        return missing


def _check_entry(checkpoint_id: int, task: str, entry: FileEntry, size: int, digest: bytes) -> None:
    if digest.hex() != entry.key or size != entry.size:
        raise DigestMismatch(
            f"checkpoint {checkpoint_id}: task {task}'s state {entry.path or entry.key} "
            "does not hold what its handle says: not completed"
        )


def _read(fd: int, size: int, key: str, checkpoint_id: int) -> bytes:
    """The ``size`` bytes at ``fd``, all there and hashing to ``key`` (else :class:`DigestMismatch`)."""
    raw = os.pread(fd, size, 0)
    if len(raw) != size or blake3.blake3(raw).hexdigest() != key:
        raise DigestMismatch(f"checkpoint {checkpoint_id}'s metadata blob is damaged: its bytes do not hash to {key}")
    return raw


def _read_parsed(fd: int, size: int, key: str, checkpoint_id: int) -> Metadata:
    """:func:`_read`, parsed: the bytes go to the parser with no other reference, which drops
    them and their text as soon as it can (only the parsed metadata stays)."""
    try:
        return parse_metadata(_read(fd, size, key, checkpoint_id))
    except InvalidArgument as exc:
        raise BadRequest(f"checkpoint {checkpoint_id}'s metadata: {exc}") from None
