"""Group commit: concurrent PUTs share the flush that makes them durable.

Each small PUT used to pay its own fsyncs (its file, ``objects/``, its name's directory):
three waits on the disk per request, one after the other. The :class:`GroupCommitter`
queues the publications that arrive while a flush is under way and hands them to
:meth:`BlobStorage.publish_batch` together once it ends, so that 32 PUTs in flight cost one
round of fsyncs instead of 32 rounds. Nothing waits for a batch to fill: a lone PUT
is flushed at once, and batches grow only as large as the load makes them.

Durability does not change: no PUT is answered before its bytes and its names are on disk
(the order is :meth:`BlobStorage.publish_batch`'s, pinned by ``tests/test_group_commit.py``),
and an error in a flush fails every PUT of that batch.
"""

from __future__ import annotations

import asyncio

from ._protocol import JobBlob
from .storage import BlobStorage, Publication, StagedUpload

__all__ = ["GroupCommitter"]

# The most publications one flush takes; the rest wait for the next. Bounds how long the
# first of a batch waits on the last's links.
MAX_BATCH = 256


class GroupCommitter:
    """Publishes uploads for one event loop, in batches, on a worker thread."""

    def __init__(self, storage: BlobStorage) -> None:
        self.storage = storage
        self._queue: list[tuple[Publication, asyncio.Future[bytes]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self.batches = 0
        """Flushes run so far (for tests and operators: publications per flush)."""

    def publish(self, upload: StagedUpload, target: JobBlob | None, digest: bytes) -> asyncio.Future[bytes]:
        """Publish like :meth:`BlobStorage.publish`, with whatever else is publishing now:
        the future of the key. A future, not a coroutine, so that a PUT costs no task of its
        own; wait for it with :func:`~blobsvc._threads.wait_out`, never cancel it: the
        caller must not discard ``upload`` before it is done."""
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._queue.append((Publication(upload, target, digest), future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_all())
        return future

    async def _flush_all(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
            self.batches += 1
            try:
                results = await asyncio.to_thread(self.storage.publish_batch, [item for item, _ in batch])
            except BaseException as exc:  # not a refusal of one upload: every one of them fails
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
                if not isinstance(exc, Exception):
                    raise
                continue
            for (_, future), result in zip(batch, results, strict=True):
                if future.done():
                    continue
                if isinstance(result, Exception):
                    future.set_exception(result)
                else:
                    future.set_result(result)
