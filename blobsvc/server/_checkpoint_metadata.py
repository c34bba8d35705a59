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
import os
from typing import TYPE_CHECKING, Protocol

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
    from ..ha.checkpoints import Record
    from ..storage import BlobStorage, OpenBlob

__all__ = ["MetadataReader"]


class _Server(Protocol):
    @property
    def storage(self) -> BlobStorage: ...

    async def open_blob(self, target: ContentKey | JobBlob) -> OpenBlob: ...


class MetadataReader:
    """The metadata blobs of every pipeline's checkpoints, as one server reads them."""

    def __init__(self, server: _Server) -> None:
        self.server = server
        # The state keys of records' metadata, by (pipeline, id, metadata key): a blob's content
        # never changes under its key, so what it references never does either.
        self._keys: dict[tuple[str, int, str], frozenset[bytes]] = {}
        self._parsing = asyncio.Lock()

    async def read_text(self, pipeline: str, checkpoint_id: int, key: str) -> tuple[str, int]:
        """The blob ``meta/<id>`` as text, and its size: its size checked before it is read and its bytes
        against ``key``; only the text outlives the worker thread that reads it."""
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
            text = await asyncio.to_thread(_read_checked, blob.fd, blob.size, key)
        if text is None:
            raise DigestMismatch(
                f"checkpoint {checkpoint_id}'s metadata blob is damaged: its bytes do not hash to {key}"
            )
        if isinstance(text, UnicodeDecodeError):
            raise BadRequest(f"checkpoint {checkpoint_id}'s metadata: checkpoint metadata is not UTF-8 JSON")
        return text, blob.size

    async def read(self, pipeline: str, checkpoint_id: int, key: str) -> tuple[Metadata, int]:
        """The metadata and its size, parsed in a worker thread (:class:`BadRequest` when it is
        not valid), one at a time on this server: what parsing costs in memory is bounded by
        one maximum-size blob, however many clients complete at once."""
        async with self._parsing:
            text, size = await self.read_text(pipeline, checkpoint_id, key)
            try:
                return await asyncio.to_thread(parse_metadata, text), size
            except InvalidArgument as exc:
                raise BadRequest(f"checkpoint {checkpoint_id}'s metadata: {exc}") from None

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
            await self.read_text(pipeline, record["id"], record["metadata"])
        else:
            await self.keys(pipeline, record)

    def forget(self, pipeline: str, keep_ids: set[int]) -> None:
        """Forget the pipeline's records but those of ``keep_ids``."""
        self._keys = {k: v for k, v in self._keys.items() if k[0] != pipeline or k[1] in keep_ids}

    async def check_state(self, pipeline: str, metadata: Metadata) -> None:
        """Every state file the metadata references is on the server, with that content."""
        job = pipeline_job(pipeline)
        entries = [(task, entry) for task, handle in metadata.tasks.items() for entry in handle.files]
        # Every name stat-ed in one worker thread: a thread hop per file would cost more than the stat.
        for index in await asyncio.to_thread(self._check_local, job, entries, metadata.checkpoint_id):
            task, entry = entries[index]  # a new leader that has not fetched it yet
            try:
                with await self.server.open_blob(JobBlob(job, state_name(bytes.fromhex(entry.key)))) as blob:
                    _check_entry(metadata.checkpoint_id, task, entry, blob.size, blob.digest)
            except NotFound:
                raise NotFound(
                    f"checkpoint {metadata.checkpoint_id}: task {task}'s state {entry.path or entry.key} "
                    "is not on the server (discarded meanwhile?): not completed"
                ) from None

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


def _read_checked(fd: int, size: int, key: str) -> str | UnicodeDecodeError | None:
    """The ``size`` bytes at ``fd`` as text; None unless they are all there and hash to ``key``."""
    raw = os.pread(fd, size, 0)
    if len(raw) != size or blake3.blake3(raw).hexdigest() != key:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc
