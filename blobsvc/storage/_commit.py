"""Group commit: concurrent PUTs share the flush that makes them durable.

Each small PUT used to pay its own fsyncs (its file, ``objects/``, its name's directory):
three waits on the disk per request, one after the other. The :class:`GroupCommitter`
queues the publications that arrive while a flush is under way and hands them to
:meth:`BlobStorage.publish_batch` together once it ends, so that 32 PUTs in flight cost one
round of fsyncs instead of 32 rounds. Nothing waits for a batch to fill: a lone PUT
is flushed at once, and batches grow only as large as the load makes them.

Durability does not change: no PUT is answered before its bytes and its names are on disk
(the order is :meth:`BlobStorage.publish_batch`'s, pinned by ``tests/test_group_commit.py``),
and an error in a flush fails the PUTs it leaves without durability, never another.
"""

from __future__ import annotations

import asyncio

from ..wire._protocol import JobBlob
from . import BlobStorage, Publication, StagedUpload

__all__ = ["GroupCommitter"]

# The most publications one flush takes; the rest wait for the next. Bounds how long the
# first of a batch waits on the last's links.
MAX_BATCH = 256


class GroupCommitter:
    """Publishes uploads for one event loop, in batches, on a worker thread.

    A batch is handed to the loop's default executor and its results taken back by a done
    callback, which hands on the next batch: no task, no coroutine steps and no context copy
    per batch (``asyncio.to_thread``'s), which cost the event loop more than the handoff. The
    first batch after a pause starts at the loop's next iteration, so that the publications
    of this one (several connections' PUTs read together) share it. The executor's thread
    finishes a batch begun before shutdown (``asyncio.run`` waits for it)."""

    def __init__(self, storage: BlobStorage) -> None:
        self.storage = storage
        self._queue: list[tuple[Publication, asyncio.Future[bytes]]] = []
        self._flushing: list[tuple[Publication, asyncio.Future[bytes]]] | None = None
        self._busy = False  # a batch is flushing or about to: publications wait for it
        self.batches = 0
        """Flushes run so far (for tests and operators: publications per flush)."""

    def publish(self, upload: StagedUpload, target: JobBlob | None, digest: bytes) -> asyncio.Future[bytes]:
        """Publish like :meth:`BlobStorage.publish`, with whatever else is publishing now:
        the future of the key. A future, not a coroutine, so that a PUT costs no task of its
        own; wait for it with :func:`~blobsvc.wire._threads.wait_out`, never cancel it: the
        caller must not discard ``upload`` before it is done."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bytes] = loop.create_future()
        self._queue.append((Publication(upload, target, digest), future))
        if not self._busy:
            self._busy = True
            loop.call_soon(self._flush_next, loop)
        return future

    def _flush_next(self, loop: asyncio.AbstractEventLoop) -> None:
        batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
        self._flushing = batch
        self.batches += 1
        try:
            flush = loop.run_in_executor(None, self.storage.publish_batch, [item for item, _ in batch])
        except RuntimeError as exc:  # the executor is shut down: nothing more can be published
            batch, self._queue, self._flushing, self._busy = batch + self._queue, [], None, False
            _fail(batch, exc)
            return
        flush.add_done_callback(self._flushed)

    def _flushed(self, flush: asyncio.Future[list[bytes | Exception]]) -> None:
        batch, self._flushing = self._flushing, None
        assert batch is not None
        error = RuntimeError("the flush was cancelled") if flush.cancelled() else flush.exception()
        if error is not None:  # not a refusal of one upload: every one of them fails
            _fail(batch, error if isinstance(error, Exception) else RuntimeError(repr(error)))
        else:
            for (_, future), result in zip(batch, flush.result(), strict=True):
                if future.done():
                    continue
                if isinstance(result, Exception):
                    future.set_exception(result)
                else:
                    future.set_result(result)
        if self._queue:
            self._flush_next(flush.get_loop())
        else:
            self._busy = False


def _fail(batch: list[tuple[Publication, asyncio.Future[bytes]]], error: Exception) -> None:
    for _, future in batch:
        if not future.done():
            future.set_exception(error)
